"""The independent references every test holds fastmetal to (NumPy, float64), and the checks
built on them, in one place: elementwise ops, conv2d (PyTorch's semantics and the CPU
engine's explicit output geometry), finite-difference stencils, Fourier series, and the
tolerances that differ by device."""
from __future__ import annotations

import math
import os

import numpy as np

import fastmetal as fm
from fastmetal import _core

F32_EPS = float(np.finfo(np.float32).eps)
F16_EPS = float(np.finfo(np.float16).eps)
F64_EPS = float(np.finfo(np.float64).eps)


# ============================================================================ tolerances
# Elementwise results against the float64 reference rounded to the result dtype, in units
# of that dtype's epsilon. Every device runs the same metal/fm_math.h helpers and computes
# float16 ops in float32 with one final rounding, so the bounds are the same everywhere
# (measured: cuda on an H100 passes them; nvcc's a*b+c -> FMA contraction stays inside).
# A device that needs more (e.g. Metal with fast-math intrinsics) gets its own row here,
# with the reason, and every elementwise test picks it up through elementwise_rtol().
# float64 (cpu and cuda; Apple GPUs have none) is computed in double by the C++ library's
# functions (cpu) or CUDA's (within 1-5 ulp by its documentation), against NumPy's own
# float64 functions (a few ulp): 32 eps (7e-15) leaves room for both. Ops whose reference or
# algorithm is worse conditioned widen it in the test (test_elementwise.py: F64_OP_RTOL).
ELEMENTWISE_RTOL = {
    "cpu": {np.float32: 8 * F32_EPS, np.float16: 2 * F16_EPS, np.float64: 32 * F64_EPS},
    "metal": {np.float32: 8 * F32_EPS, np.float16: 2 * F16_EPS},
    "cuda": {np.float32: 8 * F32_EPS, np.float16: 2 * F16_EPS, np.float64: 32 * F64_EPS},
}


def elementwise_rtol(device, dtype):
    """The relative tolerance of elementwise results of `dtype` on `device` (see above)."""
    return ELEMENTWISE_RTOL[device][np.dtype(dtype).type]


# ============================================================================ elementwise
def gelu_reference(x):
    """Exact GELU in float64: x/2 * erfc(-x/sqrt2), without scipy."""
    x = np.asarray(x, dtype=np.float64)
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    return 0.5 * x * erfc(-x / math.sqrt(2.0)) if x.size else x.copy()


def gelu_grad_reference(x):
    """GELU's derivative in float64: Phi(x) + x phi(x)."""
    x = np.asarray(x, dtype=np.float64)
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    if not x.size:
        return x.copy()
    with np.errstate(all="ignore"):
        return 0.5 * erfc(-x / math.sqrt(2.0)) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def numpy_reference(spec, *args):
    """Evaluate an op table's NumPy reference in float64 (args are float64 arrays)."""
    scope = {"np": np, "gelu_reference": gelu_reference, "gelu_grad_reference": gelu_grad_reference}
    scope.update(zip(("x", "y"), args))
    with np.errstate(all="ignore"):
        return np.asarray(eval(spec.numpy, scope), dtype=np.float64)


# ============================================================================ conv2d
F32_EPS = float(np.finfo(np.float32).eps)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def ref_pads(padding, k, dilation):
    """((top, bottom), (left, right)) as PyTorch resolves them."""
    if padding == "valid":
        return ((0, 0), (0, 0))
    if padding == "same":
        out = []
        for kk, d in zip(k, dilation):
            total = d * (kk - 1)
            out.append((total // 2, total - total // 2))
        return tuple(out)
    p = _pair(padding)
    return ((p[0], p[0]), (p[1], p[1]))


def _geometry(x, w, stride, padding, dilation):
    s, d = _pair(stride), _pair(dilation)
    (pt, pb), (pl, pr) = ref_pads(padding, w.shape[2:], d)
    H, W = x.shape[2:]
    kH, kW = w.shape[2:]
    Ho = (H + pt + pb - d[0] * (kH - 1) - 1) // s[0] + 1
    Wo = (W + pl + pr - d[1] * (kW - 1) - 1) // s[1] + 1
    return s, d, (pt, pb, pl, pr), Ho, Wo


def _tap(i, j, s, d, Ho, Wo):
    """Slices of the padded input read by kernel tap (i, j) for every output pixel."""
    return (slice(i * d[0], i * d[0] + s[0] * (Ho - 1) + 1, s[0]),
            slice(j * d[1], j * d[1] + s[1] * (Wo - 1) + 1, s[1]))


def _grouped(x, w, stride, padding, dilation, groups):
    """The padded input as (N, G, C/G, Hp, Wp), the weight as (G, C_out/G, C/G, kH, kW), the
    geometry (s, d, pads, Ho, Wo) of _geometry."""
    N, C, H, W = x.shape
    Co, Cg, kH, kW = w.shape
    geometry = _geometry(x, w, stride, padding, dilation)
    pt, pb, pl, pr = geometry[2]
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))).reshape(N, groups, Cg, H + pt + pb,
                                                                  W + pl + pr)
    return xp, w.reshape(groups, Co // groups, Cg, kH, kW), geometry


def ref_conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """float64 conv2d built from padded, strided views (one einsum per kernel tap)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    unbatched = x.ndim == 3
    if unbatched:
        x = x[None]
    N, C, H, W = x.shape
    Co, Cg, kH, kW = w.shape
    G = groups
    xp, wg, (s, d, (pt, pb, pl, pr), Ho, Wo) = _grouped(x, w, stride, padding, dilation, groups)
    out = np.zeros((N, G, Co // G, Ho, Wo))
    for i in range(kH):
        for j in range(kW):
            sh, sw = _tap(i, j, s, d, Ho, Wo)
            out += np.einsum("ngchw,goc->ngohw", xp[..., sh, sw], wg[..., i, j])
    out = out.reshape(N, Co, Ho, Wo)
    if b is not None:
        out += np.asarray(b, np.float64)[None, :, None, None]
    return out[0] if unbatched else out


def ref_conv2d_backward(gy, x, w, stride=1, padding=0, dilation=1, groups=1):
    """float64 (grad_input, grad_weight, grad_bias): the adjoints of ref_conv2d's taps."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    gy = np.asarray(gy, np.float64)
    unbatched = x.ndim == 3
    if unbatched:
        x, gy = x[None], gy[None]
    N, C, H, W = x.shape
    Co, Cg, kH, kW = w.shape
    G = groups
    xp, wg, (s, d, (pt, pb, pl, pr), Ho, Wo) = _grouped(x, w, stride, padding, dilation, groups)
    gyg = gy.reshape(N, G, Co // G, Ho, Wo)
    gxp = np.zeros_like(xp)
    gw = np.zeros_like(wg)
    for i in range(kH):
        for j in range(kW):
            sh, sw = _tap(i, j, s, d, Ho, Wo)
            gxp[..., sh, sw] += np.einsum("ngohw,goc->ngchw", gyg, wg[..., i, j])
            gw[..., i, j] = np.einsum("ngohw,ngchw->goc", gyg, xp[..., sh, sw])
    gx = gxp.reshape(N, C, H + pt + pb, W + pl + pr)[:, :, pt:pt + H, pl:pl + W]
    gb = gy.sum(axis=(0, 2, 3))
    return (gx[0] if unbatched else gx), gw.reshape(w.shape), gb


def assert_close(got, want, scale, what):
    """|got - want| <= 1e-4 * scale + 1e-6 elementwise, where `scale` is the same
    computation on absolute values (float32 rounding of a K-term sum is <= K * eps * scale;
    K stays below ~1000 here, so 1e-4 is a bound, while any indexing bug is O(scale))."""
    got = np.asarray(got)
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = np.abs(got.astype(np.float64) - want)
    bound = 1e-4 * scale + 1e-6
    bad = err > bound
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} elements off, worst "
                           f"{err.max():.3g} (bound there {bound.flat[np.argmax(err - bound)]:.3g})")


def check_conv2d_against_torch(x, w, b, kw, r):
    """fastmetal's conv2d and conv2d_backward of one problem against torch autograd in
    float64 (a random output gradient from `r`), each within the bound scaled by the
    convolution of absolute values (assert_close)."""
    import warnings

    import torch
    if b is None:
        b = np.zeros(w.shape[0], np.float32)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 'same' with even kernels warns about a copy
        yt = torch.nn.functional.conv2d(xt, wt, bt, **kw)
    gy = r.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.tensor(gy, dtype=torch.float64))
    gx, gw, gb = fm.conv2d_backward(gy, x, w, **kw)
    sx, sw, sb = ref_conv2d_backward(np.abs(gy), np.abs(x), np.abs(w), **kw)
    assert_close(fm.conv2d(x, w, b, **kw), yt.detach().numpy(),
                 ref_conv2d(np.abs(x), np.abs(w), np.abs(b), **kw), "torch forward")
    assert_close(gx, xt.grad.numpy(), sx, "torch grad_input")
    assert_close(gw, wt.grad.numpy(), sw, "torch grad_weight")
    assert_close(gb, bt.grad.numpy(), sb, "torch grad_bias")


# ----------------------------------------------------------------------------- configurations
def random_config(r, small=False):
    """A random conv2d problem: (input shape, weight shape, has bias, kwargs)."""
    kind = r.choice(["dense", "dense", "grouped", "depthwise", "multiplier"])
    cmax = 6 if small else 12
    if kind == "dense":
        G = 1
        cin_g, cout_g = int(r.integers(1, cmax)), int(r.integers(1, 2 * cmax))
    elif kind == "grouped":
        G = int(r.integers(2, 4))
        cin_g, cout_g = int(r.integers(1, 5)), int(r.integers(1, 9))
    elif kind == "depthwise":
        G = int(r.integers(2, 7))
        cin_g, cout_g = 1, 1
    else:  # depthwise with a channel multiplier
        G = int(r.integers(2, 5))
        cin_g, cout_g = 1, int(r.integers(2, 4))
    kH, kW = int(r.integers(1, 5)), int(r.integers(1, 5))
    stride = (int(r.integers(1, 4)), int(r.integers(1, 4)))
    dilation = (int(r.integers(1, 3)), int(r.integers(1, 3)))
    pmode = r.choice(["int", "pair", "valid", "same"])
    if pmode == "same":
        stride = (1, 1)
        padding = "same"
    elif pmode == "valid":
        padding = "valid"
    elif pmode == "int":
        padding = int(r.integers(0, 3))
    else:
        padding = (int(r.integers(0, 3)), int(r.integers(0, 3)))
    pads = ref_pads(padding, (kH, kW), dilation)
    # Input at least as large as the dilated kernel after padding.
    H = max(int(r.integers(1, 10 if small else 16)), dilation[0] * (kH - 1) + 1 - sum(pads[0]), 1)
    W = max(int(r.integers(1, 10 if small else 16)), dilation[1] * (kW - 1) + 1 - sum(pads[1]), 1)
    N = int(r.integers(0 if r.random() < 0.05 else 1, 3 if small else 4))
    unbatched = r.random() < 0.15
    xshape = (G * cin_g, H, W) if unbatched else (N, G * cin_g, H, W)
    wshape = (G * cout_g, cin_g, kH, kW)
    kw = dict(stride=stride if r.random() < 0.7 else stride[0] if stride[0] == stride[1] else stride,
              padding=padding, dilation=dilation, groups=G)
    return xshape, wshape, bool(r.random() < 0.7), kw


def make_problem(seed, small=False):
    r = np.random.default_rng(seed)
    xshape, wshape, has_bias, kw = random_config(r, small)
    x = r.standard_normal(xshape).astype(np.float32)
    w = r.standard_normal(wshape).astype(np.float32)
    b = r.standard_normal(wshape[0]).astype(np.float32) if has_bias else None
    return x, w, b, kw, r


def check_forward(x, w, b, kw):
    y = fm.conv2d(x, w, b, **kw)
    want = ref_conv2d(x, w, b, **kw)
    scale = ref_conv2d(np.abs(x), np.abs(w), None if b is None else np.abs(b), **kw)
    assert_close(y, want, scale, f"forward {x.shape} {w.shape} {kw}")
    return y


def check_backward(x, w, kw, r, needs=("input", "weight", "bias")):
    ys = ref_conv2d(x, w, None, **kw).shape
    gy = r.standard_normal(ys).astype(np.float32)
    gx, gw, gb = fm.conv2d_backward(gy, x, w, needs=needs, **kw)
    wx, ww, wb = ref_conv2d_backward(gy, x, w, **kw)
    sx, sw, sb = ref_conv2d_backward(np.abs(gy), np.abs(x), np.abs(w), **kw)
    where = f"{x.shape} {w.shape} {kw}"
    for name, got, want, scale in (("input", gx, wx, sx), ("weight", gw, ww, sw),
                                   ("bias", gb, wb, sb)):
        if name in needs:
            assert_close(got, want, scale, f"grad_{name} {where}")
        else:
            assert got is None


# ---------------------------------------------------------------- explicit output geometry
# The CPU engine's private entry points take (stride, top/left padding, dilation, H_out,
# W_out): the bottom/right padding is whatever H_out/W_out need (Conv2dArgs semantics).
# An independent formulation (patch tensors, not ref_conv2d's per-tap views).
def _explicit_patches(x, kH, kW, sh, sw, ph, pw, dh, dw, Ho, Wo):
    """x (N, C, H, W) -> (N, C, kH, kW, Ho, Wo): the input value each tap reads (0 in padding).
    The bottom/right padding is whatever Ho/Wo need (Conv2dArgs semantics)."""
    N, C, H, W = x.shape
    need_h = (Ho - 1) * sh + (kH - 1) * dh + 1
    need_w = (Wo - 1) * sw + (kW - 1) * dw + 1
    xp = np.zeros((N, C, max(need_h, ph + H), max(need_w, pw + W)))
    xp[:, :, ph:ph + H, pw:pw + W] = x
    out = np.empty((N, C, kH, kW, Ho, Wo))
    for kh in range(kH):
        for kw in range(kW):
            out[:, :, kh, kw] = xp[:, :, kh * dh: kh * dh + (Ho - 1) * sh + 1: sh,
                                   kw * dw: kw * dw + (Wo - 1) * sw + 1: sw]
    return out


def ref_conv2d_explicit(x, w, b, g, cfg):
    kH, kW = w.shape[2:]
    p = _explicit_patches(x.astype(np.float64), kH, kW, *cfg)
    N, C = x.shape[:2]
    Co, Cg = w.shape[:2]
    p = p.reshape(N, g, Cg, kH, kW, *p.shape[-2:])
    wg = w.astype(np.float64).reshape(g, Co // g, Cg, kH, kW)
    y = np.einsum("ngcijhw,gocij->ngohw", p, wg).reshape(N, Co, *p.shape[-2:])
    if b is not None:
        y += b[None, :, None, None]
    return y


def ref_conv2d_explicit_backward_input(gy, w, H, W, g, cfg):
    """Scatter of gy through the taps: the adjoint of _patches, computed independently."""
    sh, sw, ph, pw, dh, dw, Ho, Wo = cfg
    N, Co = gy.shape[:2]
    _, Cg, kH, kW = w.shape
    wg = w.astype(np.float64).reshape(g, Co // g, Cg, kH, kW)
    gyg = gy.astype(np.float64).reshape(N, g, Co // g, Ho, Wo)
    cols = np.einsum("ngohw,gocij->ngcijhw", gyg, wg).reshape(N, g * Cg, kH, kW, Ho, Wo)
    big_h = max((Ho - 1) * sh + (kH - 1) * dh + 1, ph + H)
    big_w = max((Wo - 1) * sw + (kW - 1) * dw + 1, pw + W)
    gxp = np.zeros((N, g * Cg, big_h, big_w))
    for kh in range(kH):
        for kw in range(kW):
            gxp[:, :, kh * dh: kh * dh + (Ho - 1) * sh + 1: sh,
                kw * dw: kw * dw + (Wo - 1) * sw + 1: sw] += cols[:, :, kh, kw]
    return gxp[:, :, ph:ph + H, pw:pw + W]


def ref_conv2d_explicit_backward_weight(gy, x, kH, kW, g, cfg):
    p = _explicit_patches(x.astype(np.float64), kH, kW, *cfg)
    N, C = x.shape[:2]
    Co = gy.shape[1]
    p = p.reshape(N, g, C // g, kH, kW, *p.shape[-2:])
    gyg = gy.astype(np.float64).reshape(N, g, Co // g, *gy.shape[2:])
    return np.einsum("ngohw,ngcijhw->gocij", gyg, p).reshape(Co, C // g, kH, kW)



# ============================================================================ derivative
def derivative_reference(v64, dx, order, accuracy, axis):
    """float64 application of fastmetal's exact stencil rows (edges one-sided), row by row."""
    from fastmetal.ops import numerics as fnum
    rows, half, _, _ = fnum._derivative_stencils(order, accuracy)
    ref = np.empty_like(v64)
    m = np.moveaxis(v64, axis, -1)
    r = np.moveaxis(ref, axis, -1)
    n = m.shape[-1]
    for i in range(n):
        row = i if i < half else (half if i < n - half else 2 * half + 1 - (n - i))
        off, w = rows[row]
        r[..., i] = sum(float(wt) * m[..., i + off + t] for t, wt in enumerate(w))
    return ref / dx**order


# ============================================================================ Fourier series
def fourier_series_reference(x, a, b, period, m=0, chunk=2000):
    """float64 reference: direct evaluation of the m-th derivative, in chunks."""
    x = np.asarray(x, np.float64).ravel()
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    K = len(a) - 1
    w = 2 * np.pi / period
    k = np.arange(1, K + 1, dtype=np.float64)
    out = np.full(x.shape, a[0] / 2 if m == 0 else 0.0)
    # d^m/dx^m cos(t) = cos(t + m pi/2), sin(t) likewise; (kw)^m chain factor
    for i in range(0, len(x), chunk):
        ph = np.outer(x[i:i + chunk], k * w) + m * np.pi / 2
        out[i:i + chunk] += (np.cos(ph) @ (a[1:] * (k * w) ** m)
                             + np.sin(ph) @ (b[1:] * (k * w) ** m))
    return out


def fourier_series_numpy32(x, a, b, period, chunk=2000):
    """NumPy float32 evaluating the same formula (the baseline to beat)."""
    x = np.asarray(x, np.float32).ravel()
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    K = len(a) - 1
    kw = np.arange(1, K + 1, dtype=np.float32) * np.float32(2 * np.pi / period)
    out = np.empty(x.shape, np.float32)
    for i in range(0, len(x), chunk):
        ph = np.outer(x[i:i + chunk], kw)
        out[i:i + chunk] = np.cos(ph) @ a32[1:] + np.sin(ph) @ b32[1:] + a32[0] / np.float32(2)
    return out


# ============================================================================ portable kernels
def _portable_kernels(path, set_path, portable, group, set_group):
    saved_path, saved_group = path(), group()
    saved_seed = os.environ.get("FASTMETAL_EMULATOR_SEED")
    set_path(portable)
    yield
    set_path(saved_path)
    set_group(saved_group)
    if saved_seed is None:
        os.environ.pop("FASTMETAL_EMULATOR_SEED", None)
    else:
        os.environ["FASTMETAL_EMULATOR_SEED"] = saved_seed


def msl_kernels_on_cpu():
    """Fixture body (``kernels = pytest.fixture(msl_kernels_on_cpu)``): the test runs the
    reductions' and matmul's MSL kernels on the CPU (under the fiber emulator, the oracle of
    the GPU kernels) instead of the CPU's own algorithms, and may set the threadgroup size
    and FASTMETAL_EMULATOR_SEED; all three are restored afterwards."""
    yield from _portable_kernels(_core._native_cpu, _core._set_native_cpu, False,
                                 _core._kernel_group_size, _core._set_kernel_group_size)


def msl_conv_kernels_on_cpu():
    """The same for conv2d: its MSL kernels instead of the CPU conv engine, the conv
    threadgroup size and the emulator seed restored afterwards."""
    yield from _portable_kernels(_core._cpu_conv_path, _core._set_cpu_conv_path, "kernels",
                                 _core._conv_group_size, _core._set_conv_group_size)
