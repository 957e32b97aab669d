"""The MSL kernels of metal/conv2d.metal, run on the CPU through the generated entries (the
GEMM and reduction kernels under the fiber emulator, in random thread orders and with
threadgroup sizes that do not divide the tiles): the oracle for the Metal kernels. CPU-only:
the fiber emulator and the cpu backend's conv path switch exist only there (the public
conv2d runs on every device in test_conv2d.py), except the first test, which asks every
device for the kernels."""
from __future__ import annotations

import os

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core

from references import make_problem, check_forward, check_backward, msl_conv_kernels_on_cpu
from thread_harness import threaded_mismatches


kernel_path = pytest.fixture(msl_conv_kernels_on_cpu)


GEMM_TILES = ("128x128", "64x128", "64x64", "32x64")  # csrc/ops/conv2d_gemm.h kTiles


# ----------------------------------------------------------------------------- MSL kernels
def test_conv_kernels_are_built(device):
    gemms = [f"conv2d_{p}_{t}" for p in ("forward", "backward_input", "backward_weight")
             for t in GEMM_TILES]
    for name in (*gemms, "conv2d_forward_direct", "conv2d_backward_input_direct",
                 "conv2d_backward_weight_reduce", "conv2d_backward_weight_narrow4",
                 "conv2d_backward_weight_narrow9", "conv2d_backward_weight_narrow16",
                 "conv2d_sum_splits",
                 "conv2d_bias_grad_chunks", "reduce_sum"):  # reduce_sum: the bias's 2nd pass
        assert _core._has_kernel(device, name), name


# Configurations that reach every kernel: GEMMs with 32- and 64-row tiles (C_out/groups or
# C_in/groups above 32), split-K weight gradients (long N*H_out*W_out), direct kernels and
# reductions (depthwise).
KERNEL_CASES = [
    ((2, 6, 9, 9), (10, 6, 3, 3), dict(padding=1)),                       # 32-row GEMMs
    ((1, 36, 5, 6), (40, 36, 2, 3), dict(padding="same")),                # 64-row GEMMs
    ((3, 6, 12, 11), (8, 3, 3, 2), dict(stride=(2, 3), dilation=(2, 1), groups=2)),
    ((2, 20, 14, 14), (6, 20, 1, 1), dict()),                             # split-K, 1x1
    ((2, 5, 7, 8), (5, 1, 3, 3), dict(padding=(1, 2), groups=5)),         # depthwise
    ((1, 3, 6, 5), (9, 1, 2, 2), dict(padding="same", dilation=2, groups=3)),  # multiplier 3
    ((4, 7, 5, 5), (2, 7, 3, 3), dict(stride=2)),                         # C_out < 5: direct
    # first layers: few weights per output channel, many positions (long split-K)
    ((3, 1, 30, 29), (6, 1, 3, 3), dict(padding=1)),
    ((4, 3, 40, 33), (5, 3, 3, 3), dict(stride=(1, 2), padding=(2, 1), dilation=(2, 1))),
    # at most 16 weights per output channel: conv2d_backward_weight_narrow (channels past a
    # group's 8, groups, strides, dilation, padding; exactly 16 columns; a 1x1 layer)
    ((3, 4, 11, 10), (12, 2, 2, 3), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)),
    ((2, 4, 9, 9), (10, 4, 2, 2), dict(padding=1)),
    ((2, 8, 14, 14), (6, 8, 1, 1), dict()),
]


@pytest.mark.parametrize("case", range(len(KERNEL_CASES)))
@pytest.mark.parametrize("threads,seed", [(256, 1), (37, 2), (64, 3), (300, 4), (1, 5)])
@pytest.mark.cpu_only
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


# Problems whose K range, rows and columns end inside a tile (partial tiles everywhere),
# with strides (the input gradient's division path), padding, groups and split-K.
TILE_CASES = [
    ((2, 20, 9, 11), (70, 20, 3, 3), dict(padding=1)),
    ((3, 9, 10, 7), (12, 3, 3, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=3)),
    ((2, 33, 6, 6), (5, 33, 1, 1), dict()),
]


@pytest.fixture
def forced_tile():
    saved = os.environ.get("FASTMETAL_CONV_TILE")
    yield lambda tile: os.environ.__setitem__("FASTMETAL_CONV_TILE", tile)
    if saved is None:
        os.environ.pop("FASTMETAL_CONV_TILE", None)
    else:
        os.environ["FASTMETAL_CONV_TILE"] = saved


@pytest.mark.parametrize("tile", GEMM_TILES)
@pytest.mark.parametrize("threads,seed", [(0, 1), (0, 2), (45, 3), (512, 4)])
@pytest.mark.cpu_only
def test_every_gemm_tile_on_both_paths(kernel_path, forced_tile, tile, threads, seed):
    """threads 0: the tile's own thread count (the double-buffered fast path); other counts
    take the passes of virtual threads. Random thread order in every group."""
    forced_tile(tile)
    _core._set_conv_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    r = np.random.default_rng(500 + seed)
    for xshape, wshape, kw in TILE_CASES:
        x = r.standard_normal(xshape).astype(np.float32)
        w = r.standard_normal(wshape).astype(np.float32)
        b = r.standard_normal(wshape[0]).astype(np.float32)
        check_forward(x, w, b, kw)
        check_backward(x, w, kw, r)


@pytest.mark.parametrize("splits", ["2", "3", "7"])
@pytest.mark.parametrize("threads,seed", [(0, 1), (45, 2)])
@pytest.mark.cpu_only
def test_forced_split_k_of_both_gradients(kernel_path, monkeypatch, splits, threads, seed):
    """FASTMETAL_CONV_SPLITS splits K of the weight gradient and of the input gradient (whose
    split-K a discrete GPU takes for 1x1 layers with few tiles), every split a slice of the
    workspace, the slices added in order; K ranges that end inside a slice, groups, strides."""
    monkeypatch.setenv("FASTMETAL_CONV_SPLITS", splits)
    _core._set_conv_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    r = np.random.default_rng(700 + seed)
    for xshape, wshape, kw in [((2, 6, 5, 7), (70, 6, 1, 1), dict()),
                               ((1, 8, 9, 8), (36, 4, 3, 3), dict(stride=2, padding=1, groups=2))]:
        x = r.standard_normal(xshape).astype(np.float32)
        w = r.standard_normal(wshape).astype(np.float32)
        check_backward(x, w, kw, r, needs=("input", "weight"))


@pytest.mark.parametrize("needs", [("weight", "bias"), ("weight",), ("bias",),
                                   ("input", "weight", "bias")])
@pytest.mark.parametrize("threads,seed", [(0, 1), (37, 2), (300, 3)])
@pytest.mark.cpu_only
def test_narrow_weight_gradient_with_and_without_its_bias(kernel_path, needs, threads, seed):
    """A first layer's weight gradient (<= 16 weights per output channel) brings the bias
    gradient along from the same pass over grad_output when both are asked for; either
    alone, or with the input gradient, gives the same values (a K range that ends inside
    a chunk, channels past a group's 8)."""
    _core._set_conv_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    r = np.random.default_rng(900 + seed)
    for xshape, wshape, kw in [((3, 1, 17, 19), (11, 1, 3, 3), dict(padding=1)),
                               ((2, 6, 8, 9), (10, 3, 1, 2), dict(stride=(1, 2), groups=2)),
                               ((2, 3, 7, 6), (35, 3, 1, 1), dict(stride=2, padding=1))]:
        x = r.standard_normal(xshape).astype(np.float32)
        w = r.standard_normal(wshape).astype(np.float32)
        check_backward(x, w, kw, r, needs=needs)


@pytest.mark.cpu_only
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


# The bias gradient a GPU computes: conv2d_bias_grad_chunks (a channel's sums over chunks of
# positions) then reduce.metal's row sum per channel, here with the reductions' MSL kernels too (the
# CPU's native rows off). Shapes: one image (the row sum alone, its rows long enough to be
# split into segments: >= 8192 elements), one partial chunk, several chunks of 1,024
# positions, the last partial; NaN and inf stay in their channel.
BIAS_CASES = [((1, 3, 7, 9), 1), ((5, 4, 6, 7), 2), ((1, 2, 96, 100), 3), ((2, 3, 91, 91), 4),
              ((16, 20, 6, 5), 5), ((19, 3, 5, 4), 6)]


@pytest.mark.parametrize("shape,seed", BIAS_CASES)
@pytest.mark.cpu_only
def test_bias_gradient_on_the_gpu_road(kernel_path, shape, seed):
    native = _core._native_cpu()
    _core._set_native_cpu(False)
    try:
        r = np.random.default_rng(seed)
        n, c, h, w = shape
        x = r.standard_normal((n, 2, h + 2, w + 2)).astype(np.float32)
        wt = r.standard_normal((c, 2, 3, 3)).astype(np.float32)
        gy = (r.standard_normal(shape) * 10.0 ** r.integers(-3, 4, shape)).astype(np.float32)
        gy[0, -1, 0, 0] = np.nan
        if c > 2:
            gy[-1, 1, -1, -1] = np.inf
        results = []
        for threads in (0, 37):
            _core._set_kernel_group_size(threads)
            os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
            gb = fm.conv2d_backward(gy, x, wt, needs=("bias",))[2]
            results.append(np.asarray(gb))
            gb2 = np.asarray(fm.conv2d_backward(gy, x, wt, needs=("bias",))[2])
            np.testing.assert_array_equal(gb2, results[-1])  # a fixed order: the same bits
        ref = gy.astype(np.float64).sum(axis=(0, 2, 3))
        scale = np.abs(gy.astype(np.float64)).sum(axis=(0, 2, 3))
        for gb in results:
            assert np.isnan(gb[-1]) and (c <= 2 or gb[1] == np.inf)
            finite = np.isfinite(ref)
            assert np.all(np.abs(gb[finite] - ref[finite]) <= 1e-6 * scale[finite])
    finally:
        _core._set_native_cpu(native)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.cpu_only
def test_msl_kernels_random_configs(kernel_path, seed):
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    _core._set_conv_group_size([0, 48, 100, 129][seed % 4])
    x, w, b, kw, r = make_problem(2000 + seed, small=True)
    check_forward(x, w, b, kw)
    check_backward(x, w, kw, r)


@pytest.mark.cpu_only
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
@pytest.mark.cpu_only
def test_python_threads_calling_at_once(kernel_path, path):
    """The GIL is released while computing: concurrent calls give the serial results."""
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
    assert threaded_mismatches(run, cases, n_threads=4, rounds=3) == []


@pytest.mark.cpu_only
def test_private_switches_validate():
    with pytest.raises(ValueError, match="expected 'fast' or 'kernels'"):
        _core._set_cpu_conv_path("gpu")
    with pytest.raises(ValueError, match="expected 0..4096"):
        _core._set_conv_group_size(-1)
