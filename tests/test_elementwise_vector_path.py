"""Contiguous elementwise ops at every length and alignment: GPU devices run them four
elements a thread (vec<T, 4> accesses) with the last n % 4 elements, and operands not aligned
to the vector, on the one-element kernel; every split must give NumPy's values."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core

from references import elementwise_rtol


@pytest.fixture(params=["device's choice", "vec4 everywhere"])
def wide(request):
    """GPUs take the vec4 kernels anyway; forcing them everywhere runs them on the CPU too
    (through its emulation of the MSL kernels), so CI without a GPU checks them."""
    _core._set_wide_elementwise(request.param == "vec4 everywhere")
    yield
    _core._set_wide_elementwise(False)


def _check(got, want, dtype):
    got = np.asarray(got)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(dtype).astype(np.float64),
                               rtol=elementwise_rtol(fm.default_device(), dtype), atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 1001, 4099])
def test_every_length_and_offset(device, wide, dtype, n):
    rng = np.random.default_rng(n)
    base_x = rng.uniform(-3, 3, n + 3).astype(dtype)
    base_y = rng.uniform(0.5, 3, n + 3).astype(dtype)
    xd, yd = fm.asarray(base_x), fm.asarray(base_y)
    for sx, sy in [(0, 0), (1, 1), (0, 3), (2, 0)]:
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
