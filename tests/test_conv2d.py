"""conv2d, conv2d_backward and nn.Conv2d against an independent NumPy float64 reference.

Two implementations are checked: the cpu backend's fast CPU algorithms (the default) and
the MSL kernels of metal/conv2d.metal, run on the CPU through the generated entries (the
GEMM and reduction kernels under the fiber emulator, in random thread orders and with
threadgroup sizes that do not divide the tiles) -- the oracle for the Metal kernels.
"""
from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core

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


@pytest.fixture
def kernel_path():
    """Run conv2d through the MSL kernels (emulated on the CPU) inside the test."""
    saved_path, saved_group = _core._cpu_conv_path(), _core._conv_group_size()
    saved_seed = os.environ.get("FASTMETAL_EMULATOR_SEED")
    _core._set_cpu_conv_path("kernels")
    yield
    _core._set_cpu_conv_path(saved_path)
    _core._set_conv_group_size(saved_group)
    if saved_seed is None:
        os.environ.pop("FASTMETAL_EMULATOR_SEED", None)
    else:
        os.environ["FASTMETAL_EMULATOR_SEED"] = saved_seed


# ----------------------------------------------------------------------------- fast CPU path
@pytest.mark.parametrize("seed", range(40))
def test_forward_and_backward_random_configs(seed):
    x, w, b, kw, r = make_problem(1000 + seed)
    check_forward(x, w, b, kw)
    check_backward(x, w, kw, r)


@pytest.mark.parametrize("kw", [
    dict(padding="same"), dict(padding="same", dilation=2), dict(padding="same", dilation=(1, 3)),
    dict(padding="valid"), dict(stride=2, padding=1), dict(stride=(1, 3), padding=(2, 0)),
    dict(dilation=(2, 1), padding=(0, 1)),
])
@pytest.mark.parametrize("k", [(2, 4), (3, 3), (4, 1)])
def test_padding_modes_with_even_and_odd_kernels(kw, k):
    r = np.random.default_rng(hash((str(kw), k)) % 2**32)
    x = r.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = r.standard_normal((5, 3, *k)).astype(np.float32)
    b = r.standard_normal(5).astype(np.float32)
    y = check_forward(x, w, b, kw)
    if kw.get("padding") == "same":
        assert y.shape == (2, 5, 9, 8)
    check_backward(x, w, kw, r)


def test_layer_shapes_of_the_benchmarks():
    r = np.random.default_rng(7)
    for xshape, wshape, kw in [((4, 1, 28, 28), (32, 1, 3, 3), {}),
                               ((2, 32, 26, 26), (64, 32, 3, 3), {}),
                               ((1, 64, 20, 20), (64, 64, 3, 3), dict(padding=1))]:
        x = r.standard_normal(xshape).astype(np.float32)
        w = r.standard_normal(wshape).astype(np.float32)
        b = r.standard_normal(wshape[0]).astype(np.float32)
        check_forward(x, w, b, kw)
        check_backward(x, w, kw, r)


def test_unbatched_input_gives_unbatched_output():
    r = np.random.default_rng(3)
    x = r.standard_normal((4, 7, 6)).astype(np.float32)
    w = r.standard_normal((6, 2, 3, 2)).astype(np.float32)
    b = r.standard_normal(6).astype(np.float32)
    y = check_forward(x, w, b, dict(groups=2, padding=(1, 0)))
    assert y.shape == (6, 7, 5)
    np.testing.assert_array_equal(y, fm.conv2d(x[None], w, b, groups=2, padding=(1, 0))[0])
    gy = r.standard_normal(y.shape).astype(np.float32)
    gx, gw, gb = fm.conv2d_backward(gy, x, w, groups=2, padding=(1, 0))
    assert gx.shape == x.shape and gw.shape == w.shape and gb.shape == (6,)
    gx4, gw4, gb4 = fm.conv2d_backward(gy[None], x[None], w, groups=2, padding=(1, 0))
    np.testing.assert_array_equal(gx, gx4[0])
    np.testing.assert_array_equal(gw, gw4)
    np.testing.assert_array_equal(gb, gb4)


def test_needs_selects_the_gradients():
    r = np.random.default_rng(4)
    x = r.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = r.standard_normal((3, 4, 3, 3)).astype(np.float32)
    for needs in [(), ("input",), ("weight",), ("bias",), ("weight", "bias"), ["bias", "input"],
                  ("input", "input"), "weight"]:
        want = (needs,) if isinstance(needs, str) else needs
        check_backward(x, w, {}, r, needs=tuple(want))
        out = fm.conv2d_backward(np.ones((2, 3, 4, 4), np.float32), x, w, needs=needs)
        assert [o is not None for o in out] == [n in want for n in ("input", "weight", "bias")]


def test_zero_batch():
    x = np.zeros((0, 3, 5, 5), np.float32)
    w = np.ones((4, 3, 3, 3), np.float32)
    b = np.arange(4, dtype=np.float32)
    y = fm.conv2d(x, w, b, padding=1)
    assert y.shape == (0, 4, 5, 5) and y.dtype == np.float32
    gx, gw, gb = fm.conv2d_backward(np.zeros((0, 4, 5, 5), np.float32), x, w, padding=1)
    assert gx.shape == (0, 3, 5, 5)
    np.testing.assert_array_equal(gw, np.zeros((4, 3, 3, 3), np.float32))
    np.testing.assert_array_equal(gb, np.zeros(4, np.float32))


def test_dtypes_are_computed_in_float32():
    r = np.random.default_rng(5)
    x = r.standard_normal((2, 3, 6, 6))
    w = r.standard_normal((4, 3, 3, 3))
    want = ref_conv2d(x.astype(np.float32), w.astype(np.float32))
    scale = ref_conv2d(np.abs(x), np.abs(w))
    assert_close(fm.conv2d(x, w), want, scale, "float64 input")
    for dt in (np.float16, np.int32, np.int64, np.uint8, np.bool_):
        xi, wi = (x * 3).astype(dt), (w * 3).astype(dt)
        assert_close(fm.conv2d(xi, wi), ref_conv2d(xi.astype(np.float32), wi.astype(np.float32)),
                     ref_conv2d(np.abs(xi.astype(np.float64)), np.abs(wi.astype(np.float64))),
                     f"{dt.__name__} input")
    # Python lists are array-likes too.
    assert_close(fm.conv2d(x.tolist(), w.tolist()), want, scale, "list input")
    gx, gw, gb = fm.conv2d_backward(np.ones((2, 4, 4, 4), np.float16), x.astype(np.float16),
                                    w.astype(np.float16))
    assert gx.dtype == gw.dtype == gb.dtype == np.float32


def test_non_contiguous_inputs():
    r = np.random.default_rng(6)
    base = r.standard_normal((3, 8, 10, 12)).astype(np.float32)
    x = base[::-1, ::2, :, ::-1].transpose(0, 1, 3, 2)  # negative and permuted strides
    w = r.standard_normal((5, 4, 3, 3)).astype(np.float32)[:, :, ::-1]
    b = r.standard_normal(10).astype(np.float32)[::2]
    check_forward(x, w, b, dict(padding=1))
    check_backward(x, w, dict(padding=1), r)


def test_fastmetal_arrays_in_arrays_out():
    r = np.random.default_rng(8)
    x = r.standard_normal((2, 4, 7, 7)).astype(np.float32)
    w = r.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = r.standard_normal(6).astype(np.float32)
    y = fm.conv2d(fm.asarray(x), w, b, groups=2)
    assert isinstance(y, fm.Array) and y.shape == (2, 6, 5, 5) and y.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(y), fm.conv2d(x, w, b, groups=2))
    y16 = fm.conv2d(fm.asarray(x, dtype="float16"), fm.asarray(w), groups=2)
    assert isinstance(y16, fm.Array) and y16.dtype == np.float32
    gy = r.standard_normal((2, 6, 5, 5)).astype(np.float32)
    out = fm.conv2d_backward(fm.asarray(gy), x, w, groups=2)
    assert all(isinstance(o, fm.Array) for o in out)
    ref = fm.conv2d_backward(gy, x, w, groups=2)
    for a, bb in zip(out, ref):
        np.testing.assert_array_equal(np.asarray(a), bb)
    assert isinstance(fm.conv2d(x, w, b, groups=2), np.ndarray)


def test_backward_against_finite_differences_of_the_reference():
    """fastmetal's gradients vs central differences of the float64 reference forward,
    f(x, w, b) = sum(conv2d(x, w, b) * gy), for every element of x, w and b."""
    r = np.random.default_rng(9)
    kw = dict(stride=(2, 1), padding="valid", dilation=(1, 2), groups=2)
    x = r.standard_normal((2, 4, 6, 7))
    w = r.standard_normal((4, 2, 2, 3))
    b = r.standard_normal(4)
    gy = r.standard_normal(ref_conv2d(x, w, b, **kw).shape)
    f = lambda x_, w_, b_: float((ref_conv2d(x_, w_, b_, **kw) * gy).sum())  # noqa: E731
    x32, w32, gy32 = x.astype(np.float32), w.astype(np.float32), gy.astype(np.float32)
    gx, gw, gb = fm.conv2d_backward(gy32, x32, w32, **kw)
    h = 1e-3
    for target, got in ((0, gx), (1, gw), (2, gb)):
        args = [x32.astype(np.float64), w32.astype(np.float64), b]
        num = np.zeros(args[target].shape)
        for idx in np.ndindex(num.shape):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[target][idx] += h
            minus[target][idx] -= h
            num[idx] = (f(*plus) - f(*minus)) / (2 * h)
        np.testing.assert_allclose(got, num, rtol=1e-4, atol=1e-4)


@pytest.mark.torch
@pytest.mark.parametrize("seed", range(8))
def test_against_torch_autograd(seed):
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    x, w, b, kw, r = make_problem(5000 + seed)
    if b is None:
        b = np.zeros(w.shape[0], np.float32)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 'same' with even kernels warns about a copy
        yt = tf.conv2d(xt, wt, bt, **kw)
    gy = r.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.tensor(gy, dtype=torch.float64))
    y = fm.conv2d(x, w, b, **kw)
    gx, gw, gb = fm.conv2d_backward(gy, x, w, **kw)
    sx, sw, sb = ref_conv2d_backward(np.abs(gy), np.abs(x), np.abs(w), **kw)
    assert_close(y, yt.detach().numpy(), ref_conv2d(np.abs(x), np.abs(w), np.abs(b), **kw),
                 "torch forward")
    assert_close(gx, xt.grad.numpy(), sx, "torch grad_input")
    assert_close(gw, wt.grad.numpy(), sw, "torch grad_weight")
    assert_close(gb, bt.grad.numpy(), sb, "torch grad_bias")


# ----------------------------------------------------------------------------- MSL kernels
def test_conv_kernels_are_built():
    for name in ("conv2d_forward_64x64", "conv2d_forward_32x64", "conv2d_forward_direct",
                 "conv2d_backward_input_64x64", "conv2d_backward_input_32x64",
                 "conv2d_backward_input_direct", "conv2d_backward_weight_64x64",
                 "conv2d_backward_weight_32x64", "conv2d_backward_weight_reduce",
                 "conv2d_sum_splits", "conv2d_backward_bias"):
        assert _core._has_kernel("cpu", name), name


# Configurations that reach every kernel: GEMMs with 32- and 64-row tiles (C_out/groups or
# C_in/groups above 32), split-K weight gradients (long N*H_out*W_out), direct kernels and
# reductions (depthwise).
KERNEL_CASES = [
    ((2, 6, 9, 9), (10, 6, 3, 3), dict(padding=1)),                       # 32-row GEMMs
    ((1, 36, 5, 6), (40, 36, 2, 3), dict(padding="same")),                # 64-row GEMMs
    ((3, 6, 12, 11), (8, 3, 3, 2), dict(stride=(2, 3), dilation=(2, 1), groups=2)),
    ((2, 8, 14, 14), (6, 8, 1, 1), dict()),                               # split-K, 1x1
    ((2, 5, 7, 8), (5, 1, 3, 3), dict(padding=(1, 2), groups=5)),         # depthwise
    ((1, 3, 6, 5), (9, 1, 2, 2), dict(padding="same", dilation=2, groups=3)),  # multiplier 3
    ((4, 7, 5, 5), (2, 7, 3, 3), dict(stride=2)),                         # C_out < 5: direct
]


@pytest.mark.parametrize("case", range(len(KERNEL_CASES)))
@pytest.mark.parametrize("threads,seed", [(256, 1), (37, 2), (64, 3), (300, 4), (1, 5)])
def test_msl_kernels_under_the_emulator(kernel_path, case, threads, seed):
    xshape, wshape, kw = KERNEL_CASES[case]
    if threads == 1 and np.prod(wshape) > 2000:
        pytest.skip("one thread per group: only the small cases (slow under the emulator)")
    _core._set_conv_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    r = np.random.default_rng(100 * case + seed)
    x = r.standard_normal(xshape).astype(np.float32)
    w = r.standard_normal(wshape).astype(np.float32)
    b = r.standard_normal(wshape[0]).astype(np.float32)
    assert _core._cpu_conv_path() == "kernels"
    check_forward(x, w, b, kw)
    check_forward(x, w, None, kw)
    check_backward(x, w, kw, r)


def test_msl_reductions_for_any_group_size(kernel_path):
    # threadgroup memory outlives a launch on the CPU: a large group first leaves every
    # slot written, so a reduction that read slots its own group never wrote would fail.
    r = np.random.default_rng(10)
    x = r.standard_normal((2, 5, 9, 10)).astype(np.float32)
    w = r.standard_normal((5, 1, 3, 3)).astype(np.float32)
    kw = dict(groups=5, padding=(0, 1))
    for i, threads in enumerate([1024, 37, 1000, 5, 129, 1, 2048]):
        _core._set_conv_group_size(threads)
        os.environ["FASTMETAL_EMULATOR_SEED"] = str(i)
        check_backward(x, w, kw, r, needs=("weight", "bias"))


@pytest.mark.parametrize("seed", range(12))
def test_msl_kernels_random_configs(kernel_path, seed):
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    _core._set_conv_group_size([0, 48, 100, 129][seed % 4])
    x, w, b, kw, r = make_problem(2000 + seed, small=True)
    check_forward(x, w, b, kw)
    check_backward(x, w, kw, r)


def test_msl_kernels_match_fast_path(kernel_path):
    r = np.random.default_rng(11)
    x = r.standard_normal((2, 12, 10, 10)).astype(np.float32)
    w = r.standard_normal((16, 6, 3, 3)).astype(np.float32)
    b = r.standard_normal(16).astype(np.float32)
    kw = dict(padding=1, groups=2)
    y_k = fm.conv2d(x, w, b, **kw)
    g_k = fm.conv2d_backward(np.ones_like(y_k), x, w, **kw)
    _core._set_cpu_conv_path("fast")
    y_f = fm.conv2d(x, w, b, **kw)
    g_f = fm.conv2d_backward(np.ones_like(y_f), x, w, **kw)
    np.testing.assert_allclose(y_k, y_f, rtol=1e-5, atol=1e-4)
    for a, bb in zip(g_k, g_f):
        np.testing.assert_allclose(a, bb, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("path", ["fast", "kernels"])
def test_python_threads_calling_at_once(kernel_path, path):
    """The GIL is released while computing: concurrent calls give the serial results."""
    import threading
    _core._set_cpu_conv_path(path)
    r = np.random.default_rng(13)
    cases = []
    for i in range(4):
        x = r.standard_normal((2, 6, 9, 8)).astype(np.float32)
        w = r.standard_normal((8 if i % 2 else 2, 6 // (1 + i % 2), 3, 3)).astype(np.float32)
        kw = dict(padding=1, groups=1 + i % 2)
        cases.append((x, w, kw))
    run = lambda x, w, kw: (fm.conv2d(x, w, **kw),  # noqa: E731
                            *fm.conv2d_backward(np.ones((2, w.shape[0], 9, 8), np.float32),
                                                x, w, **kw))
    expected = [run(*c) for c in cases]
    errors = []

    def worker(t):
        try:
            for it in range(3):
                i = (t + it) % len(cases)
                for got, want in zip(run(*cases[i]), expected[i]):
                    if not np.array_equal(got, want):
                        errors.append((t, it))
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_private_switches_validate():
    with pytest.raises(ValueError, match="expected 'fast' or 'kernels'"):
        _core._set_cpu_conv_path("gpu")
    with pytest.raises(ValueError, match="expected 0..4096"):
        _core._set_conv_group_size(-1)


# ----------------------------------------------------------------------------- nn.Conv2d
def test_conv2d_layer_forward_backward():
    r = np.random.default_rng(12)
    layer = fm.nn.Conv2d(4, 6, (3, 2), stride=(1, 2), padding=1, groups=2,
                         seed=3)
    assert layer.weight.shape == (6, 2, 3, 2) and layer.bias.shape == (6,)
    assert layer.weight.dtype == layer.bias.dtype == np.float32
    assert layer.weight_grad is None and layer.bias_grad is None
    x = r.standard_normal((3, 4, 8, 9)).astype(np.float32)
    kw = dict(stride=(1, 2), padding=1, groups=2)
    y = layer(x)
    np.testing.assert_array_equal(y, fm.conv2d(x, layer.weight, layer.bias, **kw))
    np.testing.assert_array_equal(layer.forward(x), y)
    gy = r.standard_normal(y.shape).astype(np.float32)
    gx = layer.backward(gy)
    wx, ww, wb = ref_conv2d_backward(gy, x, layer.weight, **kw)
    sx, sw, sb = ref_conv2d_backward(np.abs(gy), np.abs(x), np.abs(layer.weight), **kw)
    assert_close(gx, wx, sx, "layer grad_input")
    assert_close(layer.weight_grad, ww, sw, "layer weight_grad")
    assert_close(layer.bias_grad, wb, sb, "layer bias_grad")
    assert "Conv2d(4, 6" in repr(layer)
    assert len(layer.parameters()) == 2


def test_conv2d_layer_without_bias_and_on_arrays():
    layer = fm.nn.Conv2d(3, 5, 3, bias=False, padding="same", seed=0)
    assert layer.bias is None and layer.parameters() == [layer.weight]
    x = fm.asarray(np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32))
    y = layer(x)
    assert isinstance(y, fm.Array) and y.shape == (2, 5, 6, 6)
    gx = layer.backward(fm.ones((2, 5, 6, 6)))
    assert isinstance(gx, fm.Array) and gx.shape == (2, 3, 6, 6)
    assert isinstance(layer.weight_grad, fm.Array) and layer.bias_grad is None
    # Parameters on a device.
    dev = fm.nn.Conv2d(3, 5, 3, seed=0, device="cpu")
    assert isinstance(dev.weight, fm.Array) and isinstance(dev.bias, fm.Array)
    np.testing.assert_array_equal(np.asarray(dev.weight), fm.nn.Conv2d(3, 5, 3, seed=0).weight)


def test_conv2d_layer_initialisation_matches_pytorch_statistics():
    # kaiming_uniform_(a=sqrt(5)) -> U(-1/sqrt(fan_in), 1/sqrt(fan_in)), bias likewise.
    layer = fm.nn.Conv2d(64, 128, 3, groups=2, seed=1)
    fan_in = 32 * 9
    bound = 1 / math.sqrt(fan_in)
    w = layer.weight.astype(np.float64).ravel()
    assert np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.99 * bound
    assert abs(w.mean()) < 4 * bound / math.sqrt(3 * w.size)
    assert abs(w.var() / (bound ** 2 / 3) - 1) < 0.02
    # Uniform: each tenth of the range holds a tenth of the values.
    hist, _ = np.histogram(w, bins=10, range=(-bound, bound))
    assert np.all(np.abs(hist / w.size - 0.1) < 0.01)
    assert np.abs(layer.bias).max() <= bound
    # Reproducible from seed / rng; different seeds differ.
    np.testing.assert_array_equal(fm.nn.Conv2d(64, 128, 3, groups=2, seed=1).weight, layer.weight)
    a = fm.nn.Conv2d(4, 4, 3, rng=np.random.default_rng(5))
    b = fm.nn.Conv2d(4, 4, 3, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a.weight, b.weight)
    assert not np.array_equal(fm.nn.Conv2d(4, 4, 3, seed=1).weight,
                              fm.nn.Conv2d(4, 4, 3, seed=2).weight)


@pytest.mark.torch
def test_conv2d_layer_bound_matches_torch():
    torch = pytest.importorskip("torch")
    for args in [(3, 8, 5), (16, 32, (3, 1)), (8, 8, 3)]:
        kwargs = dict(groups=4) if args[0] == 8 else {}
        t = torch.nn.Conv2d(*args, **kwargs)
        ours = fm.nn.Conv2d(*args, **kwargs, seed=0)
        assert ours.weight.shape == tuple(t.weight.shape)
        # Both draw uniformly within the same bound, and reach close to it.
        bound = 1 / math.sqrt(ours.weight[0].size)
        tw = t.weight.detach().numpy()
        for wts in (tw, ours.weight):
            assert np.abs(wts).max() <= bound + 1e-7
            assert np.abs(wts).max() > bound * (1 - 8 / wts.size)
        assert np.abs(t.bias.detach().numpy()).max() <= bound + 1e-7


def test_conv2d_layer_bad_arguments():
    with pytest.raises(TypeError, match="in_channels"):
        fm.nn.Conv2d(2.0, 4, 3)
    with pytest.raises(ValueError, match="out_channels"):
        fm.nn.Conv2d(2, 0, 3)
    with pytest.raises(TypeError, match="kernel_size"):
        fm.nn.Conv2d(2, 4, True)
    with pytest.raises(ValueError, match="kernel_size"):
        fm.nn.Conv2d(2, 4, (3, 3, 3))
    with pytest.raises(ValueError, match=r"in_channels \(3\) to be divisible by groups \(2\)"):
        fm.nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match=r"out_channels \(3\) to be divisible by groups \(2\)"):
        fm.nn.Conv2d(4, 3, 3, groups=2)
    with pytest.raises(ValueError, match=r"\[fastmetal.nn.Conv2d\] expected stride 1 with"):
        fm.nn.Conv2d(2, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="stride to be positive"):
        fm.nn.Conv2d(2, 4, 3, stride=0)
    with pytest.raises(TypeError, match="bias"):
        fm.nn.Conv2d(2, 4, 3, bias=None)
    with pytest.raises(TypeError, match="rng"):
        fm.nn.Conv2d(2, 4, 3, rng=5)
    with pytest.raises(ValueError, match="at most one of seed and rng"):
        fm.nn.Conv2d(2, 4, 3, seed=1, rng=np.random.default_rng())
    layer = fm.nn.Conv2d(2, 4, 3)
    with pytest.raises(ValueError, match="forward"):
        layer.backward(np.zeros((1, 4, 1, 1), np.float32))
    with pytest.raises(ValueError, match="channels"):
        layer(np.zeros((1, 3, 5, 5), np.float32))
    layer(np.zeros((1, 2, 5, 5), np.float32))
    with pytest.raises(ValueError, match="grad_output"):
        layer.backward(np.zeros((1, 4, 2, 2), np.float32))


# ----------------------------------------------------------------------------- bad arguments
X = np.zeros((2, 4, 8, 8), np.float32)
Wt = np.zeros((6, 2, 3, 3), np.float32)  # for groups=2
W1 = np.zeros((6, 4, 3, 3), np.float32)

BAD_CONV = [
    # (args, kwargs, exception, message fragment)
    ((np.zeros((4, 8, 8, 1, 1)), W1), {}, ValueError, r"expected a 4-D input .* got shape \(4, 8, 8, 1, 1\)"),
    ((np.zeros((8, 8)), W1), {}, ValueError, r"3-D unbatched input"),
    ((np.float32(1.0), W1), {}, ValueError, r"4-D input"),
    ((X, np.zeros((6, 4, 3))), {}, ValueError, r"expected a 4-D weight \(C_out, C_in/groups, kH, kW\), got shape \(6, 4, 3\)"),
    ((X, np.zeros((6, 3, 3, 3))), {}, ValueError, r"weight.shape\[1\] \* groups = 3 \* 1 = 3 channels, got 4"),
    ((X, Wt), {}, ValueError, r"weight.shape\[1\] \* groups = 2 \* 1 = 2 channels, got 4"),
    ((X, W1), dict(groups=2), ValueError, r"weight.shape\[1\] \* groups = 4 \* 2 = 8 channels, got 4"),
    ((X, np.zeros((5, 2, 3, 3))), dict(groups=2), ValueError, r"weight.shape\[0\] = 5\) to be divisible by groups = 2"),
    ((X, np.zeros((6, 1, 3, 3))), dict(groups=3), ValueError, r"C_in = 4\) to be divisible by groups = 3"),
    ((X, np.zeros((0, 4, 3, 3))), {}, ValueError, r"every dimension at least 1"),
    ((X, np.zeros((6, 4, 0, 3))), {}, ValueError, r"every dimension at least 1"),
    ((np.zeros((2, 0, 8, 8)), np.zeros((6, 0, 3, 3))), {}, ValueError, r"at least 1"),
    ((np.zeros((2, 4, 0, 8)), W1), {}, ValueError, r"non-zero height and width"),
    ((X, np.zeros((6, 4, 9, 3))), {}, ValueError, r"padded input \(8 x 8\) to be at least as large as the dilated kernel \(9 x 3\)"),
    ((X, W1), dict(dilation=4), ValueError, r"dilated kernel \(9 x 9\)"),
    ((X, W1, np.zeros(5)), {}, ValueError, r"expected a bias of shape \(C_out,\) = \(6,\), got shape \(5,\)"),
    ((X, W1, np.zeros((6, 1))), {}, ValueError, r"bias of shape"),
    ((X, W1), dict(stride=0), ValueError, r"expected stride to be positive .*got \(0, 0\)"),
    ((X, W1), dict(stride=(1, -2)), ValueError, r"stride to be positive"),
    ((X, W1), dict(stride=(1, 2, 3)), ValueError, r"pair of 2 ints, got 3 values"),
    ((X, W1), dict(stride=(1,)), ValueError, r"pair of 2 ints, got 1 values"),
    ((X, W1), dict(stride=1.0), TypeError, r"expected stride to be a positive int or a pair of ints, got 1.0"),
    ((X, W1), dict(stride=True), TypeError, r"stride"),
    ((X, W1), dict(stride=(1, np.bool_(True))), TypeError, r"stride"),
    ((X, W1), dict(stride="1"), TypeError, r"stride"),
    ((X, W1), dict(stride=None), TypeError, r"stride"),
    ((X, W1), dict(dilation=0), ValueError, r"dilation to be positive"),
    ((X, W1), dict(dilation=(1, 0.5)), TypeError, r"dilation"),
    ((X, W1), dict(padding=-1), ValueError, r"padding to be non-negative"),
    ((X, W1), dict(padding=(0, -1)), ValueError, r"padding to be non-negative"),
    ((X, W1), dict(padding="full"), ValueError, r"expected padding 'valid', 'same', an int or a pair of ints, got 'full'"),
    ((X, W1), dict(padding=1.5), TypeError, r"padding"),
    ((X, W1), dict(padding=False), TypeError, r"padding"),
    ((X, W1), dict(padding="same", stride=2), ValueError, r"stride 1 with padding='same'.*got stride \(2, 2\)"),
    ((X, W1), dict(padding="same", stride=(1, 2)), ValueError, r"stride 1 with padding='same'"),
    ((X, W1), dict(groups=0), ValueError, r"groups to be a positive int, got 0"),
    ((X, W1), dict(groups=1.0), TypeError, r"groups"),
    ((X, W1), dict(groups=True), TypeError, r"groups"),
    ((X, W1), dict(stride=2**40), ValueError, r"at most 2\*\*31-1"),
    ((X.astype(np.complex64), W1), {}, TypeError, r"real .* for input, got dtype complex64"),
    ((X, W1.astype(object)), {}, TypeError, r"for weight, got dtype object"),
    ((X, W1, np.array(["a"] * 6)), {}, TypeError, r"for bias"),
    ((X, W1, np.zeros(6, np.complex128)), {}, TypeError, r"for bias"),
    (("abc", W1), {}, (TypeError, ValueError), r"input"),
    (([[1, 2], [3]], W1), {}, TypeError, r"array-like"),
]


@pytest.mark.parametrize("args,kwargs,exc,msg", BAD_CONV)
def test_conv2d_bad_arguments(args, kwargs, exc, msg):
    with pytest.raises(exc, match=r"\[fastmetal.conv2d\] " + ".*" + msg):
        fm.conv2d(*args, **kwargs)


GY = np.zeros((2, 6, 6, 6), np.float32)

BAD_BACKWARD = [
    ((GY[:, :5], X, W1), {}, ValueError, r"expected grad_output of shape \(2, 6, 6, 6\) .*got shape \(2, 5, 6, 6\)"),
    ((GY, X, W1), dict(padding=1), ValueError, r"grad_output of shape \(2, 6, 8, 8\)"),
    ((GY[0], X, W1), {}, ValueError, r"grad_output"),
    ((GY[:, :, :, :, None], X, W1), {}, ValueError, r"grad_output"),
    ((GY, X, Wt), {}, ValueError, r"channels"),
    ((GY, X[0, 0], W1), {}, ValueError, r"4-D input"),
    ((GY, X, W1), dict(needs=("input", "grad")), ValueError, r"needs entries to be 'input', 'weight' or 'bias', got 'grad'"),
    ((GY, X, W1), dict(needs=("input", 1)), TypeError, r"needs entries"),
    ((GY, X, W1), dict(needs="inputs"), ValueError, r"needs entries"),
    ((GY, X, W1), dict(needs=5), TypeError, r"expected needs to be a sequence"),
    ((GY, X, W1), dict(needs=None), TypeError, r"needs"),
    ((GY, X, W1), dict(stride=0), ValueError, r"stride to be positive"),
    ((GY, X, W1), dict(padding="same", stride=2), ValueError, r"padding='same'"),
    ((GY.astype(np.complex64), X, W1), {}, TypeError, r"grad_output"),
]


@pytest.mark.parametrize("args,kwargs,exc,msg", BAD_BACKWARD)
def test_conv2d_backward_bad_arguments(args, kwargs, exc, msg):
    with pytest.raises(exc, match=r"\[fastmetal.conv2d_backward\] " + ".*" + msg):
        fm.conv2d_backward(*args, **kwargs)


def test_bad_arguments_leave_outputs_untouched_and_do_no_work():
    # Validation happens before conversion: a float64 input with a bad weight raises the
    # shape error (not a conversion side effect) and user arrays are never written.
    x = np.ones((2, 4, 8, 8))
    before = x.copy()
    with pytest.raises(ValueError, match="channels"):
        fm.conv2d(x, np.ones((6, 3, 3, 3)))
    np.testing.assert_array_equal(x, before)


def test_array_inputs_keep_their_device():
    x = fm.asarray(X)
    y = fm.conv2d(x, fm.asarray(W1), None)
    assert y.device == x.device
