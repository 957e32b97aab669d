"""conv2d's independent NumPy float64 reference and the random configurations the conv2d
tests share (test_conv2d*.py, test_nn_conv2d.py)."""
from __future__ import annotations

import numpy as np

import fastmetal as fm

F32_EPS = float(np.finfo(np.float32).eps)


# ----------------------------------------------------------------------------- reference
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
    s, d, (pt, pb, pl, pr), Ho, Wo = _geometry(x, w, stride, padding, dilation)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))).reshape(N, G, Cg, H + pt + pb,
                                                                  W + pl + pr)
    wg = w.reshape(G, Co // G, Cg, kH, kW)
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
    s, d, (pt, pb, pl, pr), Ho, Wo = _geometry(x, w, stride, padding, dilation)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))).reshape(N, G, Cg, H + pt + pb,
                                                                  W + pl + pr)
    wg = w.reshape(G, Co // G, Cg, kH, kW)
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
