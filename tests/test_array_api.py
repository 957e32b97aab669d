"""The Array API standard's surface on fastmetal's dtypes (float32, float16, int64): the
namespace, dtype introspection, the standard's functions against NumPy float64 (always) and
PyTorch (skipped without it) on random shapes, negative axes, empty arrays and broadcasting,
their gradients, special values (-0.0, NaN, +-inf) and bad arguments."""
from __future__ import annotations

import operator

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.ops.optable import OPS
from helpers import host, torch


def arr(x, device, dtype=np.float32):
    return fm.asarray(np.asarray(x, dtype=dtype), dtype=dtype, device=device)


def linear_grad(fm_fn, np_fn, x, device, rng):
    """fm_fn's gradient against the exact one of a linear NumPy map: d sum(w f(x)) / dx_i =
    sum(w f(e_i))."""
    a = arr(x, device).requires_grad_()
    out = fm_fn(a)
    w = rng.standard_normal(out.shape)
    (out * arr(w, device)).sum().backward()
    want = np.array([np.sum(w * np_fn(np.eye(x.size)[i].reshape(x.shape)))
                     for i in range(x.size)]).reshape(x.shape)
    np.testing.assert_allclose(host(a.grad), want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- namespace
def test_namespace_and_dtypes(device):
    a = arr([1.0, 2.0], device)
    assert a.__array_namespace__() is fm and fm.__array_api_version__ == "2024.12"
    assert a.__array_namespace__(api_version="2023.12") is fm
    with pytest.raises(ValueError, match="expected api_version"):
        a.__array_namespace__(api_version="1999.01")
    assert a.dtype == fm.float32 and {fm.float32: 1}[a.dtype] == 1
    assert fm.asarray([1, 2]).astype(fm.int64).dtype == fm.int64
    assert fm.zeros(2, dtype=fm.float16).dtype == fm.float16
    assert a.to_device(device) is a and a.to_device("cpu").device == "cpu"
    m = arr(np.arange(24).reshape(2, 3, 4), device)
    np.testing.assert_array_equal(host(m.mT), np.swapaxes(np.arange(24).reshape(2, 3, 4), -1, -2))
    np.testing.assert_array_equal(host(fm.matrix_transpose(m)), host(m.mT))
    with pytest.raises(ValueError, match=r"\[fastmetal.matrix_transpose\] expected an array "
                                         r"of dimension >= 2"):
        a.mT


def test_finfo_iinfo_isdtype_result_type_can_cast():
    f = fm.finfo(fm.float32)
    assert f.bits == 32 and f.eps == np.finfo(np.float32).eps and f.smallest_normal > 0
    # Python numbers, as the standard asks (numpy.finfo's are NumPy scalars)
    assert type(f.bits) is int and type(f.eps) is float and type(f.max) is float
    assert type(f.min) is float and type(f.smallest_normal) is float
    assert (f.max, f.min, f.tiny) == (float(np.finfo(np.float32).max),
                                      float(np.finfo(np.float32).min),
                                      float(np.finfo(np.float32).tiny))
    assert fm.finfo(fm.float16).max == 65504 and fm.finfo(fm.zeros(1)).dtype == np.float32
    assert fm.iinfo(fm.int64).max == 2**63 - 1 and fm.iinfo("int64").min == -2**63
    with pytest.raises(TypeError, match=r"\[fastmetal.finfo\] expected a floating dtype"):
        fm.finfo(fm.int64)
    with pytest.raises(TypeError, match=r"\[fastmetal.iinfo\] expected an integer dtype"):
        fm.iinfo(fm.float32)
    assert fm.isdtype(fm.float32, "real floating") and fm.isdtype(fm.int64, "integral")
    assert fm.isdtype(fm.int64, ("bool", "signed integer")) and not fm.isdtype(fm.float16, "integral")
    assert fm.isdtype(fm.float16, "numeric") and fm.isdtype(fm.float16, fm.float16)
    with pytest.raises(ValueError, match=r"\[fastmetal.isdtype\] expected kind"):
        fm.isdtype(fm.float32, "floating")
    with pytest.raises(TypeError, match="expected a dtype, got a fastmetal.Array"):
        fm.isdtype(fm.zeros(1), "numeric")
    assert fm.result_type(fm.float16, fm.float32) == fm.float32
    assert fm.result_type(fm.float16, fm.float16, 1.0) == fm.float16
    assert fm.result_type(fm.int64, 2) == fm.int64 and fm.result_type(fm.int64, 2.5) == fm.float32
    assert fm.result_type(fm.zeros(2, dtype="int64"), fm.float16) == fm.float16  # PyTorch's
    with pytest.raises(TypeError, match="expected fastmetal's dtypes"):
        fm.result_type(np.int16)
    assert fm.can_cast(fm.float16, fm.float32) and not fm.can_cast(fm.float32, fm.float16)
    assert not fm.can_cast(fm.int64, fm.float32)


def test_result_type_matches_the_ops(device):
    # result_type says what the elementwise ops actually give.
    dts = [fm.float32, fm.float16, fm.int64]
    for a in dts:
        for b in dts:
            x, y = fm.ones(2, dtype=a), fm.ones(2, dtype=b)
            assert fm.add(x, y).dtype == fm.result_type(x, y), (a, b)


# ----------------------------------------------------------------------------- special values
NEW_UNARY = ["tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "log1p",
             "expm1", "log2", "log10", "floor", "ceil", "trunc", "round", "sign", "sin", "tanh"]
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5,
                     1e-30, -1e-30, 1e-45, -1e-45, 3e38, -3e38, 20.0, -20.0, 89.0, -89.0],
                    np.float32)
NUMPY = {"asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "asinh": np.arcsinh,
         "acosh": np.arccosh, "atanh": np.arctanh}


@pytest.mark.parametrize("name", NEW_UNARY)
def test_signed_zeros_nan_and_infinities_as_numpy(name, device):
    got = host(getattr(fm, name)(arr(SPECIALS, device)))
    with np.errstate(all="ignore"):
        want = NUMPY.get(name, getattr(np, name))(SPECIALS.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isposinf(got), np.isposinf(want))
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    zero = want == 0
    # sin(-0) and tanh(-0) are -0 (they once gave +0), as is every odd function's.
    assert np.array_equal(np.signbit(got[zero]), np.signbit(want[zero])), name


def test_atan2_hypot_logaddexp_special_grid(device):
    x, y = np.meshgrid(SPECIALS, SPECIALS)
    for name, ref in (("atan2", np.arctan2), ("hypot", np.hypot), ("logaddexp", np.logaddexp)):
        got = host(getattr(fm, name)(arr(x, device), arr(y, device)))
        with np.errstate(all="ignore"):
            want = ref(x.astype(np.float64), y.astype(np.float64)).astype(np.float32)
        assert np.array_equal(np.isnan(got), np.isnan(want)), name
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=3e-7, atol=1e-37, err_msg=name)
        assert np.array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0])), name
        assert np.array_equal(got[np.isinf(want)], want[np.isinf(want)]), name


def test_masks_isnan_isinf_isfinite(device):
    for name in ("isnan", "isinf", "isfinite"):
        got = getattr(fm, name)(arr(SPECIALS, device))
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(host(got), getattr(np, name)(SPECIALS))
        assert getattr(arr(SPECIALS, device), name)().shape == SPECIALS.shape
    ints = arr([1, -2, 3], device, np.int64)
    np.testing.assert_array_equal(host(fm.isfinite(ints)), [1.0, 1.0, 1.0])
    assert not fm.isnan(arr([1.0], device).requires_grad_()).requires_grad


def test_new_table_ops_against_torch():
    if torch is None:
        pytest.skip("PyTorch is not installed")
    rng = np.random.default_rng(3)
    x = rng.uniform(-0.95, 0.95, 500).astype(np.float32)
    for name in ("asin", "acos", "atan", "atanh", "asinh", "sinh", "cosh", "tan", "log1p",
                 "expm1", "floor", "ceil", "trunc", "round", "sign"):
        np.testing.assert_allclose(host(getattr(fm, name)(x)),
                                   getattr(torch, name)(torch.tensor(x)).numpy(), rtol=4e-7,
                                   atol=1e-7, err_msg=name)
    assert {s.name for s in OPS} >= {"atan2", "hypot", "logaddexp", "log2", "log10", "acosh"}


# ----------------------------------------------------------------------------- functions
def test_concat_permute_dims_pow(device, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    a = arr(x, device)
    np.testing.assert_array_equal(host(fm.concat([a, a], axis=-1)), np.concatenate([x, x], -1))
    np.testing.assert_array_equal(host(fm.concat([a, a], axis=None)), np.concatenate([x, x], None))
    np.testing.assert_array_equal(host(fm.permute_dims(a, (2, 0, 1))), x.transpose(2, 0, 1))
    np.testing.assert_allclose(host(fm.pow(a, 2)), x.astype(np.float64) ** 2, rtol=1e-6)
    with pytest.raises(TypeError, match=r"\[fastmetal.permute_dims\] expected x to be a "
                                        r"fastmetal.Array"):
        fm.permute_dims(x, (0, 1, 2))


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 0, 3), ()])
def test_clip(shape, device, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    lo = rng.standard_normal(shape[-1:]).astype(np.float32) - 0.5  # broadcast bounds
    a = arr(x, device)
    np.testing.assert_array_equal(host(fm.clip(a, -0.5, 0.5)), np.clip(x, -0.5, 0.5))
    np.testing.assert_array_equal(host(fm.clip(a, min=arr(lo, device))), np.maximum(x, lo))
    np.testing.assert_array_equal(host(fm.clip(a, max=0.25)), np.minimum(x, 0.25))
    np.testing.assert_array_equal(host(fm.clip(a)), x)
    np.testing.assert_array_equal(host(fm.clip(a, 1.0, 0.0)), np.clip(x, 1.0, 0.0) if x.size
                                  else x)  # min > max: max wins
    n = host(fm.clip(arr([np.nan, -np.inf, np.inf], device), -1.0, 1.0))
    assert np.isnan(n[0]) and n[1:].tolist() == [-1.0, 1.0]
    with pytest.raises(TypeError, match=r"\[fastmetal.clip\] expected min to be a real number"):
        fm.clip(a, "0")


def test_clip_gradient_matches_torch_clamp(device, rng):
    x = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0], np.float32)  # ties at both bounds
    lo = np.full(7, -1.0, np.float32)
    hi = np.array([1.0] * 6 + [-3.0], np.float32)  # min > max in the last element
    a, b, c = (arr(v, device).requires_grad_() for v in (x, lo, hi))
    w = rng.standard_normal(7).astype(np.float32)
    (fm.clip(a, b, c) * arr(w, device)).sum().backward()
    if torch is not None:
        ta, tb, tc = (torch.tensor(v, requires_grad=True) for v in (x, lo, hi))
        (torch.clamp(ta, tb, tc) * torch.tensor(w)).sum().backward()
        for mine, theirs in ((a, ta), (b, tb), (c, tc)):
            np.testing.assert_allclose(host(mine.grad), theirs.grad.numpy())
    # PyTorch's rule, written out: x where lo <= x <= hi, lo where x < lo, hi where taken.
    np.testing.assert_allclose(host(a.grad), w * [0, 1, 1, 1, 1, 1, 0])
    np.testing.assert_allclose(host(b.grad), w * [1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(host(c.grad), w * [0, 0, 0, 0, 0, 0, 1])


@pytest.mark.parametrize("shape,axis", [((4, 5), None), ((4, 5), 0), ((4, 5), -1),
                                        ((2, 3, 4), (0, 2)), ((0, 3), 0), ((0, 3), 1), ((), None)])
def test_all_any(shape, axis, device, rng):
    x = rng.integers(0, 2, shape).astype(np.float32) * rng.standard_normal(shape).astype(np.float32)
    if x.size:
        x.flat[0] = np.nan  # NaN is nonzero (true)
    for keepdims in (False, True):
        for name in ("all", "any"):
            got = getattr(fm, name)(arr(x, device), axis=axis, keepdims=keepdims)
            want = getattr(np, name)(x, axis=axis, keepdims=keepdims)
            assert got.dtype == np.bool_ and got.shape == np.shape(want)
            np.testing.assert_array_equal(host(got), np.asarray(want))
    ones = arr(np.ones((3, 2)), device)
    assert float(fm.all(ones)) == 1.0 and float(ones.any(dim=0, keepdim=True).sum()) == 2.0
    assert float(fm.all(arr([1, 2, 0], device, np.int64))) == 0.0
    with pytest.raises(TypeError, match=r"\[fastmetal.all\] expected x to be a fastmetal.Array"):
        fm.all(np.ones(2))


def test_broadcast_to_and_arrays(device, rng):
    x = rng.standard_normal((3, 1)).astype(np.float32)
    a = arr(x, device)
    np.testing.assert_array_equal(host(fm.broadcast_to(a, (2, 3, 4))), np.broadcast_to(x, (2, 3, 4)))
    assert fm.broadcast_to(a, (3, 1)).shape == (3, 1) and fm.broadcast_to(a, (3, 0)).shape == (3, 0)
    p, q = fm.broadcast_arrays(a, arr(np.zeros(5), device))
    assert p.shape == q.shape == (3, 5)
    for bad in ((3, 2, 2), (2,), (4, 1)):
        with pytest.raises(ValueError, match=r"\[fastmetal.broadcast_to\] expected a shape"):
            fm.broadcast_to(a, bad)
    with pytest.raises(ValueError, match=r"\[fastmetal.broadcast_arrays\] expected shapes"):
        fm.broadcast_arrays(a, arr(np.zeros(4), device), arr(np.zeros(5), device))
    linear_grad(lambda t: fm.broadcast_to(t, (2, 3, 4)), lambda t: np.broadcast_to(t, (2, 3, 4)),
                x, device, rng)


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 1)])
def test_flip_roll(axis, device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    a = arr(x, device)
    np.testing.assert_array_equal(host(fm.flip(a, axis=axis)), np.flip(x, axis=axis))
    linear_grad(lambda t: fm.flip(t, axis=axis), lambda t: np.flip(t, axis=axis), x, device, rng)
    shift = (1, -5) if isinstance(axis, tuple) else 5
    np.testing.assert_array_equal(host(fm.roll(a, shift, axis=axis)), np.roll(x, shift, axis=axis))
    linear_grad(lambda t: fm.roll(t, shift, axis=axis), lambda t: np.roll(t, shift, axis=axis),
                x, device, rng)
    if torch is not None and axis is not None:
        np.testing.assert_array_equal(
            host(fm.roll(a, shift, axis=axis)),
            torch.roll(torch.tensor(x), shift, axis).numpy())
    empty = arr(np.zeros((0, 3)), device)
    assert fm.flip(empty).shape == (0, 3) and fm.roll(empty, 2, axis=0).shape == (0, 3)
    with pytest.raises(ValueError, match=r"\[fastmetal.roll\] expected as many shifts as axes"):
        fm.roll(a, (1, 2), axis=0)


def test_repeat_tile(device, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    a = arr(x, device)
    for reps, axis in ((2, None), (3, 0), (2, -1), ([1, 0, 2], 1), ([2, 1], 0), (0, 1)):
        np.testing.assert_array_equal(host(fm.repeat(a, reps, axis=axis)),
                                      np.repeat(x, reps, axis=axis))
        linear_grad(lambda t: fm.repeat(t, reps, axis=axis),
                    lambda t: np.repeat(t, reps, axis=axis), x, device, rng)
    for reps in ((2,), (2, 1), (1, 3), (2, 1, 2), 0):
        np.testing.assert_array_equal(host(fm.tile(a, reps)), np.tile(x, reps))
        if torch is not None and isinstance(reps, tuple) and len(reps) >= 2:
            np.testing.assert_array_equal(host(fm.tile(a, reps)),
                                          torch.tensor(x).repeat(*reps).numpy())
    linear_grad(lambda t: fm.tile(t, (2, 1, 2)), lambda t: np.tile(t, (2, 1, 2)), x, device, rng)
    with pytest.raises(ValueError, match=r"\[fastmetal.repeat\] expected 3 repeats"):
        fm.repeat(a, [1, 2], axis=1)
    with pytest.raises(ValueError, match=r"\[fastmetal.repeat\] expected repeats >= 0"):
        fm.repeat(a, -1)
    with pytest.raises(ValueError, match=r"\[fastmetal.tile\] expected repetitions >= 0"):
        fm.tile(a, (-1,))


def test_eye_tril_triu_meshgrid(device, rng):
    for args, k in (((3,), 0), ((3, 5), 1), ((4, 2), -1), ((0,), 0)):
        got = fm.eye(*args, k=k)
        assert got.device == device and got.dtype == np.float32
        np.testing.assert_array_equal(host(got), np.eye(*args, k=k))
    assert fm.eye(2, dtype="int64").dtype == np.int64
    with pytest.raises(ValueError, match=r"\[fastmetal.eye\] expected non-negative sizes"):
        fm.eye(-1)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x[0, 2, 0] = np.nan  # below the diagonal: triu zeroes it (a mask, not a product)
    a = arr(x, device)
    for k in (-1, 0, 2):
        np.testing.assert_array_equal(host(fm.tril(a, k=k)), np.tril(x, k))
        np.testing.assert_array_equal(host(fm.triu(a, k=k)), np.triu(x, k))
    y = np.nan_to_num(x)
    linear_grad(lambda t: fm.tril(t, k=1), lambda t: np.tril(t, 1), y, device, rng)
    u, v = rng.standard_normal(3).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    for indexing in ("xy", "ij"):
        got = fm.meshgrid(arr(u, device), arr(v, device), indexing=indexing)
        for g, w in zip(got, np.meshgrid(u, v, indexing=indexing)):
            np.testing.assert_array_equal(host(g), w)
    with pytest.raises(ValueError, match=r"\[fastmetal.meshgrid\] expected indexing"):
        fm.meshgrid(arr(u, device), indexing="xx")


def test_take(device, rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    a = arr(x, device)
    idx = [4, 0, -1, 4]
    np.testing.assert_array_equal(host(fm.take(a, idx, axis=1)), np.take(x, idx, axis=1))
    np.testing.assert_array_equal(host(fm.take(a, arr([2, 0], device, np.int64), axis=-2)),
                                  np.take(x, [2, 0], axis=0))
    np.testing.assert_array_equal(host(fm.take(arr(x[0], device), [1, 1])), x[0, [1, 1]])
    linear_grad(lambda t: fm.take(t, idx, axis=1), lambda t: np.take(t, idx, axis=1), x,
                device, rng)
    with pytest.raises(ValueError, match=r"\[fastmetal.take\] expected axis for an array of "
                                         r"dimension 2"):
        fm.take(a, [0])
    with pytest.raises(TypeError, match=r"\[fastmetal.take\] expected integer indices"):
        fm.take(a, [0.5], axis=0)


@pytest.mark.parametrize("axes", [0, 1, 2, ([0, 2], [1, 0]), ([-1], [0])])
def test_tensordot_vecdot(axes, device, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    y_shape = {0: (3, 2), 1: (4, 5), 2: (3, 4, 5)}.get(axes) if isinstance(axes, int) else \
        (4, 2, 5) if len(axes[0]) == 2 else (4, 2)
    y = rng.standard_normal(y_shape).astype(np.float32)
    want = np.tensordot(x.astype(np.float64), y.astype(np.float64), axes=axes)
    got = fm.tensordot(arr(x, device), arr(y, device), axes=axes)
    np.testing.assert_allclose(host(got), want, rtol=1e-5, atol=1e-5)
    linear_grad(lambda t: fm.tensordot(t, arr(y, device), axes=axes),
                lambda t: np.tensordot(t, y.astype(np.float64), axes=axes), x, device, rng)
    u = rng.standard_normal((3, 1, 4)).astype(np.float32)
    v = rng.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(host(fm.vecdot(arr(u, device), arr(v, device))),
                               np.sum(u.astype(np.float64) * v, axis=-1), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"\[fastmetal.vecdot\] expected both arrays to have "
                                         r"the same length"):
        fm.vecdot(arr(u, device), arr(v[:, :3], device))
    with pytest.raises(ValueError, match=r"\[fastmetal.tensordot\] expected summed axes of "
                                         r"equal length"):
        fm.tensordot(arr(x, device), arr(x, device), axes=1)


# ----------------------------------------------------------------------------- asarray(copy=)
def test_asarray_copy_semantics(device, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    a = arr(x, device)
    assert fm.asarray(a, copy=False) is a and fm.asarray(a) is not None
    c = fm.asarray(a, copy=True)
    c[0, 0] = 99.0
    assert host(a)[0, 0] == x[0, 0]  # a real copy
    with pytest.raises(ValueError, match=r"\[fastmetal.asarray\] expected an object usable "
                                         r"without a copy"):
        fm.asarray(a, dtype="float16", copy=False)
    with pytest.raises(ValueError, match="without a copy"):
        fm.asarray([1.0, 2.0], copy=False)
    h = np.array([1.0, 2.0], np.float32)
    d = fm.asarray(h, copy=True)
    h[0] = 5.0
    assert host(d)[0] == 1.0
    if device == "cpu":
        shared = fm.asarray(h, copy=False)  # NumPy memory the cpu device can use as it is
        h[1] = 7.0
        assert host(shared)[1] == 7.0
    with pytest.raises(TypeError, match="expected copy to be True, False or None"):
        fm.asarray(h, copy="yes")


# ----------------------------------------------------------------------------- logical, sorting
def test_logical_functions_and_count_nonzero(device, rng):
    x = rng.integers(0, 2, (3, 4)).astype(np.float32) * rng.standard_normal((3, 4)).astype(np.float32)
    y = rng.integers(0, 2, (4,)).astype(np.float32)
    x[0, 0] = np.nan  # NaN is true
    a, b = arr(x, device), arr(y, device)
    for name in ("logical_and", "logical_or", "logical_xor"):
        got = getattr(fm, name)(a, b)
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(host(got), getattr(np, name)(x, y))
    np.testing.assert_array_equal(host(fm.logical_not(a)), np.logical_not(x))
    np.testing.assert_array_equal(host(fm.logical_and(a, 1.0)), np.logical_and(x, 1.0))
    for axis in (None, 0, -1):
        got = fm.count_nonzero(a, axis=axis)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(host(got), np.count_nonzero(x, axis=axis))
    with pytest.raises(TypeError, match=r"\[fastmetal.logical_or\] expected x2"):
        fm.logical_or(a, "1")


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_argsort(axis, descending, device, rng):
    x = rng.integers(0, 4, (5, 6)).astype(np.float32)  # many ties: stability shows
    x[1, 2] = np.nan
    a = arr(x, device)
    order = fm.argsort(a, axis=axis, descending=descending)
    assert order.dtype == np.int64 and order.device == device
    if descending:  # stable descending, NaN last (as NumPy's ascending order puts it)
        keys = np.where(np.isnan(x), np.inf, -x)
        want = np.argsort(keys, axis=axis, kind="stable")
    else:
        want = np.argsort(x, axis=axis, kind="stable")
    np.testing.assert_array_equal(host(order), want)
    np.testing.assert_array_equal(host(fm.sort(a, axis=axis, descending=descending)),
                                  np.take_along_axis(x, want, axis=axis))
    if torch is not None and not descending:
        t = torch.sort(torch.tensor(np.nan_to_num(x)), dim=axis, stable=True)
        np.testing.assert_array_equal(host(fm.argsort(arr(np.nan_to_num(x), device), axis=axis)),
                                      t.indices.numpy())
    ints = arr(np.array([3, -2**62, 7, 3]), device, np.int64)
    np.testing.assert_array_equal(host(fm.sort(ints, descending=True)), [7, 3, 3, -2**62])
    # sort is differentiable: each gradient goes back to its element's place.
    w = arr(rng.permutation(6).astype(np.float32), device).requires_grad_()
    (fm.sort(w) * arr(np.arange(6), device)).sum().backward()
    np.testing.assert_array_equal(host(w.grad), np.argsort(np.argsort(host(w))))
    assert fm.sort(arr(np.zeros((0, 3)), device), axis=0).shape == (0, 3)
    with pytest.raises(ValueError, match=r"\[fastmetal.argsort\] expected an array of dimension"):
        fm.argsort(arr(1.0, device))


def test_searchsorted_and_unique(device, rng):
    s = np.array([1.0, 2.0, 2.0, 5.0], np.float32)
    v = np.array([[0.0, 2.0], [2.5, 9.0]], np.float32)
    for side in ("left", "right"):
        got = fm.searchsorted(arr(s, device), arr(v, device), side=side)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(host(got), np.searchsorted(s, v, side=side))
    with pytest.raises(ValueError, match=r"\[fastmetal.searchsorted\] expected side"):
        fm.searchsorted(arr(s, device), arr(v, device), side="middle")
    x = np.array([[3.0, 1.0, np.nan], [1.0, np.nan, 3.0]], np.float32)
    a = arr(x, device)
    values, first, inverse, counts = fm.unique_all(a)
    np.testing.assert_array_equal(host(values), [1.0, 3.0, np.nan, np.nan])  # NaNs distinct
    np.testing.assert_array_equal(host(counts), [2, 2, 1, 1])
    assert inverse.shape == x.shape and first.dtype == np.int64
    np.testing.assert_array_equal(host(values)[host(inverse)][~np.isnan(x)], x[~np.isnan(x)])
    np.testing.assert_array_equal(host(fm.unique_values(a)), host(values))
    np.testing.assert_array_equal(host(fm.unique_counts(a)[1]), [2, 2, 1, 1])
    np.testing.assert_array_equal(host(fm.unique_inverse(a)[1]), host(inverse))


def test_nonzero(device, rng):
    x = rng.integers(0, 2, (3, 4, 2)).astype(np.float32)
    x[2, 3, 1] = np.nan
    got = fm.nonzero(arr(x, device))
    assert len(got) == 3 and all(g.dtype == np.int64 for g in got)
    for g, w in zip(got, np.nonzero(x)):
        np.testing.assert_array_equal(host(g), w)
    assert [g.shape for g in fm.nonzero(arr(np.zeros((2, 0)), device))] == [(0,), (0,)]
    with pytest.raises(ValueError, match=r"\[fastmetal.nonzero\] expected an array of dimension"):
        fm.nonzero(arr(1.0, device))


# ----------------------------------------------------------------------------- the rest of 2024.12's names
def test_constants(device):
    assert (fm.e, fm.pi, fm.inf) == (np.e, np.pi, np.inf) and np.isnan(fm.nan)
    assert all(type(c) is float for c in (fm.e, fm.pi, fm.inf, fm.nan))
    assert fm.newaxis is None and arr([1.0, 2.0], device)[fm.newaxis].shape == (1, 2)


def test_reshape_copy_astype(device, rng):
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    a = arr(x, device)
    for shape in [(4, 6), (-1,), (2, -1, 3), (24, 1)]:
        np.testing.assert_array_equal(host(fm.reshape(a, shape)), x.reshape(shape))
    a = arr(x.copy(), device)  # (asarray shares x's memory on the cpu)
    view, copied = fm.reshape(a, (6, 4)), fm.reshape(a, (6, 4), copy=True)
    a.fill_(5.0)  # the view sees the write, the copy does not
    np.testing.assert_array_equal(host(view), np.full((6, 4), 5.0, np.float32))
    np.testing.assert_array_equal(host(copied), x.reshape(6, 4))
    t = arr(x, device).mT  # not contiguous: no reshape without a copy
    np.testing.assert_array_equal(host(fm.reshape(t, (-1,))), np.swapaxes(x, -1, -2).ravel())
    with pytest.raises(ValueError, match=r"\[fastmetal.reshape\] expected a shape reachable "
                                         r"without a copy \(copy=False\), got \(24,\)"):
        fm.reshape(t, (-1,), copy=False)
    with pytest.raises(ValueError, match=r"fastmetal.reshape"):
        fm.reshape(a, (5, 5))
    with pytest.raises(TypeError, match=r"\[fastmetal.reshape\] expected x to be a "
                                        r"fastmetal.Array, got list"):
        fm.reshape([1.0, 2.0], (2,))
    g = arr(x, device).requires_grad_()
    (fm.reshape(g, (-1,)) * arr(np.arange(24), device)).sum().backward()
    np.testing.assert_array_equal(host(g.grad), np.arange(24, dtype=np.float32).reshape(x.shape))
    s = arr([-2.7, -0.5, 0.5, 2.7, 1e10], device)
    np.testing.assert_array_equal(host(fm.astype(s, fm.int64)),
                                  np.array([-2.7, -0.5, 0.5, 2.7, 1e10], np.float32).astype(np.int64))
    assert fm.astype(s, fm.float32, copy=False) is s
    assert fm.astype(s, fm.float32) is not s and fm.astype(s, fm.float16).dtype == fm.float16
    assert fm.astype(s, fm.float32, device=device).device == device
    with pytest.raises(TypeError, match=r"\[fastmetal.astype\] expected x"):
        fm.astype(np.ones(2), fm.float32)


def test_positive_conj_real_keep_values_and_signed_zeros(device):
    a = arr(SPECIALS, device)
    for name in ("positive", "conj", "real"):
        got = getattr(fm, name)(a)
        assert got is not a and got.dtype == fm.float32 and got.device == device
        np.testing.assert_array_equal(host(got), SPECIALS)  # NaN where NaN
        assert np.array_equal(np.signbit(host(got)), np.signbit(SPECIALS)), name  # -0.0 stays
        ints = arr([3, -2**62], device, np.int64)
        np.testing.assert_array_equal(host(getattr(fm, name)(ints)), [3, -2**62])
        with pytest.raises(TypeError, match=rf"\[fastmetal.{name}\] expected x"):
            getattr(fm, name)(1.0)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_unstack(axis, device, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    got = fm.unstack(arr(x, device), axis=axis)
    assert isinstance(got, tuple) and len(got) == x.shape[axis]
    for g, w in zip(got, np.moveaxis(x, axis, 0)):
        np.testing.assert_array_equal(host(g), w)
    assert fm.unstack(arr(np.zeros((0, 3)), device)) == ()
    with pytest.raises(ValueError, match=r"\[fastmetal.unstack\] expected an array of dimension"):
        fm.unstack(arr(1.0, device))


@pytest.mark.parametrize("axis", [0, -1])
def test_diff(axis, device, rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    a = arr(x, device)
    for n in (0, 1, 2, 5):
        np.testing.assert_allclose(host(fm.diff(a, axis=axis, n=n)), np.diff(x, axis=axis, n=n),
                                   rtol=1e-6, atol=1e-6)
    edge = np.ones((4, 5), np.float32)[(slice(None),) * (axis % 2) + (slice(0, 2),)]
    np.testing.assert_allclose(
        host(fm.diff(a, axis=axis, prepend=arr(edge, device), append=arr(-edge, device))),
        np.diff(x, axis=axis, prepend=edge, append=-edge), rtol=1e-6, atol=1e-6)
    ints = arr([1, 4, 9, 2**40], device, np.int64)
    got = fm.diff(ints)
    assert got.dtype == fm.int64
    np.testing.assert_array_equal(host(got), [3, 5, 2**40 - 9])
    linear_grad(lambda v: fm.diff(v, axis=axis, n=2), lambda v: np.diff(v, axis=axis, n=2), x,
                device, rng)
    with pytest.raises(ValueError, match=r"\[fastmetal.diff\] expected n to be a non-negative"):
        fm.diff(a, n=-1)
    with pytest.raises(ValueError, match=r"\[fastmetal.diff\] expected an array of dimension"):
        fm.diff(arr(1.0, device))


def test_cumulative_sum(device, rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    a = arr(x, device)
    for axis in (0, 1, -1):
        np.testing.assert_allclose(host(fm.cumulative_sum(a, axis=axis)),
                                   np.cumsum(x, axis=axis), rtol=1e-6, atol=1e-6)
        zero_shape = list(x.shape)
        zero_shape[axis] = 1
        want = np.concatenate([np.zeros(zero_shape, np.float32), np.cumsum(x, axis=axis)], axis)
        got = fm.cumulative_sum(a, axis=axis, include_initial=True)
        np.testing.assert_allclose(host(got), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(host(fm.cumulative_sum(arr([1, 2, 2**40], device, np.int64))),
                                  [1, 3, 3 + 2**40])
    got = fm.cumulative_sum(arr([1, 2, 3], device, np.int64), dtype=fm.float32)
    assert got.dtype == fm.float32
    np.testing.assert_array_equal(host(got), [1.0, 3.0, 6.0])
    empty = fm.cumulative_sum(arr(np.zeros(0), device), include_initial=True)
    np.testing.assert_array_equal(host(empty), [0.0])
    linear_grad(lambda v: fm.cumulative_sum(v, axis=1, include_initial=True),
                lambda v: np.concatenate([np.zeros((3, 1)), np.cumsum(v, axis=1)], 1), x, device,
                rng)
    with pytest.raises(ValueError, match=r"\[fastmetal.cumulative_sum\] expected axis for an "
                                         r"array of dimension 2"):
        fm.cumulative_sum(a)


def test_take_along_axis(device, rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    a = arr(x, device)
    for axis in (0, 1, -1):
        n = x.shape[axis]
        shape = list(x.shape)
        shape[axis] = 6
        idx = rng.integers(-n, n, shape)
        got = fm.take_along_axis(a, arr(idx, device, np.int64), axis=axis)
        np.testing.assert_array_equal(host(got), np.take_along_axis(x, idx % n, axis=axis))
    # The other axes broadcast, as NumPy's.
    idx = rng.integers(0, 5, (1, 4, 2))
    got = fm.take_along_axis(a, arr(idx, device, np.int64), axis=-1)
    np.testing.assert_array_equal(host(got), np.take_along_axis(x, np.broadcast_to(idx, (3, 4, 2)),
                                                                axis=-1))
    # the order argsort gives sorts x, as the standard's example
    order = fm.argsort(a, axis=1)
    np.testing.assert_array_equal(host(fm.take_along_axis(a, order, axis=1)), np.sort(x, axis=1))
    idx = rng.integers(0, 4, (3, 2, 5))
    linear_grad(lambda v: fm.take_along_axis(v, arr(idx, device, np.int64), axis=1),
                lambda v: np.take_along_axis(v, idx, axis=1), x, device, rng)
    with pytest.raises(TypeError, match=r"\[fastmetal.take_along_axis\] expected int64 indices, "
                                        r"got float32"):
        fm.take_along_axis(a, arr(idx, device), axis=1)
    with pytest.raises(ValueError, match=r"\[fastmetal.take_along_axis\] expected indices of x's "
                                         r"dimension"):
        fm.take_along_axis(a, arr([0], device, np.int64))


def test_index_and_complex(device):
    n = arr(3, device, np.int64)
    assert operator.index(n) == 3 and [10, 11, 12, 13][n] == 13 and range(n) == range(3)
    assert fm.zeros((n, 2), device=device).shape == (3, 2)  # a 0-d int Array as a size
    assert complex(arr(-0.5, device)) == -0.5 + 0j and complex(n) == 3 + 0j
    for bad in (arr(3.0, device), arr([3], device, np.int64)):
        with pytest.raises(TypeError, match=r"\[fastmetal.Array.__index__\] expected a 0-d "
                                            r"integer array"):
            operator.index(bad)


def test_unique_results_are_named_tuples(device):
    a = arr([[3.0, 1.0], [1.0, 2.0]], device)
    counts = fm.unique_counts(a)
    np.testing.assert_array_equal(host(counts.values), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(host(counts.counts), [2, 1, 1])
    inverse = fm.unique_inverse(a)
    np.testing.assert_array_equal(host(inverse.values)[host(inverse.inverse_indices)], host(a))
    u = fm.unique_all(a)
    assert u._fields == ("values", "indices", "inverse_indices", "counts")
    np.testing.assert_array_equal(host(u.indices), [1, 3, 0])
    values, _, _, cnt = u  # still a 4-tuple
    assert values is u.values and cnt is u.counts
    # inverse_indices has x's shape, 0-d included
    zero_d = arr(2.0, device)
    assert fm.unique_inverse(zero_d).inverse_indices.shape == ()
    assert fm.unique_all(zero_d).inverse_indices.shape == ()


STANDARD_DTYPE_NAMES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                        "uint64", "float32", "float64", "complex64", "complex128"}


def test_namespace_info_lists_the_standard_dtypes_by_name(device):
    info = fm.__array_namespace_info__()
    assert info.default_device() in info.devices() and device in info.devices()
    dts = info.dtypes(device=device)
    assert set(dts) <= STANDARD_DTYPE_NAMES and "float16" not in dts  # not a standard dtype
    assert {"bool", "int64", "float32"} <= set(dts)
    assert all(getattr(fm, name) == d and d.name == name for name, d in dts.items())
    assert set(info.dtypes(device=device, kind="real floating")) <= {"float32", "float64"}
    assert info.dtypes(kind="bool") == {"bool": fm.bool}
    assert info.default_dtypes(device=device)["indexing"] == fm.int64
