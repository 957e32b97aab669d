"""Reductions with NumPy's names, arguments and semantics: ``sum, mean, var, std, max,
min, argmax, argmin`` over ``axis=None | int | tuple of ints`` (negative axes count from
the end), with ``keepdims`` and, for ``var``/``std``, ``ddof``.

NumPy in, NumPy out (a NumPy scalar for a full reduction, as NumPy); a ``fastmetal.Array``
in gives a ``fastmetal.Array`` on its device. ``argmax``/``argmin`` return int64 indices
(an int64 ``fastmetal.Array`` for Array input). Computation is float32: float16 input is
converted on the device and the result converted back (float16 out, as NumPy); other
input dtypes are converted to float32 and the results are float32. int64 Arrays (the
index dtype) take ``sum`` (int64) and ``mean`` (float32) only.

Accuracy: on the ``cpu`` device sums accumulate in float64 over fixed chunks (bitwise the
same for any ``FASTMETAL_NUM_THREADS``); the MSL kernels (``metal/reduce.metal``: each
thread a Kahan-compensated share, then a simdgroup + threadgroup tree; few long rows split
into segments on several threadgroups, combined by a second launch, the partition a
function of the shape only) are at least as accurate as NumPy's pairwise float32 sum. NaN as NumPy: sums and max/min propagate NaN,
argmax/argmin return the first NaN's index. Empty reductions: ``sum`` gives 0, ``mean``
NaN (without NumPy's warning), ``max``/``min``/``argmax``/``argmin`` raise ``ValueError``.
"""
from __future__ import annotations

from typing import Any

import math

import numpy as np

from . import _core
from ._declare import op

__all__ = ["sum", "mean", "var", "std", "max", "min", "argmax", "argmin"]

_builtin_sum = sum


def _check_dtype(name: str, dtype: Any) -> None:
    if dtype is not None and np.dtype(dtype) != np.float32:  # float16 in: float16 out
        raise TypeError(f"[fastmetal.{name}] expected dtype None or float32, got {dtype!r}")


def _finish(name: str, result: Any, out: Any) -> Any:
    if out is None:
        return result
    if isinstance(out, _core.Array):
        if isinstance(result, _core.Array) and result.dtype == np.int64:  # argmax / argmin
            if out.dtype != np.int64:
                raise TypeError(f"[fastmetal.{name}] expected an int64 out for int64 indices, "
                                f"got dtype {out.dtype}")
            if out.shape != result.shape:
                raise ValueError(f"[fastmetal.{name}] expected out of shape {result.shape}, "
                                 f"got shape {out.shape}")
            _core.unary("copy", result, out=out)
            return out
        _core.binary("multiply", result, 1.0, out=out)
        return out
    if not isinstance(out, np.ndarray):
        raise TypeError(f"[fastmetal.{name}] expected out to be a NumPy array or "
                        f"fastmetal.Array, got {type(out).__name__}")
    if not out.flags.writeable:
        raise ValueError(f"[fastmetal.{name}] expected a writeable out, got a read-only array")
    host = result.numpy() if isinstance(result, _core.Array) else np.asarray(result)
    if out.shape != host.shape:
        raise ValueError(f"[fastmetal.{name}] expected out of shape {host.shape}, "
                         f"got shape {out.shape}")
    np.copyto(out, host, casting="same_kind")
    return out


def _reduce(name: str, a: Any, axis: Any, dtype: Any, out: Any, keepdims: bool,
            ddof: float = 0.0) -> Any:
    _check_dtype(name, dtype)
    return _finish(name, _core._reduce(name, a, axis, bool(keepdims), float(ddof)), out)


# Each reduction is declared with its gradient beside it (fastmetal._declare.op).
@op(grads=("a",))
def sum(a, axis=None, dtype=None, out=None, keepdims=False):  # noqa: A001
    """Sum of the elements over ``axis`` (all by default), as ``numpy.sum``."""
    return _reduce("sum", a, axis, dtype, out, keepdims)


@sum.vjp
def _sum_vjp(ctx, g):
    return _spread(g, ctx.shapes["a"], ctx.axis, ctx.keepdims)


@op(grads=("a",))
def mean(a, axis=None, dtype=None, out=None, keepdims=False):
    """Arithmetic mean over ``axis``, as ``numpy.mean`` (NaN for an empty axis)."""
    return _reduce("mean", a, axis, dtype, out, keepdims)


@mean.vjp
def _mean_vjp(ctx, g):
    shape = ctx.shapes["a"]
    return _spread(g * (1.0 / _count(shape, ctx.axis)), shape, ctx.axis, ctx.keepdims)


@op(grads=("a",), saves=("a",))
def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    """Variance ``sum((x - mean)**2) / (N - ddof)`` over ``axis``, as ``numpy.var``."""
    return _reduce("var", a, axis, dtype, out, keepdims, ddof)


@var.vjp
def _var_vjp(ctx, g):
    shape = ctx.shapes["a"]
    centred = ctx.a - mean(ctx.a, ctx.axis, keepdims=True)
    scale = 2.0 / (_count(shape, ctx.axis) - ctx.ddof)
    return _spread(g, shape, ctx.axis, ctx.keepdims) * centred * scale


@op(grads=("a",), saves=("a", "out"))
def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    """Standard deviation, the square root of :func:`var`, as ``numpy.std``."""
    return _reduce("std", a, axis, dtype, out, keepdims, ddof)


@std.vjp
def _std_vjp(ctx, g):
    shape = ctx.shapes["a"]
    centred = ctx.a - mean(ctx.a, ctx.axis, keepdims=True)
    n = _count(shape, ctx.axis) - ctx.ddof
    return _spread(g / (ctx.out * n), shape, ctx.axis, ctx.keepdims) * centred


@op(grads=("a",), saves=("a", "out"))
def max(a, axis=None, out=None, keepdims=False):  # noqa: A001
    """Largest element over ``axis``, NaN if any is NaN, as ``numpy.max``. Gradient: split
    evenly among the elements equal to the maximum (as ``torch.amax``)."""
    return _reduce("max", a, axis, None, out, keepdims)


@op(grads=("a",), saves=("a", "out"))
def min(a, axis=None, out=None, keepdims=False):  # noqa: A001
    """Smallest element over ``axis``, NaN if any is NaN, as ``numpy.min``. Gradient: split
    evenly among the elements equal to the minimum (as ``torch.amin``)."""
    return _reduce("min", a, axis, None, out, keepdims)


@max.vjp
@min.vjp
def _extreme_vjp(ctx, g):
    shape = ctx.shapes["a"]
    winners = _core.binary("equal", ctx.a, _spread(ctx.out, shape, ctx.axis, ctx.keepdims))
    ties = _reduce("sum", winners, ctx.axis, None, None, True)
    return _spread(g, shape, ctx.axis, ctx.keepdims) * winners / ties


def argmax(a, axis=None, out=None, *, keepdims=False):
    """Index (int64) of the first largest element along ``axis`` (of the flattened array
    when ``axis`` is None); the first NaN wins, as ``numpy.argmax``."""
    return _reduce("argmax", a, axis, None, out, keepdims)


def argmin(a, axis=None, out=None, *, keepdims=False):
    """Index (int64) of the first smallest element, as ``numpy.argmin``."""
    return _reduce("argmin", a, axis, None, out, keepdims)


# ----------------------------------------------------------------------------- gradients
def _axes(shape, axis):
    nd = len(shape)
    if axis is None:
        return tuple(range(nd))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(int(a) % nd for a in items)


def _count(shape, axis):
    return math.prod(shape[i] for i in _axes(shape, axis))


def _spread(g, shape, axis, keepdims):
    """A reduction's result (or gradient) broadcast back over the reduced axes of `shape`."""
    if not keepdims:
        axes = _axes(shape, axis)
        g = g.reshape(tuple(1 if i in axes else n for i, n in enumerate(shape)))
    if tuple(g.shape) == tuple(shape):
        return g
    from ._autograd import sum_to
    return sum_to(g, tuple(shape), g.dtype, g.device)
