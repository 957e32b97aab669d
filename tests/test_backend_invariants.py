"""The invariants every backend keeps (csrc/backend/backend.h, numbered as there), one test
each, on every device, from many Python threads at once."""
from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest

import fastmetal as fm

from conftest import HOST_VISIBLE
from thread_harness import run_threads, threaded_mismatches

N = 200_000


def host_waits(device):
    return fm._core._host_waits(device)


def small_mnist_net(device, seed=0):
    nn = fm.nn
    rng = np.random.default_rng(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, rng=rng, device=device), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.25, rng=rng), nn.Flatten(), nn.Linear(4 * 5 * 5, 10, rng=rng, device=device),
        nn.LogSoftmax(1))


def train_steps(device, steps, seed=0):
    """A few training steps of a small CNN on device Arrays; the parameters after them."""
    model = small_mnist_net(device, seed)
    opt = fm.nn.optim.Adadelta(model.parameters(), lr=1.0)
    loss_fn = fm.nn.CrossEntropyLoss()
    rng = np.random.default_rng(seed + 1)
    batches = [(fm.asarray(rng.standard_normal((8, 1, 12, 12)).astype(np.float32), device=device),
                rng.integers(0, 10, 8)) for _ in range(steps)]
    losses = []
    for x, y in batches:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()  # the whole step, backward included, must queue without waiting
        opt.step()
        losses.append(loss)
    return model, losses


# ---- 0. Asynchrony: ops on device Arrays queue their work; the host waits where it reads.

def test_0_a_chain_of_ops_on_device_arrays_never_waits(device):
    rng = np.random.default_rng(10)
    x_np = rng.standard_normal((64, 96)).astype(np.float32)
    w_np = rng.standard_normal((32, 96)).astype(np.float32)
    x = fm.asarray(x_np, device=device)  # a copy to the device may queue, never wait
    w = fm.asarray(w_np, device=device)
    before = host_waits(device)
    y = fm.relu(fm.linear(fm.multiply(fm.exp(fm.negative(x)), 0.5), w))
    for _ in range(20):
        y = fm.add(fm.multiply(y, 0.9), 0.1)
    logp = fm.log_softmax(y, 1)
    model, losses = train_steps(device, 3)
    assert host_waits(device) == before, "an op on device Arrays waited for the device"
    # Reading waits (on devices that queue work) and sees every queued op.
    want = np.maximum(np.exp(-x_np.astype(np.float64)) * 0.5 @ w_np.T.astype(np.float64), 0)
    for _ in range(20):
        want = want * 0.9 + 0.1
    want = want - want.max(1, keepdims=True)
    want = want - np.log(np.exp(want).sum(1, keepdims=True))
    np.testing.assert_allclose(np.asarray(logp), want, rtol=1e-4, atol=1e-4)
    assert all(np.isfinite(float(v)) for v in losses)
    if device not in ("cpu",):
        assert host_waits(device) > before


def test_0_the_async_training_matches_a_waiting_one(device):
    # The same steps with a read after every op must give bitwise the same parameters.
    model, _ = train_steps(device, 4)
    got = {k: np.array(v) for k, v in model.state_dict().items()}
    orig_step = fm.nn.optim.Adadelta.step

    def waiting_step(self):
        orig_step(self)
        fm.synchronize()
    fm.nn.optim.Adadelta.step = waiting_step
    try:
        ref, _ = train_steps(device, 4)
    finally:
        fm.nn.optim.Adadelta.step = orig_step
    for k, v in ref.state_dict().items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_0_every_host_read_waits_for_the_queued_work(device):
    big = np.full((512, 512), 0.5, np.float32)
    a = fm.asarray(big, device=device)

    def queued():  # slow enough that a read which does not wait sees stale data
        r = a
        for _ in range(8):
            r = fm.matmul(r, a)  # 0.5 ** k * 256 ** (k - 1) ... scaled below
            r = fm.multiply(r, 1 / 256)
        return r

    want = np.full((512, 512), 0.5, np.float32)  # each step keeps 0.5: (0.5*0.5*512)/256
    reads = {
        "np.asarray": lambda r: np.asarray(r),
        ".numpy()": lambda r: r.numpy(),
        "float(r[0, 0])": lambda r: np.full((512, 512), float(r[0, 0])),
        "item": lambda r: np.full((512, 512), r[3, 4].item()),
        "tolist": lambda r: np.array(r.tolist(), np.float32),
        "repr": lambda r: (repr(r), np.asarray(r))[1],
        "to cpu": lambda r: np.asarray(fm.asarray(r, device="cpu")),
    }
    if device in HOST_VISIBLE:
        reads["memoryview"] = lambda r: np.array(memoryview(r))
        reads["__dlpack__"] = lambda r: np.from_dlpack(r).copy()
    for name, read in reads.items():
        np.testing.assert_array_equal(read(queued()), want, err_msg=name)
    if device == "cuda":
        try:  # without torch, still run the CuPy check below (importorskip would skip it)
            import torch  # noqa: PLC0415
        except ImportError:
            torch = None
        if torch is not None and torch.cuda.is_available():  # DLPack waits for queued work
            np.testing.assert_array_equal(torch.from_dlpack(queued()).cpu().numpy(), want)
        cupy = pytest.importorskip("cupy")
        np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(queued())), want)


def test_0_numpy_in_numpy_out_is_complete_on_return(device):
    x = np.linspace(-3, 3, N, dtype=np.float32)
    out = np.empty_like(x)
    r = fm.exp(x)
    fm.multiply(x, 2.0, out=out)
    # A host write right after the call must not reach (or race) the op's result.
    x[:] = 0.0
    np.testing.assert_allclose(r, np.exp(np.linspace(-3, 3, N, dtype=np.float32)), rtol=1e-5)
    np.testing.assert_array_equal(out, np.linspace(-3, 3, N, dtype=np.float32) * 2)


def test_0_dropping_inputs_and_outputs_while_work_is_pending(device):
    kept = []
    for i in range(40):
        a = fm.asarray(np.full(N, float(i), np.float32), device=device)
        b = fm.add(fm.multiply(a, 2.0), 1.0)  # 2 i + 1
        c = fm.matmul(fm.asarray(np.full((256, 256), 1.0, np.float32), device=device),
                      fm.asarray(np.full((256, 256), float(i), np.float32), device=device))
        del a  # inputs and temporaries die while the kernels are queued
        if i % 8 == 0:
            kept.append((i, b, c))
        del b, c  # (reference counting frees them here; no gc needed)
    gc.collect()
    for i, b, c in kept:
        np.testing.assert_array_equal(np.asarray(b), np.full(N, 2.0 * i + 1, np.float32))
        np.testing.assert_array_equal(np.asarray(c), np.full((256, 256), 256.0 * i, np.float32))


def test_0_a_block_freed_under_a_queued_kernel_is_not_overwritten_before_it_ran(device):
    # x is dropped while a slow product still reads it; the very next allocation of that
    # size (written from the host at once) may get x's block.
    rng = np.random.default_rng(3)
    for round_ in range(4):
        x_np = rng.standard_normal((1024, 1024)).astype(np.float32)
        x = fm.asarray(x_np, device=device)
        y = fm.matmul(fm.matmul(x, x), x)
        del x
        churn = [fm.asarray(np.full((1024, 1024), -7.0, np.float32), device=device)
                 for _ in range(3)]
        want = (x_np.astype(np.float64) @ x_np @ x_np)
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-3, atol=1e-3 * np.abs(want).max(),
                                   err_msg=f"round {round_}")
        assert all(np.asarray(c)[0, 0] == -7.0 for c in churn)


def test_0_threads_queue_on_device_arrays_and_read_their_own_results(device):
    def work(t):
        x = fm.asarray(np.full((128, 128), float(t + 1), np.float32), device=device)
        outs = []
        for i in range(15):
            y = fm.add(fm.matmul(x, fm.multiply(x, 1 / 128)), float(i))  # (t+1)^2 + i
            outs.append(y)
        model, losses = train_steps(device, 2, seed=t % 2)
        return ([np.asarray(o)[0, 0] for o in outs],
                {k: np.array(v) for k, v in model.state_dict().items()})

    results = run_threads(work, 6)
    for t, (firsts, params) in enumerate(results):
        assert firsts == [float((t + 1) ** 2 + i) for i in range(15)], t
        ref = results[t % 2][1]
        for k in ref:
            np.testing.assert_array_equal(params[k], ref[k], err_msg=f"thread {t} {k}")


def test_0_launch_errors_surface_as_runtime_error_and_queued_work_survives(device):
    a = fm.asarray(np.full(N, 2.0, np.float32), device=device)
    r = fm.multiply(fm.exp(fm.multiply(a, 0.0)), 3.0)  # queued, unread
    with pytest.raises(RuntimeError, match="no_such_kernel"):
        fm._core._launch_kernel_named(device, "no_such_kernel")
    np.testing.assert_array_equal(np.asarray(r), np.full(N, 3.0, np.float32))
    np.testing.assert_array_equal(np.asarray(fm.add(r, 1.0)), np.full(N, 4.0, np.float32))


def test_0_waiting_releases_the_gil(device):
    if device == "cpu":
        pytest.skip("the CPU backend runs each op to completion: nothing to wait for")
    a = fm.asarray(np.full((2048, 2048), 1 / 2048, np.float32), device=device)
    progress = [0]
    seen = []
    go, ready = threading.Event(), threading.Event()

    def waiter():
        go.wait()
        before = progress[0]
        ready.set()
        fm.synchronize()  # only the main thread's loop below can move `progress` meanwhile
        seen.append(progress[0] - before)

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.5)  # no forced switch while the GPU work runs
    th = threading.Thread(target=waiter)
    th.start()
    try:
        r = a
        for _ in range(40):  # tens of milliseconds of queued work
            r = fm.matmul(r, a)
        go.set()
        ready.wait()
        while th.is_alive():
            progress[0] += 1
    finally:
        th.join()
        sys.setswitchinterval(old)
    assert seen[0] > 0, "the main thread made no progress while another thread waited"
    np.testing.assert_allclose(np.asarray(r)[:2, :2], 1 / 2048, rtol=1e-4)
