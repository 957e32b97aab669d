"""The Winograd F(2x2, 3x3) path of conv2d (metal/conv_winograd.metal and the WinogradForward /
WinogradWeight GEMMs of metal/conv2d.metal): forward, input gradient and weight gradient of
stride-1, dilation-1, 3x3, single-group convolutions, against the NumPy float64 reference and
torch autograd, on every device (on cpu: the MSL kernels under the fiber emulator, since the
CPU's own conv engine has no Winograd path), with the algorithm forced through
FASTMETAL_CONV_ALGO=winograd.

Tolerance: the shared bound of references.assert_close, |got - want| <= 1e-4 * scale, scale
the same convolution of |x| and |w|. F(2x2, 3x3) rounds differently from the direct sum:
its error is at most (terms + ~10) * eps times the convolution of |x| and |w| through the
absolute transform matrices |A^T|, |G|, |B^T|, which is at most ~7x `scale` (2.7x per axis:
a tap's weight enters up to three transform points, each scaled by at most 1), so for the
channel counts here (< 100 terms) the worst case is 7 * 110 * 6e-8 = 4.6e-5 * scale, below
the bound; an indexing or transform bug is O(scale) and fails it. The weight gradient sums
over tiles (N * H_out * W_out / 4 terms, < 300 here) with the same factor.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core

from references import (assert_close, check_backward, check_forward, msl_conv_kernels_on_cpu,
                        ref_conv2d, ref_conv2d_backward)

kernel_path = pytest.fixture(msl_conv_kernels_on_cpu)

WINOGRAD_KERNELS = ("conv2d_winograd_weight", "conv2d_winograd_input", "conv2d_winograd_output",
                    "conv2d_winograd_grad_output", "conv2d_winograd_weight_grad",
                    *(f"conv2d_winograd_{p}gemm_{t}" for p in ("", "weight_")
                      for t in ("128x128", "64x128", "64x64", "32x64")))


@pytest.fixture
def winograd(monkeypatch, device):
    """Forces the Winograd path; on cpu the MSL kernels run (under the fiber emulator)."""
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", "winograd")
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
    torch = pytest.importorskip("torch")
    x, w, b, kw, r = winograd_problem(700 + seed)
    if b is None:
        b = np.zeros(w.shape[0], np.float32)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
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


def test_forced_gemm_and_winograd_agree(monkeypatch, device):
    """The two algorithms on one layer, each within the bound of the other's reference."""
    r = np.random.default_rng(23)
    x = r.standard_normal((2, 24, 10, 9)).astype(np.float32)
    w = r.standard_normal((40, 24, 3, 3)).astype(np.float32)
    gy = r.standard_normal((2, 40, 10, 9)).astype(np.float32)
    out = {}
    for algo in ("gemm", "winograd"):
        monkeypatch.setenv("FASTMETAL_CONV_ALGO", algo)
        out[algo] = (fm.conv2d(x, w, padding=1), *fm.conv2d_backward(gy, x, w, padding=1)[:2])
    scales = (ref_conv2d(np.abs(x), np.abs(w), padding=1),
              *ref_conv2d_backward(np.abs(gy), np.abs(x), np.abs(w), padding=1)[:2])
    for what, a, b, s in zip(("forward", "grad_input", "grad_weight"), out["gemm"],
                             out["winograd"], scales):
        assert_close(a, np.asarray(b, np.float64), 2 * s, what)


# ------------------------------------------------------------------ the fiber emulator (cpu)
EMULATOR_CASES = [
    ((2, 6, 9, 7), (10, 6, 3, 3), dict(padding=1)),        # 32-row tiles, partial tiles
    ((1, 36, 6, 5), (40, 36, 3, 3), dict(padding=(0, 2))),  # 64-row tiles
    ((2, 5, 26, 22), (7, 5, 3, 3), dict(padding=0)),        # split-K weight gradient
]


@pytest.mark.parametrize("case", range(len(EMULATOR_CASES)))
@pytest.mark.parametrize("threads,seed", [(0, 1), (37, 2), (300, 3), (1, 4)])
@pytest.mark.cpu_only
def test_under_the_emulator_in_random_thread_order(kernel_path, monkeypatch, case, threads, seed):
    """Random fiber order in every group; threads 0 = the GEMM tile's own count (the
    double-buffered path), others the passes of virtual threads."""
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", "winograd")
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


@pytest.mark.parametrize("tile", ("128x128", "64x128", "64x64", "32x64"))
@pytest.mark.parametrize("splits", ("", "3"))
@pytest.mark.cpu_only
def test_every_gemm_tile_and_split_count(kernel_path, monkeypatch, tile, splits):
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", "winograd")
    monkeypatch.setenv("FASTMETAL_CONV_TILE", tile)
    monkeypatch.setenv("FASTMETAL_CONV_SPLITS", splits)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(len(tile) + len(splits))
    r = np.random.default_rng(61)
    x = r.standard_normal((2, 20, 11, 9)).astype(np.float32)
    w = r.standard_normal((70, 20, 3, 3)).astype(np.float32)
    check_forward(x, w, r.standard_normal(70).astype(np.float32), dict(padding=1))
    check_backward(x, w, dict(padding=1), r)
