"""fastmetal.sum / mean / var / std / max / min / argmax / argmin against NumPy float64:
every device of the suite, hypothesis over shapes, axes and strides, the MSL kernels of
metal/reduce.metal under the CPU fiber emulator (several threadgroup sizes and seeds),
NaN and empty cases, accuracy on 10^7 elements, bitwise reproducibility across thread
counts, bad arguments."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastmetal as fm
from fastmetal import _core
from references import msl_kernels_on_cpu

VALUE_OPS = ("sum", "mean", "var", "std", "max", "min")
ARG_OPS = ("argmax", "argmin")


kernels = pytest.fixture(msl_kernels_on_cpu)


def reference(name, x, axis, keepdims=False, ddof=0):
    x64 = np.asarray(x, dtype=np.float64)
    kw = dict(axis=axis, keepdims=keepdims)
    if name in ("var", "std"):
        kw["ddof"] = ddof
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's "Mean of empty slice"
        return getattr(np, name)(x64, **kw)


def check(name, x, axis=None, keepdims=False, ddof=0):
    """fastmetal vs NumPy float64 on a NumPy input: values, shape, dtype."""
    kw = dict(axis=axis, keepdims=keepdims)
    if name in ("var", "std"):
        kw["ddof"] = ddof
    got = getattr(fm, name)(x, **kw)
    want = reference(name, x, axis, keepdims, ddof)
    assert np.shape(got) == np.shape(want), (name, axis, np.shape(got), np.shape(want))
    if name in ARG_OPS:
        assert np.asarray(got).dtype == np.int64
        np.testing.assert_array_equal(got, want)
        return
    assert np.asarray(got).dtype == np.float32
    # Tolerance from the magnitude of what was summed.
    scale = np.abs(np.asarray(x, np.float64))
    size = max(1, np.asarray(x).size)
    if name in ("var", "std"):
        tol = 1e-5 * (1 + float(np.max(scale, initial=0.0)) ** 2)
    else:
        tol = 1e-5 * (1 + float(np.sum(scale)) / (size if name == "mean" else 1))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=tol)


# ----------------------------------------------------------------------------- every device
AXES = [None, 0, 1, -1, (0, 2), (1, 2), (0, 1, 2), ()]


@pytest.mark.parametrize("name,axis", [(n, a) for n in VALUE_OPS + ARG_OPS for a in AXES
                                       if n in VALUE_OPS or not isinstance(a, tuple)])
def test_matches_numpy(device, name, axis, rng):
    x = rng.standard_normal((6, 5, 7)).astype(np.float32)
    check(name, x, axis)
    check(name, x, axis, keepdims=True)


@pytest.mark.parametrize("name", VALUE_OPS + ARG_OPS)
def test_array_in_array_out(device, name, rng):
    x = rng.standard_normal((4, 33)).astype(np.float32)
    a = fm.asarray(x)
    got = getattr(fm, name)(a, axis=1)
    if name in ARG_OPS:  # int64 index Arrays on the device
        assert isinstance(got, fm.Array) and got.dtype == np.int64 and got.device == device
        np.testing.assert_array_equal(got.numpy(), getattr(np, name)(x, axis=1))
        return
    assert isinstance(got, fm.Array) and got.device == device and got.shape == (4,)
    np.testing.assert_allclose(got.numpy(), reference(name, x, 1), rtol=1e-5, atol=1e-5)
    full = getattr(fm, name)(a)
    assert isinstance(full, fm.Array) and full.shape == ()


def test_numpy_scalars_as_numpy(device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    s = fm.sum(x)
    assert isinstance(s, np.float32) and s == 66
    i = fm.argmax(x)
    assert isinstance(i, np.int64) and i == 11
    assert fm.argmax(x, axis=0, keepdims=True).shape == (1, 4)
    assert fm.argmin(x, keepdims=True).shape == (1, 1)


@pytest.mark.parametrize("ddof", [0, 1, 2.5])
def test_var_std_ddof(device, ddof, rng):
    x = (rng.standard_normal((5, 9)) * 3 + 100).astype(np.float32)  # offset: needs two passes
    for name in ("var", "std"):
        check(name, x, None, ddof=ddof)
        check(name, x, 1, ddof=ddof)
        check(name, x, 0, keepdims=True, ddof=ddof)


def test_strided_inputs(device, rng):
    base = rng.standard_normal((9, 8, 10)).astype(np.float32)
    views = [base[::2, :, ::3], base.transpose(2, 0, 1), base[:, ::-1, 1:], base[3]]
    for v in views:
        for name in VALUE_OPS:
            for axis in (None, 0, -1, (0, v.ndim - 1)):
                check(name, v, axis)
        for name in ARG_OPS:
            check(name, v, 1)


def test_nan_and_inf_as_numpy(device):
    x = np.array([[1, np.nan, 3, np.nan], [np.inf, 1, 2, 3], [-np.inf, np.inf, 0, 0],
                  [2, 5, 5, 1]], np.float32)
    for name in VALUE_OPS + ARG_OPS:
        for axis in (None, 0, 1):
            got = getattr(fm, name)(x, axis=axis)
            with np.errstate(all="ignore"):
                want = getattr(np, name)(x, axis=axis)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want).astype(np.asarray(got).dtype),
                                          err_msg=f"{name} axis={axis}")


def test_empty(device):
    e = np.zeros((0,), np.float32)
    assert fm.sum(e) == 0
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):  # as NumPy
        assert np.isnan(fm.mean(e))
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        assert np.isnan(fm.var(e))
    for name in ("max", "min", "argmax", "argmin"):
        with pytest.raises(ValueError, match=rf"\[fastmetal\.{name}\] expected a non-empty"):
            getattr(fm, name)(e)
    z = np.zeros((0, 3), np.float32)
    np.testing.assert_array_equal(fm.sum(z, axis=0), np.zeros(3, np.float32))
    assert fm.max(z, axis=1).shape == (0,)
    assert fm.argmax(z, axis=1).shape == (0,)
    with pytest.raises(ValueError):
        fm.max(z, axis=0)
    assert fm.sum(np.float32(3)) == 3  # 0-d


def test_bad_arguments():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"\[fastmetal\.sum\] expected axis in \[-2, 2\) for an array of 2 dimensions, got 2"):
        fm.sum(x, axis=2)
    with pytest.raises(ValueError, match=r"\[fastmetal\.mean\] expected distinct axes"):
        fm.mean(x, axis=(0, -2))
    with pytest.raises(TypeError, match=r"\[fastmetal\.max\] expected axis"):
        fm.max(x, axis=1.0)
    with pytest.raises(TypeError, match=r"\[fastmetal\.argmax\] expected axis to be None, an int"):
        fm.argmax(x, axis=(0, 1))
    with pytest.raises(TypeError, match=r"\[fastmetal\.sum\] expected dtype"):
        fm.sum(x, dtype=np.int16)  # not one of fastmetal's dtypes
    with pytest.raises(TypeError):
        fm.sum(np.zeros(3, np.complex64))
    with pytest.raises(ValueError, match=r"\[fastmetal\.sum\] expected out of shape"):
        fm.sum(x, axis=0, out=np.zeros(2, np.float32))


def test_out(device):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    o = np.zeros(3, np.float32)
    assert fm.sum(x, axis=0, out=o) is o
    np.testing.assert_array_equal(o, [3, 5, 7])
    oa = fm.zeros(2)
    assert fm.max(fm.asarray(x), axis=1, out=oa) is oa
    np.testing.assert_array_equal(oa.numpy(), [2, 5])


# ----------------------------------------------------------------------------- hypothesis
@st.composite
def arrays_and_axes(draw):
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim)))
    seed = draw(st.integers(0, 2**32 - 1))
    x = np.random.default_rng(seed).standard_normal(tuple(s * 2 for s in shape)).astype(np.float32)
    # A strided view: every other element, some axes reversed, maybe transposed.
    view = x[tuple(slice(None, None, draw(st.sampled_from([2, -2]))) for _ in shape)]
    if ndim > 1 and draw(st.booleans()):
        view = view.transpose(draw(st.permutations(range(ndim))))
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none" or ndim == 0:
        axis = None
    elif kind == "int":
        axis = draw(st.integers(-ndim, ndim - 1))
    else:
        axis = tuple(draw(st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim)))
        axis = tuple(a - ndim if draw(st.booleans()) else a for a in axis)
    return view, axis, draw(st.booleans())


def _check_any(name, x, axis, keepdims):
    if name in ARG_OPS and isinstance(axis, tuple):
        return
    # fastmetal warns where NumPy does ("Mean of empty slice", ...): both warn or neither.
    with warnings.catch_warnings(record=True) as numpy_warned:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            getattr(np, name)(np.asarray(x, np.float64), axis=axis, keepdims=keepdims)
        except ValueError:
            pass
    with warnings.catch_warnings(record=True) as fm_warned:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            getattr(fm, name)(x, axis=axis, keepdims=keepdims)
        except ValueError:
            pass
    assert bool(numpy_warned) == bool(fm_warned), (numpy_warned, fm_warned)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _check_values(name, x, axis, keepdims)


def _check_values(name, x, axis, keepdims):
    try:  # NumPy is the oracle for which empty reductions raise
        reference(name, x, axis, keepdims)
    except ValueError:
        with pytest.raises(ValueError, match=rf"\[fastmetal\.{name}\] expected a non-empty"):
            getattr(fm, name)(x, axis=axis, keepdims=keepdims)
        return
    check(name, x, axis, keepdims)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(arrays_and_axes(), st.sampled_from(VALUE_OPS + ARG_OPS))
def test_hypothesis_fast_path(case, name):
    x, axis, keepdims = case
    with np.errstate(all="ignore"):
        _check_any(name, x, axis, keepdims)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(arrays_and_axes(), st.sampled_from(VALUE_OPS + ARG_OPS),
       st.sampled_from([1, 7, 32, 37, 64]))
def test_hypothesis_kernels(case, name, threads):
    x, axis, keepdims = case
    saved = _core._native_cpu()
    _core._set_native_cpu(False)
    _core._set_kernel_group_size(threads)
    try:
        with np.errstate(all="ignore"):
            _check_any(name, x, axis, keepdims)
    finally:
        _core._set_native_cpu(saved)
        _core._set_kernel_group_size(0)


# ----------------------------------------------------------------------------- MSL kernels
def test_reduce_kernels_are_built():
    for name in ("reduce_sum", "reduce_sumsq_dev", "reduce_max", "reduce_min", "reduce_argmax",
                 "reduce_argmin", "reduce_sum_cols", "reduce_sumsq_dev_cols"):
        assert _core._has_kernel("cpu", name), name


# Big groups are slow under the emulator: every axis with small groups, full reductions
# (one group) with the big ones.
@pytest.mark.parametrize("threads,seed,axes", [
    (37, 2, (None, 1, 0, (0, 2))), (64, 3, (None, 1, 0, (0, 2))), (1, 5, (None, 1, 0, (0, 2))),
    (256, 1, (None,)), (300, 4, (None,)), (1024, 6, (None,))])
def test_msl_kernels_under_the_emulator(kernels, threads, seed, axes):
    _core._set_kernel_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    r = np.random.default_rng(seed)
    x = r.standard_normal((2, 50, 3)).astype(np.float32)
    x[1, 7, 2] = np.nan
    x[0, 40, 0] = np.inf
    for name in VALUE_OPS + ARG_OPS:
        for axis in axes:
            if name in ARG_OPS and isinstance(axis, tuple):
                continue
            got = getattr(fm, name)(x, axis=axis)
            want = reference(name, x, axis)
            if name in ARG_OPS:
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-4,
                                           err_msg=f"{name} axis={axis} threads={threads}")


@pytest.mark.parametrize("threads,seed", [(0, 1), (37, 2), (1, 3), (300, 4)])
def test_msl_column_sums_under_the_emulator(kernels, threads, seed):
    """reduce_sum_cols (32 or more columns): column blocks that end inside a block, chunks
    of 64 rows whose last is partial (their partials combined as a split row's), several
    outer blocks; sum, mean, var, std against NumPy float64, NaN and inf in their columns."""
    _core._set_kernel_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    r = np.random.default_rng(40 + seed)
    for shape, axis in (((600, 70), 0), ((3, 130, 40), 1), ((5, 33), 0), ((0, 40), 0)):
        x = (r.standard_normal(shape) * 3 + 1).astype(np.float32)
        if x.size:
            x.reshape(-1, shape[-1])[2, 2] = np.nan
            x.reshape(-1, shape[-1])[3, 5] = np.inf
        for name in ("sum", "mean", "var", "std"):
            with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
                warnings.simplefilter("ignore", RuntimeWarning)  # the empty case, as NumPy
                want = getattr(np, name)(x.astype(np.float64), axis=axis)
                got = np.asarray(getattr(fm, name)(x, axis=axis), np.float64)
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=0, equal_nan=True,
                                       err_msg=f"{name} {shape} axis={axis} threads={threads}")


def test_msl_argmax_ties_and_first_nan(kernels):
    x = np.zeros(1000, np.float32)
    x[[10, 500, 900]] = 5
    for threads in (1, 3, 32, 100, 256):
        _core._set_kernel_group_size(threads)
        assert fm.argmax(x) == 10 and fm.argmin(-x) == 10
        y = x.copy()
        y[[700, 20]] = np.nan
        assert fm.argmax(y) == 20 and fm.argmin(y) == 20
        assert fm.argmax(np.full(77, -np.inf, np.float32)) == 0


# ----------------------------------------------------------------------------- accuracy
@pytest.mark.parametrize("native", [True, False], ids=["cpu-fast-path", "msl-kernel"])
def test_sum_accuracy_1e7(native):
    """float32 sums at least as accurate as NumPy's pairwise sum, against float64."""
    saved = _core._native_cpu()
    _core._set_native_cpu(native)
    try:
        r = np.random.default_rng(7)
        for x in (r.random(10**7).astype(np.float32),
                  (r.standard_normal(10**7) + 0.1).astype(np.float32)):
            ref = x.astype(np.float64).sum()
            err_np = abs(float(np.sum(x)) - ref)
            err_fm = abs(float(fm.sum(x)) - ref)
            half_ulp = float(np.spacing(np.float32(abs(ref)))) / 2
            assert err_fm <= max(err_np, half_ulp), (err_fm, err_np)
            m = float(fm.mean(x))
            assert abs(m - ref / x.size) <= max(abs(float(np.mean(x)) - ref / x.size),
                                                float(np.spacing(np.float32(abs(m))))), m
    finally:
        _core._set_native_cpu(saved)


def test_bitwise_reproducible_across_thread_counts():
    code = (
        "import numpy as np, hashlib, fastmetal as fm\n"
        "r = np.random.default_rng(3)\n"
        "x = r.standard_normal((300, 2000)).astype(np.float32)\n"
        "big = r.standard_normal(3 * 10**6).astype(np.float32)\n"
        "a = r.standard_normal((3, 200, 150)).astype(np.float32)\n"
        "b = r.standard_normal((150, 130)).astype(np.float32)\n"
        "outs = [fm.sum(big), fm.mean(big), fm.var(big), fm.std(x, axis=0), fm.sum(x, axis=1),\n"
        "        fm.sum(x, axis=0), fm.max(x, axis=0), fm.argmax(x, axis=1), fm.argmin(big),\n"
        "        fm.matmul(a, b), fm.linear(a, b.T)]\n"
        "h = hashlib.sha256()\n"
        "[h.update(np.ascontiguousarray(o).tobytes()) for o in outs]\n"
        "print(h.hexdigest())\n")
    digests = set()
    for n in ("1", "2", "3", "5"):
        env = dict(os.environ, FASTMETAL_NUM_THREADS=n)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1, digests


# ----------------------------------------------------------------------------- split rows
# Few outputs with long rows run on several threadgroups per output (segments of at least
# 4096 elements, then a combining launch): sizes around the segment boundaries, NaN in
# one segment, every op, several threadgroup sizes, through the MSL kernels.
@pytest.mark.parametrize("threads", [32, 96, 256])
def test_split_rows_match_numpy(kernels, threads):
    _core._set_kernel_group_size(threads)
    r = np.random.default_rng(threads)
    for shape, axis in [((8191,), None), ((8192,), None), ((12289,), None), ((3, 9000), 1),
                        ((20000, 2), 0), ((2, 5000, 3), (0, 1))]:
        x = (r.standard_normal(shape) + 0.5).astype(np.float32)
        for name in VALUE_OPS + ARG_OPS:
            if name in ARG_OPS and isinstance(axis, tuple):
                continue
            check(name, x, axis)
        y = x.copy()
        y.reshape(-1)[y.size // 2 + 7] = np.nan
        y.reshape(-1)[y.size - 3] = 100.0
        for name in ("sum", "max", "min") + (() if isinstance(axis, tuple) else ARG_OPS):
            with np.errstate(invalid="ignore"):
                got, want = getattr(fm, name)(y, axis=axis), getattr(np, name)(y, axis=axis)
            np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                                       rtol=1e-5 if name == "sum" else 0, equal_nan=True)


def test_split_rows_are_reproducible(kernels):
    """The partition depends on the problem only: the same bits on every call."""
    x = np.random.default_rng(1).standard_normal(50_000).astype(np.float32)
    first = [np.asarray(getattr(fm, n)(x)).tobytes() for n in VALUE_OPS + ARG_OPS]
    os.environ["FASTMETAL_EMULATOR_SEED"] = "9"  # another interleaving of the emulated threads
    again = [np.asarray(getattr(fm, n)(x)).tobytes() for n in VALUE_OPS + ARG_OPS]
    assert first == again


# ----------------------------------------------------------------------------- float64
# float64 Arrays reduce in double (metal/reduce.metal's *_float64 kernels: cpu and cuda),
# float64 results (argmax/argmin int64), against NumPy float64. Sums are compensated in
# each thread and combined as double-doubles, so they are at least as accurate as NumPy's
# pairwise float64 sum: both within a few eps of sum |x|.
EPS64 = float(np.finfo(np.float64).eps)
F64_SHAPES = [((7, 300, 5), [None, 0, 1, 2, (0, 2), (1, 2)]),
              ((3, 20000), [1, None]),   # long rows: split into segments, combined
              ((1,), [None]), ((4, 1, 3), [1])]


def check64(name, data, x, axis, ddof=0):
    kw = {"axis": axis}
    if name in ("var", "std"):
        kw["ddof"] = ddof
    got = getattr(fm, name)(data, **kw)
    got = np.asarray(got.numpy() if isinstance(got, fm.Array) else got)
    with np.errstate(all="ignore"):
        want = np.asarray(getattr(np, name)(x, **kw))
    assert got.shape == want.shape, (name, axis)
    if name in ARG_OPS:
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want, err_msg=f"{name} axis={axis}")
        return
    assert got.dtype == np.float64, (name, got.dtype)
    if name in ("max", "min"):
        np.testing.assert_array_equal(got, want, err_msg=f"{name} axis={axis}")
        return
    for test in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(test(got), test(want), err_msg=f"{name} axis={axis}")
    a = np.abs(x)
    if name == "sum":
        bound = 8 * EPS64 * np.sum(a, axis=axis)
    elif name == "mean":
        bound = 8 * EPS64 * np.mean(a, axis=axis)
    elif name == "prod":
        n = x.size if axis is None else np.prod([x.shape[d] for d in np.atleast_1d(axis)])
        bound = 4 * n * EPS64 * np.abs(want)
    else:  # var, std: rounding of the squares of deviations of size max |x|
        m = np.max(a, axis=axis) ** 2
        bound = 64 * EPS64 * (m if name == "var" else m / np.maximum(want, 1e-300))
    finite = np.atleast_1d(np.isfinite(want))
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf (checked above)
        err = np.atleast_1d(np.abs(got - want))[finite]
    bound = np.atleast_1d(np.broadcast_to(bound, want.shape))[finite]
    np.testing.assert_array_less(err, bound + 1e-300, err_msg=f"{name} axis={axis}")


@pytest.mark.parametrize("name", VALUE_OPS + ARG_OPS + ("prod",))
def test_float64_reductions_match_numpy(device, name, rng):
    if device == "metal":
        pytest.skip("float64: Apple GPUs have no double")
    for shape, axes in F64_SHAPES:
        x = rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 1e3], size=shape) + 0.25
        if name == "prod":  # the MSL kernel (no CPU fast path, emulated there): small
            if shape[-1] > 1000:
                continue
            x = 1.0 + 0.01 * rng.standard_normal(shape)
            x = x[:, :20] if x.ndim == 3 else x
        for axis in axes:
            if name in ARG_OPS and isinstance(axis, tuple):
                continue
            for data in (x, fm.asarray(x)):
                check64(name, data, x, axis)
    v = rng.standard_normal((6, 40))
    check64(name, fm.asarray(v)[::-1, ::3], v[::-1, ::3], 1)  # a strided view of an Array


def test_float64_reductions_nan_inf_and_ddof(device):
    if device == "metal":
        pytest.skip("float64: Apple GPUs have no double")
    x = np.array([[1.0, np.nan, 3.0, np.nan], [np.inf, -1.0, 2.0, 5.0], [-np.inf, np.inf, 0.0, 1.0]])
    for name in ("sum", "mean", "max", "min", "argmax", "argmin", "prod"):
        for axis in (None, 0, 1):
            check64(name, fm.asarray(x), x, axis)
    y = np.random.default_rng(3).standard_normal((5, 9)) + 1e8  # var's cancellation: |x| >> std
    for ddof in (0, 1, 2.5):
        got = fm.var(fm.asarray(y), axis=1, ddof=ddof).numpy()
        np.testing.assert_allclose(got, np.var(y, axis=1, ddof=ddof), rtol=1e-9)
    # 1e16 + 1 - 1e16, 20000 times: compensated sums keep the ones (naive double gives 0)
    z = np.tile([1e16, 1.0, -1e16], 20000)
    assert float(fm.sum(fm.asarray(z)).numpy()) == 20000.0


@pytest.mark.parametrize("threads", [1, 37, 256])
def test_float64_msl_kernels_any_group_size(kernels, threads, rng):
    """The double kernels are threadgroup trees only: any group size, split rows included."""
    _core._set_kernel_group_size(threads)
    x = rng.standard_normal((2, 8200))  # rows of 2 segments
    for name in ("sum", "var", "max", "argmin"):
        for axis in (1, None):
            check64(name, fm.asarray(x), x, axis)


def test_float64_cumsum_is_numpy_bit_for_bit(device, rng):
    if device == "metal":
        pytest.skip("float64: Apple GPUs have no double")
    x = rng.standard_normal((4, 50, 3)) * 1e3
    for axis in (None, 0, 1, 2):
        got = fm.cumsum(fm.asarray(x), axis=axis).numpy()
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, np.cumsum(x, axis=axis))
    np.testing.assert_array_equal(fm.cumsum(x[:, ::-2], axis=1), np.cumsum(x[:, ::-2], axis=1))
