"""fastmetal.compile: a step traced once and replayed without Python per op.

Every check compares a compiled run with the same run done eagerly on the same device:
results must be bit-identical (the same kernels, the same order, the same arguments),
including dropout masks and random draws (Philox advances as eagerly), optimizer state and
step counts, BatchNorm's running statistics and a learning-rate schedule.
"""
from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from fastmetal.ops import random as random_ops
from fastmetal.models import VAE, mnist_cnn, vae_loss


def _params(model):
    return {k: np.array(v) for k, v in model.state_dict().items()}


def _same(a, b):
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _batches(n, shape, classes, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape).astype(np.float32),
             rng.integers(0, classes, shape[0]).astype(np.int64)) for _ in range(n)]


def _mnist_run(device, compiled, steps=5):
    fm.manual_seed(3)
    model = mnist_cnn(seed=1, device=device)
    opt = fm.optim.Adadelta(model.parameters(), lr=1.0)

    def step(x, y):
        opt.zero_grad()
        loss = fm.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    run = fm.compile(step) if compiled else step
    losses = []
    for x, y in _batches(steps, (4, 1, 28, 28), 10):
        xa, ya = fm.asarray(x, device=device), fm.asarray(y, dtype="int64", device=device)
        losses.append(float(run(xa, ya)))
    return losses, _params(model), run


def test_mnist_step_replays_bit_identical(device):
    eager_losses, eager_params, _ = _mnist_run(device, compiled=False)
    losses, params, run = _mnist_run(device, compiled=True)
    assert run.traces == 1
    assert losses == eager_losses
    _same(params, eager_params)


def _vae_run(device, compiled, steps=5, batch=8):
    fm.manual_seed(11)
    model = VAE(seed=2, device=device)
    opt = fm.optim.Adam(model.parameters(), lr=1e-3)

    def step(x):
        opt.zero_grad()
        recon, mu, logvar = model(x)  # eps from fastmetal.random: a new draw each step
        loss = vae_loss(recon, x, mu, logvar)
        loss.backward()
        opt.step()
        return loss, mu

    run = fm.compile(step) if compiled else step
    rng = np.random.default_rng(5)
    out = []
    for _ in range(steps):
        x = fm.asarray(rng.random((batch, 784), dtype=np.float32), device=device)
        loss, mu = run(x)
        out.append((loss.numpy().copy(), mu.numpy().copy()))
    counter = random_ops._default.counter
    return out, _params(model), counter, opt


def test_vae_step_with_random_draws_and_adam(device):
    eager, eager_params, eager_counter, eager_opt = _vae_run(device, compiled=False)
    comp, params, counter, opt = _vae_run(device, compiled=True)
    for (l0, m0), (l1, m1) in zip(eager, comp):
        np.testing.assert_array_equal(l1, l0)
        np.testing.assert_array_equal(m1, m0)
    _same(params, eager_params)
    assert counter == eager_counter  # the generator advanced exactly as eagerly
    # Adam's step count advanced at each replay (its bias correction depends on it).
    assert [s["step"] for s in opt.state.values()] == [s["step"] for s in eager_opt.state.values()]


def _bn_run(device, compiled, steps=6):
    fm.manual_seed(7)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, device=device),
                          nn.BatchNorm2d(4, device=device), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5, device=device))
    opt = fm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    sched = fm.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    def step(x, y):
        opt.zero_grad()
        loss = fm.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    run = fm.compile(step) if compiled else step
    losses = []
    for x, y in _batches(steps, (3, 3, 6, 6), 5, seed=2):
        losses.append(run(fm.asarray(x, device=device),
                          fm.asarray(y, dtype="int64", device=device)).numpy().copy())
        sched.step()  # outside the compiled step: the replays see the new learning rate
    return losses, _params(model)


def test_batchnorm_scheduler_step(device):
    eager_losses, eager_params = _bn_run(device, compiled=False)
    losses, params = _bn_run(device, compiled=True)
    np.testing.assert_array_equal(np.array(losses), np.array(eager_losses))
    _same(params, eager_params)  # running_mean / running_var / num_batches_tracked too


def test_outputs_stay_valid_and_inputs_untouched(device):
    @fm.compile
    def f(x, y):
        return fm.exp(x) * 2.0 + y, (x + y).sum()

    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((5, 7)).astype(np.float32) for _ in range(5)]
    y = fm.asarray(rng.standard_normal((5, 7)).astype(np.float32), device=device)
    results = []
    for x in xs:
        xa = fm.asarray(x, device=device)
        results.append((xa, f(xa, y)))
    assert f.traces == 1
    for x, (xa, (a, s)) in zip(xs, results):  # every earlier result still holds its values
        np.testing.assert_array_equal(xa.numpy(), x)
        want = (fm.exp(fm.asarray(x, device=device)) * 2.0 + y).numpy()
        np.testing.assert_array_equal(a.numpy(), want)
        np.testing.assert_allclose(float(s), float((x + y.numpy()).sum()), rtol=1e-5)


def test_fills_stay_out_of_the_arena(device):
    """zeros/ones made inside a step are filled on the device, not copied from the host:
    the capture's arena (uploaded again whenever a patched argument changes, as an Adam
    step count does at every step) stays small, and each replay fills them again."""
    @fm.compile
    def f(x):
        z = fm.zeros((256, 1024), device=device)  # 1 MiB of zeros
        o = fm.ones((256, 1024), dtype="int32", device=device)
        return z + x, o.sum()

    for k in range(4):
        a, s = f(fm.full((1024,), float(k), device=device))
        np.testing.assert_array_equal(a.numpy(), np.full((256, 1024), k, np.float32))
        assert int(s) == 256 * 1024
    (replay,) = [e for e in f._entries.values() if hasattr(e, "trace")]
    assert replay.trace.capture.arena_bytes < 64 * 1024


def test_new_signature_traces_again(device):
    calls = []

    @fm.compile
    def f(x, scale):
        calls.append(1)
        return x * scale

    for shape, scale in [((3,), 2.0)] * 3 + [((4,), 2.0)] * 3 + [((3,), 3.0)] * 3:
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        out = f(fm.asarray(x, device=device), scale)
        np.testing.assert_array_equal(out.numpy(), x * np.float32(scale))
    assert f.traces == 3
    assert len(calls) == 6  # per signature: one warm-up call and one traced call


def test_host_read_runs_eagerly_with_one_warning(device):
    @fm.compile
    def f(x):
        y = x * 2.0
        return y + float(y.sum())  # a host read: not replayable

    x = np.arange(4, dtype=np.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        outs = [f(fm.asarray(x + i, device=device)).numpy() for i in range(4)]
    assert sum(issubclass(w.category, fm.CompileWarning) for w in seen) == 1
    for i, out in enumerate(outs):
        y = (x + i) * 2
        np.testing.assert_allclose(out, y + y.sum())
    assert f.traces == 0


def test_replays_do_not_grow_memory(device):
    psutil = pytest.importorskip("psutil")
    model = nn.Sequential(nn.Linear(16, 32, device=device), nn.ReLU(), nn.Dropout(0.1),
                          nn.Linear(32, 4, device=device))
    opt = fm.optim.Adam(model.parameters())

    @fm.compile
    def step(x, y):
        opt.zero_grad()
        loss = fm.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    x = fm.asarray(np.ones((8, 16), np.float32), device=device)
    y = fm.asarray(np.zeros(8, np.int64), dtype="int64", device=device)
    for _ in range(200):
        step(x, y)
    fm.synchronize()
    gc.collect()
    before = psutil.Process().memory_info().rss
    for _ in range(10_000):
        step(x, y)
    fm.synchronize()
    gc.collect()
    grown = psutil.Process().memory_info().rss - before
    assert grown < 8 << 20, f"RSS grew by {grown / 2**20:.1f} MiB over 10^4 replays"


def test_uncapturable_op_runs_eagerly(device):
    q = fm.asarray(np.random.default_rng(0).standard_normal((1, 2, 8, 4)).astype(np.float32),
                   device=device)

    @fm.compile
    def f(q):
        return nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)

    with pytest.warns(fm.CompileWarning, match="dropout_p"):
        for _ in range(3):
            f(q)
    assert f.traces == 0


def test_bad_argument():
    with pytest.raises(TypeError, match=r"\[fastmetal.compile\] expected a function"):
        fm.compile(3)
