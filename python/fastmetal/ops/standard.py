"""The Array API standard's functions (2024.12) that fastmetal builds from its own ops, under
the standard's names and signatures, beside the NumPy names that exist (``concat`` and
``concatenate``, ``pow`` and ``power``, ``permute_dims`` and ``transpose``). The dtypes and
their introspection are in ``dtype_info.py``, sorting and searching in ``sorting.py``.

Everything here is made of differentiable ops (views, indexing, ``where``, ``concatenate``,
``matmul``, the elementwise table), so the gradients follow without vjps of their own, except
``clip``, declared with its gradient beside it. Nothing loops over elements in Python; the only
host work is index bookkeeping (``repeat`` with per-element counts, ``eye``/``tril``/``triu``
masks, built by NumPy once and copied to the device).

dtypes: bool, uint8, int32, int64, float16, float32 and float64 (``fastmetal.bool`` ...;
float64 on cpu and cuda). ``all``/``any``, ``isnan``/``isinf``/``isfinite`` and the logical
functions return bool, as the comparisons do.
"""
from __future__ import annotations

import builtins
import math
import numbers
from typing import Any, Optional, Sequence

import numpy as np

from .. import _core
from .._core import Array
from ..autograd.declare import op
from . import creation, layouts, linalg, manipulation, reductions, views
from .dtype_info import float32, int64
from .dtypes import native_dtype, promote
from .elementwise import FUNCTIONS as _F

__all__ = ["concat", "permute_dims", "pow", "clip", "all", "any", "broadcast_to",
           "broadcast_arrays", "flip", "roll", "repeat", "tile", "eye", "tril", "triu",
           "meshgrid", "take", "tensordot", "vecdot", "matrix_transpose", "isnan", "signbit",
           "isinf", "isfinite", "logical_not", "logical_and", "logical_or", "logical_xor",
           "count_nonzero", "e", "pi", "inf", "nan", "newaxis", "reshape", "astype",
           "positive", "conj", "real", "imag", "unstack", "cumulative_sum", "cumulative_prod",
           "diff", "take_along_axis", "from_dlpack"]


def _require(a: Any, where: str, name: str = "x") -> None:
    if not isinstance(a, Array):
        raise TypeError(f"[fastmetal.{where}] expected {name} to be a fastmetal.Array, got "
                        f"{type(a).__name__}")


# ----------------------------------------------------------------------------- renamed NumPy functions
def concat(arrays: Any, /, *, axis: Optional[int] = 0) -> Any:
    """Join ``arrays`` along ``axis`` (flattened first when ``axis`` is None): the Array
    API's name for :func:`fastmetal.concatenate`."""
    return manipulation.concatenate(arrays, axis=axis)


def permute_dims(x: Any, /, axes: Sequence[int]) -> Any:
    """``x`` with its axes in the order ``axes`` (a view): the Array API's name for
    :func:`fastmetal.transpose` with axes."""
    _require(x, "permute_dims")
    return manipulation.permute(x, tuple(axes))


def pow(x1: Any, x2: Any, /) -> Any:  # noqa: A001 (the standard's name)
    """``x1 ** x2``, with NumPy broadcasting: the Array API's name for
    :func:`fastmetal.power`."""
    return _F["power"](x1, x2)


def matrix_transpose(x: Any, /) -> Array:
    """The last two axes swapped (a view), as ``Array.mT``."""
    _require(x, "matrix_transpose")
    if x.ndim < 2:
        raise ValueError(f"[fastmetal.matrix_transpose] expected an array of dimension >= 2, "
                         f"got {x.ndim}")
    return manipulation.swapaxes(x, -1, -2)


# ----------------------------------------------------------------------------- clip
def _bound(v: Any, where: str, name: str) -> Any:
    if v is None or isinstance(v, Array):
        return v
    if isinstance(v, (builtins.bool, np.bool_)) or not isinstance(v, (numbers.Real, np.ndarray,
                                                             np.generic, list, tuple)):
        raise TypeError(f"[fastmetal.{where}] expected {name} to be a real number, an array "
                        f"or None, got {type(v).__name__}")
    return v


@op(grads=("x", "min", "max"), saves=("x", "min", "max"), higher_order=True)
def clip(x: Any, /, min: Any = None, max: Any = None) -> Any:  # noqa: A002
    """``x`` limited to ``[min, max]`` (either may be None: no limit; numbers or arrays,
    broadcast), as the Array API's ``clip``, ``numpy.clip`` and ``torch.clamp``:
    ``minimum(maximum(x, min), max)``, so ``max`` wins where ``min > max``; NaN stays NaN.
    Gradient: to ``x`` where ``min <= x <= max``, to ``min`` where ``x < min`` and to
    ``max`` where the result is ``max`` (ties go to ``x``, as PyTorch's)."""
    min, max = _bound(min, "clip", "min"), _bound(max, "clip", "max")
    if not isinstance(x, (Array, np.ndarray, np.generic, numbers.Real, list, tuple)):
        raise TypeError(f"[fastmetal.clip] expected x to be a fastmetal.Array or array-like, "
                        f"got {type(x).__name__}")
    out = x if min is None else _F["maximum"](x, min)
    out = out if max is None else _F["minimum"](out, max)
    if out is x:  # neither bound: a copy, as NumPy's
        out = _F["copy"](x)
    return out


@clip.vjp
def _clip_vjp(ctx: Any, g: Array) -> tuple:
    x, lo, hi = ctx.x, ctx.min, ctx.max
    m = x if lo is None else _F["maximum"](x, lo)
    below_hi = 1.0 if hi is None else _F["less_equal"](m, hi)
    gx = g * below_hi
    if lo is not None:
        gx = gx * _F["greater_equal"](x, lo)
    g_lo = g * below_hi * _F["less"](x, lo) if lo is not None and ctx.needs[1] else None
    g_hi = g * _F["greater"](m, hi) if hi is not None and ctx.needs[2] else None
    return gx, g_lo, g_hi


# ----------------------------------------------------------------------------- all / any
def all(x: Any, /, *, axis: Any = None, keepdims: bool = False, dim: Any = None,  # noqa: A001
        keepdim: Any = None) -> Any:
    """Whether every element along ``axis`` is nonzero (NaN counts as nonzero), as the
    Array API's ``all``: bool; an empty reduction gives True. ``dim=`` / ``keepdim=``:
    PyTorch's spellings."""
    _require(x, "all")
    axis, keepdims = reductions._torch_axis("all", axis, keepdims, dim, keepdim)
    zeros = reductions.sum(_F["equal"](x, 0), axis=axis, keepdims=keepdims)
    return _F["equal"](zeros, 0)


def any(x: Any, /, *, axis: Any = None, keepdims: bool = False, dim: Any = None,  # noqa: A001
        keepdim: Any = None) -> Any:
    """Whether any element along ``axis`` is nonzero (NaN counts as nonzero), as the Array
    API's ``any``: bool; an empty reduction gives False."""
    _require(x, "any")
    axis, keepdims = reductions._torch_axis("any", axis, keepdims, dim, keepdim)
    nonzero = reductions.sum(_F["not_equal"](x, 0), axis=axis, keepdims=keepdims)
    return _F["greater"](nonzero, 0)


# ----------------------------------------------------------------------------- broadcasting
def _shape_arg(shape: Any, where: str) -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"[fastmetal.{where}] expected shape to be a tuple of ints, got "
                        f"{type(shape).__name__}")
    return tuple(layouts.as_int(d, f"fastmetal.{where}", "dimension") for d in shape)


def broadcast_to(x: Any, /, shape: Any) -> Array:
    """``x`` broadcast to ``shape`` as a view (stride 0 along new or size-1 axes; no copy),
    as the Array API's and NumPy's ``broadcast_to``; differentiable (the gradient is summed
    back). ValueError where the shapes are not compatible."""
    _require(x, "broadcast_to")
    target = _shape_arg(shape, "broadcast_to")
    if builtins.any(d < 0 for d in target):
        raise ValueError(f"[fastmetal.broadcast_to] expected non-negative dimensions, got "
                         f"shape {target}")
    lead = len(target) - x.ndim
    if lead < 0 or builtins.any(n != 1 and n != t for n, t in zip(x.shape, target[lead:])):
        raise ValueError(f"[fastmetal.broadcast_to] expected a shape that {tuple(x.shape)} "
                         f"broadcasts to, got {target}")
    if tuple(x.shape) == target:
        return views.reshape(x, target)  # a view of the same shape (reshape records it)
    return reductions._broadcast_to(x, target)


def broadcast_arrays(*arrays: Any) -> list:
    """The arrays broadcast against each other (views), as the Array API's
    ``broadcast_arrays``."""
    for a in arrays:
        _require(a, "broadcast_arrays", "every argument")
    try:
        shape = np.broadcast_shapes(*(tuple(a.shape) for a in arrays))
    except ValueError:
        raise ValueError(f"[fastmetal.broadcast_arrays] expected shapes that broadcast "
                         f"together, got {[tuple(a.shape) for a in arrays]}") from None
    return [broadcast_to(a, shape) for a in arrays]


def meshgrid(*arrays: Any, indexing: str = "xy") -> list:
    """Coordinate arrays from 1-D arrays, as the Array API's and NumPy's ``meshgrid``
    (``indexing='xy'``: the first two axes swapped; ``'ij'``: matrix indexing). Each result
    is a broadcast view of its input (no copy)."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"[fastmetal.meshgrid] expected indexing 'xy' or 'ij', got "
                         f"{indexing!r}")
    for a in arrays:
        _require(a, "meshgrid", "every argument")
        if a.ndim != 1:
            raise ValueError(f"[fastmetal.meshgrid] expected 1-D arrays, got dimension "
                             f"{a.ndim}")
    n = len(arrays)
    sizes = [a.shape[0] for a in arrays]
    if indexing == "xy" and n > 1:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for i, a in enumerate(arrays):
        axis = (1 if i == 0 else 0 if i == 1 else i) if indexing == "xy" and n > 1 else i
        shape = [1] * n
        shape[axis] = a.shape[0]
        out.append(broadcast_to(views.reshape(a, tuple(shape)), tuple(sizes)))
    return out


# ----------------------------------------------------------------------------- rearranging
def _axes_arg(axis: Any, ndim: int, where: str) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = tuple(layouts.normalize_axis(a, ndim, f"fastmetal.{where}") for a in items)
    if len(set(out)) != len(out):
        raise ValueError(f"[fastmetal.{where}] expected distinct axes, got {axis!r}")
    return out


def flip(x: Any, /, *, axis: Any = None) -> Array:
    """``x`` with the order of elements reversed along ``axis`` (all axes by default), as
    the Array API's ``flip``: a view with negative strides (no copy)."""
    _require(x, "flip")
    axes = _axes_arg(axis, x.ndim, "flip")
    key = tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(x.ndim))
    return views.getitem(x, key)


def roll(x: Any, /, shift: Any, *, axis: Any = None) -> Array:
    """Elements shifted by ``shift`` along ``axis`` (those past the end come back at the
    start), as the Array API's and NumPy's ``roll``; ``axis=None`` rolls the flattened array.
    ``shift`` and ``axis`` may be tuples of the same length."""
    _require(x, "roll")
    if axis is None:
        if isinstance(shift, (tuple, list)):
            raise ValueError("[fastmetal.roll] expected an int shift when axis is None, got "
                             f"{shift!r}")
        return views.reshape(roll(views.reshape(x, -1), shift, axis=0), tuple(x.shape))
    shifts = tuple(shift) if isinstance(shift, (tuple, list)) else (shift,)
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    if len(shifts) != len(axes):
        raise ValueError(f"[fastmetal.roll] expected as many shifts as axes, got shift="
                         f"{shift!r} and axis={axis!r}")
    out = x
    for s, a in zip(shifts, axes):
        ax = layouts.normalize_axis(a, x.ndim, "fastmetal.roll")
        n = x.shape[ax]
        k = layouts.as_int(s, "fastmetal.roll", "shift") % n if n else 0
        if k == 0:
            continue
        head = (slice(None),) * ax
        out = manipulation.concatenate([out[head + (slice(n - k, None),)],
                                        out[head + (slice(0, n - k),)]], axis=ax)
    return out if out is not x else views.contiguous_copy(x)


def repeat(x: Any, repeats: Any, /, *, axis: Optional[int] = None) -> Array:
    """Each element repeated ``repeats`` times along ``axis`` (of the flattened array when
    None), as the Array API's and NumPy's ``repeat``. An int: a broadcast and reshape on the
    device; per-element counts (a sequence or int64 array, read on the host to build the
    gather index): one gather. (PyTorch's ``Tensor.repeat`` is :func:`tile`.)"""
    _require(x, "repeat")
    if axis is None:
        x, axis = views.reshape(x, -1), 0
    ax = layouts.normalize_axis(axis, x.ndim, "fastmetal.repeat")
    if isinstance(repeats, (int, np.integer)) and not isinstance(repeats, (builtins.bool, np.bool_)):
        r = int(repeats)
        if r < 0:
            raise ValueError(f"[fastmetal.repeat] expected repeats >= 0, got {r}")
        shape = tuple(x.shape)
        wide = views.expand_dims(x, ax + 1)
        target = shape[:ax + 1] + (r,) + shape[ax + 1:]
        merged = shape[:ax] + (shape[ax] * r,) + shape[ax + 1:]
        return views.reshape(broadcast_to(wide, target), merged)
    counts = np.asarray(repeats.numpy() if isinstance(repeats, Array) else repeats)
    if counts.dtype.kind not in "iu" or counts.ndim != 1:
        raise TypeError(f"[fastmetal.repeat] expected repeats to be an int or a 1-D sequence "
                        f"of ints, got {counts.dtype} of dimension {counts.ndim}")
    if counts.shape[0] != x.shape[ax]:
        raise ValueError(f"[fastmetal.repeat] expected {x.shape[ax]} repeats (one per element "
                         f"along axis {ax}), got {counts.shape[0]}")
    if (counts < 0).any():
        raise ValueError("[fastmetal.repeat] expected repeats >= 0, got a negative one")
    index = _core.asarray(np.repeat(np.arange(x.shape[ax], dtype=np.int64), counts),
                          dtype=np.int64, device=x.device)
    return take(x, index, axis=ax)


def tile(x: Any, repetitions: Any, /) -> Array:
    """``x`` repeated ``repetitions[i]`` times along each axis, as the Array API's
    ``tile``, ``numpy.tile`` and ``torch.Tensor.repeat``: a broadcast and one reshape."""
    _require(x, "tile")
    reps = _shape_arg(repetitions, "tile")
    if builtins.any(r < 0 for r in reps):
        raise ValueError(f"[fastmetal.tile] expected repetitions >= 0, got {reps}")
    nd = builtins.max(len(reps), x.ndim)
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - x.ndim) + tuple(x.shape)
    spread = views.reshape(x, tuple(v for n in shape for v in (1, n)))
    target = tuple(v for r, n in zip(reps, shape) for v in (r, n))
    return views.reshape(broadcast_to(spread, target), tuple(r * n for r, n in zip(reps, shape)))


def take(x: Any, indices: Any, /, *, axis: Optional[int] = None) -> Array:
    """Elements of ``x`` at ``indices`` (an int64 array or sequence of ints; negative ones
    count from the end) along ``axis``, as the Array API's and NumPy's ``take``: one gather
    on the device (differentiable; repeated indices add their gradients). ``axis`` may be
    left out for 1-D ``x``."""
    _require(x, "take")
    if axis is None:
        if x.ndim != 1:
            raise ValueError(f"[fastmetal.take] expected axis for an array of dimension "
                             f"{x.ndim} (only 1-D arrays may leave it out)")
        axis = 0
    ax = layouts.normalize_axis(axis, x.ndim, "fastmetal.take")
    if not isinstance(indices, Array):
        host = np.asarray(indices)
        if host.dtype.kind not in "iu" or host.ndim > 1:
            raise TypeError(f"[fastmetal.take] expected integer indices of dimension <= 1, "
                            f"got {host.dtype} of dimension {host.ndim}")
        indices = _core.asarray(host.astype(np.int64), dtype=np.int64, device=x.device)
    elif indices.dtype != np.int64:
        raise TypeError(f"[fastmetal.take] expected int64 indices, got {indices.dtype}")
    return views.getitem(x, (slice(None),) * ax + (indices,))


# ----------------------------------------------------------------------------- creation
def eye(n_rows: int, n_cols: Optional[int] = None, /, *, k: int = 0, dtype: Any = None,
        device: Optional[str] = None) -> Array:
    """A 2-D array with ones on the ``k``-th diagonal and zeros elsewhere, as the Array
    API's and NumPy's ``eye`` (float32 by default)."""
    where = "fastmetal.eye"
    rows = layouts.as_int(n_rows, where, "n_rows")
    cols = rows if n_cols is None else layouts.as_int(n_cols, where, "n_cols")
    if rows < 0 or cols < 0:
        raise ValueError(f"[{where}] expected non-negative sizes, got ({rows}, {cols})")
    target = float32 if dtype is None else native_dtype(dtype, where)
    host = np.eye(rows, cols, k=layouts.as_int(k, where, "k"), dtype=target)
    return _core.asarray(host, dtype=target, device=device)


def _triangle(x: Any, k: Any, upper: bool) -> Array:
    where = "triu" if upper else "tril"
    _require(x, where)
    if x.ndim < 2:
        raise ValueError(f"[fastmetal.{where}] expected an array of dimension >= 2, got "
                         f"{x.ndim}")
    k = layouts.as_int(k, f"fastmetal.{where}", "k")
    rows, cols = x.shape[-2], x.shape[-1]
    keep = np.tri(rows, cols, k - 1 if upper else k, dtype=np.float32)
    if upper:
        keep = 1.0 - keep
    mask = _core.asarray(keep, dtype=np.float32, device=x.device)
    return manipulation.where(mask, x, 0)


def tril(x: Any, /, *, k: int = 0) -> Array:
    """``x`` with the elements above the ``k``-th diagonal of its last two axes set to zero,
    as the Array API's ``tril`` (``where`` with a mask: NaN above the diagonal becomes 0)."""
    return _triangle(x, k, upper=False)


def triu(x: Any, /, *, k: int = 0) -> Array:
    """``x`` with the elements below the ``k``-th diagonal of its last two axes set to zero,
    as the Array API's ``triu``."""
    return _triangle(x, k, upper=True)


# DLPack device types (dlpack.h's DLDeviceType) a producer may report.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


def from_dlpack(x: Any, /, *, device: Optional[str] = None,
                copy: Optional[builtins.bool] = None) -> Array:
    """An Array of ``x``, any object with ``__dlpack__`` (a NumPy array, a PyTorch CPU
    tensor, a fastmetal Array), as the Array API's ``from_dlpack``. ``device=None``: x's
    device (host memory: fastmetal's cpu device). Host memory is imported without a copy (through
    ``numpy.from_dlpack``) onto host-visible devices; a fastmetal Array gives a new Array
    over the same memory. ``copy=True`` always copies, ``copy=False`` never does (ValueError
    where a copy is needed: another device, or a producer's device memory); ``copy=None``
    copies only where it must. A CUDA producer (``__dlpack_device__`` kDLCUDA, e.g. a
    ``torch`` CUDA tensor) is copied: the producer is asked for a host copy
    (``dl_device=kDLCPU``), which then goes to ``device`` (a second copy for a cuda device;
    producers that cannot copy to the host raise BufferError, with their message)."""
    where = "fastmetal.from_dlpack"
    if copy is not None and not isinstance(copy, (builtins.bool, np.bool_)):
        raise TypeError(f"[{where}] expected copy to be True, False or None, got {copy!r}")
    if isinstance(x, Array):
        target = x.device if device is None else device
        if copy is not True and target == x.device:
            return x._alias()
        return creation.asarray(x, device=target, copy=copy)
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"[{where}] expected an object with __dlpack__ (a NumPy array, a "
                        f"PyTorch tensor, a fastmetal.Array), got {type(x).__name__}")
    kind = int(x.__dlpack_device__()[0]) if hasattr(x, "__dlpack_device__") else _DL_CPU
    if kind in (_DL_CPU, _DL_CUDA_HOST):
        try:
            host = np.from_dlpack(x, copy=copy)
        except BufferError as err:  # what DLPack cannot carry (strings, objects)
            raise TypeError(f"[{where}] expected an array DLPack can carry (bool, integers, "
                            f"floats), got {type(x).__name__}: {err}") from err
        return creation.asarray(host, device="cpu" if device is None else device,
                                copy=False if copy is False else None)
    if kind in (_DL_CUDA, _DL_CUDA_MANAGED):
        if copy is False:
            raise ValueError(f"[{where}] expected a producer whose memory can be shared "
                             f"(host memory), got one in CUDA memory with copy=False: "
                             f"fastmetal imports CUDA memory only through a copy")
        try:
            host = np.from_dlpack(x, device="cpu", copy=True)
        except (BufferError, TypeError, ValueError, RuntimeError) as err:
            raise BufferError(f"[{where}] expected a producer that copies its CUDA memory to "
                              f"the host (dl_device=kDLCPU), got {type(x).__name__}: "
                              f"{err}") from err
        return creation.asarray(host, device=device)
    raise BufferError(f"[{where}] expected a producer in host (kDLCPU) or CUDA memory, got "
                      f"DLPack device type {kind} from {type(x).__name__}")


# ----------------------------------------------------------------------------- products
def tensordot(x1: Any, x2: Any, /, *, axes: Any = 2) -> Array:
    """Sum of products over ``axes`` (an int: the last ``axes`` of ``x1`` with the first of
    ``x2``; or two sequences of axes), as the Array API's and NumPy's ``tensordot``: a
    transpose, a reshape and one matmul; integers and bools (matmul is float only) exactly,
    in their promoted dtype, wrapping as NumPy's (a broadcast product and an int64 sum)."""
    _require(x1, "tensordot", "x1")
    _require(x2, "tensordot", "x2")
    where = "fastmetal.tensordot"
    if isinstance(axes, (int, np.integer)):
        n = layouts.as_int(axes, where, "axes")
        if n < 0 or n > x1.ndim or n > x2.ndim:
            raise ValueError(f"[{where}] expected 0 <= axes <= {builtins.min(x1.ndim, x2.ndim)}, "
                             f"got {n}")
        a1, a2 = tuple(range(x1.ndim - n, x1.ndim)), tuple(range(n))
    else:
        try:
            first, second = axes
        except (TypeError, ValueError):
            raise TypeError(f"[{where}] expected axes to be an int or two sequences of axes, "
                            f"got {axes!r}") from None
        first = first if isinstance(first, (tuple, list)) else (first,)
        second = second if isinstance(second, (tuple, list)) else (second,)
        if len(first) != len(second):
            raise ValueError(f"[{where}] expected as many axes of x1 as of x2, got {axes!r}")
        a1 = tuple(layouts.normalize_axis(a, x1.ndim, where) for a in first)
        a2 = tuple(layouts.normalize_axis(a, x2.ndim, where) for a in second)
    for i, j in zip(a1, a2):
        if x1.shape[i] != x2.shape[j]:
            raise ValueError(f"[{where}] expected summed axes of equal length, got "
                             f"{x1.shape[i]} (x1 axis {i}) and {x2.shape[j]} (x2 axis {j})")
    free1 = [i for i in range(x1.ndim) if i not in a1]
    free2 = [j for j in range(x2.ndim) if j not in a2]
    k = math.prod(x1.shape[i] for i in a1)
    m = math.prod(x1.shape[i] for i in free1)
    n = math.prod(x2.shape[j] for j in free2)
    left = views.reshape(manipulation.permute(x1, tuple(free1) + a1), (m, k))
    right = views.reshape(manipulation.permute(x2, a2 + tuple(free2)), (k, n))
    kind = promote(x1.dtype.name, x2.dtype.name)
    if kind.kind == "f":  # an integer operand beside a float: converted (matmul is float only)
        product = linalg.matmul(views.astype(left, kind, copy=False),
                                views.astype(right, kind, copy=False))
    else:
        product = _integer_matmul(left, right, kind)
    return views.reshape(product,
                         tuple(x1.shape[i] for i in free1) + tuple(x2.shape[j] for j in free2))


def _integer_matmul(left: Array, right: Array, dtype: np.dtype) -> Array:
    """(m, k) @ (k, n) of integers (or bools) in ``dtype``, exactly, wrapping as NumPy's
    integer dot: products in ``dtype`` (the elementwise kernels wrap), each row of sums in
    int64 wrapped back to ``dtype`` (bool: any of the ands). matmul's kernels are float
    only; this is broadcast multiply and sum, in blocks of rows of at most 2**22 products."""
    left, right = views.astype(left, dtype, copy=False), views.astype(right, dtype, copy=False)
    (m, k), n = left.shape, right.shape[1]
    rows = builtins.max(1, (1 << 22) // builtins.max(1, k * n))
    blocks = []
    for start in range(0, builtins.max(m, 1), rows):
        block = views.reshape(views.getitem(left, slice(start, start + rows)), (-1, k, 1))
        terms = _F["multiply"](block, views.reshape(right, (1, k, n)))
        blocks.append(reductions.sum(terms, axis=1, dtype=dtype))
    return blocks[0] if len(blocks) == 1 else manipulation.concatenate(blocks, axis=0)


def vecdot(x1: Any, x2: Any, /, *, axis: int = -1) -> Array:
    """Dot products of the vectors along ``axis`` of ``x1`` and ``x2`` (broadcast together),
    as the Array API's ``vecdot`` (real dtypes: no conjugation), in their promoted dtype
    (integers wrap as NumPy's)."""
    _require(x1, "vecdot", "x1")
    _require(x2, "vecdot", "x2")
    if axis >= 0 or x1.ndim == 0 or x2.ndim == 0:
        raise ValueError(f"[fastmetal.vecdot] expected a negative axis (counted from the end, "
                         f"as the standard asks) of arrays of dimension >= 1, got axis={axis}")
    n1 = x1.shape[axis] if -x1.ndim <= axis else None
    n2 = x2.shape[axis] if -x2.ndim <= axis else None
    if n1 is None or n2 is None or n1 != n2:
        raise ValueError(f"[fastmetal.vecdot] expected both arrays to have the same length "
                         f"along axis {axis}, got shapes {tuple(x1.shape)} and "
                         f"{tuple(x2.shape)}")
    # The sum in the products' dtype (integers: accumulated in int64, wrapped back).
    terms = _F["multiply"](x1, x2)
    return reductions.sum(terms, axis=axis, dtype=terms.dtype)


# ----------------------------------------------------------------------------- logical
def _truth(x: Any, where: str, name: str) -> Any:
    """x as bool: nonzero is true (NaN too, as NumPy's bool(nan))."""
    if isinstance(x, (str, bytes, complex)) or x is None:
        raise TypeError(f"[fastmetal.{where}] expected {name} to be a fastmetal.Array or a "
                        f"real number, got {type(x).__name__}")
    if isinstance(x, Array) and x.dtype == bool:
        return x
    return _F["not_equal"](x, 0)


def isnan(x: Any, /) -> Any:
    """True where ``x`` is NaN (never for integers and bool), as ``numpy.isnan``."""
    return _F["not_equal"](x, x)


def isinf(x: Any, /) -> Any:
    """True where ``x`` is +inf or -inf, as ``numpy.isinf``."""
    return _F["equal"](_F["abs"](x), math.inf)


def isfinite(x: Any, /) -> Any:
    """True where ``x`` is neither inf nor NaN, as ``numpy.isfinite``."""
    return _F["less"](_F["abs"](x), math.inf)


def signbit(x: Any, /) -> Any:
    """True where the sign bit of ``x`` is set (-0.0 and NaNs with the bit too), as
    ``numpy.signbit``; for integers, ``x < 0``; bool: False."""
    if isinstance(x, Array) and x.dtype.kind != "f":
        return _F["less"](x, 0)
    return _F["less"](_F["copysign"](1.0, x), 0)


def logical_not(x: Any, /) -> Array:
    """True where ``x`` is zero (NaN is nonzero), as the Array API's ``logical_not``."""
    _require(x, "logical_not")
    return _core.unary("bitwise_invert", _truth(x, "logical_not", "x"), None)


def logical_and(x1: Any, x2: Any, /) -> Array:
    """True where both are nonzero, broadcast, as the Array API's ``logical_and``."""
    return _core.binary("bitwise_and", _truth(x1, "logical_and", "x1"),
                        _truth(x2, "logical_and", "x2"), None)


def logical_or(x1: Any, x2: Any, /) -> Array:
    """True where either is nonzero, broadcast, as the Array API's ``logical_or``."""
    return _core.binary("bitwise_or", _truth(x1, "logical_or", "x1"),
                        _truth(x2, "logical_or", "x2"), None)


def logical_xor(x1: Any, x2: Any, /) -> Array:
    """True where exactly one is nonzero, broadcast, as the Array API's ``logical_xor``."""
    return _core.binary("bitwise_xor", _truth(x1, "logical_xor", "x1"),
                        _truth(x2, "logical_xor", "x2"), None)


def count_nonzero(x: Any, /, *, axis: Any = None, keepdims: bool = False) -> Array:
    """The number of nonzero elements (NaN counts) along ``axis``, as an int64 Array, as the
    Array API's ``count_nonzero`` (summed on the device)."""
    _require(x, "count_nonzero")
    return reductions.sum(_F["not_equal"](x, 0), axis=axis, keepdims=keepdims).astype(int64)


# ----------------------------------------------------------------------------- the rest of 2024.12's names
# Constants (the standard's: Python floats, and None as the new axis in indexing).
e = math.e
pi = math.pi
inf = math.inf
nan = math.nan
newaxis = None


def reshape(x: Any, /, shape: Any, *, copy: Optional[bool] = None) -> Array:
    """``x`` in ``shape`` (one dimension may be -1), as the Array API's ``reshape``: a view
    where the strides allow it, else a copy (``copy=None``); ``copy=True`` always copies,
    ``copy=False`` never does (ValueError where a copy would be needed)."""
    _require(x, "reshape")
    where = "fastmetal.reshape"
    target = layouts.resolve_shape(x.size, layouts.parse_shape((shape,), where), where)
    if copy:
        return views.reshape(views.contiguous_copy(x), target)
    if copy is False and layouts.nocopy_reshape(views._layout(x), target) is None:
        raise ValueError(f"[{where}] expected a shape reachable without a copy (copy=False), "
                         f"got {target} for a non-contiguous array of shape {tuple(x.shape)}")
    return views.reshape(x, target)


def astype(x: Any, dtype: Any, /, *, copy: bool = True, device: Optional[str] = None) -> Array:
    """``x`` in ``dtype`` (on ``device`` when given), as the Array API's ``astype`` and
    :meth:`Array.astype` (``copy=False`` returns ``x`` itself where nothing changes)."""
    _require(x, "astype")
    out = views.astype(x, dtype, copy=copy)
    return out if device is None else out.to_device(device)


def positive(x: Any, /) -> Array:
    """``+x`` (a copy), as the Array API's ``positive``."""
    _require(x, "positive")
    return _F["copy"](x)


def conj(x: Any, /) -> Array:
    """The complex conjugate: ``x`` itself in value (a copy) for fastmetal's real dtypes, as
    the Array API's ``conj`` (2024.12 takes real arrays too)."""
    _require(x, "conj")
    return _F["copy"](x)


def real(x: Any, /) -> Array:
    """The real part: ``x`` in value (a copy) for fastmetal's real dtypes, as the Array
    API's ``real`` (2024.12 takes real arrays too)."""
    _require(x, "real")
    return _F["copy"](x)


def imag(x: Any, /) -> Array:
    """The imaginary part: zeros of ``x``'s dtype and shape for fastmetal's real dtypes, as
    ``numpy.imag`` of real input (the Array API defines ``imag`` for complex input, which
    fastmetal does not have; a real number's imaginary part is 0, and -0.0, inf and NaN
    have 0 too). Constant, so outside the graph (no gradient to record)."""
    _require(x, "imag")
    return creation.zeros_like(x)


def unstack(x: Any, /, *, axis: int = 0) -> tuple:
    """The slices of ``x`` along ``axis``, as a tuple of views (the Array API's ``unstack``,
    the inverse of :func:`fastmetal.stack`)."""
    _require(x, "unstack")
    if x.ndim == 0:
        raise ValueError("[fastmetal.unstack] expected an array of dimension >= 1, got a 0-d "
                         "array")
    ax = layouts.normalize_axis(axis, x.ndim, "fastmetal.unstack")
    return tuple(views.getitem(x, (slice(None),) * ax + (i,)) for i in range(x.shape[ax]))


def _line_axis(x: Array, axis: Any, where: str) -> int:
    """The one axis of a cumulative function (axis=None: only for 0-d and 1-D arrays)."""
    if axis is None:
        if x.ndim > 1:
            raise ValueError(f"[fastmetal.{where}] expected axis for an array of dimension "
                             f"{x.ndim} (only 1-D arrays may leave it out)")
        return 0
    return layouts.normalize_axis(axis, builtins.max(x.ndim, 1), f"fastmetal.{where}")


def _cumulative(name: str, x: Any, axis: Any, dtype: Any, include_initial: Any) -> Array:
    _require(x, name)
    ax = _line_axis(x, axis, name)
    if x.ndim == 0:
        x = views.reshape(x, (1,))
    want = None if dtype is None else native_dtype(dtype, f"fastmetal.{name}")
    if want is not None and want != x.dtype:
        x = views.astype(x, want)
    product = name == "cumulative_prod"
    out = (reductions.cumprod if product else reductions.cumsum)(x, axis=ax)
    if want is not None and out.dtype != want:  # integers scan in int64: wrap back
        out = views.astype(out, want)
    if not include_initial:
        return out
    shape = list(x.shape)
    shape[ax] = 1
    first = np.ones(shape, dtype=out.dtype) if product else np.zeros(shape, dtype=out.dtype)
    initial = _core.asarray(first, dtype=out.dtype, device=x.device)
    return manipulation.concatenate([initial, out], axis=ax)


def cumulative_sum(x: Any, /, *, axis: Optional[int] = None, dtype: Any = None,
                   include_initial: bool = False) -> Array:
    """Running sums along ``axis`` (may be left out for 1-D ``x``), in ``dtype`` (``x`` is
    converted first) or ``x``'s dtype (integers and bool: int64), as the Array API's
    ``cumulative_sum``: :func:`fastmetal.cumsum` with, for ``include_initial=True``, a zero
    before each line."""
    return _cumulative("cumulative_sum", x, axis, dtype, include_initial)


def cumulative_prod(x: Any, /, *, axis: Optional[int] = None, dtype: Any = None,
                    include_initial: bool = False) -> Array:
    """Running products along ``axis`` (may be left out for 1-D ``x``), in ``dtype`` (``x``
    is converted first) or ``x``'s dtype (integers and bool: int64, wrapping as NumPy's), as
    the Array API's ``cumulative_prod``: :func:`fastmetal.cumprod` (a product kernel: zeros,
    signs, inf and NaN as NumPy's) with, for ``include_initial=True``, a one before each
    line."""
    return _cumulative("cumulative_prod", x, axis, dtype, include_initial)


def diff(x: Any, /, *, axis: int = -1, n: int = 1, prepend: Any = None,
         append: Any = None) -> Array:
    """The ``n``-th forward difference along ``axis``, ``out[i] = x[i+1] - x[i]`` applied
    ``n`` times, after joining ``prepend`` and ``append`` (arrays) to ``x`` along ``axis``,
    as the Array API's and NumPy's ``diff``."""
    _require(x, "diff")
    if x.ndim == 0:
        raise ValueError("[fastmetal.diff] expected an array of dimension >= 1, got a 0-d "
                         "array")
    if isinstance(n, builtins.bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"[fastmetal.diff] expected n to be a non-negative int, got {n!r}")
    ax = layouts.normalize_axis(axis, x.ndim, "fastmetal.diff")
    parts = [p for p in (prepend, x, append) if p is not None]
    for p in parts:
        _require(p, "diff", "prepend and append")
    if len(parts) > 1:
        x = manipulation.concatenate(parts, axis=ax)
    lead = (slice(None),) * ax
    for _ in range(int(n)):
        x = _F["subtract"](views.getitem(x, lead + (slice(1, None),)),
                           views.getitem(x, lead + (slice(None, -1),)))
    return x


def take_along_axis(x: Any, indices: Any, /, *, axis: int = -1) -> Array:
    """``x``'s elements at ``indices`` along ``axis`` (int64, of ``x``'s dimension; negative
    ones count from the end; the other axes broadcast), as the Array API's and NumPy's
    ``take_along_axis``: one gather of the flattened ``x`` (differentiable)."""
    _require(x, "take_along_axis")
    _require(indices, "take_along_axis", "indices")
    if indices.dtype != np.int64:
        raise TypeError(f"[fastmetal.take_along_axis] expected int64 indices, got "
                        f"{indices.dtype}")
    if x.ndim == 0 or indices.ndim != x.ndim:
        raise ValueError(f"[fastmetal.take_along_axis] expected indices of x's dimension "
                         f"(>= 1), got dimension {indices.ndim} for x of dimension {x.ndim}")
    ax = layouts.normalize_axis(axis, x.ndim, "fastmetal.take_along_axis")
    try:
        shape = list(np.broadcast_shapes(
            tuple(1 if i == ax else d for i, d in enumerate(x.shape)),
            tuple(1 if i == ax else d for i, d in enumerate(indices.shape))))
    except ValueError:
        raise ValueError(f"[fastmetal.take_along_axis] expected shapes that broadcast except "
                         f"along axis {ax}, got {tuple(x.shape)} and {tuple(indices.shape)}") from None
    shape[ax] = indices.shape[ax]
    x = broadcast_to(x, tuple(shape[:ax]) + (x.shape[ax],) + tuple(shape[ax + 1:]))
    n = x.shape[ax]
    idx = manipulation.where(_F["less"](indices, 0), _F["add"](indices, n), indices)
    strides = layouts.contiguous_strides(tuple(x.shape))
    flat = broadcast_to(_F["multiply"](idx, strides[ax]), tuple(shape))
    for i, d in enumerate(shape):
        if i != ax and d > 1:
            grid = np.arange(d, dtype=np.int64).reshape([d if j == i else 1 for j in range(len(shape))])
            flat = _F["add"](flat, _core.asarray(grid * strides[i], dtype=np.int64, device=x.device))
    return views.reshape(take(views.reshape(x, (-1,)), views.reshape(flat, (-1,))), tuple(shape))

