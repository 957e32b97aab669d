"""Reductions with NumPy's names, arguments and semantics: ``sum, mean, var, std, max,
min, argmax, argmin`` over ``axis=None | int | tuple of ints`` (negative axes count from
the end), with ``keepdims`` and, for ``var``/``std``, ``ddof``. PyTorch's spellings are accepted beside
NumPy's: ``dim=`` for ``axis``, ``keepdim=`` for ``keepdims``, and for ``var``/``std`` the
Array API's ``correction=`` (and PyTorch's ``unbiased=``) for ``ddof`` (NumPy's default, 0,
stays the default). ``max``/``min`` called with ``dim=`` or ``keepdim=`` return PyTorch's
``(values, indices)`` pair; with ``axis`` (or positionally) NumPy's values.

NumPy in, NumPy out (a NumPy scalar for a full reduction, as NumPy); a ``fastmetal.Array``
in gives a ``fastmetal.Array`` on its device. ``argmax``/``argmin`` return int64 indices
(an int64 ``fastmetal.Array`` for Array input). Computation is float32: float16 input is
converted on the device and the result converted back (float16 out, as NumPy); other
input dtypes are converted to float32 and the results are float32. int64 Arrays (the
index dtype) take ``sum``, ``prod``, ``max``, ``min`` (int64, products and sums wrapping on
overflow as NumPy's) and ``mean`` (float32). ``prod`` and ``cumsum`` (a scan, in the
input's dtype) complete NumPy's set.

Accuracy: on the ``cpu`` device sums accumulate in float64 over fixed chunks (bitwise the
same for any ``FASTMETAL_NUM_THREADS``); the MSL kernels (``metal/reduce.metal``: each
thread a Kahan-compensated share, then a simdgroup + threadgroup tree; few long rows split
into segments on several threadgroups, combined by a second launch, the partition a
function of the shape only) are at least as accurate as NumPy's pairwise float32 sum. NaN as NumPy: sums and max/min propagate NaN,
argmax/argmin return the first NaN's index. Empty reductions: ``sum`` gives 0, ``mean``
NaN with NumPy's ``RuntimeWarning`` ("Mean of empty slice"; ``var``/``std`` warn
"Degrees of freedom <= 0 for slice" where ``N - ddof <= 0``), ``prod`` gives 1,
``max``/``min``/``argmax``/``argmin`` raise ``ValueError``.
"""
from __future__ import annotations

import warnings
from collections import namedtuple
from typing import Any

import math

import numpy as np

from .. import _core
from ..autograd.declare import op
from ..autograd import tape
from ..autograd.tape import broadcast_view
from .dtypes import native_dtype
from .elementwise import FUNCTIONS as E

__all__ = ["sum", "mean", "var", "std", "max", "min", "argmax", "argmin", "prod", "cumsum",
           "cumprod"]

_builtin_sum = sum

# What max / min return when called with PyTorch's dim= / keepdim= (torch.return_types.max).
values_indices = namedtuple("values_indices", ["values", "indices"])


def _torch_axis(name: str, axis: Any, keepdims: Any, dim: Any, keepdim: Any) -> tuple:
    """(axis, keepdims) from NumPy's and PyTorch's spellings (one of each at most)."""
    if dim is not None:
        if axis is not None:
            raise TypeError(f"[fastmetal.{name}] expected axis= or dim= (the same argument), "
                            f"got both: axis={axis!r}, dim={dim!r}")
        axis = dim
    if keepdim is not None:
        if keepdims:
            raise TypeError(f"[fastmetal.{name}] expected keepdims= or keepdim= (the same "
                            f"argument), got both")
        keepdims = keepdim
    return axis, keepdims


def _torch_ddof(name: str, ddof: Any, correction: Any, unbiased: Any) -> Any:
    """ddof from NumPy's ddof, the Array API's correction or PyTorch's unbiased."""
    given = [n for n, v in (("correction", correction), ("unbiased", unbiased)) if v is not None]
    if len(given) > 1 or (given and ddof != 0):
        raise TypeError(f"[fastmetal.{name}] expected one of ddof=, correction= and unbiased=, "
                        f"got {', '.join((['ddof'] if ddof != 0 else []) + given)}")
    if unbiased is not None:
        if not isinstance(unbiased, (bool, np.bool_)):
            raise TypeError(f"[fastmetal.{name}] expected unbiased to be True or False, got "
                            f"{unbiased!r}")
        return 1 if unbiased else 0
    return ddof if correction is None else correction


def _ctx_axis(ctx: Any) -> tuple:
    """The (axis, keepdims) a recorded reduction used (NumPy's or PyTorch's spelling)."""
    return _torch_axis("backward", ctx.axis, ctx.keepdims, ctx.dim, ctx.keepdim)


def _check_dtype(name: str, dtype: Any) -> None:
    if dtype is not None and np.dtype(dtype) != np.float32:  # float16 in: float16 out
        raise TypeError(f"[fastmetal.{name}] expected dtype None or float32, got {dtype!r}")


def _reduced_count(a: Any, axis: Any) -> int:
    """How many elements each output of a reduction over `axis` takes (for the warnings);
    -1 where the axis is invalid (the reduction then raises its own error)."""
    shape = tuple(a.shape) if isinstance(a, _core.Array) else np.shape(a)
    axes = range(len(shape)) if axis is None else \
        (axis if isinstance(axis, (tuple, list)) else (axis,))
    count = 1
    try:
        for ax in axes:
            count *= shape[int(ax)]
    except (TypeError, IndexError, ValueError):
        return -1
    return count


def _warn_if_empty(name: str, a: Any, axis: Any, ddof: float) -> None:
    """NumPy's RuntimeWarnings of mean / var / std with nothing (or too little) to average."""
    n = _reduced_count(a, axis)
    if n < 0:
        return
    if name == "mean" and n == 0:
        warnings.warn("Mean of empty slice.", RuntimeWarning, stacklevel=4)
    elif name in ("var", "std") and n - ddof <= 0:
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=4)


def _in_dtype(name: str, a: Any, dtype: Any) -> tuple:
    """sum / prod's dtype=, as the Array API's and NumPy's: the input converted to `dtype`
    first (on its device; not recorded: the gradient goes back to the input's dtype), the
    result in `dtype` (integers accumulate in int64 and wrap back, as NumPy's own dtype).
    (a, the dtype or None)."""
    if dtype is None:
        return a, None
    want = native_dtype(dtype, f"fastmetal.{name}")
    if isinstance(a, _core.Array):
        return (a if a.dtype == want else _core.asarray(a, dtype=want)), want
    return np.asarray(a).astype(want, copy=False), want


def _as_dtype(result: Any, want: Any) -> Any:
    """A reduction's result in the dtype= asked for (an Array, a NumPy array or scalar)."""
    if want is None or result.dtype == want:
        return result
    if isinstance(result, _core.Array):
        return _core.asarray(result, dtype=want)
    converted = np.asarray(result).astype(want)
    return converted[()] if converted.ndim == 0 else converted


def _reduce(name: str, a: Any, axis: Any, dtype: Any, out: Any, keepdims: bool,
            ddof: float = 0.0) -> Any:
    _check_dtype(name, dtype)
    if name in ("mean", "var", "std"):
        _warn_if_empty(name, a, axis, ddof)
    return _core._reduce(name, a, axis, bool(keepdims), float(ddof), out)


# Each reduction is declared with its gradient beside it (fastmetal._declare.op).
@op(grads=("a",), higher_order=True)
def sum(a, axis=None, dtype=None, out=None, keepdims=False, *, dim=None, keepdim=None):  # noqa: A001
    """Sum of the elements over ``axis`` (all by default), as ``numpy.sum``; ``dtype``: the
    input converted to it first and the result in it (integers wrap as NumPy's)."""
    axis, keepdims = _torch_axis("sum", axis, keepdims, dim, keepdim)
    a, want = _in_dtype("sum", a, dtype)
    result = _core._reduce("sum", a, axis, bool(keepdims), 0.0, out)
    return result if out is not None else _as_dtype(result, want)


@sum.vjp
def _sum_vjp(ctx, g):
    axis, keepdims = _ctx_axis(ctx)
    return _spread(g, ctx.shapes["a"], axis, keepdims)


@op(grads=("a",), higher_order=True)
def mean(a, axis=None, dtype=None, out=None, keepdims=False, *, dim=None, keepdim=None):
    """Arithmetic mean over ``axis``, as ``numpy.mean`` (NaN for an empty axis)."""
    axis, keepdims = _torch_axis("mean", axis, keepdims, dim, keepdim)
    return _reduce("mean", a, axis, dtype, out, keepdims)


@mean.vjp
def _mean_vjp(ctx, g):
    shape = ctx.shapes["a"]
    axis, keepdims = _ctx_axis(ctx)
    return _spread(g * (1.0 / _count(shape, axis)), shape, axis, keepdims)


@op(grads=("a",), saves=("a",), higher_order=True)
def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, correction=None,
        dim=None, keepdim=None, unbiased=None):
    """Variance ``sum((x - mean)**2) / (N - ddof)`` over ``axis``, as ``numpy.var``
    (``correction=`` is the Array API's name for ``ddof``; PyTorch's ``unbiased=True`` is
    ``ddof=1``; the default stays NumPy's 0)."""
    axis, keepdims = _torch_axis("var", axis, keepdims, dim, keepdim)
    ddof = _torch_ddof("var", ddof, correction, unbiased)
    return _reduce("var", a, axis, dtype, out, keepdims, ddof)


@var.vjp
def _var_vjp(ctx, g):
    shape = ctx.shapes["a"]
    axis, keepdims = _ctx_axis(ctx)
    ddof = _torch_ddof("var", ctx.ddof, ctx.correction, ctx.unbiased)
    centred = ctx.a - mean(ctx.a, axis, keepdims=True)
    scale = 2.0 / (_count(shape, axis) - ddof)
    return _spread(g, shape, axis, keepdims) * centred * scale


@op(grads=("a",), saves=("a", "out"), higher_order=True)
def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, correction=None,
        dim=None, keepdim=None, unbiased=None):
    """Standard deviation, the square root of :func:`var`, as ``numpy.std`` (``correction=``
    and ``unbiased=`` as :func:`var`)."""
    axis, keepdims = _torch_axis("std", axis, keepdims, dim, keepdim)
    ddof = _torch_ddof("std", ddof, correction, unbiased)
    return _reduce("std", a, axis, dtype, out, keepdims, ddof)


@std.vjp
def _std_vjp(ctx, g):
    shape = ctx.shapes["a"]
    axis, keepdims = _ctx_axis(ctx)
    centred = ctx.a - mean(ctx.a, axis, keepdims=True)
    n = _count(shape, axis) - _torch_ddof("std", ctx.ddof, ctx.correction, ctx.unbiased)
    return _spread(g / (ctx.out * n), shape, axis, keepdims) * centred


@op(grads=("a",), saves=("a", "out"), higher_order=True, name="max", public=False)
def _amax(a, axis=None, out=None, keepdims=False):
    return _reduce("max", a, axis, None, out, keepdims)


@op(grads=("a",), saves=("a", "out"), higher_order=True, name="min", public=False)
def _amin(a, axis=None, out=None, keepdims=False):
    return _reduce("min", a, axis, None, out, keepdims)


@_amax.vjp
@_amin.vjp
def _extreme_vjp(ctx, g):
    shape = ctx.shapes["a"]
    winners = _core.binary("equal", ctx.a, _spread(ctx.out, shape, ctx.axis, ctx.keepdims))
    ties = _reduce("sum", winners, ctx.axis, None, None, True)
    return _spread(g, shape, ctx.axis, ctx.keepdims) * winners / ties


def max(a, axis=None, out=None, keepdims=False, *, dim=None, keepdim=None):  # noqa: A001
    """Largest element over ``axis``, NaN if any is NaN, as ``numpy.max``. Gradient: split
    evenly among the elements equal to the maximum (as ``torch.amax``). With PyTorch's
    ``dim=`` or ``keepdim=``: PyTorch's ``(values, indices)`` pair (``.values``,
    ``.indices``), as ``torch.max(x, dim=...)``."""
    torch_style = dim is not None or keepdim is not None
    axis, keepdims = _torch_axis("max", axis, keepdims, dim, keepdim)
    values = _amax(a, axis, out, keepdims)
    return values_indices(values, argmax(a, axis, keepdims=keepdims)) if torch_style else values


def min(a, axis=None, out=None, keepdims=False, *, dim=None, keepdim=None):  # noqa: A001
    """Smallest element over ``axis``, NaN if any is NaN, as ``numpy.min``; with ``dim=`` or
    ``keepdim=`` PyTorch's ``(values, indices)`` pair, as :func:`max`."""
    torch_style = dim is not None or keepdim is not None
    axis, keepdims = _torch_axis("min", axis, keepdims, dim, keepdim)
    values = _amin(a, axis, out, keepdims)
    return values_indices(values, argmin(a, axis, keepdims=keepdims)) if torch_style else values


def _arg_extreme(name: str, a: Any, axis: Any, out: Any, keepdims: bool) -> Any:
    if isinstance(a, _core.Array) and a.dtype == np.int64 and out is None:
        # Exact for int64 (float32 would merge neighbours above 2**24): the first position
        # equal to the int64 max / min, found as the first 1.0 of the equality mask.
        flat = a.reshape(-1) if axis is None else a
        extreme = _reduce("max" if name == "argmax" else "min", flat, axis, None, None, True)
        index = _reduce("argmax", _core.binary("equal", flat, extreme), axis, None, None,
                        keepdims and axis is not None)
        return index.reshape((1,) * a.ndim) if keepdims and axis is None else index
    return _reduce(name, a, axis, None, out, keepdims)


def argmax(a, axis=None, out=None, *, keepdims=False, dim=None, keepdim=None):
    """Index (int64) of the first largest element along ``axis`` (of the flattened array
    when ``axis`` is None); the first NaN wins, as ``numpy.argmax``. int64 input is exact.
    ``dim=`` / ``keepdim=``: PyTorch's spellings of ``axis`` / ``keepdims``."""
    axis, keepdims = _torch_axis("argmax", axis, keepdims, dim, keepdim)
    return _arg_extreme("argmax", a, axis, out, keepdims)


def argmin(a, axis=None, out=None, *, keepdims=False, dim=None, keepdim=None):
    """Index (int64) of the first smallest element, as ``numpy.argmin`` (``dim=`` /
    ``keepdim=`` as :func:`argmax`)."""
    axis, keepdims = _torch_axis("argmin", axis, keepdims, dim, keepdim)
    return _arg_extreme("argmin", a, axis, out, keepdims)


@op(grads=("a",), saves=("a", "out"))
def prod(a, axis=None, dtype=None, out=None, keepdims=False, *, dim=None, keepdim=None):
    """Product of the elements over ``axis`` (all by default), as ``numpy.prod``: 1 for an
    empty axis; float32 products in float32 (float16 input: computed in float32, returned as
    float16), int64 products wrapping on overflow as NumPy's. On the device: one
    threadgroup per output multiplies strided shares, then a tree (so the rounding order is
    not NumPy's: results agree to float32 rounding, not bit for bit). ``dtype`` as
    :func:`sum`'s."""
    axis, keepdims = _torch_axis("prod", axis, keepdims, dim, keepdim)
    a, want = _in_dtype("prod", a, dtype)
    result = _core._reduce("prod", a, axis, bool(keepdims), 0.0, out)
    return result if out is not None else _as_dtype(result, want)


@prod.vjp
def _prod_vjp(ctx, g):
    # The product of the others, without dividing by a zero: with z the zeros' mask,
    # p' = prod(x + z) (zeros taken as 1): p' / x where the slice has no zero, p' at the
    # zero of a slice with exactly one, 0 elsewhere.
    x, shape = ctx.a, ctx.shapes["a"]
    axis, keepdims = _ctx_axis(ctx)
    zeros = E["equal"](x, 0.0)
    count = _reduce("sum", zeros, axis, None, None, True)
    others = _reduce("prod", E["add"](x, zeros), axis, None, None, True)
    safe = E["add"](x, zeros)
    grad = E["divide"](others, safe) * E["equal"](count, 0.0) * (1.0 - zeros) + \
        others * zeros * E["equal"](count, 1.0)
    return _spread(g, shape, axis, keepdims) * grad


@op(grads=("a",), higher_order=True)
def cumsum(a, axis=None, dtype=None, out=None, *, dim=None):
    """Cumulative sum along ``axis`` (of the flattened array when ``axis`` is None), as
    ``numpy.cumsum``, in the input's dtype (float32, float16 or int64; other inputs as
    float32). Each line is summed in order, as NumPy does, so the results are NumPy's bit
    for bit (float16: each partial sum rounded to float16, as NumPy; int64: wrapping).
    An ``Array`` in gives an ``Array`` on its device, NumPy in gives NumPy. ``dim=``:
    PyTorch's spelling of ``axis``."""
    axis, _ = _torch_axis("cumsum", axis, False, dim, None)
    if dtype is not None:
        want = np.dtype(dtype)
        have = a.dtype if isinstance(a, _core.Array) else None
        if have is None or want != have:
            raise TypeError(f"[fastmetal.cumsum] expected dtype None (the input's dtype), "
                            f"got {dtype!r}; convert the input with astype first")
    return _core._cumsum(a, axis, out)


@cumsum.vjp
def _cumsum_vjp(ctx, g):
    # Each input adds into every later output: the reversed cumulative sum of g.
    shape = ctx.shapes["a"]
    axis, _ = _ctx_axis(ctx) if ctx.dim is not None else (ctx.axis, False)
    flat = axis is None
    if flat:
        g = g.reshape(-1)
    axis = 0 if flat else int(axis) % len(shape)
    rev = (slice(None),) * axis + (slice(None, None, -1),)
    back = cumsum(g[rev], axis)[rev]
    return back.reshape(shape) if flat else back


@op(grads=("a",), saves=("a", "out"))
def cumprod(a, axis=None, dtype=None, out=None, *, dim=None):
    """Cumulative product along ``axis`` (of the flattened array when ``axis`` is None), as
    ``numpy.cumprod``: in the input's dtype (float32, float16, float64; integers and bool in
    int64, wrapping on overflow as NumPy's), each line multiplied in order, so the results
    are NumPy's bit for bit (float16: each product rounded to float16). ``dtype``: the input
    converted to it first, the result in it. ``dim=``: PyTorch's spelling of ``axis``."""
    axis, _ = _torch_axis("cumprod", axis, False, dim, None)
    a, want = _in_dtype("cumprod", a, dtype)
    result = _core._cumprod(a, axis, out)
    return result if out is not None else _as_dtype(result, want)


@cumprod.vjp
def _cumprod_vjp(ctx, g):
    # d out_i / d x_k = prod_{j <= i, j != k} x_j for i >= k. Along each line, with z the
    # first zero: k < z: (reversed cumsum of g * out)_k / x_k (the later terms hold the zero
    # and vanish); k == z: the reversed cumsum of g * cumprod(x with that zero taken as 1);
    # k > z: 0 (every term holds x_z). No division by a zero.
    x, shape = ctx.a, ctx.shapes["a"]
    axis = ctx.axis if ctx.dim is None else ctx.dim
    flat = axis is None
    if flat:
        x, g, res = x.reshape(-1), g.reshape(-1), ctx.out.reshape(-1)
    else:
        res = ctx.out
    axis = 0 if flat else int(axis) % len(shape)
    rev = (slice(None),) * axis + (slice(None, None, -1),)

    def rcumsum(v):
        return cumsum(v[rev], axis)[rev]

    zeros = E["equal"](x, 0.0)
    seen = cumsum(zeros, axis)  # zeros so far, this one included
    first = E["multiply"](zeros, E["equal"](seen, 1))
    before = E["equal"](seen, 0)
    others = cumprod(E["add"](x, first), axis)  # the first zero taken as 1
    safe = E["add"](x, E["equal"](before, 0))  # 1 where not divided by (k >= z)
    grad = E["divide"](rcumsum(g * res), safe) * before + rcumsum(g * others) * first
    return grad.reshape(shape) if flat else grad


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
    if g._requires_grad:  # create_graph: the broadcast recorded
        return _broadcast_to(g, tuple(shape))
    return broadcast_view(g, tuple(shape))  # no copy: the next kernel reads it broadcast


@op(grads=("a",), passes=True, name="broadcast_to", public=False, higher_order=True)
def _broadcast_to(a, shape):
    """`a` broadcast to `shape` as a view (for gradients under create_graph)."""
    return broadcast_view(a, tuple(shape))


@_broadcast_to.vjp
def _broadcast_to_vjp(ctx, g):
    return g  # the tape sums it back over the broadcast axes


tape.ENGINE["sum"] = sum  # backward(create_graph=True) sums gradients with these
tape.ENGINE["broadcast_to"] = _broadcast_to
