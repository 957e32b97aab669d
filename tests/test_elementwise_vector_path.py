"""Elementwise ops at every length and alignment. GPU devices run contiguous ops in 16-byte
chunks (4 float32 or 8 float16 elements), 4 chunks a thread (the *_w kernels), with the
elements past the last whole thread, and operands not aligned to 16 bytes, on the
one-element kernel; row-broadcast binary ops ((R, L) with (1, L), sliced rows) run as rows
of whole chunks, 4 rows a thread (binary_rw), when every row is whole, aligned chunks.
Every split must give NumPy's values."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core

from fastmetal.ops.optable import OPS
from fastmetal.ops.elementwise import FUNCTIONS as OP
from helpers import skip_without_float64
from references import elementwise_rtol, numpy_reference


@pytest.fixture(params=["device's choice", "wide everywhere"])
def wide(request):
    """GPUs take the wide kernels anyway; forcing them everywhere runs them on the CPU too
    (through its emulation of the MSL kernels), so CI without a GPU checks them."""
    _core._set_wide_elementwise(request.param == "wide everywhere")
    yield
    _core._set_wide_elementwise(False)


def _check(got, want, dtype):
    got = np.asarray(got)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(dtype).astype(np.float64),
                               rtol=elementwise_rtol(fm.default_device(), dtype), atol=1e-6)


# float64 has no wide kernels: the host must take the one-element ones whatever it is told.
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
# One wide thread is 16 float32 or 32 float16 elements: lengths around multiples of both.
@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1001, 4099])
def test_every_length_and_offset(device, wide, dtype, n):
    if dtype == np.float64:
        skip_without_float64(device)
    rng = np.random.default_rng(n)
    base_x = rng.uniform(-3, 3, n + 8).astype(dtype)
    base_y = rng.uniform(0.5, 3, n + 8).astype(dtype)
    xd, yd = fm.asarray(base_x), fm.asarray(base_y)
    # offsets in elements: (0, 0) and (8, 8) keep every operand 16-byte aligned for both
    # dtypes, (4, 4) only for float32; the others misalign one operand or both
    for sx, sy in [(0, 0), (1, 1), (0, 3), (2, 0), (4, 4), (8, 8)]:
        x, y = xd[sx:sx + n], yd[sy:sy + n]
        hx = base_x[sx:sx + n].astype(np.float64)
        hy = base_y[sy:sy + n].astype(np.float64)
        _check(fm.exp(x), np.exp(hx), dtype)
        _check(fm.sigmoid(x), 1 / (1 + np.exp(-hx)), dtype)
        _check(fm.add(x, y), hx + hy, dtype)
        _check(fm.divide(x, y), hx / hy, dtype)
        out = fm.asarray(np.full(n + 1, np.nan, dtype))[1:]  # written in place, misaligned
        fm.multiply(x, y, out=out)
        _check(out, hx * hy, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_special_values_and_in_place_on_the_wide_path(device, wide, dtype):
    # NaN, infinities, signed zeros and subnormals in every lane of every chunk of a thread,
    # then the same op in place (out is x: each thread reads its chunks before it writes them).
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3.5, 2.0], dtype)
    base = np.tile(specials, 40)[: 5 * 64 + 7]
    for shift in range(1, 4):
        x = np.roll(base, shift)
        with np.errstate(all="ignore"):
            want = {"sigmoid": 1 / (1 + np.exp(-x.astype(np.float64))),
                    "exp": np.exp(x.astype(np.float64)), "relu": np.maximum(x, 0).astype(np.float64)}
        for name, ref in want.items():
            got = np.asarray(OP[name](fm.asarray(x)))
            np.testing.assert_allclose(got.astype(np.float64), ref.astype(dtype).astype(np.float64),
                                       rtol=elementwise_rtol(fm.default_device(), dtype), atol=0,
                                       equal_nan=True)
        y = x[::-1].copy()
        with np.errstate(all="ignore"):
            want_sum = x + y
        xd = fm.asarray(x.copy())
        fm.add(xd, fm.asarray(y), out=xd)
        np.testing.assert_array_equal(np.asarray(xd), want_sum)


ROW_SHAPES = [(1, 8), (3, 8), (4, 16), (5, 16), (9, 40), (13, 64), (6, 7), (4, 12), (2, 4)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_row_broadcast_every_shape(device, wide, dtype, shape, rng):
    if dtype == np.float64:
        skip_without_float64(device)
    # (R, L) with (1, L) on either side, and with a full (R, L) operand read through sliced
    # rows: row counts that are no multiple of 4 rows a thread, rows of whole chunks and not.
    # add and multiply of float16 or float32 operands are exact in float32, so every path
    # must equal NumPy bit for bit.
    rows, cols = shape
    m = rng.uniform(-4, 4, (rows, cols)).astype(dtype)
    r = rng.uniform(-4, 4, (1, cols)).astype(dtype)
    md, rd = fm.asarray(m), fm.asarray(r)
    np.testing.assert_array_equal(np.asarray(fm.add(md, rd)), m + r)
    np.testing.assert_array_equal(np.asarray(fm.add(rd, md)), r + m)
    np.testing.assert_array_equal(np.asarray(fm.multiply(rd, md)), r * m)
    np.testing.assert_array_equal(np.asarray(fm.subtract(md, rd)), m - r)
    wide_m = rng.uniform(-4, 4, (rows + 1, cols + 8)).astype(dtype)
    for view in (np.s_[:rows, :cols], np.s_[1:, :cols], np.s_[1:, 8:], np.s_[1:, 1:cols + 1],
                 np.s_[rows:0:-1, :cols]):  # the last: rows in reverse order
        sub = fm.asarray(wide_m)[view]
        np.testing.assert_array_equal(np.asarray(fm.add(sub, rd)), wide_m[view] + r)
        np.testing.assert_array_equal(np.asarray(fm.multiply(sub, md)), wide_m[view] * m)
    # into a misaligned out= view, and into a sliced one
    out = fm.asarray(np.full(rows * cols + 1, np.nan, dtype))[1:].reshape(rows, cols)
    fm.add(md, rd, out=out)
    np.testing.assert_array_equal(np.asarray(out), m + r)
    out2 = fm.asarray(np.full((rows, cols + 8), np.nan, dtype))[:, 8:]
    fm.add(rd, md, out=out2)
    np.testing.assert_array_equal(np.asarray(out2), r + m)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_row_broadcast_special_values(device, wide, dtype):
    row = np.array([[np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -2.5, 3.0]], dtype)
    m = np.tile(np.array([1.0, -np.inf, np.inf, 0.0, -0.0, np.nan, 2.0, -1.0], dtype), (5, 1))
    with np.errstate(all="ignore"):
        for op in ("add", "maximum", "minimum", "divide"):
            got = np.asarray(OP[op](fm.asarray(m), fm.asarray(row)))
            want = getattr(np, op)(m.astype(np.float32), row.astype(np.float32)).astype(dtype)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["gelu", "sigmoid", "exp", "tanh"])
def test_every_float16_value_within_one_ulp(device, name):
    # Every finite float16 (the wide kernels take 8 a chunk) against the float64 reference
    # rounded to float16: within 1 float16 ulp (float16 gelu has its own, shorter body).
    x = np.arange(65536, dtype=np.uint16).view(np.float16)
    x = x[np.isfinite(x)]
    spec = next(s for s in OPS if s.name == name)
    ref = numpy_reference(spec, x.astype(np.float64))
    with np.errstate(all="ignore"):
        want = ref.astype(np.float16)
    got = np.asarray(OP[name](fm.asarray(x)))
    assert got.dtype == np.float16
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite])
    with np.errstate(all="ignore"):
        spacing = np.spacing(np.abs(want[finite])).astype(np.float64)
    err = np.abs(got[finite].astype(np.float64) - want[finite].astype(np.float64)) / spacing
    i = int(np.argmax(err))
    assert err[i] <= 1.0, f"{name}({x[finite][i]!r}) = {got[finite][i]!r}, want {want[finite][i]!r}"


@pytest.mark.parametrize("grid", ["1", "2", "3", "5", "64", "device"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_grid_of_the_wide_kernels(device, wide, monkeypatch, dtype, grid):
    # The host's tuning hook picks how many chunks a thread takes (FASTMETAL_ELEMENTWISE_GRID:
    # J chunks a thread, or a grid-stride loop over a device-sized grid): the kernels' main
    # loop, 4 chunks at a time, and their one-chunk remainder loop must cover every chunk once.
    monkeypatch.setenv("FASTMETAL_ELEMENTWISE_GRID", grid)
    rng = np.random.default_rng(7)
    for n in (4, 9, 100, 1001, 4099, 70001):
        x = rng.uniform(-3, 3, n).astype(dtype)
        y = rng.uniform(0.5, 3, n).astype(dtype)
        hx, hy = x.astype(np.float64), y.astype(np.float64)
        _check(fm.sigmoid(fm.asarray(x)), 1 / (1 + np.exp(-hx)), dtype)
        np.testing.assert_array_equal(np.asarray(fm.add(fm.asarray(x), fm.asarray(y))), x + y)
        _check(fm.divide(fm.asarray(x), fm.asarray(y)), hx / hy, dtype)
