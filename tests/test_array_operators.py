"""fastmetal.Array operators, in-place operators, comparisons and NumPy dispatch
(__array_ufunc__ / __array_function__), against NumPy float64 on every device."""
from __future__ import annotations

import operator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastmetal as fm
from fastmetal.ops.optable import OPS
from helpers import host

from references import numpy_reference

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
SPEC = {s.name: s for s in OPS}
RTOL32 = 8 * np.finfo(np.float32).eps

BINARY_OPERATORS = {
    "add": (operator.add, operator.iadd), "subtract": (operator.sub, operator.isub),
    "multiply": (operator.mul, operator.imul), "divide": (operator.truediv, operator.itruediv),
    "power": (operator.pow, None),
    "less": (operator.lt, None), "less_equal": (operator.le, None),
    "greater": (operator.gt, None), "greater_equal": (operator.ge, None),
    "equal": (operator.eq, None), "not_equal": (operator.ne, None),
}
UNARY_OPERATORS = {"negative": operator.neg, "abs": abs, "copy": operator.pos}
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3e38, -3e38],
                    np.float32)


def check(got, ref, dtype=np.float32):
    """An Array holding the float64 reference rounded to dtype (NaN/inf exactly placed)."""
    assert isinstance(got, fm.Array), type(got)
    g = host(got)
    if g.dtype == np.bool_:  # comparisons: the reference is the 1.0 / 0.0 mask
        assert g.shape == ref.shape and np.isin(ref, (0.0, 1.0)).all()
        np.testing.assert_array_equal(g, ref == 1.0)
        return
    assert g.dtype == dtype and g.shape == ref.shape
    with np.errstate(all="ignore"):
        want = ref.astype(dtype)
    rtol = RTOL32 if dtype == np.float32 else 2 * np.finfo(np.float16).eps
    np.testing.assert_allclose(g.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=4 * np.finfo(dtype).tiny, equal_nan=True)
    assert np.array_equal(np.isnan(g), np.isnan(want))
    assert np.array_equal(np.isinf(g), np.isinf(want))


def strided(rng, shape, data):
    """A float32 NumPy array of `shape` that is a strided (maybe reversed) view."""
    step = data.draw(st.sampled_from([1, 2, -1, -2]))
    big = rng.standard_normal(tuple(n * abs(step) + 1 for n in shape)).astype(np.float32) * 3
    sl = tuple(slice(None, n * abs(step), abs(step)) if step > 0 else
               slice(n * abs(step) - 1, None, step) if n else slice(0, 0) for n in shape)
    x = big[sl]
    assert x.shape == tuple(shape)
    return big, sl, x


def operands(name, x, y):
    if name == "power":
        return np.abs(x) + 0.5, np.clip(y, -4, 4)
    return x, y


# ----------------------------------------------------------------------------- binary
@pytest.mark.parametrize("name", list(BINARY_OPERATORS))
@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4),
       data=st.data())
def test_binary_operators_match_numpy(device, name, shapes, data, rng):
    op, _ = BINARY_OPERATORS[name]
    spec = SPEC[name]
    (sx, sy), result_shape = shapes.input_shapes, shapes.result_shape
    bx, slx, x = strided(rng, sx, data)
    by, sly, y = strided(rng, sy, data)
    x, y = operands(name, x, y)
    if data.draw(st.booleans()):  # equal values, so == and <= see true cases
        y = np.broadcast_to(x, np.broadcast_shapes(x.shape, y.shape)).copy() if \
            np.broadcast_shapes(x.shape, y.shape) == y.shape else y
    x, y = x.copy(), y.copy()
    # Device copies viewed through strided fastmetal views.
    fx = fm.asarray(np.ascontiguousarray(x[..., ::-1]))[..., ::-1] if x.ndim else fm.asarray(x)
    fy = fm.asarray(np.stack([y, y]))[1]
    ref = numpy_reference(spec, x.astype(np.float64), y.astype(np.float64))
    check(op(fx, fy), ref)             # Array op Array
    check(op(fx, y), ref)              # Array op ndarray
    check(op(x, fy), ref)              # ndarray op Array: __array_ufunc__ gives an Array
    s = 0.75
    check(op(fx, s), numpy_reference(spec, x.astype(np.float64), np.float64(s)))
    check(op(s, fy), numpy_reference(spec, np.float64(s), y.astype(np.float64)))
    check(op(np.float32(s), fy), numpy_reference(spec, np.float64(s), y.astype(np.float64)))
    assert result_shape == np.broadcast_shapes(x.shape, y.shape)


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide"])
@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4),
       data=st.data())
def test_in_place_operators_write_into_the_array(device, name, shapes, data, rng):
    _, iop = BINARY_OPERATORS[name]
    spec = SPEC[name]
    (sx, sy), result_shape = shapes.input_shapes, shapes.result_shape
    base = (rng.standard_normal((3,) + tuple(result_shape)) * 2).astype(np.float32)
    y = (rng.standard_normal(sy) * 2).astype(np.float32)
    arr = fm.asarray(base.copy())
    view = arr[1]  # writes go through the view into arr
    before = arr
    out = iop(view, fm.asarray(y) if data.draw(st.booleans()) else y)
    assert out is view and before is arr
    ref = base.astype(np.float64)
    ref[1] = numpy_reference(spec, ref[1], y.astype(np.float64))
    check(arr, ref)
    if np.broadcast_shapes(tuple(result_shape), sy) != tuple(result_shape):
        return
    s = fm.asarray(base[0].copy())
    s_id = id(s)
    s = iop(s, 2.0)
    assert id(s) == s_id


def test_in_place_with_a_broadcast_result_raises(device):
    a = fm.zeros(3)
    with pytest.raises(ValueError,
                       match=r"^\[fastmetal\.add\] expected out of shape \(2, 3\), got shape \(3,\)"):
        a += np.ones((2, 3), np.float32)


@pytest.mark.host_visible
def test_in_place_keeps_the_memory(device):
    x = np.ones((2, 3), np.float32)
    a = fm.asarray(x)
    a *= 3.0
    a[0] -= 1.0
    np.testing.assert_array_equal(x, [[2, 2, 2], [3, 3, 3]])


@pytest.mark.parametrize("name", list(BINARY_OPERATORS))
def test_special_values(device, name):
    op, _ = BINARY_OPERATORS[name]
    x, y = np.meshgrid(SPECIALS, SPECIALS)
    ref = numpy_reference(SPEC[name], x.astype(np.float64), y.astype(np.float64))
    check(op(fm.asarray(x), fm.asarray(y)), ref)


def test_comparisons_are_bool_masks(device):
    a = fm.asarray(np.array([1.0, np.nan, 3.0], np.float32))
    b = np.array([1.0, np.nan, 2.0], np.float32)
    for op, want in [(operator.lt, [0, 0, 0]), (operator.le, [1, 0, 0]),
                     (operator.gt, [0, 0, 1]), (operator.ge, [1, 0, 1]),
                     (operator.eq, [1, 0, 0]), (operator.ne, [0, 1, 1])]:
        m = op(a, b)
        assert isinstance(m, fm.Array) and m.dtype == np.bool_
        np.testing.assert_array_equal(host(m), np.array(want, bool))
    m16 = fm.asarray(np.ones(2, np.float16)) < fm.asarray(np.array([2, 0], np.float16))
    assert m16.dtype == np.bool_
    np.testing.assert_array_equal(host(m16), [1, 0])
    # np.less etc. dispatch to the same kernels.
    m = np.less(a, b)
    assert isinstance(m, fm.Array)
    np.testing.assert_array_equal(host(m), [0, 0, 0])


@pytest.mark.parametrize("name", list(UNARY_OPERATORS))
def test_unary_operators(device, name, rng):
    x = (rng.standard_normal((3, 5)) * 4).astype(np.float32)
    x[0, :3] = [np.nan, -0.0, -np.inf]
    a = fm.asarray(x)[:, ::-2]
    got = UNARY_OPERATORS[name](a)
    check(got, numpy_reference(SPEC[name], x[:, ::-2].astype(np.float64)))


def test_float16_stays_float16(device):
    a = fm.asarray(np.arange(4, dtype=np.float16))
    assert (a + 1).dtype == np.float16 and (2 * a).dtype == np.float16
    assert (a + np.ones(4, np.float32)).dtype == np.float32
    assert (-a).dtype == np.float16


def test_unsupported_operands(device):
    a = fm.zeros(3)
    with pytest.raises(TypeError):
        a + "x"
    with pytest.raises(TypeError):
        "x" * a
    with pytest.raises(TypeError):
        a + None
    with pytest.raises(TypeError):
        pow(a, 2, 3)
    assert (a == None) is False  # noqa: E711 - falls back to identity, as Python does
    assert (a != "x") is True
    with pytest.raises(ValueError, match="broadcast"):
        a + np.zeros(4, np.float32)
    with pytest.raises(TypeError):
        hash(a)


# ----------------------------------------------------------------------------- NumPy dispatch
def test_ufuncs_dispatch_to_fastmetal(device, rng):
    x = rng.standard_normal((4, 3)).astype(np.float32)
    a = fm.asarray(x)
    for ufunc, args, name in [(np.add, (a, x), "add"), (np.exp, (a,), "exp"),
                              (np.maximum, (a, 0.0), "maximum"), (np.absolute, (a,), "abs"),
                              (np.negative, (a,), "negative"),
                              (np.divide, (x, a), "divide"), (np.power, (np.abs(a), 2.0), "power"),
                              (np.positive, (a,), "copy")]:
        got = ufunc(*args)
        ref_args = [host(v).astype(np.float64) if not isinstance(v, float) else np.float64(v)
                    for v in args]
        check(got, numpy_reference(SPEC[name], *ref_args))
    out = fm.empty((4, 3))
    assert np.multiply(a, 2.0, out=out) is out
    check(out, x.astype(np.float64) * 2)
    out_np = np.empty((4, 3), np.float32)
    assert np.multiply(a, 2.0, out=out_np) is out_np
    np.testing.assert_allclose(out_np, x * 2)


def test_numpy_functions_without_fastmetal_implementation(device):
    a = fm.asarray(np.array([1.0, np.nan], np.float32))
    if device in ("cpu", "metal"):
        # Host-visible: computed by NumPy on a view, returned as NumPy.
        got = np.signbit(a)
        assert isinstance(got, np.ndarray) and got.tolist() == [False, False]
        assert np.sort(a).shape == (2,)  # (np.concatenate is fastmetal's now: an Array)
        assert isinstance(np.add.reduce(a), np.floating)
    else:
        with pytest.raises(TypeError, match=r"numpy\.signbit"):
            np.signbit(a)
        with pytest.raises(TypeError, match=r"numpy\.sort"):
            np.sort(a)
        with pytest.raises(TypeError, match=r"numpy\.add\.reduce"):
            np.add.reduce(a)


def test_numpy_ufuncs_fastmetal_has_run_on_the_device(device):
    # np.isnan is fastmetal.isnan: bool, on the device, as the comparisons.
    a = fm.asarray(np.array([1.0, np.nan], np.float32))
    got = np.isnan(a)
    assert isinstance(got, fm.Array) and got.device == device and got.tolist() == [False, True]
    i = fm.asarray(np.array([6, 3], np.int32))
    got = np.bitwise_and(i, 5)
    assert isinstance(got, fm.Array) and got.dtype == np.int32 and got.tolist() == [4, 1]


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "argmax", "argmin", "var", "std"])
def test_reductions_call_the_module_function(device, name, monkeypatch):
    a = fm.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    calls = []

    def fake(x, **kwargs):
        calls.append((x, kwargs))
        return "result"

    monkeypatch.setattr(fm.ops.reductions, name, fake)
    assert getattr(a, name)(axis=1, keepdims=True) == "result"
    assert calls[-1][0] is a and calls[-1][1]["axis"] == 1 and calls[-1][1]["keepdims"] is True
    assert getattr(np, name)(a, axis=0) == "result"
    assert calls[-1][1] == {"axis": 0}
    if name in ("var", "std"):
        getattr(a, name)(ddof=1)
        assert calls[-1][1]["ddof"] == 1


def test_matmul_calls_the_module_function(device, monkeypatch):
    a = fm.zeros((2, 2))
    seen = []
    monkeypatch.setattr(fm.ops.linalg, "matmul", lambda x, y: seen.append((x, y)) or "mm")
    b = np.eye(2, dtype=np.float32)
    assert a @ b == "mm" and seen[-1][0] is a and seen[-1][1] is b
    assert b @ a == "mm" and seen[-1][0] is b and seen[-1][1] is a
    assert np.matmul(a, b) == "mm"


def test_array_protocol_and_repr_of_strided_views(device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = fm.asarray(x)[::-1, 1::2]
    np.testing.assert_array_equal(np.asarray(v), x[::-1, 1::2])
    np.testing.assert_array_equal(v.numpy(), x[::-1, 1::2])
    assert v.tolist() == x[::-1, 1::2].tolist()
    assert repr(v).startswith("fastmetal.Array(array([[")
    assert float(v[0, 0]) == 9.0 and int(v[2, 1]) == 3


ODD_OBJECTS = [None, "ab", b"x", 1j, object(), [1, "a"], [[1, 2], [3]], (), {}, {1: 2},
               slice(None), Ellipsis, float("nan"), 10**30, -(10**30), True, np.int64(2),
               np.array([1j]), np.array(["a"]), np.array([1, 2], object), np.zeros((2, 0)),
               np.float64(2.0), [1.0, 2.0, 3.0], 2**63, -1]


@pytest.mark.parametrize("obj", ODD_OBJECTS, ids=lambda o: type(o).__name__)
def test_no_crash_on_odd_operands_keys_and_values(device, obj):
    a = fm.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    allowed = (TypeError, ValueError, IndexError, OverflowError)
    for fn in (lambda: a + obj, lambda: obj - a, lambda: a < obj, lambda: a == obj,
               lambda: np.add(a, obj), lambda: a.__iadd__(obj), lambda: a[obj],
               lambda: a.__setitem__(0, obj), lambda: a.__setitem__(obj, 1.0),
               lambda: a.reshape(obj), lambda: a.transpose(obj), lambda: a.squeeze(obj),
               lambda: fm.expand_dims(a, obj), lambda: a.astype(obj), lambda: a.to(obj)):
        try:
            fn()
        except allowed:
            pass
    assert a.shape == (2, 3)
