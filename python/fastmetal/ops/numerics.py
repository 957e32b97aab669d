"""Numerical differentiation and the fused Fourier series.

Argument parsing and validation live here (``numpy.gradient``'s rules, finite-difference
stencil construction in exact rational arithmetic, Fourier coefficient scaling in float64);
the work runs in the MSL kernels of ``metal/numerics.metal`` through the private
``_core._stencil`` and ``_core._fourier_series``. Everything is validated before any work.

Dtypes (API.md): float32 is native; float64 computes in double and returns float64 on the
devices with doubles (cpu, cuda: every stencil weight and Fourier coefficient too), and in
float32 on Apple GPUs, which have none; float16, integer and bool inputs are converted to
float32 and the result is float32 (float16 inputs compute in float32 and return float32).
NumPy in -> NumPy out; a ``fastmetal.Array`` anywhere -> ``Array`` out.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction
from functools import lru_cache

import numpy as np

from .. import _core
from ..autograd.declare import refuse_recording
from . import elementwise, reductions
from .devices import host_visible as _host_visible

try:  # numpy >= 1.25
    from numpy.exceptions import AxisError as _AxisError
except ImportError:  # pragma: no cover
    _AxisError = np.AxisError

__all__ = ["gradient", "derivative", "fourier_series"]


def _msg(op: str, text: str) -> str:
    return f"[fastmetal.{op}] {text}"


def _type_name(obj) -> str:
    return type(obj).__name__


def _first_line(error: Exception) -> str:
    """An exception as one line: its type and the first line of its message."""
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


class _Input:
    """An array argument, inspected (dtype checked) but not yet converted."""

    def __init__(self, op: str, obj, name: str):
        self.op, self.name = op, name
        if isinstance(obj, _core.Array):
            self.obj, self.is_fm = obj, True
            self.shape = tuple(obj.shape)
            return
        try:
            arr = np.asarray(obj)
        except Exception as e:  # ragged lists and the like
            raise TypeError(_msg(op, f"expected an array-like of real numbers for {name}, "
                                     f"got {_type_name(obj)} ({_first_line(e)})")) from None
        if arr.dtype.kind not in "fiub":
            raise TypeError(_msg(op, f"expected a real (float, integer or bool) array for "
                                     f"{name}, got dtype {arr.dtype}"))
        self.obj, self.is_fm, self.shape = arr, False, arr.shape

    def converted(self, as_fm: bool = False, device=None):
        """float32 data for the kernels, or float64 where the device computes in double (a
        float32 or float64 NumPy array is passed as is: zero copy)."""
        if self.is_fm:
            return self.obj
        keep = self.obj.dtype == np.float32 or (self.obj.dtype == np.float64 and _doubles(device))
        arr = self.obj if keep else self.obj.astype(np.float32)
        if as_fm:
            return _core.asarray(arr, device=device)
        return arr


def _doubles(device) -> bool:
    """Whether `device` (None: the default one) computes float64 data in double (cpu and
    cuda; Apple GPUs have no double)."""
    return bool(_core._device_capabilities(device or _core.default_device())["float64"])


def _fm_device(*objs):
    for o in objs:
        if isinstance(o, _core.Array):
            return o.device
    return None


def _real_scalar(op: str, value, name: str) -> float:
    """A Python/NumPy real scalar (or 0-d array) as float; TypeError otherwise."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(_msg(op, f"expected a real number for {name}, got bool"))
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (np.ndarray, _core.Array)) and np.ndim(value) == 0:
        arr = np.asarray(value)
        if arr.dtype.kind in "fiu":
            return float(arr)
    raise TypeError(_msg(op, f"expected a real number for {name}, got {_type_name(value)}"))


def _int_arg(op: str, value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(_msg(op, f"expected an int for {name}, got {_type_name(value)}"))
    return int(value)


def _normalize_axes(op: str, axis, ndim: int) -> tuple:
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    axes = []
    for a in items:
        a = _int_arg(op, a, "axis")
        if not -ndim <= a < ndim:
            raise _AxisError(_msg(op, f"expected axis in [{-ndim}, {ndim}) for an array of "
                                      f"{ndim} dimension(s), got {a}"))
        axes.append(a % ndim)
    if len(set(axes)) != len(axes):
        raise ValueError(_msg(op, f"expected distinct axes, got repeated axes {tuple(items)}"))
    return tuple(axes)


# ----------------------------------------------------------------------------- gradient
def _gradient_table(h, n: int, edge_order: int):
    """Stencil table (weights, offsets, n_left, n_right, per_index) of numpy.gradient along
    an axis of n points with spacing h: a float (uniform) or the n - 1 coordinate steps."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if np.ndim(h) == 0:
            h = np.float64(h)  # zero spacing gives inf/nan as in numpy.gradient, not ZeroDivisionError
            if edge_order == 1:
                left, right, right_off = [-1.0 / h, 1.0 / h, 0.0], [-1.0 / h, 1.0 / h, 0.0], -1
            else:
                left, right, right_off = ([-1.5 / h, 2.0 / h, -0.5 / h],
                                          [0.5 / h, -2.0 / h, 1.5 / h], -2)
            w = np.array([left, [-0.5 / h, 0.0, 0.5 / h], right], dtype=np.float64)
            off = np.array([0, -1, right_off], dtype=np.int32)
            return w, off, 1, 1, False
        d = np.asarray(h, dtype=np.float64)
        w = np.zeros((n, 3), dtype=np.float64)
        off = np.full(n, -1, dtype=np.int32)
        if n > 2:  # numpy's non-uniform second-order interior formula
            dx1, dx2 = d[:-1], d[1:]
            w[1:-1, 0] = -dx2 / (dx1 * (dx1 + dx2))
            w[1:-1, 1] = (dx2 - dx1) / (dx1 * dx2)
            w[1:-1, 2] = dx1 / (dx2 * (dx1 + dx2))
        off[0] = 0
        if edge_order == 1:
            w[0, :2] = [-1.0 / d[0], 1.0 / d[0]]
            w[-1, :2] = [-1.0 / d[-1], 1.0 / d[-1]]
        else:
            dx1, dx2 = d[0], d[1]
            w[0] = [-(2.0 * dx1 + dx2) / (dx1 * (dx1 + dx2)), (dx1 + dx2) / (dx1 * dx2),
                    -dx1 / (dx2 * (dx1 + dx2))]
            dx1, dx2 = d[-2], d[-1]
            w[-1] = [dx2 / (dx1 * (dx1 + dx2)), -(dx2 + dx1) / (dx1 * dx2),
                     (2.0 * dx2 + dx1) / (dx2 * (dx1 + dx2))]
            off[-1] = -2
        return w, off, 1, 1, True


def gradient(f, *varargs, axis=None, edge_order=1):
    """Gradient of an N-D array, as ``numpy.gradient``.

    Second-order central differences inside, first- or second-order one-sided differences
    (``edge_order`` 1 or 2) at the boundaries. ``varargs``: nothing (spacing 1), one scalar
    for every axis, or one scalar or 1-D coordinate array (non-uniform spacing allowed) per
    differentiated axis. ``axis``: None (all), an int or a tuple of ints.

    Returns one array when one axis is differentiated, else a tuple of arrays (numpy 2.x).
    Results are float32, or float64 for float64 ``f`` on cpu and cuda (see the module doc);
    ``edge_order`` other than 1 or 2 is an error.
    """
    op = "gradient"
    refuse_recording(f"fastmetal.{op}", f, *varargs)
    fin = _Input(op, f, "f")
    shape = fin.shape
    ndim = len(shape)
    axes = tuple(range(ndim)) if axis is None else _normalize_axes(op, axis, ndim)
    eo = _int_arg(op, edge_order, "edge_order")
    if eo not in (1, 2):
        raise ValueError(_msg(op, f"expected edge_order 1 or 2, got {eo}"))
    for ax in axes:
        if shape[ax] < eo + 1:
            raise ValueError(_msg(op, f"expected at least edge_order + 1 = {eo + 1} points "
                                      f"along axis {ax} to compute a gradient, got shape "
                                      f"{shape}"))
    nv = len(varargs)
    if nv == 0:
        spacing = [1.0] * len(axes)
    elif nv == 1 and np.ndim(varargs[0]) == 0:
        spacing = [_real_scalar(op, varargs[0], "spacing")] * len(axes)
    elif nv == len(axes):
        spacing = []
        for i, (ax, d) in enumerate(zip(axes, varargs)):
            nd = np.ndim(d)
            if nd == 0:
                spacing.append(_real_scalar(op, d, f"spacing {i}"))
                continue
            if nd != 1:
                raise ValueError(_msg(op, f"expected spacing {i} to be a scalar or 1-D "
                                          f"coordinates, got {nd}-D"))
            try:
                coords = np.asarray(d)
            except Exception as e:
                raise TypeError(_msg(op, f"expected real coordinates for spacing {i}, "
                                         f"got {_type_name(d)} ({_first_line(e)})")) from None
            if coords.dtype.kind not in "fiub":
                raise TypeError(_msg(op, f"expected real coordinates for spacing {i}, got "
                                         f"dtype {coords.dtype}"))
            if len(coords) != shape[ax]:
                raise ValueError(_msg(op, f"expected {shape[ax]} coordinates for axis {ax} "
                                          f"(spacing {i}), got {len(coords)}"))
            steps = np.diff(coords.astype(np.float64))
            # numpy reduces constant steps to the scalar case; so do we (same formulas)
            spacing.append(float(steps[0]) if (steps == steps[0]).all() else steps)
    else:
        raise TypeError(_msg(op, f"expected 0, 1 or {len(axes)} spacing arguments (one per "
                                 f"differentiated axis), got {nv}"))

    as_fm = not fin.is_fm and _fm_device(*varargs) is not None
    data = fin.converted(as_fm, _fm_device(*varargs))
    out = []
    for ax, h in zip(axes, spacing):
        w, off, nl, nr, per = _gradient_table(h, shape[ax], eo)
        out.append(_core._stencil(op, data, ax, w, off, nl, nr, per))
    if len(out) == 1:
        return out[0]
    return tuple(out)


# ----------------------------------------------------------------------------- derivative
@lru_cache(maxsize=None)
def _fd_weights(points: tuple, order: int) -> tuple:
    """Exact weights w with sum_t w_t s_t^j = order! [j == order] for j < len(points):
    the finite-difference stencil on integer offsets `points` (Vandermonde, in Fractions)."""
    m = len(points)
    rows = [[Fraction(s) ** j for s in points] + [Fraction(math.factorial(order) if j == order else 0)]
            for j in range(m)]
    for col in range(m):  # Gauss-Jordan; the offsets are distinct, so it is invertible
        piv = next(r for r in range(col, m) if rows[r][col] != 0)
        rows[col], rows[piv] = rows[piv], rows[col]
        p = rows[col][col]
        rows[col] = [v / p for v in rows[col]]
        for r in range(m):
            if r != col and rows[r][col] != 0:
                fac = rows[r][col]
                rows[r] = [a - fac * b for a, b in zip(rows[r], rows[col])]
    return tuple(rows[j][m] for j in range(m))


@lru_cache(maxsize=None)
def _derivative_stencils(order: int, accuracy: int):
    """(offsets, exact weights) per row: `half` left-edge rows, the central row, `half`
    right-edge rows (right rows listed for the last `half` points, in order), the width
    and the minimum number of points."""
    half = accuracy // 2
    central = tuple(range(-half, half + 1))
    edge = accuracy + order  # one-sided stencils of the same accuracy need this many points
    rows = []
    for i in range(half):  # point i uses points 0 .. edge-1
        pts = tuple(t - i for t in range(edge))
        rows.append((pts[0], _fd_weights(pts, order)))
    rows.append((central[0], _fd_weights(central, order)))
    for r in range(half):  # point n - half + r uses points n - edge .. n - 1
        pts = tuple(t - edge + half - r for t in range(edge))
        rows.append((pts[0], _fd_weights(pts, order)))
    return tuple(rows), half, max(edge, len(central)), edge


@lru_cache(maxsize=None)
def _derivative_rows(order: int, accuracy: int):
    """Unscaled float64 weights (rows x width, zero-padded), offsets and edge row count."""
    rows, half, width, _ = _derivative_stencils(order, accuracy)
    w = np.zeros((len(rows), width), dtype=np.float64)
    off = np.zeros(len(rows), dtype=np.int32)
    for r, (o, weights) in enumerate(rows):
        off[r] = o
        w[r, :len(weights)] = [float(v) for v in weights]
    w.flags.writeable = False
    off.flags.writeable = False
    return w, off, half


def _derivative_table(order: int, accuracy: int, dx: float):
    w, off, half = _derivative_rows(order, accuracy)
    with np.errstate(over="ignore", under="ignore"):
        return w / dx**order, off, half  # float64 (the binding rounds it for float32 data)


def derivative(y, dx=1.0, order=1, accuracy=2, axis=-1):
    """Finite-difference derivative of uniformly sampled ``y`` along ``axis``.

    ``order`` 1 or 2; ``accuracy`` 2, 4, 6 or 8 (the error is O(dx**accuracy)): central
    stencils inside, one-sided (off-centre) stencils of the same accuracy on the first and
    last ``accuracy // 2`` points, so the output has ``y``'s shape. Needs at least
    ``accuracy + order`` points along ``axis``. Stencil weights are exact rationals
    (Vandermonde system solved in fractions), divided by ``dx**order`` in float64.
    """
    op = "derivative"
    refuse_recording(f"fastmetal.{op}", y)
    yin = _Input(op, y, "y")
    order = _int_arg(op, order, "order")
    if order not in (1, 2):
        raise ValueError(_msg(op, f"expected order 1 or 2, got {order}"))
    accuracy = _int_arg(op, accuracy, "accuracy")
    if accuracy not in (2, 4, 6, 8):
        raise ValueError(_msg(op, f"expected accuracy 2, 4, 6 or 8, got {accuracy}"))
    if np.ndim(dx) != 0:
        raise ValueError(_msg(op, f"expected a scalar dx, got an array of shape {np.shape(dx)}"))
    h = _real_scalar(op, dx, "dx")
    if not (math.isfinite(h) and h > 0):
        raise ValueError(_msg(op, f"expected a positive finite dx, got {h}"))
    ndim = len(yin.shape)
    if ndim == 0:
        raise ValueError(_msg(op, "expected an array with at least 1 dimension, got a 0-d one"))
    (ax,) = _normalize_axes(op, axis, ndim)
    need = _derivative_stencils(order, accuracy)[3]
    if yin.shape[ax] < need:
        raise ValueError(_msg(op, f"expected at least accuracy + order = {need} points along "
                                  f"axis {ax}, got shape {yin.shape}"))
    w, off, half = _derivative_table(order, accuracy, h)
    return _core._stencil(op, yin.converted(), ax, w, off, half, half, False)


# ----------------------------------------------------------------------------- Fourier
def _coefficients(op: str, c, name: str) -> np.ndarray:
    try:
        arr = np.asarray(c)
    except Exception as e:
        raise TypeError(_msg(op, f"expected a 1-D array-like of real numbers for {name}, got "
                                 f"{_type_name(c)} ({_first_line(e)})")) from None
    if arr.dtype.kind not in "fiub":
        raise TypeError(_msg(op, f"expected real coefficients for {name}, got dtype {arr.dtype}"))
    if arr.ndim != 1 or arr.shape[0] < 1:
        raise ValueError(_msg(op, f"expected a non-empty 1-D array for {name}, got shape "
                                  f"{arr.shape}"))
    return arr.astype(np.float64)


def fourier_series(x, a, b, period=2 * math.pi, derivative=0):
    """``a[0]/2 + sum_{k>=1} a[k] cos(k w x) + b[k] sin(k w x)``, ``w = 2 pi / period``.

    ``a`` and ``b`` are 1-D with the same length K + 1 (``b[0]`` is ignored);
    ``derivative=m`` returns the m-th derivative in x, analytically (each pair is rotated by
    m quarter turns and scaled by (k w)^m in float64 before the kernel runs).

    One fused kernel, no (samples x terms) temporaries. x is reduced modulo the period with
    an error-free FMA step and each phase k x / period is formed in float-float, so the
    phase error (about 2**-25 turns) does not grow with k; sin/cos come from a rotation
    recurrence re-seeded every 16 terms. Result float32 with x's shape (float64 for float64
    x on cpu and cuda, every step in double); non-finite x gives NaN.

    Supported range: finite x with ``|x| <= 2**20 * period``, where that reduction is
    exact. Beyond it a float32 phase cannot be reduced accurately, so any larger finite x
    raises ``ValueError`` instead of returning a wrong value; reduce such x modulo the
    period in float64 first (``np.fmod(x.astype(np.float64), period)``).
    """
    op = "fourier_series"
    refuse_recording(f"fastmetal.{op}", x, a, b)
    xin = _Input(op, x, "x")
    A = _coefficients(op, a, "a")
    B = _coefficients(op, b, "b")
    if A.shape != B.shape:
        raise ValueError(_msg(op, f"expected a and b of the same length, got {A.shape[0]} "
                                  f"and {B.shape[0]}"))
    P = _real_scalar(op, period, "period")
    if not (math.isfinite(P) and P > 0):
        raise ValueError(_msg(op, f"expected a positive finite period, got {P}"))
    if not 1e-30 <= P <= 1e30:  # 1/P is carried as a float32 pair: keep it a normal float
        raise ValueError(_msg(op, f"expected a period between 1e-30 and 1e30, got {P}"))
    m = _int_arg(op, derivative, "derivative")
    if m < 0:
        raise ValueError(_msg(op, f"expected derivative >= 0, got {m}"))
    K = A.shape[0] - 1
    if K > 1 << 24:  # the kernel forms k as an exact float32
        raise ValueError(_msg(op, f"expected at most 2**24 + 1 coefficients, got {K + 1}"))
    k = np.arange(1, K + 1, dtype=np.float64)
    # d^m/dx^m [a cos(kwx) + b sin(kwx)] = (kw)^m [a cos(kwx + m pi/2) + b sin(kwx + m pi/2)]
    ak, bk = A[1:], B[1:]
    ak, bk = [(ak, bk), (bk, -ak), (-ak, -bk), (-bk, ak)][m % 4]
    with np.errstate(over="ignore", invalid="ignore"):
        scale = (k * (2.0 * math.pi / P)) ** m
        coef = np.empty((K, 2), dtype=np.float64)
        coef[:, 0] = ak * scale
        coef[:, 1] = bk * scale  # float64 (the binding rounds it for float32 data)
    c0 = float(A[0]) / 2.0 if m == 0 else 0.0
    dev = _fm_device(a, b)
    data = xin.converted(not xin.is_fm and dev is not None, dev)
    _check_fourier_range(op, data, P)
    return _core._fourier_series(data, coef, c0, P)


# Periods of |x| within which the kernel's phase reduction is exact (float-float x / period
# with an error-free split; measured against a fractions reference: error <= 2e-7 of
# sum |coefficients| up to 2**21 periods, growing past 2**22).
FOURIER_MAX_PERIODS = 2**20


def _check_fourier_range(op: str, data, period: float) -> None:
    """ValueError where a finite x lies beyond the exactly reduced range."""
    limit = FOURIER_MAX_PERIODS * period
    if isinstance(data, _core.Array) and not _host_visible(data) and data.size > 0:
        # Device memory the host cannot see (cuda): reduce there and read back 4 bytes instead
        # of copying x to the host on every call; only a non-finite or too large maximum (the
        # rare case) takes the host path below, which tells the two apart.
        if float(reductions.max(elementwise.abs(data))) <= limit:
            return
    arr = data.numpy() if isinstance(data, _core.Array) else data  # a view where host-visible
    if arr.size == 0:
        return
    biggest = float(np.max(np.abs(arr)))
    if not biggest <= limit:  # inf or NaN (allowed: they give NaN) or too large
        finite = np.isfinite(arr)
        biggest = float(np.max(np.abs(arr), where=finite, initial=0.0))
    if biggest > limit:
        raise ValueError(_msg(op, f"expected finite x with |x| <= 2**20 * period = {limit:.9g} "
                                  f"(the range where the phase is reduced exactly), got "
                                  f"|x| = {biggest:.9g}; reduce x modulo the period in "
                                  f"float64 first"))
