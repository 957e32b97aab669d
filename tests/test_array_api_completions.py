"""The Array API functions and rules that closed the conformance suite's remaining
failures (docs/API.md, "Conformance"): nextafter, cumprod / cumulative_prod, from_dlpack,
0-d boolean masks, integer tensordot / vecdot in the promoted dtype, sign of integers, the
dtype= of sum / prod / the cumulative functions, imag of real input. Every value against
NumPy (float64 references, or NumPy's own result in the same dtype where fastmetal promises
NumPy's bits), on every device of the fixture."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm

from helpers import host, needs_torch, skip_without_float64, torch

FLOATS = [np.float32, np.float16, np.float64]


def _skip_float64(dtype, device):
    if dtype == np.float64:
        skip_without_float64(device)


def _bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _assert_same_floats(got, want):
    """The same dtype and bits (NaN: any NaN where NumPy has one)."""
    got, want = host(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(_bits(got)[~nan], _bits(want)[~nan]), \
        f"{got[~nan][_bits(got)[~nan] != _bits(want)[~nan]]} != " \
        f"{want[~nan][_bits(got)[~nan] != _bits(want)[~nan]]}"


# ----------------------------------------------------------------------------- nextafter
def _np_nextafter(x, y):
    """NumPy's nextafter, except one float16 quirk: NumPy's float16 loop returns x where
    x == y, so nextafter(0.0, -0.0) is 0.0 there; C, NumPy's float32/float64 and the Array
    API standard return y (-0.0), as fastmetal does for every dtype."""
    with np.errstate(all="ignore"):  # NumPy warns of max -> inf and of subnormal results
        r = np.nextafter(x, y)
        if r.dtype == np.float16:
            x, y = np.broadcast_arrays(np.asarray(x, np.float16), np.asarray(y, np.float16))
            r = np.where(x == y, y, r)
        return r


def _edges(dtype):
    f = np.finfo(dtype)
    sub = f.smallest_subnormal
    vals = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, f.max, -f.max, f.tiny, -f.tiny,
            sub, -sub, 2 * sub, -2 * sub, f.tiny - sub, 0.5, 3.0, -1e-3, 1e3]
    with np.errstate(all="ignore"):
        return np.array(vals, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_nextafter_is_numpys_bits_at_every_edge(dtype, device):
    _skip_float64(dtype, device)
    e = _edges(dtype)
    x, y = np.meshgrid(e, e)
    _assert_same_floats(fm.nextafter(fm.asarray(x), fm.asarray(y)), _np_nextafter(x, y))
    # random values: one ulp either way, as NumPy
    rng = np.random.default_rng(1)
    r = (rng.standard_normal(500) * 10.0 ** rng.integers(-3, 4, 500)).astype(dtype)
    s = (rng.standard_normal(500) * 10.0).astype(dtype)
    _assert_same_floats(fm.nextafter(fm.asarray(r), fm.asarray(s)), _np_nextafter(r, s))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_nextafter_scalars_broadcasting_0d_empty(dtype, device):
    _skip_float64(dtype, device)
    x = np.array([[1.0], [-2.0], [0.0]], dtype=dtype)
    y = np.array([3.0, -3.0, -0.0, np.nan], dtype=dtype)
    _assert_same_floats(fm.nextafter(fm.asarray(x), fm.asarray(y)), _np_nextafter(x, y))
    # a Python scalar takes the array's dtype (NEP 50): 1.0001 is 1.0 in float16
    for s in (1.0001, -np.inf, 0.0, 2.0):
        _assert_same_floats(fm.nextafter(fm.asarray(x), s), _np_nextafter(x, s))
        _assert_same_floats(fm.nextafter(s, fm.asarray(x)), _np_nextafter(s, x))
    z = np.array(-0.0, dtype=dtype)
    _assert_same_floats(fm.nextafter(fm.asarray(z), fm.asarray(np.array(1.0, dtype))),
                        _np_nextafter(z, np.array(1.0, dtype)))
    empty = np.zeros((0, 3), dtype)
    got = fm.nextafter(fm.asarray(empty), fm.asarray(empty))
    assert got.shape == (0, 3) and got.dtype == dtype


def test_nextafter_mixed_and_integer_inputs(device):
    a16 = np.array([1.0, -0.0, 65504.0], np.float16)
    a32 = np.array([2.0, 1.0, np.inf], np.float32)
    _assert_same_floats(fm.nextafter(fm.asarray(a16), fm.asarray(a32)), _np_nextafter(a16, a32))
    # integers compute in float32, as fastmetal's other float functions
    i = np.array([0, 5, -7], np.int32)
    got = fm.nextafter(fm.asarray(i), fm.asarray(np.array([1, 4, -9], np.int32)))
    _assert_same_floats(got, _np_nextafter(i.astype(np.float32), np.float32([1, 4, -9])))


def test_nextafter_has_no_gradient(device):
    x = fm.asarray(np.ones(3, np.float32)).requires_grad_()
    assert not fm.nextafter(x, 2.0).requires_grad


# ----------------------------------------------------------------------------- cumprod
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_cumprod_is_numpys_bits(dtype, device, rng):
    _skip_float64(dtype, device)
    x = (rng.uniform(0.5, 1.5, (4, 7, 5)) * rng.choice([1, -1], (4, 7, 5))).astype(dtype)
    x[1, 3, :] = 0.0
    x[2, 2, 1] = -0.0
    x[0, 4, 2] = np.nan
    x[3, 1, 3] = np.inf
    for axis in (0, 1, 2, -1, None):
        want = np.cumprod(x, axis=axis)
        _assert_same_floats(fm.cumprod(fm.asarray(x), axis=axis), want)
        # against float64 too (float32/float16: each step rounded, so a few ulp per step)
        ref = np.cumprod(x.astype(np.float64), axis=axis)
        got = host(fm.cumprod(fm.asarray(x), axis=axis)).astype(np.float64)
        ok = np.isfinite(ref)
        tol = {np.float16: 2e-2, np.float32: 1e-5, np.float64: 1e-13}[dtype]
        np.testing.assert_allclose(got[ok], ref[ok], rtol=tol, atol=0)
        assert np.array_equal(np.signbit(got), np.signbit(ref))
    # a strided (transposed) view, and NumPy input gives NumPy output
    t = fm.asarray(x).transpose(2, 0, 1)
    _assert_same_floats(fm.cumprod(t, axis=1), np.cumprod(x.transpose(2, 0, 1), axis=1))
    out = fm.cumprod(x, axis=1)
    assert isinstance(out, np.ndarray)
    _assert_same_floats(out, np.cumprod(x, axis=1))


def test_cumprod_integers_wrap_as_numpy(device):
    big = np.array([[3037000500, 3037000500, 7, -1, 2 ** 40]], np.int64)
    with np.errstate(over="ignore"):
        want = np.cumprod(big, axis=1)
    got = fm.cumprod(fm.asarray(big), axis=1)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(host(got), want)
    for dtype in (np.int32, np.uint8, np.bool_):
        x = np.array([200, 3, 0, 5, 255, 7], dtype) if dtype != np.bool_ else \
            np.array([True, True, False, True])
        got = fm.cumprod(fm.asarray(x))
        assert got.dtype == np.int64  # NumPy: the platform int (uint64 for uint8)
        np.testing.assert_array_equal(host(got), np.cumprod(x).astype(np.int64))


def test_cumprod_0d_empty_and_errors(device):
    got = fm.cumprod(fm.asarray(np.array(3.0, np.float32)))
    assert got.shape == (1,) and host(got)[0] == 3.0
    e = fm.cumprod(fm.asarray(np.zeros((2, 0), np.float32)), axis=1)
    assert e.shape == (2, 0) and e.dtype == np.float32
    with pytest.raises(ValueError, match=r"\[fastmetal.cumprod\]"):
        fm.cumprod(fm.asarray(np.ones((2, 2), np.float32)), axis=2)


def _cumprod_grad_reference(x, g):
    """d sum(g * cumprod(x)) / dx along the last axis, by definition (no division)."""
    out = np.zeros_like(x)
    n = x.shape[-1]
    for idx in np.ndindex(x.shape[:-1]):
        for k in range(n):
            total = 0.0
            for i in range(k, n):
                others = np.prod([x[idx + (j,)] for j in range(i + 1) if j != k])
                total += g[idx + (i,)] * others
            out[idx + (k,)] = total
    return out


def test_cumprod_gradient_with_zeros(device, rng):
    x = rng.uniform(-2, 2, (4, 6))
    x[1, 2] = 0.0            # one zero
    x[2, 1] = x[2, 4] = 0.0  # two zeros
    x[3, 0] = 0.0            # a zero first
    g = rng.standard_normal((4, 6))
    xa = fm.asarray(x.astype(np.float32)).requires_grad_()
    (fm.cumprod(xa, axis=1) * fm.asarray(g.astype(np.float32))).sum().backward()
    want = _cumprod_grad_reference(x.astype(np.float32).astype(np.float64), g)
    np.testing.assert_allclose(host(xa.grad), want, rtol=1e-4, atol=1e-5)
    # axis=None (flattened) and cumulative_prod's include_initial
    xb = fm.asarray(x.astype(np.float32)).requires_grad_()
    fm.cumprod(xb).sum().backward()
    flat = _cumprod_grad_reference(x.astype(np.float32).astype(np.float64).reshape(1, -1),
                                   np.ones((1, x.size)))
    np.testing.assert_allclose(host(xb.grad).reshape(1, -1), flat, rtol=1e-4, atol=1e-4)


@needs_torch
def test_cumprod_gradient_matches_torch(device, rng):
    x = rng.uniform(-2, 2, (3, 5)).astype(np.float32)
    x[0, 1] = 0.0
    xt = torch.tensor(x, requires_grad=True)
    torch.cumprod(xt, 0).pow(2).sum().backward()
    xa = fm.asarray(x).requires_grad_()
    (fm.cumprod(xa, axis=0) ** 2).sum().backward()
    np.testing.assert_allclose(host(xa.grad), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_cumulative_prod_standard_signature(device):
    x = np.array([[1.5, -2.0, 0.0], [3.0, 0.5, -4.0]], np.float32)
    got = fm.cumulative_prod(fm.asarray(x), axis=1, include_initial=True)
    want = np.concatenate([np.ones((2, 1), np.float32), np.cumprod(x, axis=1)], axis=1)
    _assert_same_floats(got, want)
    got = fm.cumulative_prod(fm.asarray(x), axis=0)
    _assert_same_floats(got, np.cumprod(x, axis=0))
    one = fm.cumulative_prod(fm.asarray(x[0]))  # 1-D: axis may be left out
    _assert_same_floats(one, np.cumprod(x[0]))
    with pytest.raises(ValueError, match=r"\[fastmetal.cumulative_prod\] expected axis"):
        fm.cumulative_prod(fm.asarray(x))
    # dtype=: converted first, the result in that dtype (integers wrap back)
    i = np.array([100, 100, 100], np.int32)
    got = fm.cumulative_prod(fm.asarray(i), dtype=np.int32)
    assert got.dtype == np.int32
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(host(got), np.cumprod(i, dtype=np.int32))
    assert fm.cumulative_prod(fm.asarray(i)).dtype == np.int64
    u = np.array([16, 16, 2], np.uint8)
    got = fm.cumulative_prod(fm.asarray(u), dtype=np.uint8, include_initial=True)
    np.testing.assert_array_equal(host(got), np.array([1, 16, 0, 0], np.uint8))
    h = fm.cumulative_prod(fm.asarray(x[0]), dtype=np.float16)
    _assert_same_floats(h, np.cumprod(x[0].astype(np.float16)))
    empty = fm.cumulative_prod(fm.asarray(np.zeros(0, np.float32)), include_initial=True)
    np.testing.assert_array_equal(host(empty), np.ones(1, np.float32))
    with pytest.raises(TypeError, match=r"\[fastmetal.cumulative_prod\] expected dtype"):
        fm.cumulative_prod(fm.asarray(x[0]), dtype=np.int16)


def test_cumulative_sum_dtype_wraps_back(device):
    i = np.array([2 ** 30, 2 ** 30, 2 ** 30], np.int32)
    got = fm.cumulative_sum(fm.asarray(i), dtype=np.int32)
    assert got.dtype == np.int32
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(host(got), np.cumsum(i, dtype=np.int32))


# ----------------------------------------------------------------------------- from_dlpack
DTYPES = [np.bool_, np.uint8, np.int32, np.int64, np.float16, np.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_from_dlpack_numpy_shares_memory_on_cpu(dtype):
    x = np.arange(6).reshape(2, 3).astype(dtype)
    y = fm.from_dlpack(x)
    assert y.device == "cpu" and y.dtype == dtype and y.shape == (2, 3)
    np.testing.assert_array_equal(host(y), x)
    assert np.shares_memory(y.numpy(), x)
    c = fm.from_dlpack(x, copy=True)
    assert not np.shares_memory(c.numpy(), x)
    np.testing.assert_array_equal(host(c), x)
    assert np.shares_memory(fm.from_dlpack(x, copy=False).numpy(), x)


def test_from_dlpack_float64_0d_and_strided():
    x = np.array(2.5)
    y = fm.from_dlpack(x)
    assert y.shape == () and y.dtype == np.float64 and float(host(y)) == 2.5
    s = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(host(fm.from_dlpack(s)), s)


def test_from_dlpack_onto_every_device(device):
    x = np.linspace(-1, 1, 10, dtype=np.float32)
    y = fm.from_dlpack(x, device=device)
    assert y.device == device
    np.testing.assert_array_equal(host(y), x)


def test_from_dlpack_of_fastmetal_arrays(device):
    a = fm.asarray(np.arange(5, dtype=np.float32), device=device)
    b = fm.from_dlpack(a)
    assert b is not a and b.device == device
    np.testing.assert_array_equal(host(b), host(a))
    a[0] = 7.0  # the same memory
    assert host(b)[0] == 7.0
    c = fm.from_dlpack(a, copy=True)
    a[1] = 9.0
    assert host(c)[1] == 1.0
    assert fm.from_dlpack(a, device=device, copy=False).device == device


@needs_torch
def test_from_dlpack_torch_cpu_tensor():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = fm.from_dlpack(t)
    np.testing.assert_array_equal(host(y), t.numpy())
    t[0, 0] = 42.0  # zero-copy: the tensor's own memory
    assert host(y)[0, 0] == 42.0
    b = fm.from_dlpack(torch.tensor([True, False]))
    assert b.dtype == np.bool_ and host(b).tolist() == [True, False]


class _CudaProducer:
    """A stand-in for a CUDA tensor: reports kDLCUDA and exports only a host copy."""

    def __init__(self, host_data, can_copy=True):
        self.host_data, self.can_copy = host_data, can_copy

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if not self.can_copy or dl_device is None or tuple(dl_device) != (1, 0):
            raise BufferError("this producer lives in CUDA memory")
        return self.host_data.copy().__dlpack__(max_version=max_version)


def test_from_dlpack_cuda_producer_is_copied_or_refused(device):
    x = np.arange(4, dtype=np.float32)
    y = fm.from_dlpack(_CudaProducer(x), device=device)
    assert y.device == device
    np.testing.assert_array_equal(host(y), x)
    with pytest.raises(ValueError, match=r"\[fastmetal.from_dlpack\].*copy=False"):
        fm.from_dlpack(_CudaProducer(x), copy=False)
    with pytest.raises(BufferError, match=r"\[fastmetal.from_dlpack\].*this producer"):
        fm.from_dlpack(_CudaProducer(x, can_copy=False))


def test_from_dlpack_bad_input():
    with pytest.raises(TypeError, match=r"\[fastmetal.from_dlpack\] expected an object with "
                                        r"__dlpack__.*list"):
        fm.from_dlpack([1, 2])
    with pytest.raises(TypeError, match=r"\[fastmetal.from_dlpack\] expected copy"):
        fm.from_dlpack(np.zeros(2), copy="yes")
    with pytest.raises(TypeError, match=r"\[fastmetal.from_dlpack\] expected an array DLPack "
                                        r"can carry .*ndarray"):
        fm.from_dlpack(np.array(["x"]))


# ----------------------------------------------------------------------------- 0-d masks
@pytest.mark.parametrize("truth", [True, False])
def test_zero_dim_mask_read_as_numpy(truth, device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = fm.asarray(x)
    m = np.array(truth)
    for key_np, key_fm in [(m, fm.asarray(m)), (m, m),
                           ((Ellipsis, m), (Ellipsis, fm.asarray(m))),
                           ((slice(None), m), (slice(None), fm.asarray(m))),
                           ((None, m, slice(1, 3)), (None, fm.asarray(m), slice(1, 3)))]:
        got = a[key_fm]
        want = x[key_np]
        assert tuple(got.shape) == want.shape, (key_np, got.shape, want.shape)
        np.testing.assert_array_equal(host(got), want)
    s = fm.asarray(np.array(5.0, np.float32))  # a 0-d array
    assert tuple(s[fm.asarray(m)].shape) == np.array(5.0)[m].shape


@pytest.mark.parametrize("truth", [True, False])
def test_zero_dim_mask_assignment_as_numpy(truth, device):
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    a = fm.asarray(x.copy())
    a[fm.asarray(np.array(truth))] = 9
    x[np.array(truth)] = 9
    np.testing.assert_array_equal(host(a), x)
    b = fm.asarray(np.zeros((2, 3), np.float32))
    b[:, fm.asarray(np.array(truth))] = fm.asarray(np.array([[1.0], [2.0]], np.float32))[:, None]
    want = np.zeros((2, 3), np.float32)
    want[:, np.array(truth)] = np.array([[1.0], [2.0]], np.float32)[:, None]
    np.testing.assert_array_equal(host(b), want)


# ----------------------------------------------------------------------------- integer products
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_tensordot_of_integers_is_exact_and_wraps(dtype, device, rng):
    if dtype == np.bool_:
        a, b = rng.random((3, 4, 5)) < 0.3, rng.random((4, 5, 2)) < 0.3
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, (3, 4, 5), dtype=dtype, endpoint=True)
        b = rng.integers(info.min, info.max, (4, 5, 2), dtype=dtype, endpoint=True)
    got = fm.tensordot(fm.asarray(a), fm.asarray(b), axes=2)
    with np.errstate(over="ignore"):
        want = np.tensordot(a, b, axes=2)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(host(got), want)
    got = fm.tensordot(fm.asarray(a), fm.asarray(b), axes=([1], [0]))
    np.testing.assert_array_equal(host(got), np.tensordot(a, b, axes=([1], [0])))
    empty = fm.tensordot(fm.asarray(a[:0]), fm.asarray(b), axes=2)
    assert empty.shape == (0, 2) and empty.dtype == want.dtype


def test_tensordot_mixed_integer_dtypes_promote(device):
    a = np.array([[200, 100]], np.uint8)
    b = np.array([[70000], [-3]], np.int32)
    got = fm.tensordot(fm.asarray(a), fm.asarray(b), axes=1)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(host(got), np.tensordot(a.astype(np.int32), b, axes=1))
    # an integer with a float: the float path (float32)
    f = fm.tensordot(fm.asarray(a), fm.asarray(b.astype(np.float32)), axes=1)
    assert f.dtype == np.float32


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64, np.bool_, np.float16,
                                   np.float32], ids=lambda d: np.dtype(d).name)
def test_vecdot_keeps_the_promoted_dtype(dtype, device, rng):
    if dtype == np.bool_:
        a, b = rng.random((4, 6)) < 0.5, rng.random((4, 6)) < 0.5
    elif np.dtype(dtype).kind == "f":
        a, b = rng.standard_normal((4, 6)).astype(dtype), rng.standard_normal((4, 6)).astype(dtype)
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, (4, 6), dtype=dtype, endpoint=True)
        b = rng.integers(info.min, info.max, (4, 6), dtype=dtype, endpoint=True)
    got = fm.vecdot(fm.asarray(a), fm.asarray(b))
    with np.errstate(over="ignore"):
        want = np.vecdot(a, b)
    assert got.dtype == want.dtype
    if want.dtype.kind == "f":
        ref = np.sum(a.astype(np.float64) * b, axis=-1)
        tol = 1e-2 if dtype == np.float16 else 1e-5
        np.testing.assert_allclose(host(got).astype(np.float64), ref, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(host(got), want)


# ----------------------------------------------------------------------------- sign, sum dtype=
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8], ids=lambda d: np.dtype(d).name)
def test_sign_of_integers_keeps_the_dtype(dtype, device):
    info = np.iinfo(dtype)
    x = np.array([info.min, -5, -1, 0, 1, 7, info.max], dtype=np.int64).astype(dtype)
    got = fm.sign(fm.asarray(x))
    assert got.dtype == dtype
    np.testing.assert_array_equal(host(got), np.sign(x))
    assert fm.sign(fm.asarray(x[:0])).dtype == dtype
    assert host(fm.sign(fm.asarray(np.array(-3, dtype=np.int64)))) == -1


def test_sum_and_prod_take_any_dtype(device):
    i = np.array([2 ** 30, 2 ** 30, 2 ** 30, 5], np.int32)
    a = fm.asarray(i)
    s = fm.sum(a, dtype=np.int64)
    assert s.dtype == np.int64 and int(host(s)) == int(i.astype(np.int64).sum())
    with np.errstate(over="ignore"):
        wrapped = np.sum(i, dtype=np.int32)
    s = fm.sum(a, dtype=np.int32)
    assert s.dtype == np.int32 and int(host(s)) == int(wrapped)
    u = np.array([200, 100, 7], np.uint8)
    s = fm.sum(fm.asarray(u), dtype=np.uint8)
    assert s.dtype == np.uint8 and int(host(s)) == int(np.sum(u, dtype=np.uint8))
    h = np.array([60000.0, 60000.0], np.float16)
    s = fm.sum(fm.asarray(h), dtype=np.float32)
    assert s.dtype == np.float32 and float(host(s)) == 120000.0
    f = fm.sum(fm.asarray(np.array([[1.5, 2.7], [-1.2, 0.4]], np.float32)), axis=1,
               dtype=np.int64)
    np.testing.assert_array_equal(host(f), np.array([3, -1]))  # converted first: 1+2, -1+0
    p = fm.prod(fm.asarray(np.array([100, 100, 100], np.int32)), dtype=np.int32)
    with np.errstate(over="ignore"):
        assert p.dtype == np.int32 and int(host(p)) == int(np.prod([100, 100, 100], dtype=np.int32))
    # NumPy in, NumPy out (a NumPy scalar)
    r = fm.sum(i, dtype=np.int64)
    assert isinstance(r, np.int64) and int(r) == int(i.astype(np.int64).sum())
    with pytest.raises(TypeError, match=r"\[fastmetal.sum\] expected dtype .*int16"):
        fm.sum(a, dtype=np.int16)


def test_sum_dtype_gradient_goes_back_to_the_input(device):
    x = fm.asarray(np.array([1.0, 2.0, 3.0], np.float16)).requires_grad_()
    fm.sum(x, dtype=np.float32).backward()
    assert x.grad.dtype == np.float16
    np.testing.assert_array_equal(host(x.grad), np.ones(3, np.float16))


# ----------------------------------------------------------------------------- imag
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_imag_of_real_input_is_zero(dtype, device):
    x = np.array([[1, 0], [3, 7]]).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x = np.array([[np.nan, np.inf], [-0.0, -3.5]], dtype)
    got = fm.imag(fm.asarray(x))
    assert got.dtype == np.imag(x).dtype and got.shape == x.shape
    np.testing.assert_array_equal(host(got), np.imag(x))
    assert fm.imag(fm.asarray(np.zeros((0,), dtype))).shape == (0,)
    with pytest.raises(TypeError, match=r"\[fastmetal.imag\] expected x to be a fastmetal.Array"):
        fm.imag([1.0])
