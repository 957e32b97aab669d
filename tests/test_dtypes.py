"""fastmetal's dtypes: bool, uint8, int32, int64, float16, float32, float64 (float64 on cpu and
cuda). Each test checks values against NumPy: asarray keeps the dtype, astype between every
pair (NumPy's x86-64 results), the promotion table (the Array API standard's, and PyTorch's
across kinds), comparisons and logical functions giving bool, integer arithmetic wrapping as
NumPy's, bitwise ops, boolean masks, where, and the reductions of integers and bool."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import fastmetal as fm

NAMES = ["bool", "uint8", "int32", "int64", "float16", "float32", "float64"]
INTS = ["uint8", "int32", "int64"]


def has_f64(device):
    return device != "metal"


def sample(name, n=64, seed=0):
    """Values of dtype `name` with its edge cases: extremes, 0, -0.0, NaN, inf."""
    rng = np.random.default_rng(seed)
    d = np.dtype(name)
    if d.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if d.kind in "iu":
        info = np.iinfo(d)
        v = rng.integers(info.min, info.max, n, dtype=d, endpoint=True)
        v[:4] = [info.min, info.max, 0, 1]
        return v
    v = (rng.standard_normal(n) * 100).astype(d)
    v[:5] = [0.0, -0.0, np.inf, -np.inf, np.nan]
    return v


def names_on(device):
    return [n for n in NAMES if n != "float64" or has_f64(device)]


# ----------------------------------------------------------------------------- asarray
def test_asarray_keeps_every_dtype(device):
    for name in names_on(device):
        host = sample(name)
        a = fm.asarray(host)
        assert a.dtype == np.dtype(name), name
        np.testing.assert_array_equal(a.numpy(), host)


def test_python_scalars_and_lists():
    assert fm.asarray(3).dtype == np.int64
    assert fm.asarray(2.5).dtype == np.float32
    assert fm.asarray(True).dtype == np.bool_
    assert fm.asarray([True, False]).dtype == np.bool_
    assert fm.asarray([1, 2]).dtype == np.int64


def test_dtype_names_are_numpy_dtypes():
    for name in NAMES:
        assert getattr(fm, name) == np.dtype(name)


def test_other_numpy_integers_widen_as_numpy_promotes():
    assert fm.asarray(np.arange(4, dtype=np.int16)).dtype == np.int64
    assert fm.asarray(np.arange(4, dtype=np.uint32)).dtype == np.int64
    assert fm.asarray(np.arange(4, dtype=np.int8)).dtype == np.int64
    with pytest.raises(TypeError, match="complex"):
        fm.asarray(np.ones(3, np.complex64))


# ----------------------------------------------------------------------------- astype
def numpy_astype(host, to):
    with np.errstate(invalid="ignore", over="ignore"):
        if np.dtype(to) == np.uint8 and host.dtype.kind == "f":
            # NumPy converts float to uint8 through a C cast; fastmetal through int64 (the
            # same low bits for every value within int64), as x86-64 NumPy does.
            safe = np.where(np.isfinite(host), host, 0).astype(np.float64)
            safe = np.where(np.abs(safe) < 2.0**63, safe, 0)
            out = safe.astype(np.int64).astype(np.uint8)
            return np.where(np.isfinite(host) & (np.abs(host.astype(np.float64)) < 2.0**63),
                            out, 0).astype(np.uint8)
        return host.astype(to)


@pytest.mark.parametrize("src", NAMES)
def test_astype_every_pair_matches_numpy(device, src):
    if src == "float64" and not has_f64(device):
        pytest.skip("no float64 on this device")
    host = sample(src)
    if np.dtype(src).kind == "f":
        host_for_ints = host.copy()
        host_for_ints[~np.isfinite(host_for_ints)] = 0  # NaN/inf -> int: checked below
    else:
        host_for_ints = host
    a = fm.asarray(host)
    for to in names_on(device):
        src_vals = host_for_ints if np.dtype(to).kind in "iu" else host
        b = fm.asarray(src_vals).astype(to)
        assert b.dtype == np.dtype(to)
        want = numpy_astype(src_vals, to)
        if np.dtype(to).kind == "f":
            np.testing.assert_array_equal(b.numpy(), want, err_msg=f"{src} -> {to}")
        elif np.dtype(to) in (np.int64, np.int32) and np.dtype(src).kind == "f":
            # out of range: NumPy's result is the type's lowest value on x86-64
            info = np.iinfo(to)
            v = src_vals.astype(np.float64)
            inside = (v >= info.min) & (v < float(info.max) + 1)
            np.testing.assert_array_equal(b.numpy()[inside], want[inside], err_msg=f"{src} -> {to}")
            assert (b.numpy()[~inside] == info.min).all()
        else:
            np.testing.assert_array_equal(b.numpy(), want, err_msg=f"{src} -> {to}")
    del a


def test_nan_and_inf_to_integers_give_the_lowest_value(device):
    a = fm.asarray(np.array([np.nan, np.inf, -np.inf, 1e30], np.float32))
    assert (a.astype("int64").numpy() == np.iinfo(np.int64).min).all()
    assert (a.astype("int32").numpy() == np.iinfo(np.int32).min).all()
    assert a.astype("bool").numpy().tolist() == [True, True, True, True]


def test_astype_of_strided_views(device):
    host = np.arange(60, dtype=np.int32).reshape(6, 10)
    a = fm.asarray(host)[::2, ::-3]
    np.testing.assert_array_equal(a.astype("float32").numpy(), host[::2, ::-3].astype(np.float32))
    np.testing.assert_array_equal(a.astype("uint8").numpy(), host[::2, ::-3].astype(np.uint8))


# ----------------------------------------------------------------------------- promotion
# The Array API standard's table (2024.12) for the dtypes fastmetal has.
STANDARD = {
    ("bool", "bool"): "bool",
    ("uint8", "uint8"): "uint8", ("uint8", "int32"): "int32", ("uint8", "int64"): "int64",
    ("int32", "int32"): "int32", ("int32", "int64"): "int64", ("int64", "int64"): "int64",
    ("float16", "float16"): "float16", ("float16", "float32"): "float32",
    ("float16", "float64"): "float64", ("float32", "float32"): "float32",
    ("float32", "float64"): "float64", ("float64", "float64"): "float64",
}


def test_result_type_follows_the_standard_table():
    for (x, y), want in STANDARD.items():
        assert fm.result_type(x, y) == np.dtype(want), (x, y)
        assert fm.result_type(y, x) == np.dtype(want), (y, x)


def test_result_type_across_kinds_is_pytorchs():
    # bool < integers < floats: the higher kind's dtype
    assert fm.result_type("bool", "int32") == np.int32
    assert fm.result_type("int64", "float16") == np.float16
    assert fm.result_type("uint8", "float32") == np.float32
    assert fm.result_type("int64", "float64") == np.float64


def test_python_scalars_are_weak():
    assert fm.result_type("int32", 1) == np.int32
    assert fm.result_type("uint8", 1) == np.uint8
    assert fm.result_type("float16", 1.5) == np.float16
    assert fm.result_type("int32", 1.5) == np.float32
    assert fm.result_type("bool", 1) == np.int64
    assert fm.result_type("bool", True) == np.bool_
    assert fm.result_type(1, 2.0) == np.float32


@pytest.mark.parametrize("x,y", list(itertools.combinations_with_replacement(NAMES, 2)))
def test_add_of_every_pair_promotes_and_computes(device, x, y):
    if "float64" in (x, y) and not has_f64(device):
        pytest.skip("no float64 on this device")
    if x == y == "bool":
        pytest.skip("bool + bool is logical or: test_bool_arithmetic")
    a, b = sample(x, 16, 1), sample(y, 16, 2)
    out = fm.asarray(a) + fm.asarray(b)
    want_dtype = fm.result_type(x, y)
    assert out.dtype == want_dtype
    with np.errstate(all="ignore"):
        want = a.astype(want_dtype) + b.astype(want_dtype)
    got = out.numpy()
    if want_dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-3 if want_dtype == np.float16 else 1e-6)
    else:
        np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- integers
@pytest.mark.parametrize("name", INTS)
def test_integer_arithmetic_wraps_as_numpy(device, name):
    x, y = sample(name, 64, 3), sample(name, 64, 4)
    y_nonzero = np.where(y == 0, 1, y).astype(name)
    a, b, bn = fm.asarray(x), fm.asarray(y), fm.asarray(y_nonzero)
    with np.errstate(all="ignore"):
        for got, want in [(a + b, x + y), (a - b, x - y), (a * b, x * y),
                          (fm.maximum(a, b), np.maximum(x, y)), (fm.minimum(a, b), np.minimum(x, y)),
                          (a // bn, x // y_nonzero), (a % bn, x % y_nonzero), (-a, -x), (abs(a), np.abs(x))]:
            assert got.dtype == np.dtype(name)
            np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("name", INTS)
def test_integer_division_by_zero_and_power(device, name):
    x = np.array([7, 0, 5, 100], dtype=name)
    zero = np.zeros(4, dtype=name)
    a = fm.asarray(x)
    assert (a // fm.asarray(zero)).numpy().tolist() == [0, 0, 0, 0]
    assert (a % fm.asarray(zero)).numpy().tolist() == [0, 0, 0, 0]
    e = np.array([0, 3, 2, 1], dtype=name)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal((a ** fm.asarray(e)).numpy(), x ** e)


@pytest.mark.parametrize("name", INTS + ["bool"])
def test_bitwise_ops_match_numpy(device, name):
    x, y = sample(name, 64, 5), sample(name, 64, 6)
    a, b = fm.asarray(x), fm.asarray(y)
    for got, want in [(a & b, x & y), (a | b, x | y), (a ^ b, x ^ y), (~a, ~x),
                      (fm.bitwise_and(a, b), np.bitwise_and(x, y))]:
        assert got.dtype == np.dtype(name)
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("name", INTS)
def test_shifts_match_numpy_within_the_width(device, name):
    x = sample(name, 64, 7)
    bits = 8 * np.dtype(name).itemsize
    s = np.random.default_rng(8).integers(0, bits, 64).astype(name)
    a, b = fm.asarray(x), fm.asarray(s)
    np.testing.assert_array_equal((a << b).numpy(), x << s)
    np.testing.assert_array_equal((a >> b).numpy(), x >> s)
    big = fm.asarray(np.full(64, bits + 3, dtype=name))
    assert ((a << big).numpy() == 0).all()


def test_python_float_lists_are_float32():
    assert fm.asarray([1.0, 2.5]).dtype == np.float32
    assert fm.asarray([[1, 2.0]]).dtype == np.float32
    assert fm.asarray(np.array([1.0])).dtype == np.float64  # NumPy's float64 stays


def test_bitwise_of_floats_is_a_type_error():
    with pytest.raises(TypeError, match="bitwise_and.*float32"):
        fm.bitwise_and(fm.asarray([1.0]), fm.asarray([2.0]))


# ----------------------------------------------------------------------------- bool
def test_comparisons_give_bool(device):
    for name in names_on(device):
        x, y = sample(name, 32, 9), sample(name, 32, 10)
        a, b = fm.asarray(x), fm.asarray(y)
        for got, want in [(a < b, x < y), (a <= b, x <= y), (a > b, x > y), (a >= b, x >= y),
                          (a == b, x == y), (a != b, x != y)]:
            assert got.dtype == np.bool_, name
            np.testing.assert_array_equal(got.numpy(), want, err_msg=name)


def test_comparisons_across_dtypes_and_with_scalars(device):
    i = fm.asarray(np.array([1, 2, 3], np.int64))
    f = fm.asarray(np.array([1.5, 2.0, 2.5], np.float32))
    assert (i > f).numpy().tolist() == [False, False, True]
    assert (i == 2).numpy().tolist() == [False, True, False]
    assert (f < 2.2).dtype == np.bool_


def test_bool_arithmetic(device):
    x, y = sample("bool", 32, 11), sample("bool", 32, 12)
    a, b = fm.asarray(x), fm.asarray(y)
    np.testing.assert_array_equal((a + b).numpy(), x + y)
    np.testing.assert_array_equal((a * b).numpy(), x * y)
    assert (a + b).dtype == np.bool_
    with pytest.raises(TypeError, match="subtract"):
        a - b
    with pytest.raises(TypeError, match="negative"):
        -a
    f = fm.asarray(np.linspace(-1, 1, 32).astype(np.float32))
    np.testing.assert_allclose((a * f).numpy(), x * f.numpy())
    assert (a * f).dtype == np.float32


def test_logical_functions_give_bool(device):
    x = np.array([0.0, 1.0, np.nan, -2.0], np.float32)
    y = np.array([0, 0, 3, 1], np.int32)
    a, b = fm.asarray(x), fm.asarray(y)
    for got, want in [(fm.logical_and(a, b), np.logical_and(x, y)),
                      (fm.logical_or(a, b), np.logical_or(x, y)),
                      (fm.logical_xor(a, b), np.logical_xor(x, y)),
                      (fm.logical_not(a), np.logical_not(x))]:
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got.numpy(), want)
    assert fm.all(a != 0.5).dtype == np.bool_ and bool(fm.all(a != 0.5))
    assert not bool(fm.any(fm.asarray(np.zeros(3, np.int32))))
    assert bool(fm.isnan(a).any()) and fm.isnan(a).dtype == np.bool_


def test_boolean_masks_index_and_assign(device):
    x = np.arange(-5, 7, dtype=np.float32).reshape(3, 4)
    a = fm.asarray(x)
    np.testing.assert_array_equal(a[a > 0].numpy(), x[x > 0])
    a[a < 0] = 0.0
    np.testing.assert_array_equal(a.numpy(), np.where(x < 0, 0, x))
    ints = fm.asarray(np.arange(6, dtype=np.int32))
    np.testing.assert_array_equal(ints[ints % 2 == 0].numpy(), [0, 2, 4])
    assert ints[ints % 2 == 0].dtype == np.int32


def test_accuracy_counts_are_integers(device):
    pred = fm.asarray(np.array([1, 2, 3, 4]))
    labels = fm.asarray(np.array([1, 0, 3, 4]))
    correct = (pred == labels).sum()
    assert correct.dtype == np.int64 and correct.item() == 3
    assert f"{correct.item()}/4" == "3/4"
    assert (pred == labels).float().mean().item() == 0.75


def test_where_with_bool_and_other_conditions(device):
    c = np.array([True, False, True, True, False, False, True, False])
    for name in names_on(device):
        x, y = sample(name, 8, 13), sample(name, 8, 14)
        got = fm.where(fm.asarray(c), fm.asarray(x), fm.asarray(y))
        assert got.dtype == np.dtype(name)
        np.testing.assert_array_equal(got.numpy(), np.where(c, x, y))
    f = fm.asarray(np.array([0.0, np.nan, 2.0], np.float32))  # nonzero, NaN too, is true
    np.testing.assert_array_equal(fm.where(f, 1, 0).numpy(), [0, 1, 1])


# ----------------------------------------------------------------------------- reductions
@pytest.mark.parametrize("name", INTS + ["bool"])
def test_sum_max_min_mean_of_integers(device, name):
    x = sample(name, 64, 15)
    if name != "bool":
        x = (x % 100).astype(name)
    a = fm.asarray(x)
    s = a.sum()
    assert s.dtype == np.int64 and s.item() == int(x.astype(np.int64).sum())
    assert a.max().dtype == np.dtype(name) and a.max().item() == x.max()
    assert a.min().item() == x.min()
    np.testing.assert_allclose(a.mean().item(), x.astype(np.float64).mean(), rtol=1e-6)
    np.testing.assert_array_equal(fm.cumsum(a).numpy(), np.cumsum(x.astype(np.int64)))


def test_argmax_of_integers(device):
    big = 2**40 if device != "metal" else 2**20  # apart by one: float32 could not tell them apart
    x = np.array([[3, big + 1, big], [7, 1, 7]], np.int64)
    a = fm.asarray(x)
    np.testing.assert_array_equal(fm.argmax(a, axis=1).numpy(), np.argmax(x, axis=1))
    np.testing.assert_array_equal(fm.argmin(a, axis=0).numpy(), np.argmin(x, axis=0))


# ----------------------------------------------------------------------------- creation, errors
def test_creation_functions_take_every_dtype(device):
    for name in names_on(device):
        assert fm.zeros((2, 3), dtype=name).dtype == np.dtype(name)
        np.testing.assert_array_equal(fm.ones(3, dtype=name).numpy(), np.ones(3, dtype=name))
    assert fm.full(3, True).dtype == np.bool_
    assert fm.arange(5).dtype == np.int64
    assert fm.arange(0.0, 1.0, 0.25).dtype == np.float32


def test_pytorch_dtype_methods(device):
    a = fm.asarray(np.array([1.7, -2.2, 0.0], np.float32))
    assert a.int().dtype == np.int32 and a.int().numpy().tolist() == [1, -2, 0]
    assert a.bool().numpy().tolist() == [True, True, False]
    assert a.long().dtype == np.int64
    if has_f64(device):
        assert a.double().dtype == np.float64


def test_float_only_ops_refuse_integer_arrays(device):
    w = fm.asarray(np.ones((2, 1, 3, 3), np.int32))
    with pytest.raises(TypeError, match="int32"):
        fm.conv2d(fm.asarray(np.ones((1, 1, 5, 5), np.float32)), w)


def test_out_of_range_scalars_are_overflow_errors():
    with pytest.raises(OverflowError, match="uint8"):
        fm.asarray(np.zeros(3, np.uint8)) + 300


def test_out_casting_same_kind(device):
    a = fm.asarray(np.arange(4, dtype=np.int32))
    out = np.zeros(4, np.float64)
    fm.add(a, 1, out=out)
    np.testing.assert_array_equal(out, np.arange(1, 5))
    with pytest.raises(ValueError, match="out"):
        fm.add(fm.asarray(np.ones(4, np.float32)), 1.0, out=np.zeros(4, np.int32))


def test_signbit_and_copysign(device):
    x = np.array([-0.0, 0.0, -1.5, 2.0, -np.inf, np.inf, np.nan, -np.nan], np.float32)
    a = fm.asarray(x)
    got = fm.signbit(a)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got.numpy(), np.signbit(x))
    y = np.array([1.0, -1.0, -0.0, 0.0, 1.0, -2.0, -1.0, 1.0], np.float32)
    c = fm.copysign(a, fm.asarray(y))
    np.testing.assert_array_equal(np.signbit(c.numpy()), np.signbit(np.copysign(x, y)))
    np.testing.assert_array_equal(np.abs(c.numpy()), np.abs(x))
    assert fm.signbit(fm.asarray(np.array([-3, 0, 4], np.int32))).numpy().tolist() == [True, False, False]
