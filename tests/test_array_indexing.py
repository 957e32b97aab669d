"""Advanced indexing of fastmetal.Array against NumPy on every device: integer index
arrays (NumPy, lists, int64 Arrays) and boolean masks (NumPy bool arrays, fastmetal float
masks) beside slices, None and ..., reading (a gathered copy) and assignment (in place),
hypothesis over shapes, strides and positions, and NumPy's IndexErrors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastmetal as fm
from fastmetal import _core
from helpers import host

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
DTYPES = [np.float32, np.float16, np.int64]


def make(shape, dtype, seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal(shape) * 50).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_integer_array_indexing(device, dtype):
    x = make((5, 6, 4), dtype)
    a = fm.asarray(x, dtype=dtype)
    idx = np.array([[4, 0], [-1, 2]])
    for key in [idx, [3, 3, 0], (slice(None), idx), (..., [1, -4]), (slice(1, None), None, [0, 5]),
                (slice(None, None, -2), slice(None), np.array([3, 0, 1])), np.array([], np.int64)]:
        got = a[key]
        want = x[key]
        assert isinstance(got, fm.Array) and got.dtype == dtype and got.device == device
        assert got.shape == want.shape, key
        np.testing.assert_array_equal(host(got), want)
    ia = fm.asarray(np.array([2, 0, -1]), dtype="int64")  # an index on the device
    np.testing.assert_array_equal(host(a[:, ia]), x[:, [2, 0, -1]])
    pred = fm.asarray(x[:, :, 0].astype(np.float32)).argmax(1)  # argmax result as an index
    np.testing.assert_array_equal(host(a[:, pred]), x[:, x[:, :, 0].astype(np.float32).argmax(1)])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_boolean_mask_indexing(device, dtype):
    x = make((4, 5, 3), dtype, 1)
    a = fm.asarray(x, dtype=dtype)
    m2 = x[:, :, 0] > 0
    for key in [m2, x > 0, (slice(None), m2[0]), (m2, slice(None, None, -1)), (..., x[0, 0] > 0),
                np.zeros((4,), bool)]:
        want = x[key]
        got = a[key]
        assert got.shape == want.shape
        np.testing.assert_array_equal(host(got), want)
    # fastmetal masks (float32 1.0/0.0 from comparisons) select as NumPy's bool masks
    if dtype != np.int64:
        np.testing.assert_array_equal(host(a[a > 0]), x[x > 0])
    fmask = fm.asarray(m2.astype(np.float32))
    np.testing.assert_array_equal(host(a[fmask]), x[m2])
    np.testing.assert_array_equal(host(a[fm.asarray(m2.astype(np.float16))]), x[m2])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_advanced_assignment(device, dtype):
    x = make((4, 5), dtype, 2)
    a = fm.asarray(x, dtype=dtype)
    m = x > 0
    a[m] = 0
    x[m] = 0
    a[[0, 2]] = np.arange(5)
    x[[0, 2]] = np.arange(5)
    a[:, np.array([-1, 1])] = fm.asarray(np.array([[7], [8], [9], [10]]), dtype=dtype)
    x[:, np.array([-1, 1])] = np.array([[7], [8], [9], [10]])
    mm = fm.asarray((x < 5).astype(np.float32))
    a[mm] = fm.asarray(np.array([3.0], np.float32)).astype(dtype)
    x[x < 5] = 3
    np.testing.assert_array_equal(host(a), x)
    a[:, [0, 1]] = a[:, [3, 4]]  # value read before anything is written
    x[:, [0, 1]] = x[:, [3, 4]]
    np.testing.assert_array_equal(host(a), x)
    a[fm.asarray(np.array([1, 3]), dtype="int64"), 2:] = -1
    x[[1, 3], 2:] = -1
    np.testing.assert_array_equal(host(a), x)


def test_mask_of_a_strided_view(device):
    x = make((6, 8), np.float32, 3)
    a = fm.asarray(x)
    v = a[::2, 1::3]
    m = host(v) > 0
    np.testing.assert_array_equal(host(v[m]), x[::2, 1::3][m])  # read: gathered from a copy
    col = a[:, ::-2]
    mc = host(col) > 0
    col[mc[:, 0]] = 5.0  # one masked axis: a view, written in place
    x[:, ::-2][mc[:, 0]] = 5.0
    np.testing.assert_array_equal(host(a), x)


@SETTINGS
@given(data=st.data())
def test_take_hypothesis(device, data):
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    x = make(shape, np.float32, data.draw(st.integers(0, 9)))
    a = fm.asarray(x)
    steps = tuple(slice(None, None, data.draw(st.sampled_from([1, -1, 2]))) for _ in shape)
    xv, av = x[steps], a[steps]
    axis = data.draw(st.integers(0, ndim - 1))
    n = xv.shape[axis]
    idx = np.array(data.draw(st.lists(st.integers(-n, n - 1), max_size=6)), np.int64)
    idx = idx.reshape(data.draw(st.sampled_from([(-1,), (1, -1)]))) if idx.size else idx
    key = (slice(None),) * axis + (idx,)
    np.testing.assert_array_equal(host(av[key]), xv[key])
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    mkey = (slice(None),) * axis + (mask,)
    np.testing.assert_array_equal(host(av[mkey]), xv[mkey])
    y, b = x.copy(), fm.asarray(x.copy())
    y[steps][mkey] = -3.0
    b[steps][mkey] = -3.0
    np.testing.assert_array_equal(host(b), y)


def test_index_errors_as_numpy(device):
    x = make((3, 4), np.float32)
    a = fm.asarray(x)
    for key in ([3], [-4], (slice(None), [4]), (slice(None), np.array([[0, -5]]))):
        with pytest.raises(IndexError):
            x[key]
        with pytest.raises(IndexError, match=r"is out of bounds for axis \d with size \d"):
            a[key]
        with pytest.raises(IndexError, match=r"is out of bounds"):
            a[key] = 1.0
    with pytest.raises(IndexError, match=r"out of bounds for axis 0 with size 3"):
        a[fm.asarray(np.array([0, 3]), dtype="int64")]
    with pytest.raises(IndexError, match="boolean index did not match indexed array along axis 1"):
        a[:, np.ones(3, bool)]
    with pytest.raises(IndexError, match="boolean index did not match"):
        a[fm.asarray(np.ones(4, np.float32))]


def test_indexing_kernels_are_built():
    for name in ("take_b2", "take_b4", "take_b8", "put_b2", "put_b4", "put_b8", "mask_positions"):
        assert _core._has_kernel("cpu", name), name
