"""Every elementwise op of the table against NumPy float64, on every device: values, layouts,
dtypes, out=."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastmetal as fm
from fastmetal.ops.optable import OPS
from fastmetal.ops.elementwise import FUNCTIONS as OP

from helpers import host, skip_without_float64
from references import elementwise_rtol, numpy_reference

# The public ops are held to a few ulps; the internal kernels (gradients and losses, "internal:"
# in the table) to what a gradient needs: test_internal_kernels_match_numpy.
UNARY = [s for s in OPS if s.arity == 1 and s.public]
BINARY = [s for s in OPS if s.arity == 2 and s.public]
INTERNAL = [s for s in OPS if not s.public]
ALL_NAMES = [s.name for s in OPS]

# Results must match the float64 reference rounded to the result dtype within a few ulps
# (per device: references.ELEMENTWISE_RTOL).
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-38, -1e-38,
                     1e-45, 3e38, -3e38, 88.7, 89.0, -87.3, -103.9, -104.5, 20.0, -20.0],
                    dtype=np.float32)


def check(got, ref, dtype=np.float32):
    """got (fastmetal) against the float64 reference rounded to `dtype`."""
    got = np.asarray(got)
    if got.dtype == np.bool_:  # comparisons: the reference is the 1.0 / 0.0 mask
        assert np.isin(ref, (0.0, 1.0)).all()
        np.testing.assert_array_equal(got, ref == 1.0)
        return
    assert got.dtype == dtype
    with np.errstate(all="ignore"):
        want = ref.astype(dtype)
    tiny = np.finfo(dtype).tiny
    rtol = elementwise_rtol(fm.default_device(), dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=4 * tiny, equal_nan=True)
    # NaN exactly where NumPy has NaN; infinities with the same sign.
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isposinf(got), np.isposinf(want))
    assert np.array_equal(np.isneginf(got), np.isneginf(want))


# Ops whose result is defined by the dtype's own grid of values (nextafter: one step of that
# dtype), so a float64 reference says nothing: NumPy's own function in the operands' dtype,
# bit for bit (test_array_api_completions.py covers every edge and dtype).
DTYPE_GRID_OPS = {"nextafter"}


def check_in_dtype(name, got, x, y):
    with np.errstate(all="ignore"):
        want = getattr(np, name)(x, y)
    got = np.asarray(got)
    assert got.dtype == want.dtype
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint8), want[~nan].view(np.uint8)), name


def sample(rng, shape, op_name):
    """Inputs that cover each op's interesting range: several magnitudes, both signs."""
    mags = rng.choice([1e-3, 0.1, 1.0, 10.0, 80.0], size=shape)
    x = rng.standard_normal(shape) * mags
    if op_name in ("log", "sqrt"):
        x = np.abs(x) * rng.choice([1.0, 1.0, 1.0, -1.0], size=shape)
    return x.astype(np.float32)


@pytest.mark.parametrize("spec", UNARY, ids=lambda s: s.name)
def test_unary_matches_numpy_float64(spec, rng, device):
    x = sample(rng, (4, 1000), spec.name)
    got = OP[spec.name](x)
    check(got, numpy_reference(spec, x.astype(np.float64)))


@pytest.mark.parametrize("spec", BINARY, ids=lambda s: s.name)
def test_binary_matches_numpy_float64(spec, rng, device):
    x = sample(rng, (3, 700), spec.name)
    y = sample(rng, (3, 700), spec.name)
    if spec.name == "power":
        x, y = np.abs(x) + 0.1, np.clip(y, -20, 20)
    if spec.name in DTYPE_GRID_OPS:
        return check_in_dtype(spec.name, OP[spec.name](x, y), x, y)
    ref = numpy_reference(spec, x.astype(np.float64), y.astype(np.float64))
    if spec.name == "logaddexp":
        # max(x, y) + log1p(e^-|x - y|) cancels where e^x + e^y is near 1 (the result crosses
        # 0: ill-conditioned there), so the bound is absolute, 2 eps (max(|x|, |y|) + ln 2);
        # NumPy's own float32 logaddexp needs it too (measured 0.9 of it; fastmetal 1.2).
        bound = 2 * np.finfo(np.float32).eps * (np.maximum(np.abs(x), np.abs(y)) + np.log(2))
        assert np.all(np.abs(np.asarray(OP[spec.name](x, y), np.float64) - ref) <= bound)
        return
    check(OP[spec.name](x, y), ref)


@pytest.mark.parametrize("spec", UNARY, ids=lambda s: s.name)
def test_unary_special_values(spec, device):
    got = OP[spec.name](SPECIALS)
    check(got, numpy_reference(spec, SPECIALS.astype(np.float64)))


@pytest.mark.parametrize("spec", BINARY, ids=lambda s: s.name)
def test_binary_special_values(spec, device):
    x, y = np.meshgrid(SPECIALS, SPECIALS)
    got = OP[spec.name](x, y)
    if spec.name in DTYPE_GRID_OPS:
        return check_in_dtype(spec.name, got, x, y)
    check(got, numpy_reference(spec, x.astype(np.float64), y.astype(np.float64)))


def test_exp_is_accurate_over_the_whole_float_range(device):
    # Two million float32 between -104 and 89: the shared fm_exp must stay within 2 ulp.
    x = np.linspace(-104, 89, 2_000_003).astype(np.float32)
    got = fm.exp(x).astype(np.float64)
    ref = np.exp(x.astype(np.float64))
    normal = (ref > np.finfo(np.float32).tiny) & (ref < np.finfo(np.float32).max)
    assert np.all(np.isinf(got[ref >= 2.0**128]))
    ulp = np.spacing(ref[normal].astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got[normal] - ref[normal]) / ulp) <= 2.0
    sub = ref <= np.finfo(np.float32).tiny
    assert np.max(np.abs(got[sub] - ref[sub])) <= 2 * np.finfo(np.float32).smallest_subnormal


@pytest.mark.parametrize("spec", UNARY, ids=lambda s: s.name)
def test_unary_float16_native(spec, rng, device):
    x = sample(rng, (257,), spec.name).clip(-60000, 60000).astype(np.float16)
    got = OP[spec.name](x)
    check(got, numpy_reference(spec, x.astype(np.float64)), dtype=np.float16)


@pytest.mark.parametrize("spec", BINARY, ids=lambda s: s.name)
def test_binary_float16_native(spec, rng, device):
    x = (rng.random(300) * 4 + 0.25).astype(np.float16)
    y = (rng.standard_normal(300) * 2).astype(np.float16)
    got = OP[spec.name](x, y)
    if spec.name in DTYPE_GRID_OPS:
        return check_in_dtype(spec.name, got, x, y)
    check(got, numpy_reference(spec, x.astype(np.float64), y.astype(np.float64)), dtype=np.float16)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_, np.int16])
def test_integers_and_bool_compute_float_functions_in_float32(dtype, rng, device):
    x = (rng.random(50) * 5).astype(dtype)
    got = fm.sqrt(x)
    assert got.dtype == np.float32
    check(got, np.sqrt(x.astype(np.float32).astype(np.float64)))
    got2 = fm.add(x, np.float16(1))  # an integer with a float: that float (PyTorch's rule)
    assert got2.dtype == np.float16


def test_dtype_promotion_rules(device):
    h = np.ones(4, np.float16)
    f = np.ones(4, np.float32)
    assert fm.add(h, h).dtype == np.float16
    assert fm.add(h, f).dtype == np.float32
    assert fm.add(f, h).dtype == np.float32
    assert fm.add(h, 2.5).dtype == np.float16  # Python scalars are weak (NEP 50)
    assert fm.multiply(3, h).dtype == np.float16
    # np.float64 is a Python float: weak too (PyTorch's reading); other NumPy scalars are not
    assert fm.add(h, np.float64(2.5)).dtype == np.float16
    assert fm.add(h, np.float32(2.5)).dtype == np.float32


@pytest.mark.parametrize("bad", [np.ones(3, np.complex64), np.array(["a", "b"]),
                                 np.array([object(), 1], dtype=object),
                                 np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]),
                                 np.array(["2020-01-01"], dtype="datetime64[D]")])
def test_unsupported_dtypes_raise_type_error(bad, device):
    with pytest.raises(TypeError, match=r"\[fastmetal\.exp\] expected a real"):
        fm.exp(bad)
    with pytest.raises(TypeError, match=r"\[fastmetal\.add\] expected a real"):
        fm.add(np.ones(1, np.float32), bad)


def test_non_array_inputs(device):
    np.testing.assert_allclose(fm.exp([0.0, 1.0]), np.exp([0.0, 1.0]).astype(np.float32))
    assert fm.exp(0.0).shape == ()
    with pytest.raises(TypeError, match=r"\[fastmetal\.exp\]"):
        fm.exp("hello")
    with pytest.raises(TypeError, match=r"\[fastmetal\.exp\]"):
        fm.exp([[1.0], [2.0, 3.0]])  # ragged
    with pytest.raises(TypeError):
        fm.exp(None)


def test_broadcast_mismatch_message(device):
    with pytest.raises(ValueError, match=r"^\[fastmetal\.add\] expected shapes that broadcast "
                                         r"together, got x \(3,\) and y \(4,\)$"):
        fm.add(np.ones(3), np.ones(4))


@pytest.mark.parametrize("op", ["add", "subtract", "divide", "power", "maximum"])
def test_python_scalars_on_either_side(op, rng, device):
    spec = next(s for s in OPS if s.name == op)
    x = (rng.random((5, 6)) + 0.5).astype(np.float32)
    for a, b in [(x, 2.5), (1.5, x), (x, -3), (True, x)]:
        ref = numpy_reference(spec, np.asarray(a, np.float64), np.asarray(b, np.float64))
        check(OP[op](a, b), ref)


def test_zero_size_arrays(device):
    for shape in [(0,), (3, 0), (0, 4, 2)]:
        x = np.ones(shape, np.float32)
        r = fm.exp(x)
        assert r.shape == shape and r.dtype == np.float32
    assert fm.add(np.ones((0, 3)), np.ones((1, 3))).shape == (0, 3)
    assert fm.add(np.ones((2, 0)), 1.0).shape == (2, 0)
    out = np.empty((0, 3), np.float32)
    assert fm.multiply(np.ones((0, 1)), np.ones(3), out=out) is out


# ---------------------------------------------------------------- layouts (hypothesis)
def strided_view(draw, shape, transpose=True):
    """A random view with exactly `shape`: a slice with steps (incl. negative) of a larger
    fresh array, sometimes with Fortran-order strides."""
    steps = [draw(st.sampled_from([1, 1, 2, -1, -2, 3])) for _ in shape]
    base_shape = tuple(n * abs(k) for n, k in zip(shape, steps))
    arr = draw(hnp.arrays(np.float32, base_shape,
                          elements=st.floats(-50, 50, width=32, allow_subnormal=False)))
    view = arr[tuple(slice(None, None, k) for k in steps)]
    assert view.shape == tuple(shape)
    if transpose and view.ndim > 1 and draw(st.booleans()):
        view = np.ascontiguousarray(view.T).T  # same shape, Fortran-order strides
    return view


@st.composite
def unary_case(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=6))
    return draw(st.sampled_from([s.name for s in UNARY])), strided_view(draw, shape)


@st.composite
def binary_case(draw):
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=5,
                                                    min_side=0, max_side=5))
    x = strided_view(draw, shapes.input_shapes[0])
    y = strided_view(draw, shapes.input_shapes[1])
    return draw(st.sampled_from([s.name for s in BINARY])), x, y


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(unary_case())
def test_unary_any_strides(device, case):  # given() fills the last argument
    name, x = case
    spec = next(s for s in OPS if s.name == name)
    check(OP[name](x), numpy_reference(spec, x.astype(np.float64)))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(binary_case())
def test_binary_any_strides_and_broadcasting(device, case):
    name, x, y = case
    spec = next(s for s in OPS if s.name == name)
    got = OP[name](x, y)
    ref = numpy_reference(spec, x.astype(np.float64), y.astype(np.float64))
    assert got.shape == np.broadcast_shapes(x.shape, y.shape)
    check(got, ref)


@pytest.mark.parametrize("name", ["add", "maximum"])
def test_large_strided_broadcast(name, rng, device):
    # Big enough to be split across the thread pool, in every kernel layout.
    spec = next(s for s in OPS if s.name == name)
    x = rng.standard_normal((64, 1, 700)).astype(np.float32)[:, :, ::-1]
    y = rng.standard_normal((33, 700)).astype(np.float32)
    check(OP[name](x, y), numpy_reference(spec, x.astype(np.float64), y.astype(np.float64)))
    z = rng.standard_normal(300_001).astype(np.float32)
    check(OP[name](z, 0.25), numpy_reference(spec, z.astype(np.float64), np.float64(0.25)))
    check(OP[name](0.25, z), numpy_reference(spec, np.float64(0.25), z.astype(np.float64)))
    check(OP[name](z, z[::-1]), numpy_reference(spec, z.astype(np.float64), z[::-1].astype(np.float64)))


# ---------------------------------------------------------------- out=
def test_out_receives_the_result_and_is_returned(rng, device):
    x = rng.standard_normal((8, 9)).astype(np.float32)
    out = np.empty((8, 9), np.float32)
    assert fm.exp(x, out=out) is out
    check(out, np.exp(x.astype(np.float64)))
    out16 = np.empty((8, 9), np.float16)
    assert fm.tanh(x, out=out16) is out16
    np.testing.assert_allclose(out16, np.tanh(x.astype(np.float64)).astype(np.float16), rtol=2e-3, atol=1e-4)
    out64 = np.empty((8, 9), np.float64)
    fm.add(x, 1.0, out=out64)
    np.testing.assert_array_equal(out64, (x + np.float32(1)).astype(np.float64))
    big = np.zeros((8, 20), np.float32)
    view = big[:, ::2][:, :9]
    fm.negative(x, out=view)
    np.testing.assert_array_equal(view, -x)
    assert np.count_nonzero(big[:, 1::2]) == 0  # nothing written outside the view


def test_out_on_the_device(rng, device):
    x = rng.standard_normal((300, 7)).astype(np.float32)
    a = fm.asarray(x)
    out = fm.empty((300, 7))
    assert fm.exp(a, out=out) is out and out.device == device
    check(out, np.exp(x.astype(np.float64)))
    out16 = fm.empty((300, 7), dtype="float16")  # another dtype: cast into the device Array
    assert fm.exp(a, out=out16) is out16
    check(out16, np.exp(x.astype(np.float64)), dtype=np.float16)
    want = x + np.float32(1)  # before: on cpu and metal `a` shares x's memory
    assert fm.add(a, 1.0, out=a) is a  # in place on the device
    np.testing.assert_array_equal(np.asarray(a), want)


def test_out_validation(device):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"\[fastmetal\.exp\] expected out of shape \(2, 3\), got shape \(3, 2\)"):
        fm.exp(x, out=np.empty((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"\[fastmetal\.add\] expected out with a floating dtype, got int32"):
        fm.add(x, x, out=np.empty((2, 3), np.int32))
    ro = np.empty((2, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        fm.exp(x, out=ro)
    with pytest.raises(TypeError, match="out"):
        fm.exp(x, out=[0.0] * 6)


def test_in_place_and_overlapping_out(rng, device):
    x = rng.standard_normal(1000).astype(np.float32)
    ref = np.exp(x.astype(np.float64))
    y = x.copy()
    fm.exp(y, out=y)
    check(y, ref)
    # out overlaps the input shifted by one element: must equal the out-of-place result.
    buf = rng.standard_normal(1001).astype(np.float32)
    src = buf[:-1].copy()
    fm.add(buf[:-1], 1.0, out=buf[1:])
    np.testing.assert_array_equal(buf[1:], src + np.float32(1))
    # out is the reversed input.
    z = rng.standard_normal(999).astype(np.float32)
    zc = z.copy()
    fm.subtract(z, 0.5, out=z[::-1])
    np.testing.assert_array_equal(z[::-1], zc - np.float32(0.5))
    # broadcast input that aliases out.
    w = rng.standard_normal((4, 4)).astype(np.float32)
    wc = w.copy()
    fm.multiply(w[0], w, out=w)
    np.testing.assert_array_equal(w, wc[0] * wc)


def test_functions_come_from_the_table():
    for spec in OPS:
        f = OP[spec.name]
        assert f.__name__ == spec.name
        assert spec.doc.split(",")[0] in f.__doc__
        # public lines are fastmetal.<name>; "internal:" lines only fastmetal.ops.elementwise's
        assert (spec.name in fm.__all__) == spec.public
        assert (getattr(fm, spec.name, None) is f) == spec.public


# ----------------------------------------------------------------------- many dimensions
# The views are made of fastmetal Arrays, so that every device sees the strides (a NumPy view
# would arrive on a GPU as a contiguous copy, whose dims all merge).
@pytest.mark.parametrize("ndim", [7, 9, 16])
def test_many_non_mergeable_dimensions(device, rng, ndim):
    """Shapes of more dims than are kept inline in the host's shape type (6), none of which
    merge (every other axis broadcast, the input transposed): the elementwise kernels and
    reductions see them all and match NumPy."""
    shape = tuple(2 + (d % 2 if d < 8 else 0) for d in range(ndim))
    base = rng.standard_normal(shape[::-1]).astype(np.float32)
    x = base.T  # reversed strides
    row = rng.standard_normal(tuple(1 if d % 2 else s for d, s in enumerate(shape)))
    row = row.astype(np.float32)
    a = fm.asarray(base).T
    assert a.shape == x.shape
    np.testing.assert_array_equal(fm.add(a, fm.asarray(row)).numpy(), x + row)
    np.testing.assert_allclose(fm.sum(a, axis=ndim // 2).numpy(), x.sum(axis=ndim // 2),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fm.exp(a).T.numpy(), np.exp(x).T, rtol=1e-6)  # exp: 2 ulp


def test_too_many_non_mergeable_dimensions_is_a_value_error(device, rng):
    a = fm.asarray(rng.standard_normal((2,) * 17).astype(np.float32))
    with pytest.raises(ValueError, match="at most 16 non-mergeable dimensions"):
        fm.add(a.T, a[..., ::2])


@pytest.mark.parametrize("case", ["broadcast", "transposed", "reversed", "out_view"])
def test_four_dims_in_three_dim_blocks(device, rng, case):
    """4-5 dims that do not merge, with few outer indices and large 3-dim blocks: the CPU
    launches them block by block (each block's buffer offset advanced by its outer index,
    negative strides included), other devices in one launch; NumPy's result either way."""
    x = rng.standard_normal((3, 5, 16, 32, 40)).astype(np.float32)[:, 1:4]  # sliced outer dim
    row = rng.standard_normal((1, 1, 16, 1, 40)).astype(np.float32)
    if case == "transposed":
        x = np.ascontiguousarray(x.transpose(4, 3, 2, 1, 0)).transpose(4, 3, 2, 1, 0)
    if case == "reversed":
        x = x[::-1, :, :, ::-1]
    got = fm.add(fm.asarray(x) if case != "out_view" else x, row)
    np.testing.assert_array_equal(np.asarray(got.numpy() if isinstance(got, fm.Array) else got),
                                  x + row)
    np.testing.assert_allclose(np.asarray(fm.sigmoid(x)), 1 / (1 + np.exp(-x.astype(np.float64))),
                               rtol=1e-6, atol=1e-7)
    if case == "out_view" and device in ("cpu", "metal"):
        big = np.zeros((3, 3, 16, 64, 40), np.float32)
        out = big[:, :, :, ::2]
        assert fm.add(x, row, out=out) is out
        np.testing.assert_array_equal(out, x + row)
        assert not big[:, :, :, 1::2].any()  # the skipped rows stay untouched


# ----------------------------------------------------------------------- internal kernels
def _internal_operands(rng, name):
    g = (rng.standard_normal(4000) * rng.choice([1e-3, 1.0, 30.0], 4000)).astype(np.float32)
    if name in ("bce", "bce_grad"):
        p = rng.uniform(0, 1, 4000).astype(np.float32)
        p[:4] = [0.0, 1.0, 1e-30, 1 - 2**-24]  # saturated: clamped logs, finite losses
        return p, rng.uniform(0, 1, 4000).astype(np.float32)
    if name == "bce_logits":
        return g, rng.uniform(0, 1, 4000).astype(np.float32)
    return g, (rng.standard_normal(4000) * rng.choice([1e-3, 1.0, 10.0], 4000)).astype(np.float32)


@pytest.mark.parametrize("spec", INTERNAL, ids=lambda s: s.name)
def test_internal_kernels_match_numpy(spec, device, rng):
    x, y = _internal_operands(rng, spec.name)
    got = np.asarray(OP[spec.name](x, y)).astype(np.float64)
    want = numpy_reference(spec, x.astype(np.float64), y.astype(np.float64))
    scale = np.maximum(np.abs(want), 1e-3 * np.abs(want).max())
    assert np.array_equal(np.isnan(got), np.isnan(want)), spec.name
    ok = ~np.isnan(want)
    assert np.all(np.abs(got - want)[ok] <= 2e-5 * scale[ok]), spec.name
    assert np.asarray(OP[spec.name](x.astype(np.float16), y.astype(np.float16))).dtype == np.float16


# ----------------------------------------------------------------------- float64 (cpu, cuda)
# Every op of the table computed in double (its operator()(double): metal/fm_math64.h) on
# the devices with doubles, against NumPy float64; Apple GPUs have no double.
F64_EPS = float(np.finfo(np.float64).eps)
F64_TINY = float(np.finfo(np.float64).tiny)
SPECIALS64 = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.75, 2.0, 20.0,
                       -20.0, 37.0, -37.0, 1e-20, -1e-20, 1e-308, -1e-308, 5e-324, 3.5e38,
                       1e300, 1.7e308, -1.7e308, 709.7, 710.0, -708.3, -745.0, -746.0])
# IEEE operations rounded once, exact operations and masks: NumPy's values bit for bit.
EXACT64 = {"relu", "abs", "negative", "square", "reciprocal", "sqrt", "add", "subtract", "multiply",
           "divide", "maximum", "minimum", "copy", "floor_divide", "remainder", "floor", "ceil",
           "trunc", "round", "sign"}
# The comparisons give bool (their own kernels, metal/convert.metal); the table's float-mask
# instances stay for fastmetal's own use.
COMPARISONS = {"less", "less_equal", "greater", "greater_equal", "equal", "not_equal"}


def f64_bound(name, x, y, want):
    """|got - want| allowed for op `name` at inputs x (, y): the device's float64 rtol, wider
    where the reference itself is worse conditioned."""
    rtol = elementwise_rtol(fm.default_device(), np.float64)
    bound = rtol * np.abs(want) + 4 * F64_TINY
    with np.errstate(all="ignore"):
        if name == "gelu":
            # The reference rounds -x / sqrt2 (relative 2^-53), which erfc magnifies by
            # 2 z^2 = x^2; fastmetal takes that rounding out (fm_math64.h).
            bound = bound + x * x * F64_EPS * np.abs(want)
        if name == "logaddexp":
            # max + log1p(e^-|x - y|) cancels where the result crosses 0: absolute, as float32's.
            bound = np.maximum(bound, 4 * F64_EPS * (np.maximum(np.abs(x), np.abs(y)) + np.log(2)))
    return bound


def check64(name, got, want, x, y=None):
    got = host(got)
    assert got.shape == want.shape
    if name in COMPARISONS:
        assert got.dtype == np.bool_, f"{name}: dtype {got.dtype}"
        np.testing.assert_array_equal(got, want != 0, err_msg=name)
        return
    assert got.dtype == np.float64, f"{name}: dtype {got.dtype}"
    with np.errstate(all="ignore"):
        _check64_values(name, got, want, x, y)


def _check64_values(name, got, want, x, y):
    assert np.array_equal(np.isnan(got), np.isnan(want)), name
    assert np.array_equal(np.isposinf(got), np.isposinf(want)), name
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), name
    if name in EXACT64:
        np.testing.assert_array_equal(got, want, err_msg=name)
        return
    finite = np.isfinite(want)
    err = np.where(finite, np.abs(got - want), 0.0)
    bound = np.broadcast_to(f64_bound(name, x, y if y is not None else x, want), want.shape)
    bad = err > bound
    if bad.any():
        i = np.argmax(np.where(bad, err / np.maximum(bound, F64_TINY), 0))
        xi = np.broadcast_to(x, want.shape).flat[i]
        yi = "" if y is None else f", {np.broadcast_to(y, want.shape).flat[i]!r}"
        raise AssertionError(f"{name}({xi!r}{yi}) = {got.flat[i]!r}, want {want.flat[i]!r} "
                             f"(|error| {err.flat[i]:.3g} > {bound.flat[i]:.3g}); "
                             f"{bad.sum()} of {bad.size} off")


def sample64(rng, shape, op_name):
    """float64 inputs: half in [-1.2, 1.2] (the inverse trigonometric functions' domain), half
    normal at magnitudes from 1e-8 to 700 (exp's overflow), both signs."""
    mags = rng.choice([1e-8, 1e-3, 0.1, 1.0, 10.0, 80.0, 700.0], size=shape)
    x = np.where(rng.random(shape) < 0.5, rng.uniform(-1.2, 1.2, shape),
                 rng.standard_normal(shape) * mags)
    if op_name in ("log", "sqrt", "log2", "log10"):
        x = np.abs(x) * rng.choice([1.0, 1.0, 1.0, -1.0], size=shape)
    return x


def f64_array(x):
    a = fm.asarray(x)
    assert a.dtype == np.float64, f"fm.asarray kept {a.dtype}, not float64"
    return a


@pytest.mark.parametrize("spec", UNARY, ids=lambda s: s.name)
def test_unary_float64_matches_numpy(spec, rng, device):
    skip_without_float64(device)
    x = sample64(rng, (4, 500), spec.name)
    check64(spec.name, OP[spec.name](f64_array(x)), numpy_reference(spec, x), x)


@pytest.mark.parametrize("spec", BINARY, ids=lambda s: s.name)
def test_binary_float64_matches_numpy(spec, rng, device):
    skip_without_float64(device)
    x = sample64(rng, (3, 400), spec.name)
    y = sample64(rng, (3, 400), spec.name)
    if spec.name == "power":
        x, y = np.abs(x) + 0.1, np.clip(y, -40, 40)
    if spec.name in ("floor_divide", "remainder"):
        y = np.where(rng.random(y.shape) < 0.3, np.round(y * 4) / 4, y)  # exact quotients too
    check64(spec.name, OP[spec.name](f64_array(x), f64_array(y)), numpy_reference(spec, x, y), x, y)


@pytest.mark.parametrize("spec", UNARY, ids=lambda s: s.name)
def test_unary_float64_special_values(spec, device):
    skip_without_float64(device)
    want = numpy_reference(spec, SPECIALS64)
    got = host(OP[spec.name](f64_array(SPECIALS64)))
    check64(spec.name, got, want, SPECIALS64)
    # Signed zeros as NumPy's (sin(-0.0) = -0.0, ceil(-0.5) = -0.0, ...).
    zero = want == 0
    assert np.array_equal(np.signbit(got[zero]), np.signbit(want[zero])), \
        f"{spec.name}: signs of zeros at {SPECIALS64[zero][np.signbit(got[zero]) != np.signbit(want[zero])]}"


@pytest.mark.parametrize("spec", BINARY, ids=lambda s: s.name)
def test_binary_float64_special_values(spec, device):
    skip_without_float64(device)
    x, y = np.meshgrid(SPECIALS64, SPECIALS64)
    want = numpy_reference(spec, x, y)
    got = host(OP[spec.name](f64_array(x), f64_array(y)))
    check64(spec.name, got, want, x, y)
    if spec.name not in ("maximum", "minimum"):  # which zero of max(-0.0, 0.0): NumPy's order
        zero = want == 0
        assert np.array_equal(np.signbit(got[zero]), np.signbit(want[zero])), spec.name


@pytest.mark.parametrize("spec", INTERNAL, ids=lambda s: s.name)
def test_internal_kernels_float64(spec, device, rng):
    skip_without_float64(device)
    x, y = (v.astype(np.float64) for v in _internal_operands(rng, spec.name))
    got = host(OP[spec.name](f64_array(x), f64_array(y)))
    assert got.dtype == np.float64
    want = numpy_reference(spec, x, y)
    scale = np.maximum(np.abs(want), 1e-3 * np.abs(want).max())
    assert np.array_equal(np.isnan(got), np.isnan(want)), spec.name
    ok = ~np.isnan(want)
    # gelu_grad: the reference's own rounding of x / sqrt2 and x * x (see f64_bound).
    assert np.all(np.abs(got - want)[ok] <= (1e-13 + y * y * F64_EPS)[ok] * scale[ok]), spec.name


# Every kernel layout: contiguous (v), a scalar on either side (sv, vs), rows of a sliced or
# broadcast array (r), any strides in 3 dims (s), more dims than merge into 3 (g).
F64_LAYOUTS = ["v", "sv", "vs", "r", "s", "g", "out_view"]


@pytest.mark.parametrize("layout", F64_LAYOUTS)
@pytest.mark.parametrize("name", ["exp", "gelu", "hypot", "floor_divide", "logaddexp"])
def test_float64_every_layout(device, rng, name, layout):
    skip_without_float64(device)
    spec = next(s for s in OPS if s.name == name)
    base = rng.standard_normal((3, 5, 4, 6, 8)) * 3
    other = rng.standard_normal((3, 5, 4, 6, 8)) * 3 + 0.25
    a, b = f64_array(base), f64_array(other)
    views = {
        "v": (np.s_[...], np.s_[...]),
        "sv": (np.s_[0, 0, 0, 0, :1], np.s_[...]),
        "vs": (np.s_[...], np.s_[1, 1, 1, 1, :1]),
        "r": (np.s_[:, :, 1:3, ::2, :], np.s_[:, :, :2, 1::2, :]),
        "s": (np.s_[0, ::-1, :, 2, ::3], np.s_[1, :, :, 1, 1::3]),
        "g": (np.s_[:, ::2, :, ::-1, ::2], np.s_[::-1, ::2, :, :, 1::2]),
        "out_view": (np.s_[...], np.s_[...]),
    }[layout]
    xv, yv = a[views[0]], b[views[1]]
    xh, yh = base[views[0]], other[views[1]]
    if layout == "s":
        xv, xh = xv.T, xh.T
        yv, yh = yv.T, yh.T
    if spec.arity == 1:
        xv, xh = (xv, xh) if layout not in ("sv", "vs") else (b[views[1]], other[views[1]])
        want = numpy_reference(spec, xh)
        got = OP[name](xv)
        if layout == "out_view":
            out = f64_array(np.full(base.shape[:-1] + (16,), np.nan))[..., ::2]
            assert OP[name](xv, out=out) is out
            got = out
        check64(name, got, want, xh)
        return
    want = numpy_reference(spec, xh, yh)
    got = OP[name](xv, yv)
    if layout == "out_view":
        out = f64_array(np.full(base.shape[:-1] + (16,), np.nan))[..., 1::2]
        assert OP[name](xv, yv, out=out) is out
        got = out
    check64(name, got, want, np.broadcast_to(xh, want.shape), np.broadcast_to(yh, want.shape))
