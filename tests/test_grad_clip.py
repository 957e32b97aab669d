"""clip_grad_norm_'s multi-tensor norm and scale (metal/grad_clip.metal, the CPU's loops in
csrc/backend/cpu/grad_clip_cpu.cpp): against NumPy float64 and PyTorch, on every device,
for many gradients of odd sizes (empty, one element, more than one chunk), p = 2, 1, 3.5
and inf, float16 / float32 / float64; in place; deterministic (run to run, across thread
counts and threadgroup sizes); under fastmetal.compile; and the launches it records.
"""
from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core, nn
from helpers import host, needs_torch, skip_without_float64, torch
from references import msl_kernels_on_cpu

kernels = pytest.fixture(msl_kernels_on_cpu)

# Odd sizes: empty, one element, a partial lane round, one chunk (4096) and one more,
# several chunks, 0-d and 2-D.
SHAPES = [(0,), (1,), (33,), (1000,), (4096,), (4097,), (9000,), (), (3, 70), (2, 0)]
NORMS = [2.0, 1.0, 3.5, math.inf]
RTOL = {np.float32: 1e-6, np.float16: 1e-6, np.float64: 1e-6}


def _grads(rng, dtype, shapes=SHAPES, scale=3.0):
    return [np.asarray(rng.standard_normal(s) * scale).astype(dtype) for s in shapes]


def _params(arrays, device):
    params = []
    for a in arrays:
        p = fm.zeros(a.shape, dtype=a.dtype.name, device=device).requires_grad_()
        p.grad = fm.asarray(a.copy(), device=device)
        params.append(p)
    return params


def _reference(arrays, p):
    flat = np.concatenate([a.astype(np.float64).ravel() for a in arrays])
    if flat.size == 0:
        return 0.0
    if math.isinf(p):
        return float(np.max(np.abs(flat)))
    return float(np.sum(np.abs(flat) ** p) ** (1.0 / p))


def _check(arrays, params, total, p, max_norm, dtype):
    want = _reference(arrays, p)
    got = host(total)
    assert got.shape == () and got.dtype == np.float32
    np.testing.assert_allclose(float(got), want, rtol=RTOL[dtype], atol=1e-30)
    # The factor as the kernels form it: float32 arithmetic on the float32 norm.
    t = np.float32(got)
    factor = min(np.float32(max_norm) / (t + np.float32(1e-6)), np.float32(1.0))
    if dtype == np.float16:
        factor = np.float32(np.float16(factor))
    for a, prm in zip(arrays, params):
        g = host(prm.grad)
        assert g.dtype == dtype and g.shape == a.shape
        expect = (a.astype(np.float64) * np.float64(factor)).astype(dtype)
        tol = {np.float16: 1e-3, np.float32: 1e-6, np.float64: 1e-12}[dtype]
        np.testing.assert_allclose(g.astype(np.float64), expect.astype(np.float64), rtol=tol,
                                   atol=0)


@pytest.mark.parametrize("p", NORMS, ids=["p2", "p1", "p3.5", "inf"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_matches_numpy_float64(device, rng, p, dtype):
    if dtype == np.float64:
        skip_without_float64(device)
    arrays = _grads(rng, dtype, SHAPES if not math.isinf(p) else
                    [s for s in SHAPES if math.prod(s) > 0])
    params = _params(arrays, device)
    grads_before = [prm.grad for prm in params]
    total = nn.utils.clip_grad_norm_(params, 1.0, norm_type=p)
    _check(arrays, params, total, p, 1.0, dtype)
    assert all(prm.grad is g for prm, g in zip(params, grads_before))  # in place
    assert total.device == device


def test_under_the_max_keeps_the_gradients(device, rng):
    arrays = _grads(rng, np.float32, scale=1e-3)
    params = _params(arrays, device)
    total = nn.utils.clip_grad_norm_(params, 1e3)
    assert float(total) == pytest.approx(_reference(arrays, 2.0), rel=1e-6)
    for a, prm in zip(arrays, params):  # factor 1: bit for bit
        np.testing.assert_array_equal(host(prm.grad), a)


def test_mixed_dtypes_none_grads_and_a_strided_view(device, rng):
    skip_without_float64(device)
    a16, a32, a64 = (rng.standard_normal(s).astype(d) for s, d in
                     (((70,), np.float16), ((5000,), np.float32), ((33,), np.float64)))
    wide = rng.standard_normal((6, 8)).astype(np.float32)
    params = _params([a16, a32, a64], device)
    no_grad = fm.zeros((4,), device=device).requires_grad_()  # grad None: skipped
    strided = fm.zeros((4, 6), device=device).requires_grad_()
    strided.grad = fm.asarray(wide.copy(), device=device)[::2, 1:7].T  # a strided view
    view_data = wide[::2, 1:7].T
    total = nn.utils.clip_grad_norm_([*params, no_grad, strided], 2.0)
    arrays = [a16, a32, a64, view_data]
    want = _reference(arrays, 2.0)
    assert float(total) == pytest.approx(want, rel=1e-6)
    factor = np.float32(2.0) / (np.float32(total) + np.float32(1e-6))
    np.testing.assert_allclose(host(params[0].grad), a16 * np.float16(factor), rtol=2e-3)
    np.testing.assert_allclose(host(params[1].grad), a32 * factor, rtol=1e-6)
    np.testing.assert_allclose(host(params[2].grad), a64 * np.float64(factor), rtol=1e-12)
    np.testing.assert_allclose(host(strided.grad), view_data * factor, rtol=1e-6)
    assert no_grad.grad is None


def test_edge_cases(device):
    # No gradients: a 0-d zero, as torch.
    assert float(nn.utils.clip_grad_norm_([], 1.0)) == 0.0
    p = fm.zeros((3,), device=device).requires_grad_()
    assert float(nn.utils.clip_grad_norm_([p], 1.0)) == 0.0
    # One Array (not a list), all zeros: norm 0, factor 1.
    z = fm.zeros((5,), device=device).requires_grad_()
    z.grad = fm.zeros((5,), device=device)
    assert float(nn.utils.clip_grad_norm_(z, 1.0)) == 0.0
    np.testing.assert_array_equal(host(z.grad), np.zeros(5, np.float32))
    # Only empty gradients: the norm is 0, nothing is written; the inf norm with an empty
    # gradient is an error, as torch's (a max of nothing has no identity).
    e = fm.zeros((0, 3), device=device).requires_grad_()
    e.grad = fm.zeros((0, 3), device=device)
    for norm in NORMS[:3]:
        assert float(nn.utils.clip_grad_norm_([e], 1.0, norm)) == 0.0
    with pytest.raises(RuntimeError, match=r"clip_grad_norm_.*non-empty.*\(0, 3\)"):
        nn.utils.clip_grad_norm_([z, e], 1.0, math.inf)


def test_nan_and_inf(device):
    def params(values):
        q = fm.zeros((len(values),), device=device).requires_grad_()
        q.grad = fm.asarray(np.array(values, np.float32), device=device)
        other = fm.zeros((5000,), device=device).requires_grad_()
        other.grad = fm.asarray(np.ones(5000, np.float32), device=device)
        return [other, q]

    for norm in NORMS:
        ps = params([1.0, np.nan, 2.0])
        assert math.isnan(float(nn.utils.clip_grad_norm_(ps, 1.0, norm)))
        assert np.isnan(host(ps[0].grad)).all()  # NaN factor, as torch
        ps = params([1.0, np.inf])
        assert float(nn.utils.clip_grad_norm_(ps, 1.0, norm)) == math.inf
        np.testing.assert_array_equal(host(ps[0].grad), np.zeros(5000, np.float32))
        ps = params([np.inf])
        with pytest.raises(RuntimeError, match="clip_grad_norm_.*finite"):
            nn.utils.clip_grad_norm_(ps, 1.0, norm, error_if_nonfinite=True)
        np.testing.assert_array_equal(host(ps[0].grad), np.ones(5000, np.float32))  # untouched


def test_huge_and_tiny_magnitudes(device):
    # Squares near float32's range limits: computed without overflow or flush in float32
    # as long as the squares themselves are representable.
    big = fm.zeros((4,), device=device).requires_grad_()
    big.grad = fm.asarray(np.array([1e18, -1e18, 3e17, 0], np.float32), device=device)
    tiny = fm.zeros((3,), device=device).requires_grad_()
    tiny.grad = fm.asarray(np.array([1e-19, 2e-19, 0], np.float32), device=device)
    want = _reference([host(big.grad), host(tiny.grad)], 2.0)
    assert float(nn.utils.clip_grad_norm_([big, tiny], 1.0)) == pytest.approx(want, rel=1e-6)
    # A sum dwarfed by one element keeps the small ones (compensated sums).
    many = fm.zeros((20000,), device=device).requires_grad_()
    values = np.full(20000, 1e-3, np.float32)
    values[0] = 1e3
    many.grad = fm.asarray(values, device=device)
    got = float(nn.utils.clip_grad_norm_([many], 1e9, 1.0))
    assert got == pytest.approx(_reference([values], 1.0), rel=1e-7)


def test_float64_gradients_are_summed_in_double(device):
    """float64 gradients keep what float32 squares would lose (1e-30 squared underflows in
    float32); the norm is returned in float32, as for every dtype."""
    skip_without_float64(device)
    tiny = fm.zeros((1000,), dtype="float64", device=device).requires_grad_()
    values = np.full(1000, 1e-30)
    tiny.grad = fm.asarray(values.copy(), device=device)
    total = nn.utils.clip_grad_norm_([tiny], 1e-31)
    assert float(total) == pytest.approx(1e-30 * math.sqrt(1000), rel=1e-6)
    factor = np.float32(1e-31) / (np.float32(total) + np.float32(1e-6))
    np.testing.assert_array_equal(host(tiny.grad), values * np.float64(factor))


def test_bad_arguments(device):
    p = fm.zeros((3,), device=device).requires_grad_()
    p.grad = fm.ones((3,), device=device)
    with pytest.raises(TypeError, match="clip_grad_norm_.*max_norm"):
        nn.utils.clip_grad_norm_([p], "1")
    with pytest.raises(ValueError, match="clip_grad_norm_.*norm_type > 0"):
        nn.utils.clip_grad_norm_([p], 1.0, 0.0)
    q = fm.zeros((3,), dtype="int32", device=device)
    q.grad = fm.zeros((3,), dtype="int32", device=device)
    with pytest.raises(TypeError, match="clip_grad_norm_.*floating-point gradients.*int32"):
        nn.utils.clip_grad_norm_([q], 1.0)


@needs_torch
@pytest.mark.parametrize("p", NORMS, ids=["p2", "p1", "p3.5", "inf"])
def test_matches_torch(device, rng, p):
    shapes = [(1,), (33,), (1000,), (4097,), (9000,), (3, 70)] + ([] if math.isinf(p) else [(0,)])
    arrays = _grads(rng, np.float32, shapes)
    params = _params(arrays, device)
    tparams = []
    for a in arrays:
        t = torch.zeros(a.shape, requires_grad=True)
        t.grad = torch.tensor(a.copy())
        tparams.append(t)
    total = nn.utils.clip_grad_norm_(params, 0.5, norm_type=p)
    ttotal = torch.nn.utils.clip_grad_norm_(tparams, 0.5, norm_type=p)
    assert float(total) == pytest.approx(float(ttotal), rel=2e-6)
    for prm, t in zip(params, tparams):
        np.testing.assert_allclose(host(prm.grad), t.grad.numpy(), rtol=2e-6, atol=1e-12)


# ============================================================================ determinism
def _digest(device, native=True, group=0):
    rng = np.random.default_rng(5)
    arrays = _grads(rng, np.float32, [(33,), (70000,), (4097,), (1,), (12345,)])
    out = []
    for p in NORMS:
        params = _params(arrays, device)
        total = nn.utils.clip_grad_norm_(params, 1.0, p)
        out.append(host(total).tobytes())
        out.extend(host(prm.grad).tobytes() for prm in params)
    return hashlib.sha256(b"".join(out)).hexdigest()


def test_same_bits_twice(device):
    assert _digest(device) == _digest(device)


DIGEST = (
    "import hashlib, math, numpy as np, fastmetal as fm\n"
    "from fastmetal import _core, nn\n"
    "for native in (True, False):\n"
    "  _core._set_native_cpu(native)\n"
    "  rng = np.random.default_rng(5)\n"
    "  out = []\n"
    "  for p in (2.0, 1.0, 3.5, math.inf):\n"
    "    for dt in (np.float32, np.float16, np.float64):\n"
    "      ps = []\n"
    "      for s in ((33,), (9000,), (4097,), (1,)):\n"
    "        q = fm.zeros(s, dtype=np.dtype(dt).name).requires_grad_()\n"
    "        q.grad = fm.asarray((rng.standard_normal(s) * 3).astype(dt))\n"
    "        ps.append(q)\n"
    "      out.append(nn.utils.clip_grad_norm_(ps, 1.0, p).numpy().tobytes())\n"
    "      out.extend(q.grad.numpy().tobytes() for q in ps)\n"
    "  print(native, hashlib.sha256(b''.join(out)).hexdigest())\n")


@pytest.mark.cpu_only
def test_bits_do_not_depend_on_the_thread_count():
    """The chunk partition is fixed by the shapes: 1, 2 and 3 threads give the same bits, on
    the CPU's loops and on the MSL kernels alike."""
    digests = set()
    for threads in ("1", "2", "3"):
        env = dict(os.environ, FASTMETAL_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, "-c", DIGEST], env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        digests.add(tuple(out.stdout.split()))  # (True, native digest, False, kernels digest)
    assert len(digests) == 1, digests


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_msl_kernels_under_the_emulator(kernels, dtype):
    """The GPU code itself under the CPU's fiber emulator: the same bits for any threadgroup
    size (lanes are fixed, threads only serve them), matching NumPy and the CPU's loops."""
    rng = np.random.default_rng(11)
    for p in NORMS:
        arrays = _grads(rng, dtype, [s for s in SHAPES if not math.isinf(p) or math.prod(s) > 0])
        results = {}
        for native, group in ((True, 0), (False, 1), (False, 7), (False, 256), (False, 1024)):
            _core._set_native_cpu(native)
            _core._set_kernel_group_size(group)
            params = _params(arrays, "cpu")
            total = nn.utils.clip_grad_norm_(params, 1.0, p)
            if not native:
                _check(arrays, params, total, p, 1.0, dtype)
            results[(native, group)] = (host(total), [host(q.grad) for q in params])
        kernel_runs = [v for (native, _), v in results.items() if not native]
        for tot, grads in kernel_runs[1:]:
            np.testing.assert_array_equal(tot, kernel_runs[0][0])
            for a, b in zip(grads, kernel_runs[0][1]):
                np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(results[(True, 0)][0], kernel_runs[0][0], rtol=1e-6)


# ============================================================================ launches
def _recorded_entries(device, params):
    cap = _core._Capture(device)
    cap.begin_recording()
    try:
        nn.utils.clip_grad_norm_(params, 1.0)
    finally:
        cap.end_recording()
    return len(cap)


@pytest.mark.parametrize("native", [False, True], ids=["kernels", "native"])
def test_launches_for_52_gradients(device, native):
    """The GPT of `bench gpt` has 52 parameters: 4 launches of partial sums (14 gradients
    each), 1 finish and 4 scales, where the per-gradient road took 4 launches a gradient; the
    CPU's own loops are 2 recorded host calls."""
    if native and device != "cpu":
        pytest.skip("the CPU's loops")
    rng = np.random.default_rng(2)
    shapes = [(128, 128), (128,), (512, 128), (512,), (96, 128), (128, 384)] * 8 + [(1,)] * 4
    params = _params(_grads(rng, np.float32, shapes), device)
    saved = _core._native_cpu()
    _core._set_native_cpu(native)
    try:
        assert _recorded_entries(device, params) == (2 if native else 9)
    finally:
        _core._set_native_cpu(saved)


# ============================================================================ compile
@pytest.mark.parametrize("native", [True, False], ids=["native", "kernels"])
def test_compiled_step_equals_eager(device, native):
    """A step with clip_grad_norm_ under fastmetal.compile gives the eager step's bits
    (the norm and the factor never leave the device)."""
    if not native and device != "cpu":
        pytest.skip("the MSL kernels are what a GPU runs anyway")

    def run(compiled):
        fm.manual_seed(0)
        model = nn.Sequential(nn.Linear(12, 40, device=device), nn.LayerNorm(40, device=device),
                              nn.ReLU(), nn.Linear(40, 3, device=device))
        opt = fm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            loss = fm.cross_entropy(model(x), y)
            loss.backward()
            norm = nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # clips: 0.05 is small
            opt.step()
            return loss, norm

        f = fm.compile(step) if compiled else step
        rng = np.random.default_rng(4)
        outs = []
        for _ in range(5):
            x = fm.asarray(rng.standard_normal((8, 12)).astype(np.float32), device=device)
            y = fm.asarray(rng.integers(0, 3, 8), dtype="int64", device=device)
            loss, norm = f(x, y)
            outs.append((host(loss).copy(), host(norm).copy()))
        return outs, [host(p).copy() for p in model.parameters()], f

    saved = _core._native_cpu()
    _core._set_native_cpu(native)
    try:
        eager, eager_params, _ = run(False)
        compiled, params, f = run(True)
    finally:
        _core._set_native_cpu(saved)
    assert f.traces == 1
    for (l1, n1), (l2, n2) in zip(eager, compiled):
        np.testing.assert_array_equal(l1, l2)
        np.testing.assert_array_equal(n1, n2)
    assert float(eager[0][1]) > 0.05  # the clipping scaled
    for a, b in zip(eager_params, params):
        np.testing.assert_array_equal(a, b)
