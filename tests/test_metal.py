"""The Metal backend on an Apple GPU: elementwise ops against NumPy float64 and against the
CPU backend (the same kernel source compiled as C++). Skipped where fastmetal.devices()
has no "metal" (Linux, a Mac without a Metal 3 GPU, CI runners without a GPU)."""
from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.ops.optable import OPS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif("metal" not in fm.devices(), reason="no Metal device (fastmetal.devices() has no 'metal')"),
]

UNARY = [s for s in OPS if s.arity == 1]
BINARY = [s for s in OPS if s.arity == 2]
# Exactly rounded in float32 on every conforming device (IEEE add/sub/mul, sign and
# comparisons); the rest are held to a few float32 ulps.
EXACT = {"relu", "abs", "negative", "square", "add", "subtract", "multiply", "maximum", "minimum"}


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.nodeid)) % (2**32))


def gelu64(x):
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    return 0.5 * x * erfc(-x / math.sqrt(2.0)) if x.size else x.copy()


def reference(spec, *args):
    """The op table's NumPy reference, in float64."""
    scope = {"np": np, "gelu_reference": gelu64}
    scope.update(zip(("x", "y"), (np.asarray(a, np.float64) for a in args)))
    with np.errstate(all="ignore"):
        return np.asarray(eval(spec.numpy, scope), np.float64)


def inputs(spec, rng, shape, dtype=np.float32):
    """Operands inside each op's domain (so the check is about accuracy, not NaN)."""
    x = rng.uniform(-6, 6, shape)
    y = rng.uniform(-6, 6, shape)
    if spec.name in ("log", "sqrt"):
        x = np.abs(x) + 1e-3
    if spec.name == "power":
        x, y = np.abs(x) + 0.1, rng.uniform(-3, 3, shape)
    if spec.name in ("divide", "reciprocal"):
        y = np.where(np.abs(y) < 1e-2, 1.0, y)
        if spec.name == "reciprocal":
            x = y
    return x.astype(dtype), y.astype(dtype)


def assert_close(got, want, name, dtype=np.float32):
    got = np.asarray(got)
    assert got.dtype == dtype
    want_r = want.astype(dtype).astype(np.float64)
    got64 = got.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got64), np.isnan(want_r), err_msg=f"{name}: NaN positions")
    finite = np.isfinite(want_r)
    np.testing.assert_array_equal(got64[~finite & ~np.isnan(want_r)], want_r[~finite & ~np.isnan(want_r)])
    if name in EXACT:  # the float64 result rounded once to the storage type
        np.testing.assert_array_equal(got64[finite], want_r[finite], err_msg=name)
        return
    if dtype == np.float16:
        rtol, atol = 2e-3, 1e-3
    else:
        rtol, atol = 4e-6, 1e-6  # ~32 float32 ulps; Metal's precise math is within 4-16
    np.testing.assert_allclose(got64[finite], want[finite], rtol=rtol, atol=atol, err_msg=name)


def test_metal_is_listed_first():
    devs = fm.devices()
    assert devs[0] == "metal" and devs[-1] == "cpu"


@pytest.mark.parametrize("spec", UNARY, ids=lambda s: s.name)
def test_unary_numpy_in_numpy_out(spec, rng):
    x, _ = inputs(spec, rng, (37, 129))
    prev = fm.default_device()
    fm.set_default_device("metal")
    try:
        got = getattr(fm, spec.name)(x)
    finally:
        fm.set_default_device(prev)
    assert isinstance(got, np.ndarray)
    assert_close(got, reference(spec, x), spec.name)


@pytest.mark.parametrize("spec", UNARY, ids=lambda s: s.name)
def test_unary_metal_array_matches_cpu(spec, rng):
    x, _ = inputs(spec, rng, (1000,))
    gm = getattr(fm, spec.name)(fm.asarray(x, device="metal"))
    gc = getattr(fm, spec.name)(fm.asarray(x, device="cpu"))
    assert isinstance(gm, fm.Array) and gm.device == "metal"
    assert_close(gm.numpy(), reference(spec, x), spec.name)
    # Same kernel source on both backends: results agree to a few ulps.
    np.testing.assert_allclose(gm.numpy(), gc.numpy(), rtol=4e-6, atol=1e-6, err_msg=spec.name)


@pytest.mark.parametrize("spec", BINARY, ids=lambda s: s.name)
def test_binary_broadcast_and_strides(spec, rng):
    x, y = inputs(spec, rng, (6, 40, 33))
    cases = [
        (x, y),                              # contiguous
        (x[:, :1, :], y),                    # broadcast
        (x[0, 0, 0].item(), y),              # Python scalar on the left
        (x[:, ::3], y[:, ::-3]),             # step and negative strides
        (x.transpose(2, 0, 1)[:, :, :1], y[:, :, 0]),  # transposed view
    ]
    for a, b in cases:
        want_shape = np.broadcast_shapes(np.shape(a), np.shape(b))
        am = fm.asarray(a, device="metal") if isinstance(a, np.ndarray) else a
        got = getattr(fm, spec.name)(am, fm.asarray(b, device="metal"))
        assert got.shape == want_shape
        assert_close(got.numpy(), reference(spec, a, b), spec.name)


@pytest.mark.parametrize("spec", [s for s in OPS if s.name in ("sigmoid", "exp", "add", "multiply", "gelu")],
                         ids=lambda s: s.name)
def test_float16(spec, rng):
    x, y = inputs(spec, rng, (513,), np.float16)
    args = (x,) if spec.arity == 1 else (x, y)
    got = getattr(fm, spec.name)(*(fm.asarray(a, device="metal") for a in args))
    assert got.dtype == np.float16
    assert_close(got.numpy(), reference(spec, *args), spec.name, np.float16)


def test_out_unaligned_numpy_view_gets_results(rng):
    # A view starting mid-page: shared through a page-rounded no-copy buffer or copied and
    # copied back; either way the caller's memory holds the result and nothing else moves.
    base = np.full(10_000, -7.0, np.float32)
    out = base[3:9003]
    x = rng.standard_normal(9000).astype(np.float32)
    prev = fm.default_device()
    fm.set_default_device("metal")
    try:
        r = fm.sigmoid(x, out=out)
    finally:
        fm.set_default_device(prev)
    assert r is out
    np.testing.assert_allclose(out, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=4e-6, atol=1e-7)
    assert (base[:3] == -7).all() and (base[9003:] == -7).all()


def test_read_only_input(rng):
    x = rng.standard_normal(4096).astype(np.float32)
    ro = np.frombuffer(x.tobytes(), np.float32)
    assert not ro.flags.writeable
    got = fm.exp(fm.asarray(ro, device="metal"))
    assert_close(got.numpy(), np.exp(x.astype(np.float64)), "exp")


def test_many_sequential_ops():
    # Each result feeds the next op: pooled buffers are recycled while earlier ones may
    # still be named by finished command buffers.
    a = fm.zeros((1000,), device="metal")
    for _ in range(300):
        a = fm.add(a, 1.0)
    fm.synchronize("metal")
    np.testing.assert_array_equal(a.numpy(), np.full(1000, 300, np.float32))


def test_large_and_odd_size(rng):
    n = (1 << 22) + 7
    x = rng.uniform(-10, 10, n).astype(np.float32)
    got = fm.sigmoid(fm.asarray(x, device="metal")).numpy()
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=4e-6, atol=1e-7)


def test_zero_size():
    x = fm.asarray(np.zeros((0, 5), np.float32), device="metal")
    assert fm.tanh(x).shape == (0, 5)
    assert fm.add(x, fm.ones((5,), device="metal")).shape == (0, 5)


def test_nan_inf_propagation():
    x = fm.asarray(np.array([np.nan, 1.0, -np.inf, np.inf, 0.0], np.float32), device="metal")
    y = fm.asarray(np.array([0.0, np.nan, 1.0, np.nan, -0.0], np.float32), device="metal")
    np.testing.assert_array_equal(fm.maximum(x, y).numpy(), np.maximum(x.numpy(), y.numpy()))
    np.testing.assert_array_equal(fm.minimum(x, y).numpy(), np.minimum(x.numpy(), y.numpy()))
    np.testing.assert_array_equal(fm.exp(x).numpy()[[0, 2, 3]], np.array([np.nan, 0, np.inf], np.float32))


def test_result_shares_device_memory():
    a = fm.ones((64,), device="metal")
    v1, v2 = np.asarray(a), np.asarray(a)
    assert np.shares_memory(v1, v2)
    v1[0] = 5.0
    assert a.numpy()[0] == 5.0


def test_mixed_devices_rejected():
    with pytest.raises(ValueError, match="one device"):
        fm.add(fm.ones((3,), device="metal"), fm.ones((3,), device="cpu"))


def test_threads(rng):
    xs = [rng.standard_normal((200, 300)).astype(np.float32) for _ in range(4)]
    results, errors = [None] * 4, []

    def work(i):
        try:
            a = fm.asarray(xs[i], device="metal")
            for _ in range(20):
                r = fm.multiply(fm.tanh(a), 2.0)
            results[i] = r.numpy()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for x, r in zip(xs, results):
        np.testing.assert_allclose(r, 2 * np.tanh(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("forced", ["cpu", "metal"])
def test_fastmetal_device_env(forced):
    import os
    import subprocess
    import sys

    code = "import fastmetal as fm; print(fm.default_device(), ','.join(fm.devices()))"
    env = dict(os.environ, FASTMETAL_DEVICE=forced)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    default, devs = out.stdout.split()
    assert default == forced and devs.split(",")[0] == "metal"
