"""The normalization and softmax kernels (metal/normalization.metal, the CPU fast paths in
csrc/backend/cpu/isa/normalization.cpp) through their private entries _core._layer_norm,
_rms_norm, _group_norm, _batch_norm, their backward passes, _softmax, _softmax_backward and
_logsumexp: against float64 NumPy references over random shapes (size-1 dims, empty batches,
NaN/inf, large magnitudes, float16), on every device, and the MSL kernels under the CPU
emulator at several threadgroup sizes (the GPU code, proven here)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core
from references import msl_kernels_on_cpu

kernels = pytest.fixture(msl_kernels_on_cpu)

# Relative to the scale of the terms (see close()): float32 results in float32 steps,
# float16 results rounded once to half (and reductions of half inputs in float32).
TOL = {np.float32: 2e-5, np.float16: 4e-3}


def host(a):
    return a.numpy() if isinstance(a, fm.Array) else np.asarray(a)


def close(got, want, scale, dtype, what):
    """|got - want| <= tol * scale elementwise (scale: the size of the terms that made
    want), NaN where want is NaN, inf where want is inf."""
    got = host(got).astype(np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    tol = TOL[np.dtype(dtype).type]
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{what}: NaN positions")
    with np.errstate(over="ignore"):  # a float64 value past the dtype's range is its inf
        want_r = want.astype(dtype).astype(np.float64)
    inf = np.isinf(want_r)
    np.testing.assert_array_equal(got[inf], want_r[inf], err_msg=f"{what}: inf")
    ok = ~(nan | inf)
    err = np.abs(got[ok] - want[ok])
    # plus the dtype's subnormal spacing: a result rounded to half below 2**-14 is absolute
    tiny = 2.0 ** -24 if np.dtype(dtype) == np.float16 else 2.0 ** -149
    bound = tol * (np.broadcast_to(scale, want.shape)[ok] + np.abs(want[ok])) + tiny
    assert np.all(err <= bound), (
        f"{what}: max error {err.max() if err.size else 0:.3g}, worst ratio "
        f"{(err / bound).max() if err.size else 0:.3g}")


# ============================================================================ references
def ln_ref(x, nd, w, b, eps, rms):
    x = x.astype(np.float64)
    ax = tuple(range(x.ndim - nd, x.ndim))
    mean = np.zeros(x.shape[:x.ndim - nd] + (1,) * nd) if rms else x.mean(ax, keepdims=True)
    var = (x * x).mean(ax, keepdims=True) if rms else ((x - mean) ** 2).mean(ax, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean) * rstd
    if w is not None:
        y = y * w.astype(np.float64)
    if b is not None:
        y = y + b.astype(np.float64)
    return y, mean, rstd


def ln_backward_ref(g, x, nd, w, eps, rms):
    """dx, dw, db in float64, and the scales of their terms."""
    _, mean, rstd = ln_ref(x, nd, None, None, eps, rms)
    x, g = x.astype(np.float64), g.astype(np.float64)
    ax = tuple(range(x.ndim - nd, x.ndim))
    lead = tuple(range(x.ndim - nd))
    xhat = (x - mean) * rstd
    wg = g * (w.astype(np.float64) if w is not None else 1.0)
    mg = 0.0 if rms else wg.mean(ax, keepdims=True)
    mgx = (wg * xhat).mean(ax, keepdims=True)
    dx = rstd * (wg - mg - xhat * mgx)
    # xhat's float32 error is relative to |x| rstd (x - mean rounds at x's magnitude).
    cond = np.abs(xhat) + np.abs(x) * rstd
    dx_scale = rstd * (np.abs(wg) + np.abs(wg).mean(ax, keepdims=True) * (1 + cond))
    dw, db = (g * xhat).sum(lead), g.sum(lead)
    return dx, dw, db, dx_scale, np.abs(g * cond).sum(lead), np.abs(g).sum(lead)


def gn_ref(x, G, w, b, eps):
    N, C = x.shape[:2]
    xr = x.astype(np.float64).reshape(N, G, C // G * int(np.prod(x.shape[2:])))
    mean = xr.mean(2, keepdims=True)
    rstd = 1.0 / np.sqrt(((xr - mean) ** 2).mean(2, keepdims=True) + eps)
    y = ((xr - mean) * rstd).reshape(x.shape)
    shp = (1, C) + (1,) * (x.ndim - 2)
    if w is not None:
        y = y * w.astype(np.float64).reshape(shp)
    if b is not None:
        y = y + b.astype(np.float64).reshape(shp)
    return y, mean.reshape(N, G), rstd.reshape(N, G)


def gn_backward_ref(g, x, G, w, eps):
    N, C = x.shape[:2]
    _, mean, rstd = gn_ref(x, G, None, None, eps)
    shp = (1, C) + (1,) * (x.ndim - 2)
    wb = w.astype(np.float64).reshape(shp) if w is not None else 1.0
    g64 = g.astype(np.float64)
    per = C // G * int(np.prod(x.shape[2:]))
    wg = (g64 * wb).reshape(N, G, per)
    xhat = (x.astype(np.float64).reshape(N, G, per) - mean[..., None]) * rstd[..., None]
    r = rstd[..., None]
    dx = r * (wg - wg.mean(2, keepdims=True) - xhat * (wg * xhat).mean(2, keepdims=True))
    cond = np.abs(xhat) + np.abs(x.astype(np.float64).reshape(N, G, per)) * r
    scale = r * (np.abs(wg) + np.abs(wg).mean(2, keepdims=True) * (1 + cond))
    red = (0,) + tuple(range(2, x.ndim))
    gx = g64 * xhat.reshape(x.shape)
    return (dx.reshape(x.shape), gx.sum(red), g64.sum(red), scale.reshape(x.shape),
            np.abs(g64 * cond.reshape(x.shape)).sum(red), np.abs(g64).sum(red))


def bn_ref(x, w, b, rm, rv, training, momentum, eps):
    x64 = x.astype(np.float64)
    red = (0,) + tuple(range(2, x.ndim))
    shp = (1, -1) + (1,) * (x.ndim - 2)
    if training:
        mean, var = x64.mean(red), x64.var(red)
        cnt = x64.size // x64.shape[1]
        new_rm = None if rm is None else (1 - momentum) * rm + momentum * mean
        new_rv = None if rv is None else (1 - momentum) * rv + momentum * var * cnt / (cnt - 1)
    else:
        mean, var = rm.astype(np.float64), rv.astype(np.float64)
        new_rm = new_rv = None
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x64 - mean.reshape(shp)) * rstd.reshape(shp)
    if w is not None:
        y = y * w.reshape(shp)
    if b is not None:
        y = y + b.reshape(shp)
    return y, mean, rstd, new_rm, new_rv


def bn_backward_ref(g, x, w, mean, rstd, training):
    red = (0,) + tuple(range(2, x.ndim))
    shp = (1, -1) + (1,) * (x.ndim - 2)
    g64 = g.astype(np.float64)
    xhat = (x.astype(np.float64) - mean.reshape(shp)) * rstd.reshape(shp)
    wr = (w.reshape(shp) if w is not None else 1.0) * rstd.reshape(shp)
    cond = np.abs(xhat) + np.abs(x.astype(np.float64)) * rstd.reshape(shp)
    if training:
        dx = wr * (g64 - g64.mean(red, keepdims=True) - xhat * (g64 * xhat).mean(red, keepdims=True))
        scale = np.abs(wr) * (np.abs(g64) + np.abs(g64).mean(red, keepdims=True) * (1 + cond))
    else:
        dx, scale = wr * g64, np.abs(wr * g64)
    gx = g64 * xhat
    return dx, gx.sum(red), g64.sum(red), scale, np.abs(g64 * cond).sum(red), np.abs(g64).sum(red)


def softmax_ref(x, axis, log):
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        m = x.max(axis, keepdims=True, initial=-np.inf)
        s = np.exp(x - m).sum(axis, keepdims=True)
        return (x - m) - np.log(s) if log else np.exp(x - m) / s


def softmax_backward_ref(g, y, axis, log):
    g, y = g.astype(np.float64), y.astype(np.float64)
    if log:
        return g - np.exp(y) * g.sum(axis, keepdims=True)
    return y * (g - (g * y).sum(axis, keepdims=True))


def logsumexp_ref(x, axis, keepdims):
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
        m = np.where(np.isinf(m), 0.0, m)
        r = m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
    return r if keepdims else np.squeeze(r, axis=axis)


def on(device, *arrays):
    """Arrays as fastmetal.Arrays on `device` (None stays None)."""
    return [None if a is None else fm.asarray(a, device=device) for a in arrays]


# ============================================================================ layer / rms norm
LN_SHAPES = [((4, 8), 1), ((3, 5, 16), 1), ((2, 3, 4), 2), ((1, 1), 1), ((6, 1), 1),
             ((1, 300), 1), ((5, 2, 1, 7), 3), ((0, 12), 1), ((33, 1000), 1)]


def check_layer_norm(x, nd, w, b, eps, rms, device, rng, dtype):
    xa, wa, ba = on(device, x, w, b)
    if rms:
        y, rstd = _core._rms_norm(xa, nd, wa, eps)
        mean = None
    else:
        y, mean, rstd = _core._layer_norm(xa, nd, wa, ba, eps)
    yr, mr, rr = ln_ref(x, nd, w, None if rms else b, eps, rms)
    assert y.dtype == xa.dtype and y.shape == x.shape
    # float32 rounding of x - mean is relative to |x|: the scale of y's error is |x| rstd.
    cond = np.abs(x.astype(np.float64)) * rr + 4.0
    scale = 1.0 + cond * (np.abs(w.astype(np.float64)) if w is not None else 1.0)
    close(y, yr, scale, dtype, "y")
    lead = x.shape[:x.ndim - nd]
    close(rstd, rr.reshape(lead), 0.0, np.float32 if dtype == np.float32 else dtype, "rstd")
    if not rms:
        close(mean, mr.reshape(lead), np.abs(x.astype(np.float64)).max(initial=1.0), dtype, "mean")
    g = rng.standard_normal(x.shape).astype(dtype)
    (ga,) = on(device, g)
    if rms:
        dx, dw = _core._rms_norm_backward(ga, xa, nd, wa, rstd)
        db = None
    else:
        dx, dw, db = _core._layer_norm_backward(ga, xa, nd, wa, mean, rstd)
    dxr, dwr, dbr, sx, sw, sb = ln_backward_ref(g, x, nd, w, eps, rms)
    close(dx, dxr, sx, dtype, "dx")
    close(dw, dwr.reshape(-1), sw.reshape(-1), dtype, "dweight")
    if not rms:
        close(db, dbr.reshape(-1), sb.reshape(-1), dtype, "dbias")
    if w is not None:
        assert dw.dtype == wa.dtype
    only = (_core._rms_norm_backward(ga, xa, nd, wa, rstd, affine=False) if rms else
            _core._layer_norm_backward(ga, xa, nd, wa, mean, rstd, affine=False))
    np.testing.assert_array_equal(host(only), host(dx))


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape,nd", LN_SHAPES)
def test_layer_norm(device, rng, shape, nd, dtype, rms):
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    norm = shape[len(shape) - nd:]
    w = rng.standard_normal(norm).astype(dtype)
    b = rng.standard_normal(norm).astype(dtype)
    for ww, bb in ((w, b), (None, None), (w, None)):
        check_layer_norm(x, nd, ww, bb, 1e-5, rms, device, rng, dtype)


def test_layer_norm_large_offset_and_magnitude(device, rng):
    """Two-pass statistics: a row of 1e4 + noise keeps its variance (sum of squares minus
    the squared sum would lose every digit), and rows of 1e18 or 1e-20 normalise."""
    x = np.stack([1e4 + rng.standard_normal(256), rng.standard_normal(256) * 1e18,
                  rng.standard_normal(256) * 1e-20]).astype(np.float32)
    check_layer_norm(x, 1, None, None, 1e-5, False, device, rng, np.float32)
    y, _ = _core._rms_norm(fm.asarray(x[1:2] * 1e-3, device=device), 1, None, 1e-6)
    close(y, ln_ref(x[1:2] * 1e-3, 1, None, None, 1e-6, True)[0], 4.0, np.float32, "rms 1e15")


def test_layer_norm_nan_inf_stay_in_their_row(device):
    x = np.ones((4, 8), np.float32) * np.arange(8, dtype=np.float32)
    x[1, 3] = np.nan
    x[2, 5] = np.inf
    y, mean, rstd = _core._layer_norm(fm.asarray(x, device=device), 1)
    y = host(y)
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all()
    want = ln_ref(x[[0, 3]], 1, None, None, 1e-5, False)[0]
    close(y[[0, 3]], want, 4.0, np.float32, "finite rows")


def test_rms_norm_eps_and_errors(device, rng):
    x = fm.asarray(rng.standard_normal((3, 4)).astype(np.float32), device=device)
    with pytest.raises(ValueError, match=r"\[fastmetal.layer_norm\] expected weight of 4 elements"):
        _core._layer_norm(x, 1, np.ones(5, np.float32))
    with pytest.raises(ValueError, match=r"\[fastmetal.rms_norm\] expected normalized_shape of 1 to 2"):
        _core._rms_norm(x, 3)
    with pytest.raises(ValueError, match=r"\[fastmetal.layer_norm\] expected eps"):
        _core._layer_norm(x, 1, None, None, -1.0)
    with pytest.raises(ValueError, match=r"grad_output of the input's shape"):
        _core._layer_norm_backward(np.ones((3, 5), np.float32), x, 1, None,
                                   np.zeros(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(TypeError, match=r"\[fastmetal.layer_norm\].*int64"):
        _core._layer_norm(fm.arange(6, device=device).reshape(2, 3), 1)


# ============================================================================ group norm
GN_CASES = [((2, 6, 5), 3), ((3, 4, 2, 3), 2), ((1, 8), 4), ((2, 4, 1, 1), 4), ((0, 4, 3), 2),
            ((2, 3, 7, 9), 1), ((4, 32, 17), 8)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape,G", GN_CASES)
def test_group_norm(device, rng, shape, G, dtype):
    x = (rng.standard_normal(shape) * 2 - 1).astype(dtype)
    C = shape[1]
    w = rng.standard_normal(C).astype(dtype)
    b = rng.standard_normal(C).astype(dtype)
    for ww, bb in ((w, b), (None, None)):
        xa, wa, ba = on(device, x, ww, bb)
        y, mean, rstd = _core._group_norm(xa, G, wa, ba, 1e-5)
        yr, mr, rr = gn_ref(x, G, ww, bb, 1e-5)
        wscale = 1.0 + 4 * (np.abs(ww.astype(np.float64)).reshape((1, C) + (1,) * (x.ndim - 2))
                            if ww is not None else 1.0)
        close(y, yr, wscale, dtype, "y")
        close(rstd, rr, 0.0, dtype, "rstd")
        g = rng.standard_normal(shape).astype(dtype)
        (ga,) = on(device, g)
        dx, dw, db = _core._group_norm_backward(ga, xa, G, wa, mean, rstd)
        dxr, dwr, dbr, sx, sw, sb = gn_backward_ref(g, x, G, ww, 1e-5)
        close(dx, dxr, sx, dtype, "dx")
        close(dw, dwr, sw, dtype, "dweight")
        close(db, dbr, sb, dtype, "dbias")


def test_group_norm_errors(device):
    x = fm.zeros((2, 6, 3), device=device)
    with pytest.raises(ValueError, match=r"\[fastmetal.group_norm\] expected num_groups >= 1 dividing the 6 channels, got 4"):
        _core._group_norm(x, 4)
    with pytest.raises(ValueError, match=r"at least 2 dimensions"):
        _core._group_norm(fm.zeros((6,), device=device), 2)
    with pytest.raises(ValueError, match=r"expected weight of 6 elements"):
        _core._group_norm(x, 3, np.ones(3, np.float32))


# ============================================================================ batch norm
BN_SHAPES = [(8, 3), (5, 3, 4, 4), (2, 4, 17), (1, 2, 3, 3), (64, 5), (3, 2, 40), (4, 1, 1)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batch_norm_training(device, rng, shape, dtype):
    x = (rng.standard_normal(shape) * 2 + 3).astype(dtype)
    C = shape[1]
    w = rng.standard_normal(C).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32)
    rm0 = rng.standard_normal(C).astype(np.float32)
    rv0 = rng.uniform(0.5, 2, C).astype(np.float32)
    for ww, bb in ((w, b), (None, None)):
        # Copies: on the cpu an Array may share the NumPy array's memory, updated in place.
        xa, wa, ba, rm, rv = on(device, x, ww, bb, rm0.copy(), rv0.copy())
        y, mean, rstd = _core._batch_norm(xa, wa, ba, rm, rv, True, 0.1, 1e-5)
        yr, mr, rr, nrm, nrv = bn_ref(x, ww, bb, rm0, rv0, True, 0.1, 1e-5)
        scale = 1.0 + 4 * (np.abs(ww).reshape((1, C) + (1,) * (x.ndim - 2)) if ww is not None else 1)
        close(y, yr, scale, dtype, "y")
        close(mean, mr, np.abs(x.astype(np.float64)).max(), dtype, "save_mean")
        close(rstd, rr, 0.0, dtype, "save_rstd")
        close(rm, nrm, np.abs(rm0) + np.abs(mr), np.float32 if dtype == np.float32 else dtype, "running_mean")
        close(rv, nrv, np.abs(rv0) + 1, np.float32 if dtype == np.float32 else dtype, "running_var")
        g = rng.standard_normal(shape).astype(dtype)
        (ga,) = on(device, g)
        dx, dw, db = _core._batch_norm_backward(ga, xa, wa, mean, rstd, True)
        dxr, dwr, dbr, sx, sw, sb = bn_backward_ref(g, x, ww, mr, rr, True)
        close(dx, dxr, sx, dtype, "dx")
        close(dw, dwr, sw, dtype, "dweight")
        close(db, dbr, sb, dtype, "dbias")


def test_batch_norm_statistics_of_hard_channels(device):
    """The batch statistics against float64 where a one-pass sum of squares would fail:
    a large offset (1e4 + N(0, 1)), an outlier that is the first element a thread reads,
    a tiny spread, and a constant channel; rstd within 1e-4 relative."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((16, 4, 70))
    x[:, 0] += 1e4
    x[0, 1, 0] = 1e3
    x[:, 2] *= 1e-3
    x[:, 3] = 7.25
    x = x.astype(np.float32)
    (xa,) = on(device, x)
    _, mean, rstd = _core._batch_norm(xa, None, None, None, None, True, 0.1, 1e-5)
    x64 = x.astype(np.float64)
    want_mean = x64.mean(axis=(0, 2))
    want_rstd = 1.0 / np.sqrt(x64.var(axis=(0, 2)) + 1e-5)
    np.testing.assert_allclose(host(mean), want_mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(host(rstd), want_rstd, rtol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", BN_SHAPES + [(0, 3, 2)])
def test_batch_norm_eval(device, rng, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    C = shape[1]
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    rm0 = rng.standard_normal(C).astype(np.float32)
    rv0 = rng.uniform(0.5, 2, C).astype(np.float32)
    xa, wa, ba, rm, rv = on(device, x, w, b, rm0.copy(), rv0.copy())
    y, mean, rstd = _core._batch_norm(xa, wa, ba, rm, rv, False, 0.1, 1e-5)
    np.testing.assert_array_equal(host(rm), rm0)  # eval never writes the running statistics
    yr, mr, rr, _, _ = bn_ref(x, w, b, rm0, rv0, False, 0.1, 1e-5)
    close(y, yr, 1.0 + 4 * np.abs(w).reshape((1, C) + (1,) * (x.ndim - 2)), dtype, "y")
    g = rng.standard_normal(shape).astype(dtype)
    (ga,) = on(device, g)
    dx, dw, db = _core._batch_norm_backward(ga, xa, wa, mean, rstd, False)
    dxr, dwr, dbr, sx, sw, sb = bn_backward_ref(g, x, w, mr, rr, False)
    close(dx, dxr, sx, dtype, "dx")
    close(dw, dwr, sw, dtype, "dweight")
    close(db, dbr, sb, dtype, "dbias")


def test_batch_norm_running_stats_in_place(device, rng):
    """float16 and strided running statistics are updated in place too, with the version of
    their storage advanced; without running statistics training still normalises."""
    x = rng.standard_normal((6, 3, 5)).astype(np.float32)
    rm = fm.asarray(np.zeros(3, np.float16), device=device)
    big = fm.asarray(np.ones(6, np.float32), device=device)
    rv = big[::2]
    _core._batch_norm(fm.asarray(x, device=device), None, None, rm, rv, True, 0.5, 1e-5)
    _, mr, _, nrm, nrv = bn_ref(x, None, None, np.zeros(3), np.ones(3), True, 0.5, 1e-5)
    close(rm, nrm, 1.0, np.float16, "float16 running_mean")
    close(rv, nrv, 1.0, np.float32, "strided running_var")
    np.testing.assert_array_equal(host(big)[1::2], 1.0)
    y, _, _ = _core._batch_norm(x, None, None, None, None, True)
    close(y, bn_ref(x, None, None, None, None, True, 0.1, 1e-5)[0], 4.0, np.float32, "y")


def test_batch_norm_errors(device):
    x = fm.zeros((1, 3), device=device)
    rm, rv = fm.zeros(3, device=device), fm.ones(3, device=device)
    with pytest.raises(ValueError, match=r"\[fastmetal.batch_norm\] expected more than 1 value per channel when training"):
        _core._batch_norm(x, None, None, rm, rv, True)
    with pytest.raises(ValueError, match=r"expected running_mean and running_var when training=False"):
        _core._batch_norm(fm.zeros((4, 3), device=device), None, None, None, None, False)
    with pytest.raises(TypeError, match=r"expected running_mean to be a fastmetal.Array"):
        _core._batch_norm(fm.zeros((4, 3), device=device), None, None, np.zeros(3, np.float32),
                          rv, True)
    with pytest.raises(ValueError, match=r"expected running_var of 3 elements"):
        _core._batch_norm(fm.zeros((4, 3), device=device), None, None, rm,
                          fm.ones(4, device=device), True)


# ============================================================================ softmax family
SM_SHAPES = [(4, 7), (3, 5, 6), (2, 1, 9), (1,), (5, 1), (2, 300), (0, 4), (3, 0, 2), (2, 3, 4, 5)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", SM_SHAPES)
def test_softmax_any_axis(device, rng, shape, dtype):
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    xa, ga = on(device, x, g)
    for axis in range(-len(shape), len(shape)):
        for log in (False, True):
            y = _core._softmax(xa, axis, log)
            assert y.dtype == xa.dtype
            want = softmax_ref(x, axis, log)
            close(y, want, 1.0 if log else 0.0, dtype, f"{'log_' if log else ''}softmax {axis}")
            dx = _core._softmax_backward(ga, y, axis, log)
            yv = host(y)
            dr = softmax_backward_ref(g, yv, axis, log)
            ys = np.abs(yv.astype(np.float64))
            scale = (np.abs(g) + (np.abs(g).sum(axis, keepdims=True) * (np.exp(yv.astype(np.float64)) if log else ys))
                     if log else ys * (np.abs(g) + (np.abs(g) * ys).sum(axis, keepdims=True)))
            close(dx, dr, scale, dtype, f"backward {axis} log={log}")


def test_softmax_nan_inf_and_huge_logits(device):
    x = np.array([[1, 2, 3, 4], [1, np.nan, 0, 0], [np.inf, 0, 1, 2], [-np.inf] * 4,
                  [-np.inf, 0, 1, -np.inf], [3e38, -3e38, 1e30, 0]], np.float32)
    xa = fm.asarray(x, device=device)
    for log in (False, True):
        close(_core._softmax(xa, 1, log), softmax_ref(x, 1, log), 1.0, np.float32, f"log={log}")
        close(_core._softmax(fm.asarray(x.T.copy(), device=device), 0, log),
              softmax_ref(x.T, 0, log), 1.0, np.float32, f"columns log={log}")
    close(_core._logsumexp(xa, 1), logsumexp_ref(x, 1, False), 1.0, np.float32, "logsumexp")


LSE_CASES = [((4, 5), None), ((4, 5), 1), ((4, 5), 0), ((2, 3, 4), (0, 2)), ((2, 3, 4), (1, 2)),
             ((2, 3, 4), -1), ((3,), 0), ((), None), ((0, 3), 0), ((0, 3), 1), ((5, 1, 2), (0, 1))]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape,axis", LSE_CASES)
def test_logsumexp(device, rng, shape, axis, dtype, keepdims):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    got = _core._logsumexp(fm.asarray(x, device=device), axis, keepdims)
    want = logsumexp_ref(x, axis, keepdims)
    assert got.dtype == np.dtype(dtype)
    close(got, want, 1.0, dtype, f"logsumexp {axis}")
    if x.size:  # NumPy in, NumPy out (a scalar for a full reduction)
        r = _core._logsumexp(x, axis, keepdims)
        assert not isinstance(r, fm.Array)
        close(r, want, 1.0, dtype, "numpy")


def test_softmax_errors(device):
    x = fm.zeros((2, 3), device=device)
    with pytest.raises(ValueError, match=r"\[fastmetal.softmax\] expected dim in \[-2, 2\)"):
        _core._softmax(x, 2)
    with pytest.raises(ValueError, match=r"\[fastmetal.logsumexp\] expected distinct axes"):
        _core._logsumexp(x, (1, -1))
    with pytest.raises(TypeError, match=r"\[fastmetal.logsumexp\] expected axis"):
        _core._logsumexp(x, 1.5)
    with pytest.raises(ValueError, match=r"\[fastmetal.log_softmax_backward\] expected grad_output"):
        _core._softmax_backward(fm.zeros((3, 2), device=device), x, 1, True)


# ============================================================================ MSL kernels
KERNEL_NAMES = ["row_norm_forward", "row_norm_backward", "norm_affine_partial",
                "batch_norm_forward", "batch_norm_backward", "softmax_rows", "softmax_cols",
                "softmax_backward_rows", "softmax_backward_cols"]


def test_kernels_are_built():
    for name in KERNEL_NAMES:
        for dt in ("float32", "float16"):
            assert _core._has_kernel("cpu", f"{name}_{dt}"), name
    assert _core._has_kernel("cpu", "norm_affine_finish")


@pytest.mark.parametrize("threads,seed", [(1, 1), (7, 2), (32, 3), (45, 4), (64, 5), (256, 6)])
def test_msl_kernels_under_the_emulator(kernels, threads, seed):
    """The GPU code itself: every kernel under the CPU's fiber emulator, partial simdgroups
    and groups smaller or larger than a row included, against the same references."""
    _core._set_kernel_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    rng = np.random.default_rng(seed)
    for dtype in (np.float32, np.float16):
        for shape, nd in (((3, 70), 1), ((2, 3, 5), 2), ((0, 4), 1), ((2, 1), 1), ((150, 5), 1)):
            x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
            w = rng.standard_normal(shape[len(shape) - nd:]).astype(dtype)
            b = rng.standard_normal(shape[len(shape) - nd:]).astype(dtype)
            for rms in (False, True):
                check_layer_norm(x, nd, w, b, 1e-5, rms, "cpu", rng, dtype)
        test_group_norm("cpu", rng, (2, 6, 5), 3, dtype)
        test_group_norm("cpu", rng, (3, 4, 2, 3), 2, dtype)
        for shape in ((9, 3), (2, 3, 20), (1, 2, 3, 3), (5, 2, 41)):
            test_batch_norm_training("cpu", rng, shape, dtype)
            test_batch_norm_eval("cpu", rng, shape, dtype)
        for shape in ((4, 37), (3, 5, 6), (2, 1, 9)):
            test_softmax_any_axis("cpu", rng, shape, dtype)
        for shape, axis in (((4, 37), None), ((2, 3, 4), (0, 2)), ((0, 3), 1)):
            test_logsumexp("cpu", rng, shape, axis, dtype, False)
    test_softmax_nan_inf_and_huge_logits("cpu")
    test_layer_norm_nan_inf_stay_in_their_row("cpu")
    test_batch_norm_statistics_of_hard_channels("cpu")


def test_msl_kernels_match_the_fast_path(kernels):
    """The two CPU roads (MSL kernels, C++ fast path) agree to float32 rounding."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 10, 33)).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    w = rng.standard_normal(33).astype(np.float32)
    outs = {}
    for native in (False, True):
        _core._set_native_cpu(native)
        y, m, r = _core._layer_norm(x, 1, w, None)
        gi = _core._layer_norm_backward(g, x, 1, w, m, r)
        s = _core._softmax(x, 1)
        outs[native] = [y, *gi, s, _core._softmax_backward(g, s, 1)]
    for a, b in zip(outs[False], outs[True]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# ============================================================================ determinism
def test_bits_do_not_depend_on_the_thread_count():
    """Affine gradients and statistics are summed in an order fixed by the shape: the same
    bits on 1, 2 and 3 threads (and from run to run)."""
    code = (
        "import hashlib, numpy as np, fastmetal as fm\n"
        "from fastmetal import _core\n"
        "fm.set_default_device('cpu')\n"
        "r = np.random.default_rng(3)\n"
        "x = r.standard_normal((512, 256)).astype(np.float32)\n"
        "g = r.standard_normal((512, 256)).astype(np.float32)\n"
        "w = r.standard_normal(256).astype(np.float32)\n"
        "xi = r.standard_normal((16, 32, 24, 24)).astype(np.float32)\n"
        "gi = r.standard_normal(xi.shape).astype(np.float32)\n"
        "y, m, s = _core._layer_norm(x, 1, w, w)\n"
        "outs = [y, m, s, *_core._layer_norm_backward(g, x, 1, w, m, s)]\n"
        "y, m, s = _core._group_norm(xi, 8, w[:32], w[:32])\n"
        "outs += [y, m, s, *_core._group_norm_backward(gi, xi, 8, w[:32], m, s)]\n"
        "y, m, s = _core._batch_norm(xi, w[:32], w[:32], None, None, True)\n"
        "outs += [y, m, s, *_core._batch_norm_backward(gi, xi, w[:32], m, s, True)]\n"
        "xb = r.standard_normal((4096, 64)).astype(np.float32)\n"
        "y, m, s = _core._batch_norm(xb, None, None, None, None, True)\n"
        "outs += [y, m, s, *_core._batch_norm_backward(xb, xb, None, m, s, True)]\n"
        "outs += [_core._softmax(x, 1), _core._softmax(xi, 1, True), _core._logsumexp(xi, (0, 2))]\n"
        "print(hashlib.sha256(b''.join(np.ascontiguousarray(o).tobytes() for o in outs)).hexdigest())\n")
    digests = set()
    for threads in (1, 2, 3, 2):
        env = dict(os.environ, FASTMETAL_NUM_THREADS=str(threads))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        digests.add(r.stdout.split()[-1])
    assert len(digests) == 1, digests

