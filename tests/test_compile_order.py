"""The order a compiled step's launches may run in (csrc/backend/capture_order.h).

A replay need not follow the list's order: each launch waits only for the launches that
wrote what it reads, or read or wrote what it writes (CUDA records these edges into its
graph, so independent launches run side by side). Here the edges are checked against an
independent computation from the entries' buffers, the written buffers against the
kernels' signatures, and the results of replays in another order that respects the edges
(the latest ready launch first) against eager execution, bit for bit; an order that breaks
one edge must change them. On the CPU the MSL kernels run (the fixtures), so the entries
are the launches a GPU replays.
"""
from __future__ import annotations

import heapq
import warnings

import numpy as np
import pytest

import fastmetal as fm
import fastmetal.nn.functional as F
from fastmetal import nn
from references import msl_conv_kernels_on_cpu, msl_kernels_on_cpu

conv_kernels = pytest.fixture(msl_conv_kernels_on_cpu)
kernels = pytest.fixture(msl_kernels_on_cpu)


class Net(nn.Module):
    """MNIST's network in small, with its second layer's input gradient and weight gradient
    independent of each other."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = self.drop(F.max_pool2d(F.relu(self.conv2(x)), 2))
        return self.fc(fm.flatten(x, 1))


def _batches(device, n):
    rng = np.random.default_rng(3)
    return [(fm.asarray(rng.standard_normal((4, 1, 14, 14)).astype(np.float32), device=device),
             fm.asarray(rng.integers(0, 10, 4), dtype="int64", device=device)) for _ in range(n)]


def _train(device, compiled, order=None, steps=5):
    """Losses and final parameters of `steps` Adam steps; with `order(capture)`, the replays
    run the capture's entries in the order it returns (fastmetal.compile runs the first call
    eagerly, traces the second and replays from the third)."""
    fm.random.seed(0)
    net = Net().to(device)
    opt = fm.optim.Adam(net.parameters(), lr=0.01)

    def step(x, y):
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    run = fm.compile(step) if compiled else step
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", fm.CompileWarning)
        for i, batch in enumerate(_batches(device, steps)):
            losses.append(np.array(run(*batch)))
            if i == 1 and order is not None:  # traced: the next calls replay
                cap = _capture(run)
                cap.replay_order = order(cap)
    return losses, {k: np.array(v) for k, v in net.state_dict().items()}, run


def _capture(run):
    (replay,) = [e for e in run._entries.values() if hasattr(e, "trace")]
    return replay.trace.capture


def _conflicts(accesses, i, j):
    (ki, ai), (kj, aj) = accesses[i], accesses[j]
    if "fused" in (ki, kj):
        return False
    if "host_call" in (ki, kj):
        return True
    return any((wa or wb) and a < b + nb and b < a + na
               for a, na, wa in ai for b, nb, wb in aj)


def _ancestors(deps):
    reach = []
    for d in deps:
        mine = set(d)
        for i in d:
            mine |= reach[i]
        reach.append(mine)
    return reach


def _latest_ready_first(cap):
    """A topological order of the dependencies that takes the highest-numbered ready entry
    each time: as far from the list's order as the edges allow."""
    deps = cap.dependencies()
    waiting = [len(d) for d in deps]
    users = [[] for _ in deps]
    for j, d in enumerate(deps):
        for i in d:
            users[i].append(j)
    ready = [-j for j, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        j = -heapq.heappop(ready)
        order.append(j)
        for u in users[j]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, -u)
    assert len(order) == len(deps)
    return order


def test_dependencies_are_the_conflicts_and_nothing_more(device, kernels, conv_kernels):
    *_, run = _train(device, compiled=True, steps=3)
    cap = _capture(run)
    accesses, deps = cap.accesses(), cap.dependencies()
    assert len(accesses) == len(deps) == len(cap)
    reach = _ancestors(deps)
    unordered = 0
    for j in range(len(deps)):
        assert deps[j] == sorted(deps[j], reverse=True) and all(i < j for i in deps[j])
        for i in deps[j]:  # every edge is a conflict, and none is implied by another
            assert _conflicts(accesses, i, j), (i, j, accesses[i], accesses[j])
            assert not any(i in reach[k] for k in deps[j] if k != i), (i, j)
        for i in range(j):  # every conflict is ordered
            if _conflicts(accesses, i, j):
                assert i in reach[j], (i, j, accesses[i], accesses[j])
            elif accesses[i][0] != "fused" and accesses[j][0] != "fused":
                unordered += i not in reach[j]
    # the step is not one chain: some launches may run side by side (here, between the
    # host calls of CPU-native ops, which order everything around them)
    assert unordered > 0


@pytest.mark.parametrize("max_lanes", [1, 2, 8])
def test_lanes_order_what_the_dependencies_ask(device, kernels, conv_kernels, max_lanes):
    """How CUDA spreads the graph over its streams (capture::assign_lanes): each lane runs in
    order, and a wait makes a lane run after the awaited entry and what was before it. Every
    dependency must be so ordered; with enough lanes nothing else is (no edge the
    dependencies lack), and one lane is the list's order. With two or more, lane 0 (CUDA's
    high-priority stream) holds a longest path through the dependencies, and nothing else."""
    *_, run = _train(device, compiled=True, steps=3)
    cap = _capture(run)
    deps = cap.dependencies()
    lane, waits = cap.lanes(max_lanes)
    reach = _ancestors(deps)
    done_before, last_on = [], {}
    for j in range(len(deps)):
        before = set()
        if lane[j] >= 0:
            assert 0 <= lane[j] < max_lanes
            if lane[j] in last_on:
                prev = last_on[lane[j]]
                before |= done_before[prev] | {prev}
            for d in waits[j]:
                assert d < j and lane[d] != lane[j]
                before |= done_before[d] | {d}
            last_on[lane[j]] = j
        else:
            assert not deps[j] and not waits[j]
        done_before.append(before)
        assert set(deps[j]) <= before, (j, deps[j], lane[j], waits[j])
    extra = sum(len(done_before[j] - reach[j]) for j in range(len(deps)) if lane[j] >= 0)
    if max_lanes == 1:
        assert set(lane) <= {0, -1} and not any(waits)
    else:
        longest = [0] * len(deps)  # launches on the longest path ending at j
        for j, d in enumerate(deps):
            longest[j] = 0 if lane[j] < 0 else 1 + max((longest[i] for i in d), default=0)
        chain = [j for j in range(len(deps)) if lane[j] == 0]
        assert len(chain) == max(longest)
        assert all(a in reach[b] for a, b in zip(chain, chain[1:]))
    if max_lanes == 8:
        assert extra == 0 and max(lane) > 0


def test_written_buffers_follow_the_kernel_signatures(device, kernels):
    def f(a, b):
        return fm.exp(a @ b) + 1.0

    rng = np.random.default_rng(0)
    a = fm.asarray(rng.standard_normal((5, 7)).astype(np.float32), device=device)
    b = fm.asarray(rng.standard_normal((7, 3)).astype(np.float32), device=device)
    run = fm.compile(f)
    want = np.exp(np.asarray(a.numpy(), np.float64) @ np.asarray(b.numpy(), np.float64)) + 1
    for _ in range(3):
        np.testing.assert_allclose(run(a, b).numpy(), want, rtol=1e-5)
    accesses = dict(_capture(run).accesses())
    (mm,) = [k for k in accesses if k.startswith("matmul_") and "sum" not in k]
    assert [w for _, _, w in accesses[mm]] == [False, False, True]  # A, B read; C written
    exps = [k for k in accesses if k.startswith("unary_") and k.endswith("_exp_float32")]
    assert exps and all([w for _, _, w in accesses[k]] == [False, True] for k in exps)


def test_replays_in_another_dependency_order_give_eager_bits(device, kernels, conv_kernels):
    eager_losses, eager_params, _ = _train(device, compiled=False)
    losses, params, run = _train(device, compiled=True, order=_latest_ready_first)
    order = _capture(run).replay_order
    assert order != sorted(order)  # really another order
    for got, want in zip(losses, eager_losses):
        np.testing.assert_array_equal(got, want)
    for k in eager_params:
        np.testing.assert_array_equal(params[k], eager_params[k], err_msg=k)


def test_an_order_against_one_dependency_changes_the_results(device, kernels, conv_kernels):
    """The check above has teeth: the optimizer's last update moved before the launch it
    waits for (the gradient it reads) gives other parameters."""
    def broken(cap):
        deps = cap.dependencies()
        j = max(j for j, d in enumerate(deps) if d and cap.accesses()[j][0].startswith("adam"))
        order = [i for i in range(len(deps)) if i != j]
        order.insert(order.index(deps[j][0]), j)
        return order

    _, eager_params, _ = _train(device, compiled=False)
    _, params, _ = _train(device, compiled=True, order=broken)
    assert any(not np.array_equal(params[k], eager_params[k]) for k in eager_params)


def test_replay_order_must_be_a_permutation(device):
    run = fm.compile(lambda a: fm.exp(a) * 2.0)
    a = fm.asarray(np.ones(3, np.float32), device=device)
    run(a)
    run(a)
    cap = _capture(run)
    n = len(cap)
    for bad in ([0] * n, list(range(n + 1)), list(range(n))[:-1] if n > 1 else [5]):
        with pytest.raises(ValueError, match="permutation"):
            cap.replay_order = bad
    cap.replay_order = list(range(n))  # the list's own order is one
    np.testing.assert_array_equal(run(a).numpy(), (fm.exp(a) * 2.0).numpy())


@pytest.mark.parametrize("streams", ["1", "2", "8"])
def test_compiled_step_gives_eager_bits_on_any_stream_count(device, streams, monkeypatch):
    """FASTMETAL_COMPILE_STREAMS: how many streams CUDA records a step's graph on (one: the
    list's order); every count replays eager's bits. Elsewhere the setting changes nothing."""
    monkeypatch.setenv("FASTMETAL_COMPILE_STREAMS", streams)
    eager_losses, eager_params, _ = _train(device, compiled=False)
    losses, params, _ = _train(device, compiled=True)
    for got, want in zip(losses, eager_losses):
        np.testing.assert_array_equal(got, want)
    for k in eager_params:
        np.testing.assert_array_equal(params[k], eager_params[k], err_msg=k)
