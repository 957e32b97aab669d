"""fastmetal.Array views (indexing, reshape, transpose, squeeze, expand_dims, ravel) and
__setitem__, against NumPy on every device; views share memory on host-visible ones."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastmetal as fm
from helpers import host

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)

_ints = st.integers(-7, 7)
_slices = st.builds(slice, st.none() | _ints, st.none() | _ints, st.none() | st.integers(-3, 3))
_items = st.one_of(st.integers(-6, 6), _slices, st.just(None), st.just(Ellipsis))
KEYS = st.one_of(_items, st.lists(_items, max_size=6).map(tuple))


def numbered(shape, dtype=np.float32):
    """Distinct, exactly representable values, so any misplaced element shows."""
    size = int(np.prod(shape, dtype=np.int64))
    return (np.arange(size, dtype=np.float64) * 0.5 - 3).astype(dtype).reshape(shape)


def outcome(fn):
    """('ok', result) or ('raised', exception type), without pytest.raises' matching."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the type is what gets compared
        return "raised", type(e)


def assert_same_outcome(np_fn, fm_fn):
    """fm_fn gives NumPy's values and shape, or raises NumPy's exception type."""
    kind, want = outcome(np_fn)
    if kind == "raised":
        with pytest.raises(want):
            fm_fn()
        return None, None
    got = fm_fn()
    assert isinstance(got, fm.Array)
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(host(got), want)
    return want, got


# ----------------------------------------------------------------------------- indexing
@SETTINGS
@given(shape=SHAPES, key=KEYS, key2=KEYS)
def test_basic_indexing_matches_numpy(device, shape, key, key2):
    base = numbered(shape)
    arr = fm.asarray(base)
    want, got = assert_same_outcome(lambda: base[key], lambda: arr[key])
    if want is not None:  # index the (strided) view again
        assert_same_outcome(lambda: want[key2], lambda: got[key2])


@pytest.mark.host_visible
@SETTINGS
@given(shape=SHAPES, key=KEYS)
def test_indexing_returns_views_sharing_memory(device, shape, key):
    arr = fm.asarray(numbered(shape))
    try:
        view = arr[key]
    except (IndexError, ValueError):
        return
    assert view.size == 0 or np.shares_memory(host(view), host(arr))
    assert np.shares_memory(view, arr) == (view.size > 0)  # through __array_function__


def test_index_errors_are_worded(device):
    a = fm.asarray(numbered((2, 3)))
    cases = [((0, 0, 0), IndexError, "expected at most 2 indices"),
             ((5,), IndexError, "expected an index in [-2, 2) for axis 0"),
             ((0, -4), IndexError, "for axis 1 of size 3, got -4"),
             ((..., ...), IndexError, "at most one ellipsis"),
             ((1.0,), IndexError, "got float"),
             (([0, 2],), IndexError, "index 2 is out of bounds for axis 0 with size 2"),
             ((np.array([True, False, True]),), IndexError, "boolean index did not match"),
             (([0, 1], [1, 0, 1]), IndexError, "index arrays that broadcast together"),
             ((0, [5]), IndexError, "index 5 is out of bounds for axis"),
             ((np.array([0.5]),), IndexError, "integer or boolean index arrays"),
             ((True,), IndexError, "boolean"),
             (("a",), IndexError, "got str")]
    for key, exc, text in cases:
        with pytest.raises(exc, match=r"^\[fastmetal\.Array\.__getitem__\] expected"):
            a[key]
        with pytest.raises(exc) as info:
            a[key]
        assert text in str(info.value)
    with pytest.raises(ValueError):
        a[::0]  # as NumPy: slice step cannot be zero
    with pytest.raises(TypeError):
        a[1.5:]


def test_zero_dimensional_and_empty(device):
    s = fm.asarray(np.float32(2.5))
    assert s[()].shape == () and s[None].shape == (1,) and s[...].shape == ()
    assert float(s) == 2.5 and bool(s) and s.item() == 2.5
    with pytest.raises(TypeError, match=r"0-d"):
        iter(s)
    e = fm.zeros((0, 3))
    assert e[:, 1].shape == (0,) and e[5:].shape == (0, 3) and e.reshape(3, 0).shape == (3, 0)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(fm.zeros(2))
    assert [host(row).tolist() for row in fm.asarray(numbered((2, 2)))] == \
        numbered((2, 2)).tolist()


# ----------------------------------------------------------------------------- reshape & co
def _factorisations(size, ndim, data):
    dims = []
    rest = size
    for _ in range(ndim - 1):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0] if rest else [0, 1, 2]
        d = data.draw(st.sampled_from(divisors))
        dims.append(d)
        rest = rest // d if d else rest
    dims.append(rest if size else data.draw(st.sampled_from([0, 1, 3])))
    if data.draw(st.booleans()) and dims and size:
        dims[data.draw(st.integers(0, len(dims) - 1))] = -1
    return tuple(dims)


@SETTINGS
@given(shape=SHAPES, key=KEYS, ndim=st.integers(0, 4), data=st.data())
def test_reshape_matches_numpy_and_copies_only_when_numpy_does(device, shape, key, ndim, data):
    base = numbered(shape)
    arr = fm.asarray(base)
    try:
        want_view = base[key]
    except (IndexError, ValueError, TypeError):
        return
    view = arr[key]
    # NumPy returns a scalar (a copy) for an all-integer index; fastmetal a 0-d view.
    numpy_view = isinstance(want_view, np.ndarray)
    want_view = np.asarray(want_view)
    new_shape = _factorisations(want_view.size, ndim, data) if ndim or want_view.size == 1 \
        else (2, 3)
    want, got = assert_same_outcome(lambda: want_view.reshape(new_shape),
                                    lambda: view.reshape(new_shape))
    if want is not None and device in ("cpu", "metal") and want.size and numpy_view:
        # A view exactly when NumPy gives a view, a copy exactly when it copies.
        assert np.shares_memory(host(got), host(arr)) == np.shares_memory(want, base)
    if want is not None:
        assert_same_outcome(lambda: want_view.reshape(*new_shape) if new_shape else
                            want_view.reshape(()), lambda: view.reshape(*new_shape)
                            if new_shape else view.reshape(()))


@SETTINGS
@given(shape=SHAPES, key=KEYS, data=st.data())
def test_transpose_squeeze_expand_ravel_flatten(device, shape, key, data):
    base = numbered(shape)
    arr = fm.asarray(base)
    try:
        nv = np.asarray(base[key])
    except (IndexError, ValueError, TypeError):
        return
    v = arr[key]
    perm = data.draw(st.permutations(range(nv.ndim)))
    assert_same_outcome(lambda: nv.T, lambda: v.T)
    assert_same_outcome(lambda: nv.transpose(perm), lambda: v.transpose(perm))
    assert_same_outcome(lambda: nv.transpose(*perm), lambda: v.transpose(*perm))
    assert_same_outcome(lambda: np.transpose(nv), lambda: np.transpose(v))
    assert_same_outcome(lambda: nv.squeeze(), lambda: v.squeeze())
    axis = data.draw(st.integers(-nv.ndim - 1, nv.ndim))
    assert_same_outcome(lambda: nv.squeeze(axis), lambda: v.squeeze(axis))
    assert_same_outcome(lambda: np.expand_dims(nv, axis), lambda: fm.expand_dims(v, axis))
    assert_same_outcome(lambda: np.expand_dims(nv, (0, axis)), lambda: np.expand_dims(v, (0, axis)))
    assert_same_outcome(lambda: nv.ravel(), lambda: v.ravel())
    assert_same_outcome(lambda: np.ravel(nv), lambda: np.ravel(v))
    assert_same_outcome(lambda: nv.flatten(), lambda: v.flatten())
    assert_same_outcome(lambda: nv.copy(), lambda: v.copy())
    if device in ("cpu", "metal") and nv.size:
        assert not np.shares_memory(host(v.flatten()), host(arr))
        assert not np.shares_memory(host(v.copy()), host(arr))
        assert np.shares_memory(host(v.T), host(arr))
        assert np.shares_memory(host(v.ravel()), host(arr)) == nv.flags.c_contiguous


def test_reshape_transpose_errors(device):
    a = fm.asarray(numbered((2, 3)))
    for bad, text in [((4,), "expected a shape of 6 elements"), ((-1, -1), "at most one unknown"),
                      ((4, -1), "fits 6 elements"), ((-2, -3), "dimensions >= 0")]:
        with pytest.raises(ValueError, match=r"^\[fastmetal\.Array\.reshape\] expected") as info:
            a.reshape(bad)
        assert text in str(info.value)
    with pytest.raises(TypeError, match="integer dimension, got float"):
        a.reshape(2.0, 3)
    with pytest.raises(ValueError, match="order"):
        a.reshape(6, order="F")
    with pytest.raises(ValueError, match="distinct axes"):
        a.transpose(0, 0)
    with pytest.raises(ValueError, match="expected 2 axes"):
        a.transpose(0)
    with pytest.raises(np.exceptions.AxisError):
        a.transpose(0, 2)
    with pytest.raises(ValueError, match="size 1 to squeeze"):
        a.squeeze(0)
    with pytest.raises(np.exceptions.AxisError):
        fm.expand_dims(a, 3)
    with pytest.raises(TypeError, match=r"\[fastmetal\.expand_dims\] expected a fastmetal.Array"):
        fm.expand_dims(np.zeros(2), 0)


def test_astype_copy_to(device, rng):
    x = (rng.standard_normal((3, 5)) * 100).astype(np.float32)
    x[0, 0], x[0, 1], x[0, 2] = np.nan, -0.0, np.inf
    a = fm.asarray(x)[:, ::-2]
    h = a.astype(np.float16)
    assert h.dtype == np.float16 and h.device == device
    np.testing.assert_array_equal(host(h), x[:, ::-2].astype(np.float16))
    np.testing.assert_array_equal(host(h.astype("float32")), x[:, ::-2].astype(np.float16)
                                  .astype(np.float32))
    c = a.copy()
    assert host(c).tobytes() == np.ascontiguousarray(x[:, ::-2]).tobytes()  # bit-exact
    assert a.astype(np.float32, copy=False) is a
    assert a.to(device) is a
    moved = a.to("cpu")
    assert moved.device == "cpu"
    np.testing.assert_array_equal(host(moved), x[:, ::-2])
    with pytest.raises(TypeError, match=r"^\[fastmetal\.Array\.astype\] expected dtype"):
        a.astype(np.int16)


# ----------------------------------------------------------------------------- setitem
@SETTINGS
@given(shape=SHAPES, key=KEYS, data=st.data())
def test_setitem_matches_numpy(device, shape, key, data):
    ref = numbered(shape)
    arr = fm.asarray(ref.copy())
    kind, target = outcome(lambda: ref[key])
    if kind == "raised":
        with pytest.raises(target):
            arr[key] = 1.0
        return
    # A value that broadcasts (or, sometimes, one that does not).
    vshape = list(target.shape[data.draw(st.integers(0, target.ndim)):])
    vshape = [1 if data.draw(st.booleans()) else n for n in vshape]
    if data.draw(st.integers(0, 4)) == 0:
        vshape = [1] * data.draw(st.integers(0, 2)) + vshape
    if data.draw(st.integers(0, 5)) == 0:
        vshape = vshape + [data.draw(st.integers(2, 4))]
    form = data.draw(st.sampled_from(["scalar", "numpy", "numpy64", "array", "array16"]))
    value_np = (np.arange(int(np.prod(vshape)), dtype=np.float64) + 100).reshape(vshape)
    value = {"scalar": 7.25, "numpy": value_np.astype(np.float32), "numpy64": value_np,
             "array": fm.asarray(value_np, dtype="float32"),
             "array16": fm.asarray(value_np, dtype="float16")}[form]
    value_ref = value_np if form not in ("scalar",) else 7.25
    if isinstance(target, np.generic) and value_np.size == 1 and form != "scalar":
        # NumPy takes an all-integer index's scalar path, which refuses arrays of ndim > 0
        # (even of one element); fastmetal assigns into the 0-d view, broadcasting as usual.
        value_ref = value_np.reshape(())
    try:
        ref[key] = value_ref
    except ValueError:
        with pytest.raises(ValueError, match=r"^\[fastmetal\.Array\.__setitem__\] expected"):
            arr[key] = value
        np.testing.assert_array_equal(host(arr), numbered(shape))  # untouched
        return
    arr[key] = value
    np.testing.assert_array_equal(host(arr), ref)


def test_setitem_overlapping_source_and_target(device):
    ref = numbered((4, 5))
    arr = fm.asarray(ref.copy())
    ref[1:] = ref[:-1].copy()
    arr[1:] = arr[:-1]
    ref[:, ::-1] = ref.copy()
    arr[:, ::-1] = arr
    ref[0] = ref[0][::-1].copy()
    arr[0] = arr[0][::-1]
    np.testing.assert_array_equal(host(arr), ref)


def test_setitem_float16_and_special_values(device):
    arr = fm.zeros((2, 4), dtype="float16")
    arr[0] = np.array([np.nan, -0.0, np.inf, 70000.0])  # 70000 overflows float16 as NumPy
    ref = np.zeros((2, 4), np.float16)
    with np.errstate(over="ignore"):
        ref[0] = np.array([np.nan, -0.0, np.inf, 70000.0])
    got = host(arr).copy()
    # NaN stays NaN; its payload bits are the device's own (CUDA's float->half gives 0x7fff,
    # NumPy 0x7e00; MSL does not specify one), so only the other elements compare bitwise.
    assert np.isnan(got[0, 0])
    got[0, 0] = ref[0, 0] = 0
    assert got.tobytes() == ref.tobytes()


def test_setitem_bad_values(device):
    arr = fm.zeros((2, 3))
    for bad in ("x", 1j, None, object(), np.array(["a"]), np.array([1j])):
        with pytest.raises(TypeError, match=r"^\[fastmetal\.Array\.__setitem__\] expected"):
            arr[0] = bad
    with pytest.raises(ValueError, match=r"broadcasts to shape \(3,\), got shape \(2,\)"):
        arr[0] = np.zeros(2)
    with pytest.raises(IndexError):
        arr[2] = 1.0
    np.testing.assert_array_equal(host(arr), np.zeros((2, 3)))


@pytest.mark.host_visible
def test_writes_through_views_reach_numpy_memory(device):
    x = numbered((3, 4))
    arr = fm.asarray(x)  # shares x's memory on host-visible devices
    arr[1, ::2] = -1.0
    v = arr.T[::-1]
    v[0] = 9.0
    ref = numbered((3, 4))
    ref[1, ::2] = -1.0
    ref[:, -1] = 9.0
    np.testing.assert_array_equal(x, ref)


# ----------------------------------------------------------------------------- _view checks
@settings(max_examples=300, deadline=None)
@given(offset=st.integers(-2**63, 2**63 - 1),
       shape=st.lists(st.integers(-2, 2**62), max_size=4),
       strides=st.lists(st.integers(-2**63, 2**63 - 1), max_size=4))
def test_view_binding_never_addresses_outside_the_storage(offset, shape, strides):
    a = fm.zeros(24)
    try:
        v = a._view(offset, shape, strides)
    except (ValueError, TypeError, OverflowError):
        return
    # Accepted: every element must lie in [0, 24).
    if v.size:
        lo = offset + sum(min(0, s * (n - 1)) for n, s in zip(shape, strides))
        hi = offset + sum(max(0, s * (n - 1)) for n, s in zip(shape, strides))
        assert 0 <= lo <= hi < 24
        host(v)  # readable


def test_view_binding_errors():
    a = fm.zeros((2, 3))
    with pytest.raises(ValueError, match="inside the storage of 6 elements"):
        a._view(5, [2], [1])
    with pytest.raises(ValueError, match="inside the storage"):
        a._view(0, [2], [-1])
    with pytest.raises(ValueError, match="overflows"):
        a._view(0, [2**62, 4], [2**62, 1])
    with pytest.raises(ValueError, match="as many strides"):
        a._view(0, [2], [1, 1])
    with pytest.raises(ValueError, match="non-negative"):
        a._view(0, [-1], [1])
    assert a._view(5, [3, 2], [0, -2]).shape == (3, 2)
