"""The int64 index dtype of fastmetal.Array, astype on the device and float16 reductions,
against NumPy on every device: argmax/argmin of Arrays return int64 Arrays, comparisons
with integer labels stay on the device, sums and means of masks and of int64 arrays,
conversions float32 <-> float16 <-> int64 over any strides, and the TypeError of every op
that does not take int64."""
from __future__ import annotations

import operator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastmetal as fm
from fastmetal import _core
from helpers import host

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
COMPARISONS = {"less": operator.lt, "less_equal": operator.le, "greater": operator.gt,
               "greater_equal": operator.ge, "equal": operator.eq, "not_equal": operator.ne}


def strided(rng, shape, dtype, step):
    """A view with step `step` on every axis (negative: reversed) of a bigger array."""
    big_shape = tuple(n * abs(step) for n in shape)
    if np.dtype(dtype).kind == "i":
        big = rng.integers(-50, 50, big_shape).astype(dtype)
    else:
        big = (rng.standard_normal(big_shape) * 40).astype(dtype)
    return big[tuple(slice(None, None, step) for _ in shape)]


# ----------------------------------------------------------------------------- argmax
@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), (-1, False)])
def test_arg_reductions_return_int64_arrays(device, name, axis, keepdims, rng):
    x = rng.standard_normal((7, 33)).astype(np.float32)
    x[3, 5] = np.nan
    got = getattr(fm.asarray(x), name)(axis=axis, keepdims=keepdims)
    want = getattr(np, name)(x, axis=axis, keepdims=keepdims)
    assert isinstance(got, fm.Array) and got.device == device and got.dtype == np.int64
    assert got.shape == np.shape(want)
    np.testing.assert_array_equal(host(got), want)
    # NumPy in, NumPy out (a NumPy scalar for a full reduction), as before.
    plain = getattr(fm, name)(x, axis=axis, keepdims=keepdims)
    assert isinstance(plain, (np.ndarray, np.int64)) and np.asarray(plain).dtype == np.int64
    np.testing.assert_array_equal(plain, want)


@pytest.mark.parametrize("labels_kind", ["numpy-int64", "numpy-int32", "numpy-uint8", "array",
                                         "list"])
def test_accuracy_stays_on_the_device(device, labels_kind, rng):
    logits = rng.standard_normal((200, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 200)
    want = np.mean(logits.argmax(1) == labels)
    lab = {"numpy-int64": labels, "numpy-int32": labels.astype(np.int32),
           "numpy-uint8": labels.astype(np.uint8), "list": labels.tolist(),
           "array": fm.asarray(labels, dtype="int64")}[labels_kind]
    pred = fm.asarray(logits).argmax(1)
    mask = pred == lab
    assert isinstance(mask, fm.Array) and mask.dtype == np.bool_ and mask.device == device
    np.testing.assert_array_equal(host(mask), logits.argmax(1) == labels)
    acc = mask.mean()
    assert isinstance(acc, fm.Array) and acc.dtype == np.float32 and acc.shape == ()
    assert abs(float(acc) - want) < 1e-6
    assert float(mask.sum()) == np.sum(logits.argmax(1) == labels)
    # reflected: labels on the left
    if labels_kind != "list":
        np.testing.assert_array_equal(host(lab == pred), host(mask))


# ----------------------------------------------------------------------------- comparisons
@SETTINGS
@given(data=st.data(), op=st.sampled_from(sorted(COMPARISONS)))
def test_int64_comparisons_match_numpy(device, data, op):
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3,
                                                         max_side=4))
    x = data.draw(hnp.arrays(np.int64, shapes.input_shapes[0],
                             elements=st.integers(-2**62, 2**62)))
    y = data.draw(hnp.arrays(np.int64, shapes.input_shapes[1], elements=st.sampled_from(
        [0, 1, -1, 2**53 + 1, 2**53, -2**62, 2**62, 7])))
    if x.size:
        x.flat[0] = 2**53 + 1  # not a float: an exact comparison tells it from 2**53
    fn = COMPARISONS[op]
    want = fn(x, y)
    for a, b in ((fm.asarray(x, dtype="int64"), fm.asarray(y, dtype="int64")),
                 (fm.asarray(x, dtype="int64"), y), (x, fm.asarray(y, dtype="int64"))):
        got = fn(a, b)
        assert isinstance(got, fm.Array) and got.dtype == np.bool_
        np.testing.assert_array_equal(host(got), want)
        np.testing.assert_array_equal(host(getattr(fm, op)(a, b)), want)
    s = int(y.flat[0]) if y.size else 3
    np.testing.assert_array_equal(host(fn(fm.asarray(x, dtype="int64"), s)),
                                  fn(x, s))


@pytest.mark.parametrize("op", sorted(COMPARISONS))
def test_int64_vs_float_compares_in_float32(device, op, rng):
    x = rng.integers(-1000, 1000, (5, 6))
    y = (rng.standard_normal(6) * 500).astype(np.float32)
    y[0] = x[0, 0]  # an equal pair
    fn = COMPARISONS[op]
    want = fn(x, y)
    xi = fm.asarray(x, dtype="int64")
    for b in (y, fm.asarray(y), fm.asarray(y.astype(np.float16))):
        yb = host(b).astype(np.float64)
        np.testing.assert_array_equal(host(fn(xi, b)), fn(x, yb))
    np.testing.assert_array_equal(host(fn(xi, 2.5)), fn(x, 2.5))
    np.testing.assert_array_equal(host(fn(xi, y)), want)


def test_strided_int64_comparisons(device, rng):
    x = strided(rng, (4, 5, 3), np.int64, -2)
    y = strided(rng, (5, 1), np.int64, 3)
    xa = fm.asarray(x, dtype="int64")[:, ::-1]
    ya = fm.asarray(y, dtype="int64")
    np.testing.assert_array_equal(host(xa <= ya), x[:, ::-1] <= y)


# ----------------------------------------------------------------------------- reductions
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 2), -1])
def test_int64_sum_and_mean(device, axis, rng):
    x = rng.integers(-2**40, 2**40, (6, 50, 3))
    a = fm.asarray(x, dtype="int64")
    s = a.sum(axis=axis)
    assert isinstance(s, fm.Array) and s.dtype == np.int64
    np.testing.assert_array_equal(host(s), x.sum(axis=axis))
    m = fm.mean(a, axis=axis, keepdims=True)
    assert m.dtype == np.float32
    np.testing.assert_allclose(host(m), x.mean(axis=axis, keepdims=True), rtol=2e-7)
    t = a[:, ::-3, 1:]  # strided: gathered on the device
    np.testing.assert_array_equal(host(t.sum(axis=axis)), x[:, ::-3, 1:].sum(axis=axis))


def test_int64_sum_wraps_as_numpy(device):
    x = np.array([2**62, 2**62, 2**62, 5], np.int64)
    with np.errstate(over="ignore"):
        want = x.sum()
    assert int(fm.asarray(x, dtype="int64").sum()) == int(want)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var", "std"])
@pytest.mark.parametrize("axis", [None, 1])
def test_float16_reductions_return_float16(device, name, axis, rng):
    x = (rng.standard_normal((5, 300)) * 3).astype(np.float16)
    want = getattr(np, name)(x.astype(np.float32), axis=axis).astype(np.float16)
    for arg in (x, fm.asarray(x)):
        got = getattr(fm, name)(arg, axis=axis)
        assert host(got).dtype == np.float16
        assert getattr(np, name)(x, axis=axis).dtype == np.float16  # NumPy's rule
        # float32 accumulation, one rounding to float16 at the end
        np.testing.assert_allclose(host(got).astype(np.float64), want.astype(np.float64),
                                   rtol=2e-3, atol=2e-3)


# ----------------------------------------------------------------------------- astype
CASTS = [(np.float32, np.float16), (np.float16, np.float32), (np.float32, np.int64),
         (np.float16, np.int64), (np.int64, np.float32), (np.int64, np.float16),
         (np.int64, np.int64), (np.float32, np.float32)]


@pytest.mark.parametrize("src,dst", CASTS, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("step", [1, -2])
def test_astype_on_the_device(device, src, dst, step, rng):
    x = strided(rng, (3, 4, 5), src, step)
    if np.dtype(src).kind == "f":
        with np.errstate(over="ignore"):  # 70000 and -1e9 are inf in float16
            x.flat[:6] = np.array([0.5, -0.5, 2.5, -1e9, 70000.0, -0.0], np.float32).astype(src)
    a = fm.asarray(x, dtype=src)
    got = a.astype(dst)
    assert got.dtype == dst and got.device == device and got.shape == x.shape
    with np.errstate(all="ignore"):
        want = x.astype(dst)
    np.testing.assert_array_equal(host(got), want)


@SETTINGS
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
                    elements=st.floats(-1e6, 1e6, width=32)),
       dst=st.sampled_from([np.float16, np.int64]))
def test_astype_hypothesis(device, x, dst):
    with np.errstate(all="ignore"):
        want = x.astype(dst)
    got = fm.asarray(x).astype(dst)
    np.testing.assert_array_equal(host(got), want)
    if dst is np.int64:
        np.testing.assert_array_equal(host(got.astype(np.float32)), want.astype(np.float32))


def test_astype_special_values_to_int64(device):
    x = np.array([np.nan, np.inf, -np.inf, 1e19, -1e19, 3.9, -3.9], np.float32)
    got = host(fm.asarray(x).astype(np.int64))
    assert got.tolist() == [-2**63] * 5 + [3, -3]


def test_astype_runs_on_the_device_not_the_host(device, monkeypatch):
    a = fm.asarray(np.arange(6, dtype=np.float32))
    monkeypatch.setattr(fm.Array, "numpy", lambda self: pytest.fail("host round trip"))
    b = a.astype(np.float16).astype(np.int64).astype(np.float32)
    assert b.dtype == np.float32


# ----------------------------------------------------------------------------- int64 Arrays
def test_int64_views_copies_and_exports(device, rng):
    x = rng.integers(-10**12, 10**12, (4, 6))
    a = fm.asarray(x, dtype="int64")
    assert a.dtype == np.int64 and a.nbytes == x.size * 8
    np.testing.assert_array_equal(host(a[1:, ::-2].copy()), x[1:, ::-2])
    np.testing.assert_array_equal(host(a.T.reshape(-1)), x.T.reshape(-1))
    np.testing.assert_array_equal(np.asarray(a), x)
    assert np.asarray(a).dtype == np.int64 and a.tolist() == x.tolist()
    assert isinstance(a[0, 0].item(), int) and a[0, 0].item() == x[0, 0]
    assert int(a[1, 2]) == x[1, 2]
    b = a.to("cpu")
    assert b.dtype == np.int64 and b.device == "cpu"
    np.testing.assert_array_equal(host(b), x)
    a[0] = 7
    a[1:3, ::2] = np.array([1, 2, 3])
    a[3] = a[2]
    x[0] = 7
    x[1:3, ::2] = np.array([1, 2, 3])
    x[3] = x[2]
    np.testing.assert_array_equal(host(a), x)
    a[:, 1:] = a[:, :-1]  # overlapping: read before written
    x[:, 1:] = x[:, :-1].copy()
    np.testing.assert_array_equal(host(a), x)
    a[0] = fm.asarray(np.full(6, 2.7, np.float32))  # float value: truncated on the device
    assert host(a)[0].tolist() == [2] * 6
    z = fm.zeros((2, 3), dtype="int64")
    o = fm.ones(4, dtype=np.int64)
    assert z.dtype == np.int64 and host(z).tolist() == [[0] * 3] * 2 and host(o).tolist() == [1] * 4


@pytest.mark.host_visible
def test_int64_buffer_protocol_and_dlpack(device):
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    a = fm.asarray(x, dtype="int64")
    m = memoryview(a)
    assert m.format == "q" and m.itemsize == 8 and m.shape == (3, 4)
    v = np.asarray(a)
    assert v.dtype == np.int64 and np.shares_memory(v, np.asarray(a))
    d = np.from_dlpack(a)
    assert d.dtype == np.int64 and d.tolist() == x.tolist()


def test_int64_cuda_array_interface(device):
    if device != "cuda":
        pytest.skip("__cuda_array_interface__ is the cuda device's export")
    a = fm.asarray(np.arange(3), dtype="int64")
    assert a.__cuda_array_interface__["typestr"] == "<i8"


# int64 arithmetic, max/min/prod and float math on int64 (converted to float32) are
# tests/test_numpy_surface.py's, argmax/argmin tests/test_tensor_habits.py's; matmul still
# refuses integers (var computes them in float32: tests/test_dtypes.py).
@pytest.mark.parametrize("call", [lambda a: a @ a], ids=["matmul"])
def test_other_ops_refuse_int64(device, call):
    a = fm.asarray(np.arange(3), dtype="int64")
    with pytest.raises(TypeError, match=r"^\[fastmetal\.\w+\] expected .*int64"):
        call(a)


def test_int64_dtype_arguments(device):
    assert fm.asarray([1, 2], dtype=np.int64).dtype == np.int64
    assert fm.asarray(np.array([1, 2])).dtype == np.int64  # API rule: the dtype is kept
    with pytest.raises(TypeError, match=r"expected dtype bool, uint8, int32, int64"):
        fm.asarray([1, 2]).astype(np.int16)
    with pytest.raises(TypeError, match=r"expected one of fastmetal's dtypes"):
        fm.zeros(3, dtype="uint16")


def test_new_kernels_are_built():
    for name in ("convert_float32_int64", "convert_int64_float16", "convert_int64_int64",
                 "compare_equal_int64", "reduce_sum_int64", "reduce_mean_int64"):
        assert _core._has_kernel("cpu", name), name


def test_arg_reductions_into_out(device, rng):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    out = fm.zeros(4, dtype="int64")
    assert fm.argmax(fm.asarray(x), axis=1, out=out) is out
    np.testing.assert_array_equal(host(out), x.argmax(1))
    host_out = np.zeros(4, np.int64)
    fm.argmin(fm.asarray(x), axis=1, out=host_out)
    np.testing.assert_array_equal(host_out, x.argmin(1))
    # out= takes what the result casts to by NumPy's same_kind rule (every op's out=):
    # int64 indices into floats, never into bool.
    fout = fm.zeros(4)
    assert fm.argmax(fm.asarray(x), axis=1, out=fout) is fout
    np.testing.assert_array_equal(host(fout), x.argmax(1))
    with pytest.raises(ValueError, match=r"\[fastmetal\.argmax\] expected out with an integer "
                                         r"or floating dtype, got bool"):
        fm.argmax(fm.asarray(x), axis=1, out=np.zeros(4, np.bool_))
