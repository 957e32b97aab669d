"""fastmetal.matmul (np.matmul semantics), fastmetal.linear / linear_backward (PyTorch
semantics) against NumPy float64 and torch autograd: every device of the suite, hypothesis
over shapes and strides, the tiled MSL kernel of metal/matmul.metal under the CPU fiber
emulator (several threadgroup sizes and seeds), bad arguments."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fastmetal as fm
from fastmetal import _core
from references import msl_kernels_on_cpu


kernels = pytest.fixture(msl_kernels_on_cpu)


def check_matmul(a, b):
    got = fm.matmul(a, b)
    want = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
    assert np.shape(got) == want.shape
    assert np.asarray(got).dtype == np.float32
    k = np.shape(a)[-1]
    tol = 1e-5 * (1 + k) * (1 + np.abs(np.asarray(a)).max(initial=0) * np.abs(np.asarray(b)).max(initial=0))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-4, atol=tol)


SHAPES = [
    ((3,), (3,)),              # 1-D @ 1-D: a scalar
    ((3,), (3, 4)),            # 1-D promoted on the left
    ((2, 3), (3,)),            # ... on the right
    ((5, 2, 3), (3,)),
    ((4,), (2, 4, 5)),
    ((70, 130), (130, 90)),    # several tiles, partial edges
    ((1, 16), (16, 200)),      # one row
    ((33, 1), (1, 65)),        # K = 1
    ((2, 0), (0, 3)),          # K = 0: zeros
    ((0, 4), (4, 3)),          # empty result
    ((2, 1, 5, 6), (3, 6, 7)),  # broadcast batches
    ((4, 3, 8, 9), (1, 3, 9, 2)),
    ((2, 3, 4, 5, 6, 7), (7, 3)),  # more batch dims than the kernel takes (merged)
]


@pytest.mark.parametrize("sa,sb", SHAPES, ids=[f"{a}@{b}" for a, b in SHAPES])
def test_matmul_matches_numpy(device, sa, sb, rng):
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    check_matmul(a, b)


def test_matmul_scalar_result_and_types(device, rng):
    a = rng.standard_normal(5).astype(np.float32)
    r = fm.matmul(a, a)
    assert isinstance(r, np.float32)
    x = rng.standard_normal((6, 7)).astype(np.float32)
    y = fm.matmul(fm.asarray(x), x.T)
    assert isinstance(y, fm.Array) and y.device == device and y.shape == (6, 6)
    np.testing.assert_allclose(y.numpy(), x.astype(np.float64) @ x.T, rtol=1e-4, atol=1e-4)


def test_matmul_strided_views(device, rng):
    base = rng.standard_normal((40, 50)).astype(np.float32)
    check_matmul(base.T, base)                     # transposed operand
    check_matmul(base[::2, ::3], base[:-18:-1, ::-3])  # steps, reversed rows and columns
    batch = rng.standard_normal((3, 50, 40)).astype(np.float32)
    check_matmul(batch.transpose(0, 2, 1)[:, :, ::2], base.T[::2])


def test_matmul_out(device, rng):
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    o = np.empty((4, 3), np.float32)
    assert fm.matmul(a, b, out=o) is o
    np.testing.assert_allclose(o, a @ b, rtol=1e-5, atol=1e-5)
    oa = fm.zeros((4, 3))
    assert fm.matmul(fm.asarray(a), b, out=oa) is oa
    np.testing.assert_allclose(oa.numpy(), a @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"\[fastmetal\.matmul\] expected out"):
        fm.matmul(a, b, out=np.empty((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"\[fastmetal\.matmul\] expected out"):
        fm.matmul(fm.asarray(a), b, out=fm.zeros((3, 4)))


def test_matmul_bad_shapes():
    with pytest.raises(ValueError, match=r"\[fastmetal\.matmul\] expected the last axis .* got "
                                         r"shapes \(2, 3\) and \(4, 5\)"):
        fm.matmul(np.zeros((2, 3)), np.zeros((4, 5)))
    with pytest.raises(ValueError, match=r"\[fastmetal\.matmul\] expected operands of at least 1"):
        fm.matmul(np.float32(2), np.zeros(3))
    with pytest.raises(ValueError, match=r"\[fastmetal\.matmul\] expected batch dimensions that "
                                         r"broadcast"):
        fm.matmul(np.zeros((2, 3, 4)), np.zeros((5, 4, 2)))
    with pytest.raises(ValueError):
        fm.matmul(np.zeros(3), np.zeros(4))
    with pytest.raises(TypeError):
        fm.matmul(np.zeros((2, 2), np.complex64), np.zeros((2, 2)))


@st.composite
def matmul_operands(draw):
    m, k, n = draw(st.integers(1, 40)), draw(st.integers(0, 40)), draw(st.integers(1, 40))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    ba = tuple(d if draw(st.booleans()) else 1 for d in batch)
    seed = draw(st.integers(0, 2**32 - 1))
    r = np.random.default_rng(seed)
    a = r.standard_normal(ba + (m, k)).astype(np.float32)
    b = r.standard_normal(batch + (k, n)).astype(np.float32)
    if draw(st.booleans()):  # a transposed (column-major) operand
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    if draw(st.booleans()):
        b = np.ascontiguousarray(np.swapaxes(b, -1, -2)).swapaxes(-1, -2)
    if draw(st.booleans()) and k > 0:
        # Drop a's last axis: its rows become the contracted axis, which may no longer match
        # b's, and its batch axes shift by one, which may no longer broadcast.
        a = a[..., 0]
    return a, b


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(matmul_operands())
# Batch axes that stop broadcasting once a's last axis is dropped (found by CI's run).
@example((np.ones((2, 1, 1), np.float32), np.ones((2, 3, 1, 1), np.float32)))
def test_hypothesis_fast_path(ops):
    a, b = ops
    try:  # NumPy decides whether the shapes are valid; fastmetal must agree
        np.matmul(a, b)
    except ValueError:
        with pytest.raises(ValueError):
            fm.matmul(a, b)
        return
    check_matmul(a, b)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(matmul_operands(), st.sampled_from([1, 37, 64, 256, 300]))
@example((np.ones((2, 1, 1), np.float32), np.ones((2, 3, 1, 1), np.float32)), 37)
def test_hypothesis_kernels(ops, threads):
    a, b = ops
    try:  # only valid shapes here (test_hypothesis_fast_path checks that errors agree)
        np.matmul(a, b)
    except ValueError:
        return
    saved = _core._native_cpu()
    _core._set_native_cpu(False)
    _core._set_kernel_group_size(threads)
    try:
        check_matmul(a, b)
    finally:
        _core._set_native_cpu(saved)
        _core._set_kernel_group_size(0)


TILES = ("128x128", "64x128", "64x64", "32x64")


def test_matmul_kernels_are_built():
    for tile in TILES:
        for layout in ("", "_kn", "_kk", "_mn", "_mk"):
            assert _core._has_kernel("cpu", f"matmul_{tile}{layout}"), tile + layout
    assert _core._has_kernel("cpu", "matmul_sum_splits")


def layout_cases(r):
    """Operands that reach every load path of the MSL GEMM: row-major (quads along k for A,
    along columns for B), transposed (quads along A's rows / along k for B), odd sizes and
    steps (scalar loads), a misaligned start (scalar), broadcast batches, partial tiles."""
    def f32(*shape):
        return r.standard_normal(shape).astype(np.float32)

    a, b = f32(70, 44), f32(44, 36)
    flat = f32(1 + 40 * 24)
    return [
        (a, b),                                      # _kn
        (a, np.ascontiguousarray(b.T).T),            # _kk
        (np.ascontiguousarray(a.T).T, b),            # _mn
        (np.ascontiguousarray(a.T).T, np.ascontiguousarray(b.T).T),  # _mk
        (f32(33, 45), f32(45, 17)),                  # odd sizes: scalar
        (f32(40, 90)[:, ::2], f32(45, 40)[:, ::3]),  # steps: scalar
        (flat[1:].reshape(40, 24), f32(24, 8)),      # misaligned start: scalar
        (f32(2, 1, 12, 8), f32(3, 8, 20)),           # broadcast batches, quads
        (f32(3, 5, 7), f32(7, 9)[::-1]),             # reversed rows of B
    ]


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("splits", ["", "3"])
def test_msl_gemm_tiles_layouts_splits(kernels, tile, splits, monkeypatch):
    """Every tile shape (forced as the tuning hook does) with every operand layout, with and
    without split-K, under the emulator with the tile's own threadgroup size (the fast,
    double-buffered path) and with 37 threads (the any-size path)."""
    monkeypatch.setenv("FASTMETAL_MATMUL_TILE", tile)
    monkeypatch.setenv("FASTMETAL_MATMUL_SPLITS", splits)
    r = np.random.default_rng(7)
    for threads in (0, 37):
        _core._set_kernel_group_size(threads)
        for a, b in layout_cases(r):
            check_matmul(a, b)


def test_msl_gemm_long_k_splits(kernels):
    """The host's own split choice on a tall-skinny product (few tiles, long K: the MNIST
    layer's shape at a smaller scale), forward and both backward products."""
    r = np.random.default_rng(8)
    x = r.standard_normal((16, 2304)).astype(np.float32)
    w = r.standard_normal((24, 2304)).astype(np.float32)
    gy = r.standard_normal((16, 24)).astype(np.float32)
    np.testing.assert_allclose(fm.linear(x, w), x.astype(np.float64) @ w.T, rtol=1e-4, atol=2e-3)
    gi, gw, _ = fm.linear_backward(gy, x, w, needs=("input", "weight"))
    np.testing.assert_allclose(gi, gy.astype(np.float64) @ w, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(gw, gy.T.astype(np.float64) @ x, rtol=1e-4, atol=1e-3)


TRAINING_SHAPES = [(64, 9216, 128), (128, 784, 400), (128, 400, 20), (256, 256, 256)]


@pytest.mark.parametrize("m,k,n", TRAINING_SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in TRAINING_SHAPES])
def test_training_shapes_forward_backward(device, m, k, n, rng):
    """The MNIST / VAE layers and a square product on every device: linear forward, its
    input gradient (grad @ W) and weight gradient (grad^T @ x, a transposed A)."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    gy = rng.standard_normal((m, n)).astype(np.float32)
    xa, wa, ga = fm.asarray(x), fm.asarray(w), fm.asarray(gy)
    y = fm.linear(xa, wa).numpy()
    gi, gw, _ = fm.linear_backward(ga, xa, wa, needs=("input", "weight"))
    x64, w64, g64 = x.astype(np.float64), w.astype(np.float64), gy.astype(np.float64)
    for got, want, depth in ((y, x64 @ w64.T, k), (gi.numpy(), g64 @ w64, n), (gw.numpy(), g64.T @ x64, m)):
        # float32 accumulation over `depth` terms of unit-variance products
        err = np.abs(got - want).max() / np.sqrt(depth)
        assert err < 1e-5 * np.sqrt(depth) + 1e-5, err


# (m, k, n) past the CPU GEMM's blocks: several K blocks (up to 512 rows of B each), several
# packed blocks of B's columns per task, partial panels and strips, one row, one column.
BLOCKED_SHAPES = [(300, 777, 1000), (37, 130, 2500), (129, 513, 49), (1, 600, 1000),
                  (1000, 300, 1), (257, 64, 65)]


@pytest.mark.parametrize("m,k,n", BLOCKED_SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in BLOCKED_SHAPES])
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt", "steps"])
def test_matmul_blocked_shapes_layouts(device, m, k, n, layout, rng):
    """Larger products than the hypothesis tests draw, with A and B row-major, transposed
    (column-major) or read with steps: on the CPU, the blocked GEMM's packing of both
    operands across K blocks, column blocks and thread tasks."""
    def operand(rows, cols, transposed):
        if layout == "steps":  # every other row, every third column, reversed
            return rng.standard_normal((2 * rows, 3 * cols)).astype(np.float32)[::2, ::-3]
        if transposed:
            return np.ascontiguousarray(rng.standard_normal((cols, rows)).astype(np.float32)).T
        return rng.standard_normal((rows, cols)).astype(np.float32)
    check_matmul(operand(m, k, layout[0] == "t"), operand(k, n, layout[1:] == "t"))


# Tall or long-K products that the CPU GEMM cuts into tiles whose tasks pack their own A
# (Split::tiles, 2 threads or more): a transformer's rows x d_model layers, its weight
# gradients (K = the rows), a single column, strips and panels cut short.
TILE_SHAPES = [(1003, 77, 33), (2050, 40, 97), (200, 3001, 45), (333, 1000, 1), (1, 4000, 130)]


@pytest.mark.parametrize("m,k,n", TILE_SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in TILE_SHAPES])
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "steps"])
def test_matmul_tile_shapes_layouts(device, m, k, n, layout, rng):
    def operand(rows, cols, transposed):
        if layout == "steps":
            return rng.standard_normal((2 * rows, 3 * cols)).astype(np.float32)[::2, ::-3]
        if transposed:
            return np.ascontiguousarray(rng.standard_normal((cols, rows)).astype(np.float32)).T
        return rng.standard_normal((rows, cols)).astype(np.float32)
    check_matmul(operand(m, k, layout[0] == "t"), operand(k, n, layout[1:] == "t"))


def test_linear_backward_tile_shapes(device, rng):
    """linear forward and backward at a GPT's shapes cut short (rows not a multiple of the
    strips, features not of the panels), and with no rows at all."""
    for rows, fin, fout in ((1030, 129, 385), (999, 515, 131), (0, 64, 32)):
        x = rng.standard_normal((rows, fin)).astype(np.float32)
        w = rng.standard_normal((fout, fin)).astype(np.float32)
        gy = rng.standard_normal((rows, fout)).astype(np.float32)
        xa, wa, ga = fm.asarray(x), fm.asarray(w), fm.asarray(gy)
        y = fm.linear(xa, wa).numpy()
        gi, gw, gb = fm.linear_backward(ga, xa, wa, needs=("input", "weight", "bias"))
        x64, w64, g64 = x.astype(np.float64), w.astype(np.float64), gy.astype(np.float64)
        for got, want, depth in ((y, x64 @ w64.T, fin), (gi.numpy(), g64 @ w64, fout),
                                 (gw.numpy(), g64.T @ x64, rows), (gb.numpy(), g64.sum(0), rows)):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * (1 + depth))


@pytest.mark.parametrize("m", [12, 40, 200])
def test_linear_weight_views(device, m, rng):
    """linear's W^T read through views: rows of a wider weight (a pitch longer than K) and
    rows in reverse order. On the CPU, 12 rows take the dot-product path and 40 and 200 the
    GEMM, whose packing of W^T transposes blocks of 8 columns x 8 k in registers (K = 777 and
    131 columns: partial blocks along both)."""
    x = rng.standard_normal((m, 777)).astype(np.float32)
    wide = rng.standard_normal((131, 790)).astype(np.float32)
    for w in (wide[:, 5:782], wide[::-1, :777]):
        np.testing.assert_allclose(np.asarray(fm.linear(x, w), np.float64),
                                   x.astype(np.float64) @ w.astype(np.float64).T,
                                   rtol=1e-4, atol=1e-3)


def test_matmul_blocked_broadcast_batches(device, rng):
    a = rng.standard_normal((2, 1, 70, 300)).astype(np.float32)
    b = rng.standard_normal((3, 300, 530)).astype(np.float32)
    check_matmul(a, b)
    check_matmul(a, b[0].T.copy().T)  # one B (column-major) for every batch
    # Products with more than 2**20 floats of A each: A packed and used in groups of row
    # chunks, one product per thread (a batch) and one product shared by the threads.
    big = rng.standard_normal((4, 1100, 1000)).astype(np.float32)
    check_matmul(big, rng.standard_normal((1000, 20)).astype(np.float32))
    check_matmul(big[0], rng.standard_normal((1000, 40)).astype(np.float32))


def test_matmul_empty_batches_and_zero_k(device):
    assert fm.matmul(np.zeros((0, 3, 4), np.float32), np.zeros((4, 5), np.float32)).shape == (0, 3, 5)
    got = fm.matmul(fm.asarray(np.ones((2, 8, 0), np.float32)), np.ones((0, 12), np.float32))
    np.testing.assert_array_equal(got.numpy(), np.zeros((2, 8, 12), np.float32))


@pytest.mark.parametrize("threads,seed", [(256, 1), (37, 2), (64, 3), (300, 4), (1, 5)])
def test_msl_kernel_under_the_emulator(kernels, threads, seed):
    _core._set_kernel_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    r = np.random.default_rng(seed)
    cases = [((70, 45), (45, 66)), ((2, 20, 17), (17, 3)), ((5,), (5, 70))]
    if threads == 1:
        cases = cases[1:]  # one thread per group: small cases only (slow under the emulator)
    for sa, sb in cases:
        check_matmul(r.standard_normal(sa).astype(np.float32), r.standard_normal(sb).astype(np.float32))
    w = r.standard_normal((9, 17)).astype(np.float32)
    x = r.standard_normal((4, 17)).astype(np.float32)
    np.testing.assert_allclose(fm.linear(x, w), x.astype(np.float64) @ w.T, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- linear
def linear_reference(x, w, b):
    y = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    return y if b is None else y + b


@pytest.mark.parametrize("xshape", [(5,), (7, 12), (2, 3, 12), (0, 12)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_forward_backward_numpy(device, xshape, with_bias, rng):
    inf, outf = 12, 9
    x = rng.standard_normal(xshape[:-1] + (inf,)).astype(np.float32) if len(xshape) > 1 else \
        rng.standard_normal(inf).astype(np.float32)
    w = rng.standard_normal((outf, inf)).astype(np.float32)
    b = rng.standard_normal(outf).astype(np.float32) if with_bias else None
    y = fm.linear(x, w, b)
    np.testing.assert_allclose(y, linear_reference(x, w, b), rtol=1e-5, atol=1e-4)
    gy = rng.standard_normal(np.shape(y)).astype(np.float32)
    gi, gw, gb = fm.linear_backward(gy, x, w)
    g2 = gy.reshape(-1, outf).astype(np.float64)
    x2 = x.reshape(-1, inf).astype(np.float64)
    np.testing.assert_allclose(gi, gy.astype(np.float64) @ w, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gw, g2.T @ x2, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gb, g2.sum(0), rtol=1e-5, atol=1e-4)
    only = fm.linear_backward(gy, x, w, needs=("weight",))
    assert only[0] is None and only[2] is None
    np.testing.assert_array_equal(only[1], gw)


# (rows, in, out): the dot path (few rows, or few columns), the GEMM's tiles, its shared packed
# A, the small one-task product, K past one block (513), partial panels, K = 0, one column.
BIAS_SHAPES = [(5, 200, 40), (40, 300, 20), (64, 256, 1024), (300, 130, 70), (9, 600, 33),
               (3, 7, 5), (6, 0, 17), (70, 64, 1), (2048, 64, 256)]


@pytest.mark.parametrize("rows,inf,outf", BIAS_SHAPES, ids=[f"{r}x{i}x{o}" for r, i, o in BIAS_SHAPES])
def test_linear_bias_equals_product_plus_bias_bit_for_bit(device, rows, inf, outf, rng):
    """linear's bias, added by the CPU GEMM to each tile as it stores it (native op
    matmul_bias), equals the product and a separate add bit for bit (one rounding of the same
    sum), NaN, inf and -0.0 in the bias included; and float64 NumPy within rounding."""
    x = rng.standard_normal((2, rows, inf)).astype(np.float32)
    w = rng.standard_normal((outf, inf)).astype(np.float32)
    b = rng.standard_normal(outf).astype(np.float32)
    b[:3] = [np.nan, np.inf, -0.0][:outf]
    xa, wa, ba = fm.asarray(x), fm.asarray(w), fm.asarray(b)
    got = fm.linear(xa, wa, ba).numpy()
    np.testing.assert_array_equal(got, (fm.linear(xa, wa) + ba).numpy())
    assert np.array_equal(np.signbit(got), np.signbit((fm.linear(xa, wa) + ba).numpy()))
    want = linear_reference(x, w, b.astype(np.float64))
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T + np.abs(b)
    ok = np.isfinite(want)
    np.testing.assert_array_equal(got[~ok], want[~ok].astype(np.float32))
    assert (np.abs(got[ok] - want[ok]) <= 1e-5 * scale[ok] + 1e-6).all()


def test_linear_bias_float64(device, rng):
    """float64 linear with a bias: NumPy's sum within double rounding."""
    if device == "metal":
        pytest.skip("float64: Apple GPUs have no double")
    x = rng.standard_normal((7, 30))
    w = rng.standard_normal((11, 30))
    b = rng.standard_normal(11)
    got = fm.linear(fm.asarray(x), fm.asarray(w), fm.asarray(b)).numpy()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, x @ w.T + b, rtol=1e-12, atol=1e-12)


def test_linear_against_torch_autograd(device, rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((4, 6, 33)).astype(np.float32)
    w = rng.standard_normal((70, 33)).astype(np.float32)
    b = rng.standard_normal(70).astype(np.float32)
    gy = rng.standard_normal((4, 6, 70)).astype(np.float32)
    tx, tw, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, w, b))
    ty = torch.nn.functional.linear(tx, tw, tb)
    ty.backward(torch.tensor(gy, dtype=torch.float64))
    xa, wa = fm.asarray(x), fm.asarray(w)
    y = fm.linear(xa, wa, b)
    assert isinstance(y, fm.Array)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-4)
    gi, gw, gb = fm.linear_backward(fm.asarray(gy), xa, wa)
    for got, want in ((gi, tx.grad), (gw, tw.grad), (gb, tb.grad)):
        assert isinstance(got, fm.Array)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-3)


def test_linear_bad_arguments():
    x = np.zeros((2, 3), np.float32)
    w = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"\[fastmetal\.linear\] expected a 2-D weight"):
        fm.linear(x, np.zeros(3))
    with pytest.raises(ValueError, match=r"\[fastmetal\.linear\] expected x of shape \(\*, "
                                         r"in_features\) with in_features = 5"):
        fm.linear(x, np.zeros((4, 5)))
    with pytest.raises(ValueError, match=r"\[fastmetal\.linear\] expected bias of shape \(4,\)"):
        fm.linear(x, w, np.zeros(3))
    with pytest.raises(ValueError, match=r"\[fastmetal\.linear_backward\] expected grad_output "
                                         r"of shape \(2, 4\)"):
        fm.linear_backward(np.zeros((2, 3)), x, w)
    with pytest.raises(ValueError, match=r"\[fastmetal\.linear_backward\] expected needs"):
        fm.linear_backward(np.zeros((2, 4)), x, w, needs=("inputs",))
    with pytest.raises(ValueError, match=r"\[fastmetal\.linear_backward\] expected needs"):
        fm.linear_backward(np.zeros((2, 4)), x, w, needs="input")


def test_cpu_products_same_bits_for_any_thread_count():
    """The CPU's GEMM (several K blocks, column blocks and tasks in c @ d; a transposed B
    packed, linear's x @ W^T at 37 rows; groups of row chunks in e @ d; tiles packing their
    own A in linear(h, ...) and e.T @ e[:, :50]) and its dot-product
    path (linear at 12 rows) give the same bits whatever the pool size (each element's sum
    runs in a fixed order; threads only take tiles)."""
    import subprocess
    import sys
    code = (
        "import hashlib, numpy as np, fastmetal as fm\n"
        "fm.set_default_device('cpu')\n"
        "r = np.random.default_rng(5)\n"
        "x = r.standard_normal((37, 3000)).astype(np.float32)\n"
        "w = r.standard_normal((101, 3000)).astype(np.float32)\n"
        "a = r.standard_normal((300, 200)).astype(np.float32)\n"
        "g = r.standard_normal((37, 64)).astype(np.float32)\n"
        "v = r.standard_normal((64, 320)).astype(np.float32)\n"
        "c = r.standard_normal((150, 700)).astype(np.float32)\n"
        "d = r.standard_normal((700, 1100)).astype(np.float32)\n"
        "e = r.standard_normal((1600, 700)).astype(np.float32)\n"
        "h = r.standard_normal((2000, 130)).astype(np.float32)\n"
        "outs = [fm.linear(x, w), fm.linear(x[:12], w), fm.matmul(a, a.T[:, :150]), fm.matmul(a.T, a), fm.matmul(g, v),\n"
        "        fm.matmul(c, d), fm.matmul(c.T.copy().T, d.T.copy().T), fm.matmul(e, d[:, :40]),\n"
        "        fm.linear(h, w[:, :130]), fm.matmul(e.T, e[:, :50])]\n"
        "print(hashlib.sha256(b''.join(np.ascontiguousarray(o).tobytes() for o in outs)).hexdigest())\n")
    digests = set()
    for threads in (1, 2, 3):
        env = dict(os.environ, FASTMETAL_NUM_THREADS=str(threads))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        digests.add(r.stdout.split()[-1])
    assert len(digests) == 1, digests


def test_bench_matmul_runs_on_the_cpu(capsys):
    """`python -m fastmetal bench matmul` on the cpu device: every row printed with its
    GFLOP/s and ratios (a short budget; torch's column is '-' where torch is missing)."""
    from fastmetal.benchmarks.matmul import main
    saved = fm.default_device()
    try:
        assert main(["--device", "cpu", "--quick", "--budget", "0.001", "--interleave"]) == 0
    finally:
        fm.set_default_device(saved)
    out = capsys.readouterr().out
    for case in ("matmul 1024^2", "MNIST fc1 64x9216->128 fwd linear+bias", "grad_w g^T@x"):
        assert case in out, out
    from fastmetal.benchmarks.matmul import openblas_core
    core = openblas_core()  # NumPy's OpenBLAS kernels, named in the header where found
    assert core is None or f"numpy: OpenBLAS {core} kernels" in out, out
    assert out.count("G ") >= 2 * 11


# ----------------------------------------------------------------------------- float64
# float64 operands multiply in double (cpu: a blocked double GEMM; cuda: matmul_float64 of
# metal/matmul.metal, no TF32): within 1e-12 of the size of the terms, |A| @ |B|, of NumPy
# float64 (a K-term sum in double rounds by at most K eps of it: K <= 300 here).
def check_matmul64(a, b, ah=None, bh=None):
    ah = np.asarray(a) if ah is None else ah
    bh = np.asarray(b) if bh is None else bh
    got = fm.matmul(a, b)
    got = np.asarray(got.numpy() if isinstance(got, fm.Array) else got)
    want = np.matmul(ah.astype(np.float64), bh.astype(np.float64))
    assert got.shape == want.shape and got.dtype == np.float64, (got.shape, got.dtype)
    scale = np.matmul(np.abs(ah).astype(np.float64), np.abs(bh).astype(np.float64))
    np.testing.assert_array_less(np.abs(got - want), 1e-12 * scale + 1e-300)


@pytest.mark.parametrize("sa,sb", SHAPES, ids=[f"{a}@{b}" for a, b in SHAPES])
def test_float64_matmul_matches_numpy(device, sa, sb, rng):
    if device == "metal":
        pytest.skip("float64: Apple GPUs have no double")
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    check_matmul64(a, b)
    check_matmul64(fm.asarray(a), fm.asarray(b), a, b)


def test_float64_matmul_views_promotion_and_specials(device, rng):
    if device == "metal":
        pytest.skip("float64: Apple GPUs have no double")
    a = rng.standard_normal((40, 300))
    b = rng.standard_normal((70, 300))
    # transposed and strided Arrays: the GEMM reads through the strides
    check_matmul64(fm.asarray(a)[::2], fm.asarray(b).T, a[::2], b.T)
    check_matmul64(fm.asarray(a).T[::-3], fm.asarray(b)[:, :40].T, a.T[::-3], b[:, :40].T)
    # a float32 operand with a float64 one: float64, as NumPy
    c = rng.standard_normal((300, 9)).astype(np.float32)
    check_matmul64(a, c)
    # inf and NaN propagate as in NumPy's float64 product
    x = np.array([[1.0, np.inf], [np.nan, 2.0]])
    y = np.array([[1.0, 0.5], [2.0, -1.0]])
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(fm.matmul(x, y), x @ y)
    z = fm.matmul(np.zeros((2, 0)), np.zeros((0, 3)))
    assert z.dtype == np.float64 and not z.any()


@pytest.mark.parametrize("threads", [1, 37, 256, 300])
def test_float64_msl_gemm_any_group_size(kernels, threads, rng):
    """The float64 tile kernel under the CPU emulator: any threadgroup size (passes of its 256
    virtual threads), partial tiles, batches, strided operands."""
    _core._set_kernel_group_size(threads)
    a = rng.standard_normal((2, 70, 21))
    b = rng.standard_normal((21, 66))
    check_matmul64(fm.asarray(a), fm.asarray(b), a, b)
    check_matmul64(fm.asarray(b).T, fm.asarray(a)[1].T, b.T, a[1].T)
