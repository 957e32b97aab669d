"""conv_transpose2d (the private _core._conv_transpose2d / _conv_transpose2d_backward, run on
conv2d's engine) against NumPy float64 references written from the definition: every input
pixel scatters its weighted kernel into the output (stride apart, dilated taps), the result
is cropped by `padding` and extended by `output_padding`. On every device; on the cpu both
through the CPU conv engine and through the MSL kernels (under the fiber emulator)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core

from references import msl_conv_kernels_on_cpu

kernel_path = pytest.fixture(msl_conv_kernels_on_cpu)

try:
    import torch
except ImportError:  # the NumPy references still run
    torch = None


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def host(a):
    return a.numpy() if isinstance(a, fm.Array) else np.asarray(a)


# ----------------------------------------------------------------------------- references
def _frame(x, w, stride, padding, output_padding, dilation):
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = map(_pair, (stride, padding, output_padding,
                                                          dilation))
    H, W = x.shape[-2:]
    kH, kW = w.shape[-2:]
    Ho = (H - 1) * sh - 2 * ph + dh * (kH - 1) + oph + 1
    Wo = (W - 1) * sw - 2 * pw + dw * (kW - 1) + opw + 1
    # The uncropped scatter target, tall enough for the crop [ph, ph + Ho).
    Hf = max((H - 1) * sh + dh * (kH - 1) + 1, ph + Ho)
    Wf = max((W - 1) * sw + dw * (kW - 1) + 1, pw + Wo)
    return (sh, sw), (ph, pw), (dh, dw), (Ho, Wo), (Hf, Wf)


def ref_conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1,
                         dilation=1):
    """y[n, co, ih*sh + kh*dh - ph, iw*sw + kw*dw - pw] += x[n, ci, ih, iw] * w[ci, co', kh, kw]
    for the co of ci's group, in float64."""
    unbatched = x.ndim == 3
    x = np.asarray(x, np.float64)[None] if unbatched else np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    (sh, sw), (ph, pw), (dh, dw), (Ho, Wo), (Hf, Wf) = _frame(x, w, stride, padding,
                                                              output_padding, dilation)
    N, Cin, H, W = x.shape
    cog, kH, kW = w.shape[1:]
    cig = Cin // groups
    full = np.zeros((N, cog * groups, Hf, Wf))
    for n in range(N):
        for ci in range(Cin):
            g = ci // cig
            for ih in range(H):
                for iw in range(W):
                    for kh in range(kH):
                        for kw in range(kW):
                            full[n, g * cog:(g + 1) * cog, ih * sh + kh * dh, iw * sw + kw * dw] \
                                += x[n, ci, ih, iw] * w[ci, :, kh, kw]
    y = full[:, :, ph:ph + Ho, pw:pw + Wo]
    if b is not None:
        y = y + np.asarray(b, np.float64)[None, :, None, None]
    return y[0] if unbatched else y


def ref_conv_transpose2d_backward(gy, x, w, stride=1, padding=0, output_padding=0, groups=1,
                                  dilation=1):
    """Gradients of ref_conv_transpose2d: each product x * w above read back from gy."""
    unbatched = x.ndim == 3
    x = np.asarray(x, np.float64)[None] if unbatched else np.asarray(x, np.float64)
    gy = np.asarray(gy, np.float64)[None] if unbatched else np.asarray(gy, np.float64)
    w = np.asarray(w, np.float64)
    (sh, sw), (ph, pw), (dh, dw), (Ho, Wo), (Hf, Wf) = _frame(x, w, stride, padding,
                                                              output_padding, dilation)
    N, Cin, H, W = x.shape
    cog, kH, kW = w.shape[1:]
    cig = Cin // groups
    full = np.zeros((N, cog * groups, Hf, Wf))
    full[:, :, ph:ph + Ho, pw:pw + Wo] = gy
    gx = np.zeros_like(x)
    gw = np.zeros_like(w)
    for ci in range(Cin):
        g = ci // cig
        for kh in range(kH):
            for kw in range(kW):
                # (N, cog, H, W): the output pixels input (ih, iw) reaches through tap (kh, kw)
                taps = full[:, g * cog:(g + 1) * cog,
                            kh * dh:kh * dh + (H - 1) * sh + 1:sh,
                            kw * dw:kw * dw + (W - 1) * sw + 1:sw]
                gx[:, ci] += np.einsum("nchw,c->nhw", taps, w[ci, :, kh, kw])
                gw[ci, :, kh, kw] = np.einsum("nchw,nhw->c", taps, x[:, ci])
    gb = gy.sum(axis=(0, 2, 3))
    return (gx[0] if unbatched else gx), gw, gb


def check(got, want, scale, what):
    """|got - want| <= 1e-4 * scale + 1e-6, scale = the computation on absolute values."""
    got = host(got)
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = np.abs(got.astype(np.float64) - want)
    bad = err > 1e-4 * scale + 1e-6
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} off, worst {err.max():.3g}"


def run_case(x, w, b, kw, needs=("input", "weight", "bias"), seed=0):
    y = _core._conv_transpose2d(x, w, b, **kw)
    check(y, ref_conv_transpose2d(x, w, b, **kw),
          ref_conv_transpose2d(np.abs(x), np.abs(w), None if b is None else np.abs(b), **kw),
          f"forward {kw}")
    gy = np.random.default_rng(seed).standard_normal(host(y).shape).astype(np.float32)
    gx, gw, gb = _core._conv_transpose2d_backward(gy, x, w, needs=needs, **kw)
    rx, rw, rb = ref_conv_transpose2d_backward(gy, x, w, **kw)
    sx, sw, sb = ref_conv_transpose2d_backward(np.abs(gy), np.abs(x), np.abs(w), **kw)
    for name, got, want, scale in (("input", gx, rx, sx), ("weight", gw, rw, sw),
                                   ("bias", gb, rb, sb)):
        if name in needs:
            check(got, want, scale, f"grad {name} {kw}")
        else:
            assert got is None


def random_case(r, small=True):
    groups = int(r.choice([1, 1, 2, 3]))
    cig, cog = int(r.integers(1, 4)), int(r.integers(1, 4))
    kH, kW = int(r.integers(1, 4)), int(r.integers(1, 4))
    sh, sw = int(r.integers(1, 4)), int(r.integers(1, 4))
    dh, dw = int(r.integers(1, 3)), int(r.integers(1, 3))
    ph, pw = int(r.integers(0, 3)), int(r.integers(0, 3))
    oph = int(r.integers(0, max(sh, dh)))
    opw = int(r.integers(0, max(sw, dw)))
    N = int(r.integers(0, 3))
    H, W = int(r.integers(1, 6)), int(r.integers(1, 6))
    kw = dict(stride=(sh, sw), padding=(ph, pw), output_padding=(oph, opw), groups=groups,
              dilation=(dh, dw))
    Ho = (H - 1) * sh - 2 * ph + dh * (kH - 1) + oph + 1
    Wo = (W - 1) * sw - 2 * pw + dw * (kW - 1) + opw + 1
    if Ho < 1 or Wo < 1:
        kw["padding"] = (0, 0)
    x = r.standard_normal((N, cig * groups, H, W)).astype(np.float32)
    w = r.standard_normal((cig * groups, cog, kH, kW)).astype(np.float32)
    b = r.standard_normal(cog * groups).astype(np.float32) if r.random() < 0.6 else None
    return x, w, b, kw


# ----------------------------------------------------------------------------- every device
@pytest.mark.parametrize("seed", range(24))
def test_random_shapes(device, seed):
    x, w, b, kw = random_case(np.random.default_rng(seed))
    run_case(x, w, b, kw, seed=seed)


CASES = [
    # DCGAN-like: 4x4 kernels, stride 2, padding 1 (doubles the size)
    ((2, 8, 4, 4), (8, 6, 4, 4), dict(stride=2, padding=1)),
    # output_padding < stride
    ((1, 3, 5, 4), (3, 2, 3, 3), dict(stride=(2, 3), padding=1, output_padding=(1, 2))),
    # output_padding >= stride but < dilation (allowed by PyTorch)
    ((2, 2, 4, 5), (2, 3, 2, 3), dict(stride=1, dilation=(2, 3), output_padding=(1, 2))),
    # groups, dilation and padding together; padding larger than the dilated kernel extent
    ((1, 6, 6, 6), (6, 2, 3, 2), dict(stride=2, padding=(3, 2), groups=3, dilation=(1, 2))),
    # depthwise (one input channel a group)
    ((2, 4, 5, 5), (4, 1, 3, 3), dict(stride=2, padding=1, output_padding=1, groups=4)),
    # size-1 everything
    ((1, 1, 1, 1), (1, 1, 1, 1), dict()),
    ((3, 1, 1, 7), (1, 5, 1, 3), dict(stride=(1, 2))),
    # wide GEMM shapes (the engines' tiled paths: more than 4 channels a group each way)
    ((2, 40, 6, 7), (40, 36, 3, 3), dict(stride=1, padding=1)),
    ((2, 33, 5, 5), (33, 20, 4, 4), dict(stride=2, padding=1, output_padding=1)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_cases(device, case):
    xs, ws, kw = CASES[case]
    r = np.random.default_rng(case)
    x = r.standard_normal(xs).astype(np.float32)
    w = r.standard_normal(ws).astype(np.float32)
    b = r.standard_normal(ws[1] * kw.get("groups", 1)).astype(np.float32)
    run_case(x, w, b, kw, seed=case)
    run_case(x, w, None, kw, needs=("weight",), seed=case)
    run_case(x, w, None, kw, needs="input", seed=case)


def test_unbatched_and_empty_batch(device):
    r = np.random.default_rng(7)
    w = r.standard_normal((3, 4, 3, 3)).astype(np.float32)
    b = r.standard_normal(4).astype(np.float32)
    x = r.standard_normal((3, 5, 4)).astype(np.float32)
    kw = dict(stride=2, padding=1, output_padding=1)
    run_case(x, w, b, kw)
    assert host(_core._conv_transpose2d(x, w, b, **kw)).shape == (4, 10, 8)
    e = np.zeros((0, 3, 5, 4), np.float32)
    y = _core._conv_transpose2d(e, w, b, **kw)
    assert host(y).shape == (0, 4, 10, 8)
    gx, gw, gb = _core._conv_transpose2d_backward(np.zeros((0, 4, 10, 8), np.float32), e, w,
                                                  **kw)
    assert host(gx).shape == (0, 3, 5, 4)
    assert (host(gw) == 0).all() and host(gw).shape == w.shape
    assert (host(gb) == 0).all() and host(gb).shape == (4,)


def test_float16_and_arrays(device):
    r = np.random.default_rng(11)
    x = r.standard_normal((2, 4, 3, 3)).astype(np.float16)
    w = r.standard_normal((4, 2, 3, 3)).astype(np.float16)
    kw = dict(stride=2, padding=1, output_padding=1, groups=2)
    y = _core._conv_transpose2d(fm.asarray(x), fm.asarray(w), None, **kw)
    assert isinstance(y, fm.Array) and y.dtype == np.float32 and y.device == device
    want = ref_conv_transpose2d(x.astype(np.float32), w.astype(np.float32), **kw)
    check(y, want, ref_conv_transpose2d(np.abs(x.astype(np.float32)),
                                        np.abs(w.astype(np.float32)), **kw), "float16")


def test_non_finite_values_propagate(device):
    x = np.ones((1, 1, 3, 3), np.float32)
    x[0, 0, 1, 1] = np.nan
    x[0, 0, 0, 0] = np.inf
    w = np.ones((1, 1, 2, 2), np.float32)
    y = host(_core._conv_transpose2d(x, w, stride=2))
    want = ref_conv_transpose2d(x, w, stride=2)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(y[fin], want[fin])


@pytest.mark.parametrize("kw,arg", [
    (dict(stride=2, output_padding=2), "output_padding"),      # >= stride and >= dilation
    (dict(stride=1, dilation=1, output_padding=1), "output_padding"),
    (dict(output_padding=-1), "output_padding"),
    (dict(stride=0), "stride"),
    (dict(dilation=(1, 0)), "dilation"),
    (dict(padding=-1), "padding"),
    (dict(groups=0), "groups"),
    (dict(groups=3), "groups"),                                 # 4 input channels
    (dict(padding=5), "output size"),                           # negative output
])
def test_bad_hyper_parameters(device, kw, arg):
    x = np.zeros((1, 4, 3, 3), np.float32)
    w = np.zeros((4, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match=rf"\[fastmetal.conv_transpose2d\] expected .*{arg}"):
        _core._conv_transpose2d(x, w, None, **kw)


def test_bad_shapes_and_types(device):
    x = np.zeros((1, 4, 3, 3), np.float32)
    w = np.zeros((4, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"conv_transpose2d\] expected an input with "
                                         r"weight.shape\[0\] = 5 channels, got 4"):
        _core._conv_transpose2d(x, np.zeros((5, 2, 3, 3), np.float32))
    with pytest.raises(ValueError, match=r"expected a bias of shape \(C_out,\) = \(2,\)"):
        _core._conv_transpose2d(x, w, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"expected a 4-D input"):
        _core._conv_transpose2d(np.zeros((4, 3), np.float32), w)
    with pytest.raises(ValueError, match=r"expected a 4-D weight"):
        _core._conv_transpose2d(x, np.zeros((4, 2, 3), np.float32))
    with pytest.raises(TypeError, match=r"expected padding to be a non-negative int"):
        _core._conv_transpose2d(x, w, padding="same")
    with pytest.raises(TypeError, match=r"expected output_padding to be a non-negative int"):
        _core._conv_transpose2d(x, w, output_padding=1.5)
    with pytest.raises(ValueError, match=r"conv_transpose2d_backward\] expected grad_output of "
                                         r"shape \(1, 2, 5, 5\)"):
        _core._conv_transpose2d_backward(np.zeros((1, 2, 4, 4), np.float32), x, w)
    with pytest.raises(ValueError, match=r"expected needs entries"):
        _core._conv_transpose2d_backward(np.zeros((1, 2, 5, 5), np.float32), x, w,
                                         needs=("inputs",))


# ----------------------------------------------------------------------------- MSL kernels
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("threads", [0, 37])
@pytest.mark.cpu_only
def test_msl_kernels_under_the_emulator(kernel_path, case, threads):
    """The same cases through conv2d's MSL kernels (GEMM tiles, direct kernels, reductions)."""
    _core._set_conv_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(case + 1)
    xs, ws, kw = CASES[case]
    r = np.random.default_rng(50 + case)
    x = r.standard_normal(xs).astype(np.float32)
    w = r.standard_normal(ws).astype(np.float32)
    b = r.standard_normal(ws[1] * kw.get("groups", 1)).astype(np.float32)
    run_case(x, w, b, kw, seed=case)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.cpu_only
def test_msl_kernels_random(kernel_path, seed):
    x, w, b, kw = random_case(np.random.default_rng(1000 + seed))
    run_case(x, w, b, kw, seed=seed)


# ----------------------------------------------------------------------------- PyTorch
@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("seed", range(6))
def test_against_torch(device, seed):
    x, w, b, kw = random_case(np.random.default_rng(300 + seed))
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    tb = None if b is None else torch.tensor(b, dtype=torch.float64, requires_grad=True)
    ty = torch.nn.functional.conv_transpose2d(tx, tw, tb, **kw)
    y = host(_core._conv_transpose2d(x, w, b, **kw))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    gy = np.random.default_rng(seed).standard_normal(y.shape).astype(np.float32)
    ty.backward(torch.tensor(gy, dtype=torch.float64))
    gx, gw, gb = _core._conv_transpose2d_backward(gy, x, w, **kw)
    np.testing.assert_allclose(host(gx), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(host(gw), tw.grad.numpy(), rtol=1e-4, atol=1e-4)
    if tb is not None:
        np.testing.assert_allclose(host(gb), tb.grad.numpy(), rtol=1e-4, atol=1e-4)
