"""gradient, derivative and fourier_series against NumPy float64 references, on every device.

The kernels compute in float32, so every comparison uses a tolerance derived from float32
rounding of the *inputs and the stencil* (eps32 * |f| * sum|w|), not a fixed number: a wrong
weight, offset or edge formula gives errors of order |f| / h, far above these bounds. float64
data computes in double on cpu and cuda (the float64 section at the end, eps64 bounds).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.ops import numerics as fnum

from helpers import skip_without_float64
from references import derivative_reference, fourier_series_numpy32, fourier_series_reference

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EPS32 = float(np.finfo(np.float32).eps)


def _as_tuple(g):
    return g if isinstance(g, tuple) else (g,)


# ============================================================================ gradient
def _grad_tol(f32, spacings, ref):
    """Per-axis tolerance: float32 rounding of the differences (|f| / min step, times the
    step ratio for non-uniform grids) plus rounding of the result itself."""
    fmax = float(np.max(np.abs(f32))) if f32.size else 0.0
    tols = []
    for h, r in zip(spacings, _as_tuple(ref)):
        steps = np.abs(np.diff(h)) if np.ndim(h) else np.array([abs(h)])
        ratio = steps.max() / steps.min()
        tols.append(16 * EPS32 * fmax / steps.min() * ratio ** 2 + 8 * EPS32 * np.abs(r))
    return tols


def _check_gradient(f32, *varargs, axis=None, edge_order=1, spacings=None):
    got = fm.gradient(f32, *varargs, axis=axis, edge_order=edge_order)
    ref = np.gradient(f32.astype(np.float64), *varargs, axis=axis, edge_order=edge_order)
    assert type(got) is type(ref)  # one ndarray, or a tuple as numpy 2.x returns
    if isinstance(ref, tuple):
        assert len(got) == len(ref)
    axes = range(f32.ndim) if axis is None else np.atleast_1d(axis)
    if spacings is None:
        if len(varargs) == 0:
            spacings = [1.0] * len(list(axes))
        elif len(varargs) == 1 and np.ndim(varargs[0]) == 0:
            spacings = [varargs[0]] * len(list(axes))
        else:
            spacings = list(varargs)
    for g, r, tol in zip(_as_tuple(got), _as_tuple(ref), _grad_tol(f32, spacings, ref)):
        assert isinstance(g, np.ndarray) and g.dtype == np.float32 and g.shape == r.shape
        np.testing.assert_array_less(np.abs(g - r), tol + 1e-30)
    return got


@pytest.mark.parametrize("edge_order", [1, 2])
@pytest.mark.parametrize("shape", [(7,), (3,), (2,), (5, 4), (3, 6, 5), (2, 3, 4, 5), (3, 4, 3, 5)])
def test_gradient_all_axes_matches_numpy(shape, edge_order, device):
    if min(shape) < edge_order + 1:
        with pytest.raises(ValueError):
            fm.gradient(np.zeros(shape, np.float32), edge_order=edge_order)
        return
    rng = np.random.default_rng(sum(shape) + edge_order)
    f = rng.standard_normal(shape).astype(np.float32)
    _check_gradient(f, edge_order=edge_order)
    _check_gradient(f, 0.25, edge_order=edge_order)


@pytest.mark.parametrize("edge_order", [1, 2])
def test_gradient_axes_forms(edge_order, device):
    rng = np.random.default_rng(1)
    f = rng.standard_normal((4, 5, 6)).astype(np.float32)
    for axis in [0, 1, 2, -1, -3, (0, 2), (2, 0), (-1, 1), (0, 1, 2)]:
        got = _check_gradient(f, axis=axis, edge_order=edge_order)
        assert isinstance(got, np.ndarray) == isinstance(axis, int)
    # one spacing per listed axis, in the order of the axes
    _check_gradient(f, 0.5, 3.0, axis=(2, 0), edge_order=edge_order)


@pytest.mark.parametrize("edge_order", [1, 2])
def test_gradient_nonuniform_coordinates(edge_order, device):
    rng = np.random.default_rng(2)
    f = rng.standard_normal((9, 6, 5)).astype(np.float32)
    x0 = np.cumsum(rng.uniform(0.5, 2.0, 9))
    x1 = np.arange(6) * 2  # integer, uniform: numpy reduces it to a scalar step
    x2 = np.sort(rng.uniform(-3, 3, 5)).astype(np.float32)
    _check_gradient(f, x0, x1, x2, edge_order=edge_order)
    _check_gradient(f, x0, 0.5, x2, edge_order=edge_order)
    _check_gradient(f, x2, axis=2, edge_order=edge_order)
    # decreasing coordinates (negative steps) work too
    _check_gradient(f, x0[::-1].copy(), axis=0, edge_order=edge_order)


def test_gradient_nonuniform_is_second_order_exact_on_quadratics(device):
    # numpy's non-uniform formulas are exact for quadratics (interior; edges with edge_order=2)
    rng = np.random.default_rng(3)
    x = np.cumsum(rng.uniform(0.5, 1.5, 12))
    y = (0.3 * x**2 - x + 2).astype(np.float32)
    g = fm.gradient(y, x, edge_order=2)
    exact = 0.6 * x - 1
    tol = 64 * EPS32 * np.abs(y).max() / np.diff(x).min() * 4
    np.testing.assert_allclose(g, exact, rtol=0, atol=tol)


@pytest.mark.parametrize("shape", [(3, 70, 40), (1000,), (37, 45), (3, 4, 17, 33)])
def test_gradient_and_derivative_larger_shapes(shape, device):
    # sizes that take the 16-lane CPU kernels (stride-1 axis or stride-1 inner dim) plus
    # their scalar tails, and (through transposes) the general strided kernel
    rng = np.random.default_rng(len(shape))
    f = rng.standard_normal(shape).astype(np.float32)
    for view in (f, f.T):
        for eo in (1, 2):
            _check_gradient(view, edge_order=eo)
        coords = np.cumsum(rng.uniform(0.5, 1.5, view.shape[-1]))
        _check_gradient(view, coords, axis=-1)
        _check_gradient(view, coords[: view.shape[0]] if view.shape[0] <= len(coords)
                        else np.cumsum(rng.uniform(0.5, 1.5, view.shape[0])), axis=0)
        v64 = view.astype(np.float64)
        for axis in range(view.ndim):
            if view.shape[axis] < 10:
                continue
            for order, acc in [(1, 8), (2, 6)]:
                got = fm.derivative(view, dx=0.5, order=order, accuracy=acc, axis=axis)
                ref = derivative_reference(v64, 0.5, order, acc, axis)
                tol = 4 * EPS32 * np.abs(v64).max() * _stencil_abs_sum(order, acc) / 0.5**order
                np.testing.assert_array_less(np.abs(got - ref), tol)


def test_gradient_strided_and_negative_views(device):
    rng = np.random.default_rng(4)
    base = rng.standard_normal((10, 12, 8)).astype(np.float32)
    for view in [base[::-1], base[:, ::-2], base[::2, 3:, ::-3], base.transpose(2, 0, 1),
                 np.swapaxes(base, 0, 2)[:, ::-1]]:
        assert not view.flags.c_contiguous
        for eo in (1, 2):
            _check_gradient(view, edge_order=eo)
            _check_gradient(view, 0.7, axis=-1, edge_order=eo)


def test_gradient_dtypes_and_containers(device):
    f64 = np.linspace(0, 3, 11) ** 2
    g = fm.gradient(f64)
    # float64 in double where the device has doubles (test_float64_* below), else float32
    assert g.dtype == (np.float32 if device == "metal" else np.float64)
    np.testing.assert_allclose(g, np.gradient(f64), rtol=1e-6, atol=1e-5)
    gi = fm.gradient(np.arange(10) ** 2)
    np.testing.assert_allclose(gi, np.gradient(np.arange(10) ** 2), rtol=0, atol=1e-5)
    gh = fm.gradient(np.arange(8, dtype=np.float16) * 0.5)
    assert gh.dtype == np.float32
    np.testing.assert_allclose(gh, 0.5, atol=1e-6)
    gl = fm.gradient([1.0, 4.0, 9.0])
    np.testing.assert_allclose(gl, [3.0, 4.0, 5.0])
    a = fm.asarray(np.arange(12, dtype=np.float32).reshape(3, 4) ** 2)
    ga = fm.gradient(a, axis=1)
    assert isinstance(ga, fm.Array)
    np.testing.assert_allclose(np.asarray(ga), np.gradient(np.asarray(a).astype(np.float64), axis=1))
    # zero-size along a non-differentiated axis
    e = fm.gradient(np.zeros((0, 4), np.float32), axis=1)
    assert e.shape == (0, 4)


def test_gradient_errors(device):
    f = np.zeros((3, 4), np.float32)

    def check(exc, *args, **kw):
        with pytest.raises(exc) as ei:
            fm.gradient(*args, **kw)
        assert str(ei.value).startswith("[fastmetal.gradient] expected"), str(ei.value)

    check(ValueError, np.zeros(1, np.float32))  # too few points for edge_order 1
    check(ValueError, np.zeros((2, 5), np.float32), edge_order=2)
    check(ValueError, np.zeros((2, 5), np.float32), axis=0, edge_order=2)
    check(ValueError, f, edge_order=3)
    check(ValueError, f, edge_order=0)
    check(TypeError, f, edge_order=1.5)
    check(TypeError, f, 1.0, 2.0, 3.0)  # wrong number of spacings
    check(ValueError, f, np.arange(5.0), 1.0)  # coordinates of the wrong length
    check(ValueError, f, np.zeros((3, 1)), 1.0)  # 2-D coordinates
    check(TypeError, f, "a")
    check(TypeError, f, np.array([1j, 2j, 3j]), 1.0)
    check(ValueError, f, axis=2)
    check(ValueError, f, axis=(0, -2))  # repeated axis
    check(TypeError, f, axis=1.0)
    check(TypeError, np.ones(3, np.complex64))
    check(TypeError, np.array(["a", "b", "c"]))
    with pytest.raises(IndexError):  # numpy's AxisError is both ValueError and IndexError
        fm.gradient(f, axis=-3)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       edge_order=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1),
       data=st.data())
def test_gradient_hypothesis(shape, edge_order, seed, data, device):
    shape = [max(s, edge_order + 1) for s in shape]
    rng = np.random.default_rng(seed)
    f = (rng.standard_normal(shape) * 10).astype(np.float32)
    ndim = len(shape)
    axes = data.draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1),
                               st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim,
                                        unique=True).map(tuple)))
    listed = list(range(ndim)) if axes is None else list(np.atleast_1d(axes))
    kind = data.draw(st.sampled_from(["none", "scalar", "each"]))
    if kind == "none":
        args = ()
    elif kind == "scalar":
        args = (data.draw(st.sampled_from([0.1, 1.0, 3.5, -2.0])),)
    else:
        args = tuple(np.cumsum(rng.uniform(0.2, 1.0, shape[a])) if rng.random() < 0.5
                     else float(rng.uniform(0.2, 2.0)) for a in listed)
    _check_gradient(f, *args, axis=axes, edge_order=edge_order)


# ============================================================================ derivative
def _stencil_abs_sum(order, accuracy):
    rows, _, _, _ = fnum._derivative_stencils(order, accuracy)
    return max(sum(abs(float(w)) for w in weights) for _, weights in rows)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("accuracy", [2, 4, 6, 8])
def test_derivative_weights_exact_in_rationals(order, accuracy):
    # Every row (edges and interior) differentiates x^d exactly at its point, d <= accuracy.
    rows, half, width, need = fnum._derivative_stencils(order, accuracy)
    assert need == accuracy + order and len(rows) == 2 * half + 1
    for off, weights in rows:
        pts = range(off, off + len(weights))
        for d in range(accuracy + 1):
            got = sum(w * Fraction(s) ** d for w, s in zip(weights, pts))
            exact = Fraction(math.factorial(d), math.factorial(d - order)) * 0 ** (d - order) \
                if d >= order else 0
            assert got == exact, (off, d)


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("accuracy", [2, 4, 6, 8])
def test_derivative_polynomials_exact(order, accuracy, device):
    rng = np.random.default_rng(order * 10 + accuracy)
    n, h = 23, 0.125
    x = (np.arange(n) - n // 2) * h
    for degree in range(accuracy + 1):
        c = rng.standard_normal(degree + 1)
        y = np.polyval(c, x).astype(np.float32)
        exact = np.polyval(np.polyder(c, order), x) if degree >= order else np.zeros(n)
        got = fm.derivative(y, dx=h, order=order, accuracy=accuracy)
        assert got.shape == y.shape and got.dtype == np.float32
        tol = (4 * EPS32 * np.abs(y).max() * _stencil_abs_sum(order, accuracy) / h**order
               + 8 * EPS32 * np.abs(exact))
        np.testing.assert_array_less(np.abs(got - exact), tol)


# k*h windows (interior, edges) where truncation dominates float32 rounding by >= ~10x:
# higher orders need coarser grids before they hit the rounding floor ~eps / (k h)^order.
_KH_WINDOWS = {
    (1, 2): ([0.4, 0.3, 0.2, 0.14, 0.1],) * 2,
    (1, 4): ([0.4, 0.3, 0.2, 0.14, 0.1],) * 2,
    (1, 6): ([0.65, 0.5, 0.4, 0.3],) * 2,
    (1, 8): ([1.0, 0.8, 0.65, 0.5], [0.8, 0.65, 0.5, 0.4]),
    (2, 2): ([0.3, 0.2, 0.14, 0.1],) * 2,
    (2, 4): ([0.65, 0.5, 0.4, 0.3],) * 2,
    (2, 6): ([0.8, 0.65, 0.5, 0.4],) * 2,
    (2, 8): ([1.2, 1.0, 0.8, 0.65], [1.0, 0.8, 0.65, 0.5]),
}


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("accuracy", [2, 4, 6, 8])
def test_derivative_convergence_order(order, accuracy, device):
    """Slope of log(error) against log(h) on sin(k x), inside and at the edge points."""
    k, half = 12.0, accuracy // 2
    for region, khs in zip(("interior", "edges"), _KH_WINDOWS[order, accuracy]):
        hs, errs = [], []
        for kh in khs:
            h = kh / k
            x = np.arange(0.0, 3.0, h)
            y = np.sin(k * x + 0.3).astype(np.float32)
            d = fm.derivative(y, dx=h, order=order, accuracy=accuracy).astype(np.float64)
            exact = (k * np.cos(k * x + 0.3)) if order == 1 else (-k * k * np.sin(k * x + 0.3))
            err = np.abs(d - exact) / k**order
            hs.append(h)
            errs.append(err[half:-half].max() if region == "interior"
                        else max(err[:half].max(), err[-half:].max()))
        slope = np.polyfit(np.log(hs), np.log(errs), 1)[0]
        assert accuracy - 0.6 < slope < accuracy + 1.2, (region, errs, slope)


def test_derivative_nd_axes_and_views(device):
    rng = np.random.default_rng(5)
    y = rng.standard_normal((6, 14, 5)).astype(np.float32)
    for axis in (0, 1, 2, -1, -2):
        for order, acc in [(1, 4), (2, 2), (1, 2), (2, 4)]:
            if y.shape[axis] < acc + order:
                continue
            got = fm.derivative(y, dx=0.3, order=order, accuracy=acc, axis=axis)
            ref = np.apply_along_axis(
                lambda v: fm.derivative(np.ascontiguousarray(v), dx=0.3, order=order, accuracy=acc),
                axis, y)
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)
    # second-order accuracy 2 inside equals numpy's (f[i+1] - 2 f[i] + f[i-1]) / h^2
    v = y[:, ::-1].transpose(1, 0, 2)  # negative strides, not contiguous
    got = fm.derivative(v, dx=0.5, order=2, accuracy=2, axis=0)
    v64 = v.astype(np.float64)
    ref = (v64[2:] - 2 * v64[1:-1] + v64[:-2]) / 0.25
    np.testing.assert_allclose(got[1:-1], ref, rtol=1e-5, atol=1e-4)
    # first-order accuracy 2 equals numpy.gradient with edge_order=2
    got = fm.derivative(v, dx=0.5, order=1, accuracy=2, axis=2)
    np.testing.assert_allclose(got, np.gradient(v64, 0.5, axis=2, edge_order=2), rtol=1e-5, atol=1e-5)
    a = fm.asarray(y)
    assert isinstance(fm.derivative(a, axis=1), fm.Array)


def test_derivative_errors(device):
    y = np.zeros(20, np.float32)

    def check(exc, *args, **kw):
        with pytest.raises(exc) as ei:
            fm.derivative(*args, **kw)
        assert str(ei.value).startswith("[fastmetal.derivative] expected"), str(ei.value)

    check(ValueError, y, order=3)
    check(ValueError, y, order=0)
    check(TypeError, y, order=1.0)
    check(TypeError, y, order=True)
    check(ValueError, y, accuracy=3)
    check(ValueError, y, accuracy=10)
    check(ValueError, y, dx=0.0)
    check(ValueError, y, dx=-1.0)
    check(ValueError, y, dx=float("nan"))
    check(ValueError, y, dx=float("inf"))
    check(ValueError, y, dx=np.ones(3))
    check(TypeError, y, dx="1")
    check(TypeError, y, dx=1j)
    check(ValueError, np.zeros(8, np.float32), order=1, accuracy=8)  # needs 9 points
    check(ValueError, np.zeros(9, np.float32), order=2, accuracy=8)  # needs 10 points
    check(ValueError, np.zeros((20, 3), np.float32), accuracy=4, axis=1)
    check(ValueError, y, axis=1)
    check(ValueError, np.float32(1.0))
    check(TypeError, np.ones(5, np.complex128))
    fm.derivative(np.zeros(9, np.float32), order=1, accuracy=8)  # exactly enough points
    fm.derivative(np.zeros(10, np.float32), order=2, accuracy=8)


# ============================================================================ Fourier
def _coefs(rng, K, decay=1.0):
    k = np.arange(K + 1, dtype=np.float64)
    return (rng.standard_normal(K + 1) / (1 + k) ** decay, rng.standard_normal(K + 1) / (1 + k) ** decay)


@pytest.mark.parametrize("K,n", [(1, 20000), (10, 20000), (1000, 4000), (10000, 600)])
@pytest.mark.parametrize("period,span", [(2 * np.pi, 100.0), (0.37, 50.0), (10.0, 1000.0)])
def test_fourier_vs_float64(K, n, period, span, device):
    rng = np.random.default_rng(K + n)
    x = (rng.uniform(-span, span, n) * period).astype(np.float32)  # +- span periods
    a, b = _coefs(rng, K)
    got = fm.fourier_series(x, a, b, period=period)
    assert got.dtype == np.float32 and got.shape == x.shape
    ref = fourier_series_reference(x, a, b, period)
    err = np.abs(got - ref).max()
    err32 = np.abs(fourier_series_numpy32(x, a, b, period) - ref).max()
    scale = np.abs(a[0]) / 2 + np.abs(a[1:]).sum() + np.abs(b[1:]).sum()
    # bounded error independent of k and |x|: a few float32 ulps of the coefficient sum
    assert err <= 4e-6 * scale, (err, scale)
    assert err <= err32 * 1.05 + 2 * EPS32 * scale, (err, err32)
    g64 = got.astype(np.float64)
    cos_sim = g64 @ ref / (np.linalg.norm(g64) * np.linalg.norm(ref))
    assert cos_sim > 1 - 1e-10


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("K", [1, 10, 300])
def test_fourier_derivatives(m, K, device):
    rng = np.random.default_rng(m * 100 + K)
    period = 3.0
    x = rng.uniform(-20 * period, 20 * period, 5000).astype(np.float32)
    a, b = _coefs(rng, K, decay=m + 1.0)
    got = fm.fourier_series(x, a, b, period=period, derivative=m)
    ref = fourier_series_reference(x, a, b, period, m=m)
    k = np.arange(1, K + 1)
    scale = ((np.abs(a[1:]) + np.abs(b[1:])) * (k * 2 * np.pi / period) ** m).sum()
    assert np.abs(got - ref).max() <= 4e-6 * scale
    # and it is the derivative of the m-1-th: check with a centred difference in float64
    if K <= 10:
        xs = np.linspace(-1, 1, 50)
        h = 1e-3
        lo = fourier_series_reference(xs - h, a, b, period, m=m - 1)
        hi = fourier_series_reference(xs + h, a, b, period, m=m - 1)
        np.testing.assert_allclose(fourier_series_reference(xs, a, b, period, m=m), (hi - lo) / (2 * h),
                                   rtol=1e-4, atol=1e-4 * scale)


def test_fourier_small_x_not_worse_than_numpy32(device):
    # near x = 0 NumPy float32 is at its best (tiny phases); we must not lose there either
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, 20000).astype(np.float32)
    for K in (1, 3, 10):
        a, b = _coefs(rng, K)
        ref = fourier_series_reference(x, a, b, 2 * np.pi)
        err = np.abs(fm.fourier_series(x, a, b) - ref).max()
        err32 = np.abs(fourier_series_numpy32(x, a, b, 2 * np.pi) - ref).max()
        scale = np.abs(a).sum() + np.abs(b).sum()
        assert err <= err32 * 1.05 + 2 * EPS32 * scale, (K, err, err32)


def test_fourier_shapes_dtypes_special_values(device):
    a, b = np.array([1.0, 0.5, 0.25]), np.array([0.0, -0.5, 2.0])
    x2 = np.linspace(-5, 5, 37 * 3, dtype=np.float32).reshape(37, 3)
    got = fm.fourier_series(x2, a, b)
    assert got.shape == (37, 3)
    np.testing.assert_allclose(got.ravel(), fourier_series_reference(x2, a, b, 2 * np.pi), atol=3e-6)
    # strided and negative-stride views, float64 and int x (converted to float32)
    v = x2[::-2, ::-1]
    np.testing.assert_allclose(fm.fourier_series(v, a, b).ravel(), fourier_series_reference(v, a, b, 2 * np.pi),
                               atol=3e-6)
    xi = np.arange(-50, 50)
    np.testing.assert_allclose(fm.fourier_series(xi, a, b), fourier_series_reference(xi, a, b, 2 * np.pi), atol=3e-6)
    # 0-d, empty, constant-only series, b[0] ignored
    assert fm.fourier_series(np.float32(0.5), a, b).shape == ()
    assert fm.fourier_series(np.zeros((0, 3), np.float32), a, b).shape == (0, 3)
    np.testing.assert_array_equal(fm.fourier_series(x2, [3.0], [7.0]), np.float32(1.5))
    np.testing.assert_allclose(fm.fourier_series(x2, a, b + np.array([9.0, 0, 0])), got)
    # non-finite x -> NaN (as cos(inf) in NumPy); Array in -> Array out
    s = fm.fourier_series(np.array([np.inf, -np.inf, np.nan, 0.0], np.float32), a, b)
    assert np.isnan(s[:3]).all() and np.isfinite(s[3])
    # huge |x| (beyond the exactly reduced range): a ValueError stating it, never a wrong value
    with pytest.raises(ValueError, match=r"\|x\| <= 2\*\*20 \* period"):
        fm.fourier_series(np.array([1e30, -3e38, 3e38, 2.0**60], np.float32), a, b)
    xa = fm.asarray(np.linspace(0, 1, 100, dtype=np.float32))
    r = fm.fourier_series(xa, a, b)
    assert isinstance(r, fm.Array)
    np.testing.assert_allclose(np.asarray(r), fourier_series_reference(np.asarray(xa), a, b, 2 * np.pi), atol=3e-6)
    # float16 x computes in float32 and returns float32; Array coefficients -> Array result
    xh = np.linspace(-3, 3, 50).astype(np.float16)
    rh = fm.fourier_series(xh, a, b)
    assert rh.dtype == np.float32
    np.testing.assert_allclose(rh, fourier_series_reference(xh.astype(np.float32), a, b, 2 * np.pi), atol=3e-6)
    ra = fm.fourier_series(xh, fm.asarray(a.astype(np.float32)), b)
    assert isinstance(ra, fm.Array)
    np.testing.assert_allclose(np.asarray(ra), rh, atol=1e-6)
    # sizes that are not a multiple of the CPU lane count (tail samples)
    for n in (1, 63, 64, 65, 129, 1000):
        xs = np.linspace(-3, 7, n, dtype=np.float32)
        np.testing.assert_allclose(fm.fourier_series(xs, a, b), fourier_series_reference(xs, a, b, 2 * np.pi),
                                   atol=3e-6)


def test_fourier_errors(device):
    x = np.zeros(4, np.float32)
    a = b = np.ones(3)

    def check(exc, *args, **kw):
        with pytest.raises(exc) as ei:
            fm.fourier_series(*args, **kw)
        assert str(ei.value).startswith("[fastmetal.fourier_series] expected"), str(ei.value)

    check(ValueError, x, np.ones(3), np.ones(4))
    check(ValueError, x, [], [])
    check(ValueError, x, np.ones((2, 2)), np.ones((2, 2)))
    check(TypeError, x, np.ones(3, complex), b)
    check(TypeError, x, a, ["u", "v", "w"])
    check(ValueError, x, a, b, period=0.0)
    check(ValueError, x, a, b, period=-1.0)
    check(ValueError, x, a, b, period=float("inf"))
    check(ValueError, x, a, b, period=float("nan"))
    check(TypeError, x, a, b, period="1")
    check(ValueError, x, np.zeros((1 << 24) + 2), np.zeros((1 << 24) + 2))  # k must be exact
    check(ValueError, x, a, b, period=1e-40)
    check(ValueError, x, a, b, period=1e40)
    check(ValueError, x, a, b, derivative=-1)
    check(TypeError, x, a, b, derivative=1.0)
    check(TypeError, x, a, b, derivative=True)
    check(TypeError, np.ones(3, np.complex64), a, b)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(K=st.integers(0, 40), m=st.integers(0, 3), seed=st.integers(0, 2**31 - 1),
       period=st.floats(0.05, 100.0), span=st.floats(0.0, 300.0), n=st.integers(1, 300))
def test_fourier_hypothesis(K, m, seed, period, span, n, device):
    rng = np.random.default_rng(seed)
    x = (rng.uniform(-span, span, n) * period).astype(np.float32)
    a, b = _coefs(rng, K, decay=m + 1.0)
    got = fm.fourier_series(x, a, b, period=period, derivative=m)
    ref = fourier_series_reference(x, a, b, period, m=m)
    k = np.arange(1, K + 1)
    scale = (np.abs(a[0]) / 2 if m == 0 else 0.0) + \
        ((np.abs(a[1:]) + np.abs(b[1:])) * (k * 2 * np.pi / period) ** m).sum()
    assert np.abs(got - ref).max() <= 4e-6 * scale + 1e-30


# ============================================================================ float64
# float64 data is differentiated and summed in double on the devices with doubles (cpu,
# cuda): every weight and coefficient in float64, results float64, NumPy float64's values
# to ~1e-12 of the scale of the terms. (Apple GPUs have no double: float32 there.)
EPS64 = float(np.finfo(np.float64).eps)


def _host(a):
    return np.asarray(a.numpy() if isinstance(a, fm.Array) else a)


def test_float64_accuracy_8_beats_accuracy_2_by_orders_of_magnitude(device):
    """The issue: float64 data through float32 made accuracy-8 stencils worse than
    accuracy-2 ones (rounding, eps32 |y| / dx, swamps the truncation error). In double the
    accuracy-8 error is the truncation's O(dx^8), down at rounding level."""
    skip_without_float64(device)
    x = np.linspace(0.0, 2 * np.pi, 2001)
    dx = x[1] - x[0]
    y = np.sin(x) * np.exp(0.1 * x)
    dy = (np.cos(x) + 0.1 * np.sin(x)) * np.exp(0.1 * x)
    err = {}
    for acc in (2, 4, 8):
        d = fm.derivative(y, dx=dx, accuracy=acc)
        assert d.dtype == np.float64
        err[acc] = np.abs(d - dy).max()
    assert err[2] > 1e-6, err  # the truncation error, about dx^2 / 6 |y'''|
    assert err[4] < 1e-2 * err[2], err
    assert err[8] < 1e-5 * err[2], err
    assert err[8] < 1e-10, err  # rounding: ~eps |y| / dx, the one-sided edge rows included
    # the same data through float32: accuracy 8 is no better than accuracy 2 (the issue)
    d32 = [np.abs(fm.derivative(y.astype(np.float32), dx=dx, accuracy=a) - dy).max() for a in (2, 8)]
    assert d32[1] > 0.5 * d32[0], d32


@pytest.mark.parametrize("order,accuracy", [(1, 2), (1, 4), (1, 8), (2, 6)])
def test_float64_derivative_matches_numpy(order, accuracy, device, rng):
    skip_without_float64(device)
    v = rng.standard_normal((5, 40, 11))
    rows = fnum._derivative_stencils(order, accuracy)[0]
    wsum = max(sum(abs(float(w)) for w in r[1]) for r in rows) / 0.37**order
    for axis in (0, 1, 2):
        if v.shape[axis] < accuracy + order:
            continue
        for data in (v, v[::-1, ::2, :], fm.asarray(v)):
            got = fm.derivative(data, dx=0.37, order=order, accuracy=accuracy, axis=axis)
            assert isinstance(got, fm.Array) == isinstance(data, fm.Array)
            got, vh = _host(got), _host(data)
            assert got.dtype == np.float64
            ref = derivative_reference(vh, 0.37, order, accuracy, axis)
            # a few roundings of terms of size sum|w| |v|
            np.testing.assert_array_less(np.abs(got - ref), 8 * EPS64 * wsum * np.abs(vh).max())


@pytest.mark.parametrize("edge_order", [1, 2])
def test_float64_gradient_matches_numpy(edge_order, device, rng):
    skip_without_float64(device)
    f = rng.standard_normal((6, 7, 5)) * 10
    coords = np.cumsum(rng.uniform(0.2, 1.0, 7))
    for args, kw in [((), {}), ((0.3,), {}), ((0.5, coords), {"axis": (0, 1)}),
                     ((coords,), {"axis": 1})]:
        for data in (f, f[::-1, :, ::-1], fm.asarray(f)):
            fh = _host(data)
            got = _as_tuple(fm.gradient(data, *args, edge_order=edge_order, **kw))
            ref = _as_tuple(np.gradient(fh, *args, edge_order=edge_order, **kw))
            assert len(got) == len(ref)
            for g, r in zip(got, ref):
                g = _host(g)
                assert g.dtype == np.float64 and g.shape == r.shape
                # a few roundings of terms of size |f| / step (the smallest 0.2, ratios to 5)
                np.testing.assert_allclose(g, r, rtol=0, atol=64 * EPS64 * np.abs(fh).max() / 0.2 * 25)


@pytest.mark.parametrize("K", [1, 10, 1000])
@pytest.mark.parametrize("m", [0, 1, 2])
def test_float64_fourier_matches_numpy(K, m, device, rng):
    skip_without_float64(device)
    period = 0.37
    x = rng.uniform(-100 * period, 100 * period, 3001)
    a, b = _coefs(rng, K, decay=m + 1.0)
    k = np.arange(1, K + 1)
    kw = k * 2 * np.pi / period
    scale = np.abs(a[0]) / 2 + ((np.abs(a[1:]) + np.abs(b[1:])) * kw ** m).sum()
    # NumPy's own phase error: cos of k w x rounds k w |x| by eps (|x| up to 100 periods)
    ref_err = ((np.abs(a[1:]) + np.abs(b[1:])) * kw ** m * k) @ np.ones(K) * 2 * np.pi * 100 * EPS64
    ref = fourier_series_reference(x, a, b, period, m=m)
    for data in (x, fm.asarray(x)):
        got = _host(fm.fourier_series(data, a, b, period=period, derivative=m))
        assert got.dtype == np.float64
        err = np.abs(got - ref).max()
        assert err <= 64 * EPS64 * scale + 4 * ref_err, (err, scale, ref_err)


def test_float64_fourier_exact_phases_and_special_values(device):
    """A period of 2 makes x / period exact, so the reference reduced first by np.fmod is
    exact too: the kernel's double-double phase keeps ~1e-15 of the coefficient sum out to
    2**20 periods."""
    skip_without_float64(device)
    a, b = np.array([0.5, 1.0, -0.25, 0.125]), np.array([0.0, 0.5, 2.0, -1.0])
    x = np.array([0.0, 0.3, -1.7, 12345.678, -2.0**20 + 0.1, 2.0**20 - 0.3])
    got = _host(fm.fourier_series(x, a, b, period=2.0))
    ref = fourier_series_reference(np.fmod(x, 2.0), a, b, 2.0)
    np.testing.assert_allclose(got, ref, rtol=0, atol=32 * EPS64 * 4)
    s = _host(fm.fourier_series(np.array([np.inf, -np.inf, np.nan, 0.0]), a, b))
    assert s.dtype == np.float64 and np.isnan(s[:3]).all() and np.isfinite(s[3])
