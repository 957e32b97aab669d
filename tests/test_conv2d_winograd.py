"""The Winograd paths of conv2d, F(2x2, 3x3) and F(4x4, 3x3) (metal/conv_winograd.metal and the
WinogradForward / WinogradWeight GEMMs of metal/conv2d.metal): forward, input gradient and weight gradient of
stride-1, dilation-1, 3x3, single-group convolutions, against the NumPy float64 reference and
torch autograd, on every device (on cpu: the MSL kernels under the fiber emulator, since the
CPU's own conv engine has no Winograd path), with the algorithm forced through
FASTMETAL_CONV_ALGO=winograd (F(2x2) for every pass) or winograd4 (F(4x4) for every pass).

Tolerance: |got - want| <= 1e-4 * scale (references.assert_close), scale the same convolution
of |x| and |w|, for F(2x2, 3x3); F(4x4, 3x3) gets scale = max(scale, wscale / 10), wscale
the convolution carried out through the absolute transform matrices (|B^T| |d| |B|,
|G| |g| |G^T|, |A^T| M |A|; winograd_float64 below). Why: Winograd's rounding error is
at most (terms + ~12) * eps * wscale (every rounded intermediate is bounded by its
absolute-value counterpart), and wscale is not bounded by a constant times scale: an output
whose window is mostly padding has a small scale, but it shares its tile's transformed
values with its neighbours. For F(2x2, 3x3) wscale is ~7x scale in the interior (2.7x per
axis) and up to ~16x at padded borders; the observed F(2x2) errors stay below 1.3e-7 of
scale (docs/gpu_kernels.md), far inside the shared bound; for
F(4x4, 3x3) the bound 1e-5 * wscale covers (terms + 12) * eps for up to ~150 terms. Both
stay far below O(scale), the size of any indexing or transform bug. The weight gradient sums
over tiles (N * H_out * W_out / m^2 terms, < 300 here); under F(4x4) it gets the same
max(scale, wscale / 10), wscale its adjoint carried out through the absolute matrices
(|G^T| [sum over tiles of (|A| |z| |A^T|) * (|B^T| |d| |B|)] |G|; winograd_wgrad_float64).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core

from references import (assert_close, check_conv2d_against_torch, msl_conv_kernels_on_cpu,
                        ref_conv2d, ref_conv2d_backward, ref_pads)

kernel_path = pytest.fixture(msl_conv_kernels_on_cpu)

WINOGRAD_KERNELS = ("conv2d_winograd_transforms", "conv2d_winograd_grad_transforms",
                    "conv2d_winograd_output", "conv2d_winograd_weight_grad",
                    "conv2d_winograd4_transforms", "conv2d_winograd4_grad_transforms",
                    "conv2d_winograd4_output", "conv2d_winograd4_weight_grad",
                    *(f"conv2d_winograd{p}gemm_{t}" for p in ("_", "4_", "_weight_", "4_weight_")
                      for t in ("128x128", "64x128", "64x64", "32x64")))
# FASTMETAL_CONV_ALGO values: F(2x2, 3x3) or F(4x4, 3x3), each for every pass.
ALGOS = ("winograd", "winograd4")


@pytest.fixture(params=ALGOS)
def winograd(request, monkeypatch, device):
    """Forces a Winograd path; on cpu the MSL kernels run (under the fiber emulator)."""
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", request.param)
    if device != "cpu":
        yield
        return
    saved_path, saved_seed = _core._cpu_conv_path(), os.environ.get("FASTMETAL_EMULATOR_SEED")
    _core._set_cpu_conv_path("kernels")
    yield
    _core._set_cpu_conv_path(saved_path)
    if saved_seed is None:
        os.environ.pop("FASTMETAL_EMULATOR_SEED", None)
    else:
        os.environ["FASTMETAL_EMULATOR_SEED"] = saved_seed


# ------------------------------------------------------------------ references and bounds
_BT = {2: np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
       4: np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                    [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)}
_G = {2: np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]),
      4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                   [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])}
_AT = {2: np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64),
       4: np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                    [0, 1, -1, 8, -8, 1]], np.float64)}


def _input_patches(x, pad, out_hw, m):
    """The (m+2) x (m+2) input patch of every m x m output tile: (N, C, th, tw, m+2, m+2),
    zero outside the image."""
    N, C, H, W = x.shape
    th, tw = -(-out_hw[0] // m), -(-out_hw[1] // m)
    rows, cols = np.arange(th * m + 2) - pad[0], np.arange(tw * m + 2) - pad[1]
    ri = np.nonzero((rows >= 0) & (rows < H))[0]
    ci = np.nonzero((cols >= 0) & (cols < W))[0]
    xp = np.zeros((N, C, len(rows), len(cols)))
    xp[:, :, ri[:, None], ci[None, :]] = x[:, :, rows[ri][:, None], cols[ci][None, :]]
    a = m + 2
    return np.stack([np.stack([xp[:, :, i:i + th * m:m, j:j + tw * m:m] for j in range(a)], -1)
                     for i in range(a)], -2)


def winograd_wgrad_float64(gy, x, pad, m, absolute=True):
    """The weight gradient (K, C, 3, 3) of the stride-1 3x3 convolution of x (N, C, H, W)
    whose output gradient is gy (N, K, H_out, W_out), computed in float64 through the
    adjoint of F(m x m, 3x3): G^T [sum over tiles of (A z A^T) * (B^T d B)] G. absolute: with
    |gy|, |x| and the absolute matrices (the error scale)."""
    gy, x = np.asarray(gy, np.float64), np.asarray(x, np.float64)
    BT, G, AT = _BT[m], _G[m], _AT[m]
    if absolute:
        gy, x, BT, G, AT = (np.abs(t) for t in (gy, x, BT, G, AT))
    N, K, Ho, Wo = gy.shape
    th, tw = -(-Ho // m), -(-Wo // m)
    V = np.einsum("ir,ncturs,js->nctuij", BT, _input_patches(x, pad, (Ho, Wo), m), BT)
    gp = np.zeros((N, K, th * m, tw * m))
    gp[:, :, :Ho, :Wo] = gy
    z = gp.reshape(N, K, th, m, tw, m).transpose(0, 1, 2, 4, 3, 5)  # (N, K, th, tw, m, m)
    Z = np.einsum("pi,nktupq,qj->nktuij", AT, z, AT)
    dU = np.einsum("nktuij,nctuij->kcij", Z, V)
    return np.einsum("ir,kcij,js->kcrs", G, dU, G)


def winograd_float64(x, w, pad, out_hw, m, absolute=True):
    """The stride-1 3x3 convolution of x (N, C, H, W) with w (K, C, 3, 3) computed in float64
    by F(m x m, 3x3), tile by tile: (N, K, *out_hw). `pad` (top, left) may be negative (a
    crop). absolute: with |x|, |w| and the absolute transform matrices (the error scale)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    BT, G, AT = _BT[m], _G[m], _AT[m]
    if absolute:
        x, w, BT, G, AT = (np.abs(t) for t in (x, w, BT, G, AT))
    N, C, H, W = x.shape
    th, tw = -(-out_hw[0] // m), -(-out_hw[1] // m)
    V = np.einsum("ir,ncturs,js->nctuij", BT, _input_patches(x, pad, out_hw, m), BT)
    U = np.einsum("ir,kcrs,js->kcij", G, w, G)
    M = np.einsum("kcij,nctuij->nktuij", U, V)
    Y = np.einsum("pi,nktuij,qj->nktupq", AT, M, AT)  # (N, K, th, tw, m, m)
    Y = Y.transpose(0, 1, 2, 4, 3, 5).reshape(N, w.shape[0], th * m, tw * m)
    return Y[:, :, :out_hw[0], :out_hw[1]]


def _algo():
    return os.environ.get("FASTMETAL_CONV_ALGO", "")


def forward_scale(x, w, b, kw):
    """The error scale of a forward pass under the forced algorithm (module docstring)."""
    scale = ref_conv2d(np.abs(x), np.abs(w), None if b is None else np.abs(b), **kw)
    if _algo() == "winograd4":
        (pt, _), (pl, _) = ref_pads(kw.get("padding", 0), (3, 3), (1, 1))
        scale = np.maximum(scale, winograd_float64(x, w, (pt, pl), scale.shape[2:], 4) / 10)
    return scale


def input_grad_scale(gy, x, w, kw):
    """Likewise for the input gradient: gy convolved with w rotated, padding 2 - p."""
    scale = ref_conv2d_backward(np.abs(gy), np.abs(x), np.abs(w), **kw)[0]
    if _algo() == "winograd4":
        (pt, _), (pl, _) = ref_pads(kw.get("padding", 0), (3, 3), (1, 1))
        w_eq = np.ascontiguousarray(np.asarray(w).transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
        scale = np.maximum(scale, winograd_float64(gy, w_eq, (2 - pt, 2 - pl), x.shape[2:], 4) / 10)
    return scale


def weight_grad_scale(gy, x, w, kw):
    """Likewise for the weight gradient: its adjoint's absolute-value bound under F(4x4)."""
    scale = ref_conv2d_backward(np.abs(gy), np.abs(x), np.abs(w), **kw)[1]
    if _algo() == "winograd4":
        (pt, _), (pl, _) = ref_pads(kw.get("padding", 0), (3, 3), (1, 1))
        scale = np.maximum(scale, winograd_wgrad_float64(gy, x, (pt, pl), 4) / 10)
    return scale


def check_forward(x, w, b, kw):
    y = fm.conv2d(x, w, b, **kw)
    assert_close(y, ref_conv2d(x, w, b, **kw), forward_scale(x, w, b, kw),
                 f"forward {x.shape} {w.shape} {kw}")


def check_backward(x, w, kw, r):
    ys = ref_conv2d(x, w, None, **kw).shape
    gy = r.standard_normal(ys).astype(np.float32)
    gx, gw, gb = fm.conv2d_backward(gy, x, w, **kw)
    wx, ww, wb = ref_conv2d_backward(gy, x, w, **kw)
    _, _, sb = ref_conv2d_backward(np.abs(gy), np.abs(x), np.abs(w), **kw)
    sx, sw = input_grad_scale(gy, x, w, kw), weight_grad_scale(gy, x, w, kw)
    where = f"{x.shape} {w.shape} {kw}"
    for name, got, want, scale in (("input", gx, wx, sx), ("weight", gw, ww, sw),
                                   ("bias", gb, wb, sb)):
        assert_close(got, want, scale, f"grad_{name} {where}")


@pytest.mark.parametrize("m", (2, 4))
@pytest.mark.parametrize("pad", ((0, 0), (1, 1), (2, 0), (-1, 1)))
def test_float64_winograd_reference_is_the_convolution(m, pad):
    """The tolerance helper's tiling and matrices: signed, it is the convolution; absolute,
    it bounds the convolution of absolute values."""
    r = np.random.default_rng(3)
    x = r.standard_normal((2, 3, 7, 6))
    w = r.standard_normal((4, 3, 3, 3))
    out_hw = (7 + 2 * pad[0] - 2, 6 + 2 * pad[1] - 2)
    if pad[0] >= 0:
        direct = ref_conv2d(x, w, padding=pad)
    else:  # a crop: the convolution of the input without its first and last row
        direct = ref_conv2d(x[:, :, 1:-1], w, padding=(0, pad[1]))
    np.testing.assert_allclose(winograd_float64(x, w, pad, out_hw, m, absolute=False), direct,
                               rtol=1e-10, atol=1e-10)
    bound = winograd_float64(x, w, pad, out_hw, m)
    assert np.all(bound >= np.abs(direct) - 1e-10)
    if pad[0] >= 0:  # the weight gradient's adjoint, likewise
        gy = r.standard_normal(direct.shape)
        dw = ref_conv2d_backward(gy, x, w, padding=pad)[1]
        np.testing.assert_allclose(winograd_wgrad_float64(gy, x, pad, m, absolute=False), dw,
                                   rtol=1e-10, atol=1e-10)
        assert np.all(winograd_wgrad_float64(gy, x, pad, m) >= np.abs(dw) - 1e-10)


def winograd_problem(seed):
    """A random Winograd shape: odd and even H/W (partial tiles), padding 0..2 per axis or
    'same', batch 1..3, channel counts that are not multiples of any tile."""
    r = np.random.default_rng(seed)
    ci, co = int(r.integers(5, 41)), int(r.integers(5, 71))
    mode = r.choice(["int", "pair", "same"])
    padding = ("same" if mode == "same" else int(r.integers(0, 3)) if mode == "int"
               else (int(r.integers(0, 3)), int(r.integers(0, 3))))
    ph, pw = (1, 1) if padding == "same" else (padding, padding) if isinstance(padding, int) else padding
    H = int(r.integers(max(1, 3 - 2 * ph), 16))
    W = int(r.integers(max(1, 3 - 2 * pw), 16))
    N = int(r.integers(1, 4))
    x = r.standard_normal((N, ci, H, W)).astype(np.float32)
    w = r.standard_normal((co, ci, 3, 3)).astype(np.float32)
    b = r.standard_normal(co).astype(np.float32) if r.random() < 0.7 else None
    return x, w, b, dict(padding=padding), r


def test_winograd_kernels_are_built(device):
    for name in WINOGRAD_KERNELS:
        assert _core._has_kernel(device, name), name


@pytest.mark.parametrize("seed", range(10))
def test_random_shapes_against_float64(winograd, seed, device):
    x, w, b, kw, r = winograd_problem(300 + seed)
    check_forward(x, w, b, kw)
    check_backward(x, w, kw, r)


@pytest.mark.parametrize("xshape,co,padding", [
    ((1, 7, 5, 5), 9, 0),          # batch 1, one full and one partial tile per axis
    ((2, 6, 3, 3), 6, 0),          # a single output pixel
    ((1, 5, 1, 1), 7, 1),          # 1x1 image, padding 1
    ((1, 6, 2, 7), 5, 2),          # padding 2: the input gradient's padding is 0
    ((2, 9, 4, 6), 11, 3),         # padding 3: the input gradient crops (padding -1)
    ((1, 8, 9, 2), 33, (0, 2)),    # 33 rows: past a 32-row tile
    ((2, 12, 13, 11), 65, (0, 1)),  # 65 rows: past a 64-row tile
])
def test_edge_shapes(winograd, xshape, co, padding, device):
    r = np.random.default_rng(sum(xshape) + co)
    x = r.standard_normal(xshape).astype(np.float32)
    w = r.standard_normal((co, xshape[1], 3, 3)).astype(np.float32)
    b = r.standard_normal(co).astype(np.float32)
    check_forward(x, w, b, dict(padding=padding))
    check_forward(x, w, None, dict(padding=padding))
    check_backward(x, w, dict(padding=padding), r)


def test_many_channels_stay_within_the_bound(winograd, device):
    """A deeper sum (96 input and 80 output channels) with a long weight-gradient K."""
    r = np.random.default_rng(17)
    x = r.standard_normal((2, 96, 14, 14)).astype(np.float32)
    w = r.standard_normal((80, 96, 3, 3)).astype(np.float32)
    check_forward(x, w, r.standard_normal(80).astype(np.float32), dict(padding=1))
    check_backward(x, w, dict(padding=1), r)


@pytest.mark.torch
@pytest.mark.parametrize("seed", range(3))
def test_against_torch_autograd(winograd, seed, device):
    pytest.importorskip("torch")
    x, w, b, kw, r = winograd_problem(700 + seed)
    check_conv2d_against_torch(x, w, b, kw, r)


def test_forced_gemm_and_winograd_agree(monkeypatch, device):
    """The two algorithms on one layer, each within the bound of the other's reference."""
    r = np.random.default_rng(23)
    x = r.standard_normal((2, 24, 10, 9)).astype(np.float32)
    w = r.standard_normal((40, 24, 3, 3)).astype(np.float32)
    gy = r.standard_normal((2, 40, 10, 9)).astype(np.float32)
    out = {}
    for algo in ("gemm", *ALGOS):
        monkeypatch.setenv("FASTMETAL_CONV_ALGO", algo)
        out[algo] = (fm.conv2d(x, w, padding=1), *fm.conv2d_backward(gy, x, w, padding=1)[:2])
    scales = (ref_conv2d(np.abs(x), np.abs(w), padding=1),
              *ref_conv2d_backward(np.abs(gy), np.abs(x), np.abs(w), padding=1)[:2])
    for algo in ALGOS:
        for what, a, b, s in zip(("forward", "grad_input", "grad_weight"), out["gemm"],
                                 out[algo], scales):
            assert_close(a, np.asarray(b, np.float64), 2 * s, f"{algo} {what}")


# ------------------------------------------------------------------ the fiber emulator (cpu)
EMULATOR_CASES = [
    ((2, 6, 9, 7), (10, 6, 3, 3), dict(padding=1)),        # 32-row tiles, partial tiles
    ((1, 36, 6, 5), (40, 36, 3, 3), dict(padding=(0, 2))),  # 64-row tiles
    ((2, 5, 26, 22), (7, 5, 3, 3), dict(padding=0)),        # split-K weight gradient
]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("case", range(len(EMULATOR_CASES)))
@pytest.mark.parametrize("threads,seed", [(0, 1), (37, 2), (300, 3), (1, 4)])
@pytest.mark.cpu_only
def test_under_the_emulator_in_random_thread_order(kernel_path, monkeypatch, algo, case, threads,
                                                   seed):
    """Random fiber order in every group; threads 0 = the GEMM tile's own count (the
    double-buffered path), others the passes of virtual threads."""
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", algo)
    xshape, wshape, kw = EMULATOR_CASES[case]
    if threads == 1 and np.prod(wshape) > 2000:
        pytest.skip("one thread per group: only the small cases (slow under the emulator)")
    _core._set_conv_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    r = np.random.default_rng(40 + 10 * case + seed)
    x = r.standard_normal(xshape).astype(np.float32)
    w = r.standard_normal(wshape).astype(np.float32)
    check_forward(x, w, r.standard_normal(wshape[0]).astype(np.float32), kw)
    check_backward(x, w, kw, r)


@pytest.mark.parametrize("algo,splits", [("winograd", ""), ("winograd", "3"), ("winograd4", "")])
@pytest.mark.parametrize("tile", ("128x128", "64x128", "64x64", "32x64"))
@pytest.mark.cpu_only
def test_every_gemm_tile_and_split_count(kernel_path, monkeypatch, algo, tile, splits):
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", algo)
    monkeypatch.setenv("FASTMETAL_CONV_TILE", tile)
    monkeypatch.setenv("FASTMETAL_CONV_SPLITS", splits)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(len(tile) + len(splits))
    r = np.random.default_rng(61)
    x = r.standard_normal((2, 20, 11, 9)).astype(np.float32)
    w = r.standard_normal((70, 20, 3, 3)).astype(np.float32)
    check_forward(x, w, r.standard_normal(70).astype(np.float32), dict(padding=1))
    check_backward(x, w, dict(padding=1), r)


def test_queued_back_to_back_without_host_waits(winograd, device):
    """Device Arrays in, device Arrays out: the four launches per pass queue without a host
    wait, and the pool buffers each pass frees (transformed tensors, products) while its
    kernels are still queued are not handed to the next pass before those kernels ran."""
    r = np.random.default_rng(29)
    xs = [r.standard_normal((2, 20, 9, 7)).astype(np.float32) for _ in range(3)]
    w = r.standard_normal((24, 20, 3, 3)).astype(np.float32)
    gy = r.standard_normal((2, 24, 9, 7)).astype(np.float32)
    wd, gyd = fm.asarray(w, device=device), fm.asarray(gy, device=device)
    xds = [fm.asarray(x, device=device) for x in xs]
    before = fm._core._host_waits(device)
    outs = [(fm.conv2d(xd, wd, padding=1), *fm.conv2d_backward(gyd, xd, wd, padding=1)[:2])
            for xd in xds]
    assert fm._core._host_waits(device) == before, "a Winograd pass waited for the device"
    kw = dict(padding=1)
    for x, (y, gx, gw) in zip(xs, outs):
        wx, ww, _ = ref_conv2d_backward(gy, x, w, **kw)
        sw = ref_conv2d_backward(np.abs(gy), np.abs(x), np.abs(w), **kw)[1]
        assert_close(np.asarray(y), ref_conv2d(x, w, **kw), forward_scale(x, w, None, kw), "forward")
        assert_close(np.asarray(gx), wx, input_grad_scale(gy, x, w, kw), "grad_input")
        assert_close(np.asarray(gw), ww, sw, "grad_weight")
