"""out= for every public function that has it, found from ``fastmetal.__all__`` and
``inspect.signature`` (a new op with out= is picked up here without editing this file):
the result against NumPy float64; out aliased with an input (the input itself, or a view of
its memory) and partially overlapping it (a view of the same Array shifted by one
element) give the result computed from the inputs as they were; a wrong shape or dtype is
a ValueError naming out with what was expected and what was given; a NumPy out= is filled
and returned; the return value is out. One road decides all of it (csrc/ops/arguments.h).

A new function with out= is run through a recipe below: the op table's (elementwise ops),
a named one, or the generic one (each required parameter an array, NumPy's function of
the same name as the reference). Without a recipe that fits, its test fails and says so.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.ops.optable import OPS
from references import elementwise_rtol, numpy_reference


def _functions_with_out() -> list[str]:
    names = []
    for name in fm.__all__:
        fn = getattr(fm, name)
        if not callable(fn) or inspect.isclass(fn):
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        if "out" in params:
            names.append(name)
    return names


OUT_FUNCTIONS = _functions_with_out()
TABLE = {spec.name: spec for spec in OPS if spec.public}
SHAPE = (6, 8)


def test_the_walk_finds_the_functions_with_out():
    # Guards the discovery itself: if it found nothing, every test below would pass vacuously.
    for name in ("add", "exp", "copy", "sum", "argmax", "cumsum", "matmul", "dot",
                 "concatenate", "stack", "divmod"):
        assert name in OUT_FUNCTIONS, name


@dataclass
class Case:
    inputs: list            # host float32 arrays
    call: Callable          # (fn, device inputs, out) -> result
    reference: Callable     # (float64 inputs) -> float64 result (a tuple for pairs)
    rtol: float = 1e-5
    pair: bool = False      # out= is a pair of arrays (divmod)


def _values(rng, shape):
    # Multiples of 1/4 in [0.25, 3]: exact in float32, inside every op's domain, and
    # floor_divide / remainder never sit on a rounding boundary.
    return (rng.integers(1, 13, size=shape) / 4).astype(np.float32)


def _case(name: str, rng, device) -> Case:
    fn = getattr(fm, name)
    if name in TABLE:
        spec = TABLE[name]
        return Case([_values(rng, SHAPE) for _ in range(spec.arity)],
                    lambda f, a, out: f(*a, out=out),
                    lambda *a: numpy_reference(spec, *a),
                    rtol=elementwise_rtol(device, np.float32))
    if name in ("sum", "mean", "var", "std", "max", "min", "prod", "argmax", "argmin", "cumsum"):
        return Case([_values(rng, SHAPE)], lambda f, a, out: f(a[0], axis=1, out=out),
                    lambda a: getattr(np, name)(a, axis=1))
    if name in ("matmul", "dot"):
        return Case([_values(rng, (6, 6)), _values(rng, (6, 6))],
                    lambda f, a, out: f(a[0], a[1], out=out), lambda a, b: a @ b)
    if name in ("concatenate", "stack", "cat"):  # cat: torch.cat's name for concatenate
        return Case([_values(rng, SHAPE), _values(rng, SHAPE)],
                    lambda f, a, out: f([a[0], a[1]], out=out),
                    lambda a, b: getattr(np, {"cat": "concatenate"}.get(name, name))([a, b]))
    if name.startswith("bitwise_") or name in ("left_shift", "right_shift", "invert"):
        # integers (floats are a TypeError), shift counts within the width
        arity = 1 if name in ("bitwise_invert", "invert", "bitwise_not") else 2
        return Case([rng.integers(0, 31, SHAPE).astype(np.int32) for _ in range(arity)],
                    lambda f, a, out: f(*a, out=out),
                    lambda *a: getattr(np, name)(*(v.astype(np.int32) for v in a)))
    if name == "divmod":
        return Case([_values(rng, SHAPE), _values(rng, SHAPE)],
                    lambda f, a, out: f(a[0], a[1], out=out),
                    lambda a, b: (np.floor_divide(a, b), np.remainder(a, b)), pair=True)
    # Generic: every required parameter an array; NumPy's function of the same name.
    params = inspect.signature(fn).parameters.values()
    required = [p for p in params if p.default is p.empty and
                p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not hasattr(np, name) or not required:
        pytest.fail(f"fastmetal.{name} has out= but no recipe in tests/test_out_argument.py "
                    f"(and no NumPy function of that name to hold it to): add one")
    return Case([_values(rng, SHAPE) for _ in required], lambda f, a, out: f(*a, out=out),
                lambda *a: getattr(np, name)(*a))


def re_shape(shape):
    return re.escape(str(tuple(shape)))


def _host(a):
    return a.numpy() if isinstance(a, fm.Array) else np.asarray(a)


def _expected(case: Case):
    with np.errstate(all="ignore"):
        ref = case.reference(*[x.astype(np.float64) for x in case.inputs])
    return tuple(np.asarray(r) for r in ref) if case.pair else (np.asarray(ref),)


def _result_dtype(case: Case, name: str):
    """The dtype fastmetal gives without out= (int64 for argmax, float32 otherwise)."""
    got = case.call(getattr(fm, name), [fm.asarray(x) for x in case.inputs], None)
    got = got if case.pair else (got,)
    return [np.dtype(g.dtype) for g in got]


def _check(case: Case, outs, expected):
    for got, want in zip(outs, expected):
        got = _host(got)
        assert got.shape == want.shape
        if np.dtype(got.dtype).kind == "i":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=case.rtol,
                                       atol=case.rtol, equal_nan=True)


def _run(name, case, inputs, out):
    result = case.call(getattr(fm, name), inputs, out)
    if case.pair:
        assert isinstance(result, tuple) and len(result) == 2
        assert result[0] is out[0] and result[1] is out[1]
        return list(out)
    assert result is out, f"fastmetal.{name} returned {type(result).__name__}, not out"
    return [out]


@pytest.fixture
def rng():
    return np.random.default_rng(20261127)


@pytest.mark.parametrize("name", OUT_FUNCTIONS)
def test_fresh_out(device, rng, name):
    case = _case(name, rng, device)
    expected = _expected(case)
    dtypes = _result_dtype(case, name)
    outs = [fm.empty(e.shape, dtype=d) for e, d in zip(expected, dtypes)]
    out = tuple(outs) if case.pair else outs[0]
    _check(case, _run(name, case, [fm.asarray(x) for x in case.inputs], out), expected)


def _shared(x, shape, shift):
    """A device Array holding x, and a view of `shape` into the same memory starting `shift`
    elements in: the input and an out= that overlaps it."""
    n = x.size
    size = int(np.prod(shape))
    base = fm.zeros(max(n, shift + size) + 1)
    base[:n] = fm.asarray(x.reshape(-1))
    return base[:n].reshape(x.shape), base[shift:shift + size].reshape(shape)


@pytest.mark.parametrize("how", ["aliased", "shifted"])
@pytest.mark.parametrize("name", OUT_FUNCTIONS)
def test_out_overlapping_an_input(device, rng, name, how):
    case = _case(name, rng, device)
    expected = _expected(case)
    dtypes = _result_dtype(case, name)
    if dtypes[0] != np.float32:
        pytest.skip(f"the result is {dtypes[0]}: it cannot share memory with float32 inputs")
    inputs = [fm.asarray(x) for x in case.inputs]
    shape = expected[0].shape
    if how == "aliased" and tuple(inputs[0].shape) == shape:
        out = inputs[0]  # the input itself
    else:  # a view of the input's memory: at its start, or shifted by one element
        inputs[0], out = _shared(case.inputs[0], shape, 0 if how == "aliased" else 1)
    if case.pair:  # the quotient over x, the remainder into a new array
        out = (out, fm.empty(expected[1].shape))
    _check(case, _run(name, case, inputs, out), expected)


@pytest.mark.parametrize("name", OUT_FUNCTIONS)
def test_wrong_shape_is_a_value_error(device, rng, name):
    case = _case(name, rng, device)
    expected = _expected(case)
    shape = expected[0].shape
    wrong = (shape[0] + 1,) + shape[1:]
    out = fm.empty(wrong, dtype=_result_dtype(case, name)[0])
    out = (out, fm.empty(expected[1].shape)) if case.pair else out
    with pytest.raises(ValueError, match=rf"\[fastmetal\.\w+\] expected out of shape "
                                         rf"{re_shape(shape)}, got shape {re_shape(wrong)}"):
        case.call(getattr(fm, name), [fm.asarray(x) for x in case.inputs], out)


@pytest.mark.parametrize("name", OUT_FUNCTIONS)
def test_wrong_dtype_is_a_value_error(device, rng, name):
    case = _case(name, rng, device)
    expected = _expected(case)
    shape = expected[0].shape
    if _result_dtype(case, name)[0] == np.bool_:
        pytest.skip("a bool result casts to every real dtype (NumPy's same_kind)")
    if _result_dtype(case, name)[0] == np.float32:
        out = fm.empty(shape, dtype="int64")  # floats do not go into integers
    else:
        out = np.empty(shape, np.bool_)  # int64 does not go into bool (NumPy's same_kind)
    out = (out, fm.empty(expected[1].shape)) if case.pair else out
    with pytest.raises(ValueError, match=r"\[fastmetal\.\w+\] expected out with an? [a-z ]+ "
                                         r"dtype, got (int64|bool)"):
        case.call(getattr(fm, name), [fm.asarray(x) for x in case.inputs], out)


@pytest.mark.parametrize("name", OUT_FUNCTIONS)
def test_numpy_out(device, rng, name):
    case = _case(name, rng, device)
    expected = _expected(case)
    dtypes = _result_dtype(case, name)
    inputs = [fm.asarray(x) for x in case.inputs]
    for as_float64 in (False, True):  # fastmetal's dtype (in place), and one it does not have
        outs = [np.full(e.shape, -7, np.float64 if as_float64 and d.kind == "f" else d)
                for e, d in zip(expected, dtypes)]
        out = tuple(outs) if case.pair else outs[0]
        _check(case, _run(name, case, inputs, out), expected)


@pytest.mark.host_visible
@pytest.mark.parametrize("name", OUT_FUNCTIONS)
def test_numpy_out_overlapping_numpy_input(device, rng, name):
    # NumPy memory on both sides: the device sees it in place, so overlap is its to detect.
    case = _case(name, rng, device)
    expected = _expected(case)
    if _result_dtype(case, name)[0] != np.float32:
        pytest.skip("an int64 result cannot share memory with float32 inputs")
    shape = expected[0].shape
    x = case.inputs[0]
    base = np.zeros(max(x.size, 1 + int(np.prod(shape))) + 1, np.float32)
    base[:x.size] = x.reshape(-1)
    inputs = [base[:x.size].reshape(x.shape)] + case.inputs[1:]
    out = base[1:1 + int(np.prod(shape))].reshape(shape)
    if case.pair:
        out = (out, np.empty(expected[1].shape, np.float32))
    _check(case, _run(name, case, inputs, out), expected)


def test_same_rules_across_ops(device):
    """The messages of one road: the same words for an elementwise op, a reduction and
    matmul."""
    a = fm.ones((3, 3))
    for call, shape in ((lambda o: fm.add(a, a, out=o), (3, 3)),
                        (lambda o: fm.sum(a, axis=0, out=o), (3,)),
                        (lambda o: fm.matmul(a, a, out=o), (3, 3))):
        with pytest.raises(ValueError, match=rf"expected out of shape {re_shape(shape)}, "
                                             r"got shape \(4, 4\)"):
            call(fm.empty((4, 4)))
        with pytest.raises(ValueError, match=r"expected out with a floating dtype, got int64 "
                                             r"\(the result is float32\)"):
            call(fm.empty(shape, dtype="int64"))
        with pytest.raises(TypeError, match=r"expected out to be a numpy.ndarray or "
                                            r"fastmetal.Array, got list"):
            call([0.0] * 9)


def test_readonly_and_broadcast_out_refused(device):
    a = fm.ones((3, 3))
    ro = np.zeros((3, 3), np.float32)
    ro.flags.writeable = False
    bc = np.broadcast_to(np.zeros(3, np.float32), (3, 3))
    for fn in (lambda o: fm.exp(a, out=o), lambda o: fm.matmul(a, a, out=o),
               lambda o: fm.cumsum(a, axis=1, out=o)):
        with pytest.raises(ValueError, match="writeable"):
            fn(ro)
        with pytest.raises(ValueError, match=r"(writeable|broadcast)"):
            fn(bc)


def test_int64_results_into_out(device):
    """int64 results (integer arithmetic, argmax) go into int64 or float out=, as NumPy's
    same_kind casting allows; comparisons of int64 arrays take out= too."""
    i = fm.asarray(np.array([[3, -2, 7], [1, 5, -4]]), dtype="int64")
    o = fm.zeros((2, 3), dtype="int64")
    assert fm.add(i, 2, out=o) is o
    np.testing.assert_array_equal(o.numpy(), np.array([[5, 0, 9], [3, 7, -2]]))
    f = fm.zeros((2, 3))
    assert fm.multiply(i, i, out=f) is f
    np.testing.assert_array_equal(f.numpy(), np.array([[9, 4, 49], [1, 25, 16]], np.float32))
    m = np.zeros((2, 3), np.float32)
    assert fm.less(i, 2, out=m) is m
    np.testing.assert_array_equal(m, [[0, 1, 0], [1, 0, 1]])
    shifted_base = fm.asarray(np.arange(7), dtype="int64")
    fm.negative(shifted_base[:-1], out=shifted_base[1:])  # overlapping int64 views
    np.testing.assert_array_equal(shifted_base.numpy(), [0, 0, -1, -2, -3, -4, -5])
    idx = np.zeros(2, np.int32)  # int64 indices into int32 (same kind)
    assert fm.argmax(fm.asarray(np.array([[1.0, 3.0], [4.0, 2.0]])), axis=1, out=idx) is idx
    np.testing.assert_array_equal(idx, [1, 0])


def test_dot_of_nd_arrays_into_out(device, rng):
    a = _values(rng, (2, 3, 4))
    b = _values(rng, (3, 4, 5))
    want = np.dot(a.astype(np.float64), b.astype(np.float64))
    out = fm.empty(want.shape)
    assert fm.dot(fm.asarray(a), fm.asarray(b), out=out) is out
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5)
    with pytest.raises(ValueError, match=r"\[fastmetal\.dot\] expected out of shape"):
        fm.dot(fm.asarray(a), fm.asarray(b), out=fm.empty((2, 3)))
