"""avg_pool2d, adaptive_avg_pool2d and nearest interpolation (metal/pooling.metal, the private
_core._avg_pool2d, ... entries) and their backward kernels on every device, against NumPy
float64 references written from PyTorch's definitions (and, where installed, PyTorch)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core

try:
    import torch
except ImportError:  # the NumPy references still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def host(a):
    return a.numpy() if isinstance(a, fm.Array) else np.asarray(a)


def close(got, want, what, rtol=2e-6, atol=1e-6):
    got = host(got)
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


# ----------------------------------------------------------------------------- references
def avg_ref(x, k, s, p):
    """Zero-padded windows, divided by kh * kw (count_include_pad, floor mode)."""
    (kh, kw), (sh, sw), (ph, pw) = k, s, p
    *lead, h, w = x.shape
    xp = np.zeros((*lead, h + 2 * ph, w + 2 * pw))
    xp[..., ph:ph + h, pw:pw + w] = x
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out = np.zeros((*lead, oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[..., i, j] = xp[..., i * sh:i * sh + kh, j * sw:j * sw + kw].sum(axis=(-1, -2))
    return out / (kh * kw)


def avg_backward_ref(g, shape, k, s, p):
    (kh, kw), (sh, sw), (ph, pw) = k, s, p
    *lead, h, w = shape
    gp = np.zeros((*lead, h + 2 * ph, w + 2 * pw))
    g = np.asarray(g, np.float64)
    for i in range(g.shape[-2]):
        for j in range(g.shape[-1]):
            gp[..., i * sh:i * sh + kh, j * sw:j * sw + kw] += g[..., i, j, None, None] / (kh * kw)
    return gp[..., ph:ph + h, pw:pw + w]


def windows(n_in, n_out):
    """PyTorch's adaptive windows: [floor(i * in / out), ceil((i + 1) * in / out))."""
    return [(i * n_in // n_out, -(-(i + 1) * n_in // n_out)) for i in range(n_out)]


def adaptive_ref(x, oh, ow):
    *lead, h, w = x.shape
    out = np.zeros((*lead, oh, ow))
    for i, (a, b) in enumerate(windows(h, oh)):
        for j, (c, d) in enumerate(windows(w, ow)):
            out[..., i, j] = x[..., a:b, c:d].mean(axis=(-1, -2))
    return out


def adaptive_backward_ref(g, shape, oh, ow):
    *lead, h, w = shape
    gi = np.zeros(shape)
    g = np.asarray(g, np.float64)
    for i, (a, b) in enumerate(windows(h, oh)):
        for j, (c, d) in enumerate(windows(w, ow)):
            gi[..., a:b, c:d] += g[..., i, j, None, None] / ((b - a) * (d - c))
    return gi


def nearest_index(n_in, n_out, scale_factor=None):
    """PyTorch's upsample_nearest source index: same size i, twice the size i // 2, else
    min(floor(i * scale), in - 1) in float32 (scale = 1 / scale_factor or in / out)."""
    if n_out == n_in:
        return np.arange(n_out)
    if n_out == 2 * n_in:
        return np.arange(n_out) // 2
    scale = np.float32(1.0 / scale_factor) if scale_factor else np.float32(n_in) / np.float32(n_out)
    src = np.floor(np.arange(n_out, dtype=np.float32) * scale).astype(np.int64)
    return np.minimum(src, n_in - 1)


def nearest_ref(x, oh, ow, sh=None, sw=None):
    iy, ix = nearest_index(x.shape[-2], oh, sh), nearest_index(x.shape[-1], ow, sw)
    return np.asarray(x, np.float64)[..., iy[:, None], ix[None, :]]


def nearest_backward_ref(g, shape, sh=None, sw=None):
    *lead, h, w = shape
    g = np.asarray(g, np.float64)
    iy = nearest_index(h, g.shape[-2], sh)
    ix = nearest_index(w, g.shape[-1], sw)
    gi = np.zeros((int(np.prod(lead, dtype=np.int64)), h, w))
    flat = g.reshape(-1, g.shape[-2], g.shape[-1])
    for i in range(g.shape[-2]):
        for j in range(g.shape[-1]):
            gi[:, iy[i], ix[j]] += flat[:, i, j]
    return gi.reshape(shape)


# ----------------------------------------------------------------------------- avg_pool2d
AVG_CASES = [
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0)),
    ((1, 2, 7, 9), (3, 3), (2, 2), (1, 1)),
    ((2, 1, 5, 6), (3, 2), (1, 3), (1, 1)),     # overlapping rows, gaps between columns
    ((3, 4, 4), (4, 4), (1, 1), (2, 2)),        # unbatched, padding = kernel / 2
    ((1, 1, 1, 1), (1, 1), (1, 1), (0, 0)),
    ((0, 3, 5, 5), (2, 2), (2, 2), (0, 0)),     # empty batch
    ((2, 2, 11, 3), (5, 1), (3, 1), (2, 0)),
]


@pytest.mark.parametrize("case", range(len(AVG_CASES)))
def test_avg_pool2d(device, case):
    shape, k, s, p = AVG_CASES[case]
    r = np.random.default_rng(case)
    x = r.standard_normal(shape).astype(np.float32)
    y = _core._avg_pool2d(x, *k, *s, *p)
    close(y, avg_ref(x.astype(np.float64), k, s, p), f"forward {case}")
    g = r.standard_normal(host(y).shape).astype(np.float32)
    gi = _core._avg_pool2d_backward(g, shape[-2], shape[-1], *k, *s, *p)
    close(gi, avg_backward_ref(g, shape, k, s, p), f"backward {case}")


@pytest.mark.parametrize("seed", range(12))
def test_avg_pool2d_random(device, seed):
    r = np.random.default_rng(100 + seed)
    kh, kw = int(r.integers(1, 5)), int(r.integers(1, 5))
    k, s = (kh, kw), (int(r.integers(1, 4)), int(r.integers(1, 4)))
    p = (int(r.integers(0, kh // 2 + 1)), int(r.integers(0, kw // 2 + 1)))
    shape = (int(r.integers(1, 3)), int(r.integers(1, 4)), int(r.integers(kh, 12)),
             int(r.integers(kw, 12)))
    x = (r.standard_normal(shape) * 10 ** r.uniform(-3, 3)).astype(np.float32)
    y = _core._avg_pool2d(fm.asarray(x), *k, *s, *p)
    assert isinstance(y, fm.Array) and y.device == device
    close(y, avg_ref(x.astype(np.float64), k, s, p), "forward", atol=1e-6 * np.abs(x).max())
    g = r.standard_normal(y.shape).astype(np.float32)
    gi = _core._avg_pool2d_backward(fm.asarray(g), shape[-2], shape[-1], *k, *s, *p)
    close(gi, avg_backward_ref(g, shape, k, s, p), "backward")


def test_avg_pool2d_float16_and_non_finite(device):
    x = np.arange(32, dtype=np.float16).reshape(1, 2, 4, 4)
    y = _core._avg_pool2d(x, 2, 2, 2, 2, 0, 0)
    close(y, avg_ref(x.astype(np.float64), (2, 2), (2, 2), (0, 0)), "float16")
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 0, 0], x[0, 0, 3, 3] = np.nan, np.inf
    y = host(_core._avg_pool2d(x, 2, 2, 2, 2, 0, 0))
    assert np.isnan(y[0, 0, 0, 0]) and y[0, 0, 1, 1] == np.inf and y[0, 0, 0, 1] == 0


def test_avg_pool2d_bad_input(device):
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match=r"\[fastmetal.avg_pool2d\] expected padding"):
        _core._avg_pool2d(x, 2, 2, 1, 1, 2, 0)
    with pytest.raises(ValueError, match=r"\[fastmetal.avg_pool2d\] expected kernel_size"):
        _core._avg_pool2d(x, 0, 2, 1, 1, 0, 0)
    with pytest.raises(ValueError, match=r"\[fastmetal.avg_pool2d\] expected stride"):
        _core._avg_pool2d(x, 2, 2, 0, 1, 0, 0)
    with pytest.raises(ValueError, match=r"expected the padded input \(4 x 4\) to be at least"):
        _core._avg_pool2d(x, 5, 2, 1, 1, 0, 0)
    with pytest.raises(ValueError, match=r"expected input to be 3-D"):
        _core._avg_pool2d(np.zeros((4, 4), np.float32), 2, 2, 1, 1, 0, 0)
    with pytest.raises(ValueError, match=r"avg_pool2d_backward\] expected grad_output of shape "
                                         r"\(1, 1, 2, 2\)"):
        _core._avg_pool2d_backward(np.zeros((1, 1, 3, 2), np.float32), 4, 4, 2, 2, 2, 2, 0, 0)


# ----------------------------------------------------------------------------- adaptive
ADAPTIVE_CASES = [
    ((2, 3, 8, 8), (1, 1)),      # global average
    ((1, 2, 7, 10), (3, 4)),     # uneven, overlapping windows
    ((2, 1, 5, 6), (5, 6)),      # identity
    ((1, 2, 3, 4), (7, 9)),      # more outputs than inputs
    ((3, 5, 13), (4, 5)),        # unbatched
    ((0, 2, 4, 4), (2, 2)),      # empty batch
    ((1, 1, 1, 1), (3, 1)),
]


@pytest.mark.parametrize("case", range(len(ADAPTIVE_CASES)))
def test_adaptive_avg_pool2d(device, case):
    shape, (oh, ow) = ADAPTIVE_CASES[case]
    r = np.random.default_rng(case)
    x = r.standard_normal(shape).astype(np.float32)
    y = _core._adaptive_avg_pool2d(x, oh, ow)
    close(y, adaptive_ref(x.astype(np.float64), oh, ow), f"forward {case}")
    g = r.standard_normal(host(y).shape).astype(np.float32)
    gi = _core._adaptive_avg_pool2d_backward(g, shape[-2], shape[-1])
    close(gi, adaptive_backward_ref(g, shape, oh, ow), f"backward {case}")


@pytest.mark.parametrize("seed", range(12))
def test_adaptive_random(device, seed):
    r = np.random.default_rng(200 + seed)
    shape = (int(r.integers(1, 3)), int(r.integers(1, 4)), int(r.integers(1, 15)),
             int(r.integers(1, 15)))
    oh, ow = int(r.integers(1, 15)), int(r.integers(1, 15))
    x = r.standard_normal(shape).astype(np.float32)
    y = _core._adaptive_avg_pool2d(x, oh, ow)
    close(y, adaptive_ref(x.astype(np.float64), oh, ow), "forward")
    g = r.standard_normal(host(y).shape).astype(np.float32)
    close(_core._adaptive_avg_pool2d_backward(g, shape[-2], shape[-1]),
          adaptive_backward_ref(g, shape, oh, ow), "backward")


def test_adaptive_bad_input(device):
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match=r"\[fastmetal.adaptive_avg_pool2d\] expected "
                                         r"output_size of at least 1 x 1"):
        _core._adaptive_avg_pool2d(x, 0, 2)
    with pytest.raises(ValueError, match=r"expected an input of at least 1 x 1"):
        _core._adaptive_avg_pool2d(np.zeros((1, 1, 0, 4), np.float32), 2, 2)
    with pytest.raises(ValueError, match=r"adaptive_avg_pool2d_backward\] expected an input "
                                         r"size of at least"):
        _core._adaptive_avg_pool2d_backward(x, 0, 3)


# ----------------------------------------------------------------------------- nearest
NEAREST_CASES = [
    ((2, 3, 4, 5), (8, 10), None, None),     # twice: i >> 1
    ((1, 2, 6, 6), (3, 2), None, None),      # down
    ((1, 2, 5, 7), (5, 7), None, None),      # same size
    ((2, 1, 3, 5), (7, 11), None, None),     # uneven up
    ((1, 1, 5, 5), (10, 10), 2.1, 2.1),      # twice the size from a scale 2.1: i >> 1
    ((1, 2, 7, 3), (10, 4), 1.5, 1.5),       # scale 1 / 1.5 (floor(7 * 1.5) = 10)
    ((3, 4, 9), (1, 13), 0.3, 1.5),          # unbatched
    ((0, 2, 3, 3), (6, 6), None, None),      # empty batch
    ((1, 1, 1, 1), (3, 5), None, None),
]


@pytest.mark.parametrize("case", range(len(NEAREST_CASES)))
def test_interpolate_nearest(device, case):
    shape, (oh, ow), sh, sw = NEAREST_CASES[case]
    r = np.random.default_rng(case)
    x = r.standard_normal(shape).astype(np.float32)
    y = _core._interpolate_nearest(x, oh, ow, sh or 0.0, sw or 0.0)
    close(y, nearest_ref(x, oh, ow, sh, sw), f"forward {case}", rtol=0, atol=0)
    g = r.standard_normal(host(y).shape).astype(np.float32)
    gi = _core._interpolate_nearest_backward(g, shape[-2], shape[-1], sh or 0.0, sw or 0.0)
    close(gi, nearest_backward_ref(g, shape, sh, sw), f"backward {case}")


@pytest.mark.parametrize("seed", range(12))
def test_nearest_random(device, seed):
    r = np.random.default_rng(300 + seed)
    shape = (int(r.integers(1, 3)), int(r.integers(1, 3)), int(r.integers(1, 12)),
             int(r.integers(1, 12)))
    if seed % 2:
        sh, sw = float(r.uniform(0.2, 3.5)), float(r.uniform(0.2, 3.5))
        oh, ow = max(1, math.floor(shape[-2] * sh)), max(1, math.floor(shape[-1] * sw))
    else:
        sh = sw = None
        oh, ow = int(r.integers(1, 25)), int(r.integers(1, 25))
    x = r.standard_normal(shape).astype(np.float32)
    y = _core._interpolate_nearest(x, oh, ow, sh or 0.0, sw or 0.0)
    close(y, nearest_ref(x, oh, ow, sh, sw), "forward", rtol=0, atol=0)
    g = r.standard_normal(host(y).shape).astype(np.float32)
    close(_core._interpolate_nearest_backward(g, shape[-2], shape[-1], sh or 0.0, sw or 0.0),
          nearest_backward_ref(g, shape, sh, sw), "backward")


def test_nearest_bad_input(device):
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match=r"\[fastmetal.interpolate\] expected an output size"):
        _core._interpolate_nearest(x, 0, 2, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"\[fastmetal.interpolate\] expected a finite "
                                         r"non-negative scale"):
        _core._interpolate_nearest(x, 2, 2, -1.0, 0.0)
    with pytest.raises(ValueError, match=r"expected input to be 3-D"):
        _core._interpolate_nearest(np.zeros(4, np.float32), 2, 2, 0.0, 0.0)


# ----------------------------------------------------------------------------- PyTorch
@needs_torch
@pytest.mark.parametrize("seed", range(6))
def test_against_torch(device, seed):
    F = torch.nn.functional
    r = np.random.default_rng(400 + seed)
    x = r.standard_normal((2, 3, int(r.integers(4, 12)), int(r.integers(4, 12)))).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    h, w = x.shape[-2:]
    checks = [
        (lambda t: F.avg_pool2d(t, 3, 2, 1), lambda a: _core._avg_pool2d(a, 3, 3, 2, 2, 1, 1),
         lambda g: _core._avg_pool2d_backward(g, h, w, 3, 3, 2, 2, 1, 1)),
        (lambda t: F.adaptive_avg_pool2d(t, (3, 5)), lambda a: _core._adaptive_avg_pool2d(a, 3, 5),
         lambda g: _core._adaptive_avg_pool2d_backward(g, h, w)),
        (lambda t: F.interpolate(t, size=(2 * h + 1, w + 3), mode="nearest"),
         lambda a: _core._interpolate_nearest(a, 2 * h + 1, w + 3, 0.0, 0.0),
         lambda g: _core._interpolate_nearest_backward(g, h, w, 0.0, 0.0)),
        (lambda t: F.interpolate(t, scale_factor=1.7, mode="nearest"),
         lambda a: _core._interpolate_nearest(a, math.floor(h * 1.7), math.floor(w * 1.7), 1.7, 1.7),
         lambda g: _core._interpolate_nearest_backward(g, h, w, 1.7, 1.7)),
    ]
    for tf, fwd, bwd in checks:
        tx.grad = None
        ty = tf(tx)
        y = host(fwd(x))
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-6, atol=1e-6)
        g = r.standard_normal(y.shape).astype(np.float32)
        ty.backward(torch.tensor(g))
        np.testing.assert_allclose(host(bwd(g)), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


# ------------------------------------------- avg_pool2d's options, (bi)linear interpolation
F_ = fm.nn.functional


def avg_options_ref(x, k, s, p, ceil_mode, count_include_pad, divisor_override):
    """PyTorch's avg_pool2d (aten/src/ATen/native/cpu/AvgPoolKernel.cpp) in float64 loops."""
    *lead, h, w = x.shape

    def out_size(n, k, s, p):
        o = (n + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
        return o - 1 if ceil_mode and (o - 1) * s >= n + p else o
    oh, ow = out_size(h, k, s, p), out_size(w, k, s, p)
    out = np.zeros((*lead, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * s - p, j * s - p
            he, we = min(hs + k, h + p), min(ws + k, w + p)
            pool = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            div = divisor_override or (pool if count_include_pad else (he - hs) * (we - ws))
            out[..., i, j] = x[..., hs:he, ws:we].sum(axis=(-2, -1)) / div
    return out


def linear_ref(x, axis, n_out, scale_factor, align_corners):
    """PyTorch's linear interpolation along one axis in float64 loops (the source index as
    area_pixel_compute_source_index gives it)."""
    n_in = x.shape[axis]
    if n_in == n_out:  # PyTorch copies an axis whose size stays, whatever the scale
        return x
    xs = np.moveaxis(x, axis, -1)
    out = np.zeros((*xs.shape[:-1], n_out))
    for i in range(n_out):
        if align_corners:
            src = i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            scale = 1.0 / scale_factor if scale_factor else n_in / n_out
            src = max((i + 0.5) * scale - 0.5, 0.0)
        i0 = min(int(src), n_in - 1)
        i1 = i0 + 1 if i0 < n_in - 1 else i0
        lam = src - i0
        out[..., i] = (1 - lam) * xs[..., i0] + lam * xs[..., i1]
    return np.moveaxis(out, -1, axis)


AVG_OPTION_CASES = [  # (shape, k, s, p, ceil_mode, count_include_pad, divisor_override)
    ((2, 3, 7, 9), 3, 2, 1, True, True, None),
    ((2, 3, 7, 9), 3, 2, 1, False, False, None),
    ((2, 3, 7, 9), 3, 2, 1, True, False, None),
    ((1, 2, 5, 5), 2, 2, 0, True, True, None),     # a last window past the input
    ((1, 2, 6, 4), 3, 3, 1, True, False, None),
    ((3, 6, 6), 2, 1, 1, False, True, 3),          # 3-D input, divisor_override
    ((1, 1, 1, 1), 1, 1, 0, True, False, None),    # size-1
    ((2, 1, 4, 4), 4, 4, 2, True, False, 5),
]


@pytest.mark.parametrize("case", range(len(AVG_OPTION_CASES)))
def test_avg_pool2d_options_against_float64(device, case):
    shape, k, s, p, ceil, cip, div = AVG_OPTION_CASES[case]
    r = np.random.default_rng(case)
    x = r.standard_normal(shape).astype(np.float32)
    xa = fm.asarray(x, device=device).requires_grad_()
    y = F_.avg_pool2d(xa, k, s, p, ceil_mode=ceil, count_include_pad=cip,
                      divisor_override=div)
    want = avg_options_ref(x.astype(np.float64), k, s, p, ceil, cip, div)
    close(y, want, f"avg_pool2d case {case}", rtol=1e-5, atol=1e-6)
    # A linear map: the gradient is its adjoint, <f(x), g> = <x, f^T(g)>.
    g = r.standard_normal(want.shape).astype(np.float32)
    (y * fm.asarray(g, device=device)).sum().backward()
    lhs = float((want * g).sum())
    rhs = float((x.astype(np.float64) * host(xa.grad)).sum())
    assert abs(lhs - rhs) <= 1e-5 * (1 + abs(lhs)), (lhs, rhs)
    layer = fm.nn.AvgPool2d(k, s, p, ceil_mode=ceil, count_include_pad=cip, divisor_override=div)
    close(layer(fm.asarray(x, device=device)), want, "AvgPool2d", rtol=1e-5, atol=1e-6)


INTERP_CASES = [  # (shape, size, scale_factor, mode, align_corners)
    ((2, 3, 5, 7), (9, 4), None, "bilinear", False),
    ((2, 3, 5, 7), (9, 4), None, "bilinear", True),
    ((1, 2, 4, 6), None, 2, "bilinear", False),
    ((1, 2, 4, 6), None, (1.7, 0.6), "bilinear", False),
    ((1, 2, 4, 6), None, 2.5, "bilinear", True),
    ((1, 2, 3, 6), None, 1.3, "bilinear", False),     # the height keeps its size
    ((1, 1, 1, 3), (4, 1), None, "bilinear", True),   # size-1 in and out
    ((2, 3, 7), 12, None, "linear", False),
    ((2, 3, 7), None, 0.5, "linear", True),
]


@pytest.mark.parametrize("case", range(len(INTERP_CASES)))
def test_interpolate_linear_modes_against_float64(device, case):
    shape, size, sf, mode, ac = INTERP_CASES[case]
    r = np.random.default_rng(50 + case)
    x = r.standard_normal(shape).astype(np.float32)
    xa = fm.asarray(x, device=device).requires_grad_()
    y = F_.interpolate(xa, size=size, scale_factor=sf, mode=mode, align_corners=ac)
    spatial = shape[2:]
    sizes = ((size,) * len(spatial) if isinstance(size, int) else size) if size is not None \
        else tuple(math.floor(n * f) for n, f in
                   zip(spatial, sf if isinstance(sf, tuple) else (sf,) * len(spatial)))
    sfs = (None,) * len(spatial) if sf is None else \
        (sf if isinstance(sf, tuple) else (sf,) * len(spatial))
    want = x.astype(np.float64)
    for ax, (n_out, f) in enumerate(zip(sizes, sfs)):
        want = linear_ref(want, 2 + ax, n_out, f, ac)
    close(y, want, f"interpolate case {case}", rtol=1e-5, atol=2e-6)
    g = r.standard_normal(want.shape).astype(np.float32)
    (y * fm.asarray(g, device=device)).sum().backward()
    lhs = float((want * g).sum())
    rhs = float((x.astype(np.float64) * host(xa.grad)).sum())
    assert abs(lhs - rhs) <= 1e-5 * (1 + abs(lhs)), (lhs, rhs)
    if mode == "bilinear":
        up = fm.nn.Upsample(size=size, scale_factor=sf, mode=mode, align_corners=ac)
        close(up(fm.asarray(x, device=device)), want, "Upsample", rtol=1e-5, atol=2e-6)


def test_pooling_options_bad_input():
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(TypeError, match=r"\[fastmetal.avg_pool2d\] expected ceil_mode"):
        F_.avg_pool2d(x, 2, ceil_mode="yes")
    with pytest.raises(ValueError, match=r"\[fastmetal.avg_pool2d\] expected divisor_override"):
        F_.avg_pool2d(x, 2, divisor_override=0)
    with pytest.raises(ValueError, match=r"\[fastmetal.avg_pool2d\] expected padding"):
        F_.avg_pool2d(x, 2, padding=2, ceil_mode=True)
    with pytest.raises(ValueError, match=r"\[fastmetal.interpolate\] expected mode"):
        F_.interpolate(x, scale_factor=2, mode="bicubic")
    with pytest.raises(ValueError, match=r"\[fastmetal.interpolate\] expected a 4-D input "
                                         r"for mode='bilinear'"):
        F_.interpolate(x[0], scale_factor=2, mode="bilinear")
    with pytest.raises(ValueError, match=r"\[fastmetal.interpolate\] expected align_corners=None"):
        F_.interpolate(x, scale_factor=2, align_corners=True)
    with pytest.raises(TypeError, match=r"\[fastmetal.interpolate\] expected align_corners"):
        F_.interpolate(x, scale_factor=2, mode="bilinear", align_corners=1)
    with pytest.raises(ValueError, match=r"\[fastmetal.nn.Upsample\] expected mode"):
        fm.nn.Upsample(scale_factor=2, mode="area")
    with pytest.raises(TypeError, match=r"\[fastmetal.nn.AvgPool2d\] expected count_include_pad"):
        fm.nn.AvgPool2d(2, count_include_pad=None)


@needs_torch
@pytest.mark.parametrize("seed", range(4))
def test_pooling_options_and_bilinear_against_torch(device, seed):
    Ft = torch.nn.functional
    r = np.random.default_rng(700 + seed)
    x = r.standard_normal((2, 3, int(r.integers(3, 11)), int(r.integers(3, 11)))).astype(np.float32)
    h, w = x.shape[-2:]
    cases = [
        lambda F, t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        lambda F, t: F.avg_pool2d(t, 2, 3, 1, ceil_mode=True),
        lambda F, t: F.avg_pool2d(t, (3, 2), (1, 2), (1, 0), count_include_pad=False),
        lambda F, t: F.avg_pool2d(t, 2, 2, 1, divisor_override=3),
        lambda F, t: F.interpolate(t, size=(2 * h - 1, w + 3), mode="bilinear",
                                   align_corners=False),
        lambda F, t: F.interpolate(t, size=(h // 2 + 1, 3 * w), mode="bilinear",
                                   align_corners=True),
        lambda F, t: F.interpolate(t, scale_factor=1.3, mode="bilinear"),
    ]
    for i, f in enumerate(cases):
        tx = torch.tensor(x, requires_grad=True)
        ty = f(Ft, tx)
        xa = fm.asarray(x, device=device).requires_grad_()
        y = f(F_, xa)
        np.testing.assert_allclose(host(y), ty.detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"case {i}")
        g = r.standard_normal(tuple(ty.shape)).astype(np.float32)
        ty.backward(torch.tensor(g))
        (y * fm.asarray(g, device=device)).sum().backward()
        np.testing.assert_allclose(host(xa.grad), tx.grad.numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=f"case {i} gradient")
