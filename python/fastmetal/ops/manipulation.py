"""Joining, selecting and rearranging arrays with NumPy's names and semantics: ``where``,
``concatenate``, ``stack``, ``transpose``, ``permute`` (PyTorch's name), ``swapaxes``,
``moveaxis``, ``squeeze`` (``expand_dims`` is beside ``Array``'s views in ``_array``).

The rearrangements return views (no copy), as NumPy's do. ``where`` runs on the device
(metal/select.metal); ``concatenate`` and ``stack`` allocate the result and copy each input
into its slice with the copy kernel (converting dtypes there). The return type rule of the
API: a ``fastmetal.Array`` if any array argument is one, else a NumPy array.
"""
from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from .. import _core
from . import dtypes, layouts
from .._core import Array
from ..autograd.declare import op

__all__ = ["where", "concatenate", "stack", "transpose", "permute", "swapaxes", "moveaxis",
           "squeeze"]


def _layout(a: Array) -> layouts.Layout:
    return a._offset, a.shape, a._strides


def _view(a: Array, layout: layouts.Layout) -> Array:
    offset, shape, strides = layout
    return a._view(offset, list(shape), list(strides))


def _require_array(a: Any, where: str) -> None:
    if not isinstance(a, (Array, np.ndarray, np.generic, numbers.Real, list, tuple)):
        raise TypeError(f"[fastmetal.{where}] expected a fastmetal.Array or array-like, got "
                        f"{type(a).__name__}")


# ----------------------------------------------------------------------------- where
@op(grads=("x", "y"), saves=("condition",), higher_order=True)  # condition: saved
def where(condition: Any, x: Any = None, y: Any = None) -> Any:
    """``x`` where ``condition`` is true, else ``y``, broadcast together, as
    ``numpy.where``. The condition may be a fastmetal mask (the float32/float16 arrays that
    comparisons return: nonzero and NaN are true), an int64 Array, or anything NumPy
    accepts. The result dtype is NumPy's promotion of ``x`` and ``y`` (int64 for two
    integer operands, else float32 / float16; Python scalars take the other's dtype).

    With only ``condition``: the indices of its nonzero elements, one int64 array per
    dimension, as ``numpy.nonzero`` (an Array condition: computed on the device, reading
    one count to the host to size the result)."""
    if x is None and y is None:
        return nonzero(condition)
    if x is None or y is None:
        raise ValueError("[fastmetal.where] expected both x and y, or neither, got one of them")
    for name, v in (("condition", condition), ("x", x), ("y", y)):
        if not isinstance(v, (Array, np.ndarray, np.generic, numbers.Real, list, tuple)):
            raise TypeError(f"[fastmetal.where] expected {name} to be a fastmetal.Array or "
                            f"array-like, got {type(v).__name__}")
    return _core._where(condition, x, y)


@where.vjp
def _where_vjp(ctx: Any, g: Array) -> tuple:  # g where each side was chosen, 0 elsewhere
    pick = where if g._requires_grad else _core._where  # create_graph: recorded
    gx = pick(ctx.condition, g, 0.0) if ctx.needs[0] else None
    gy = pick(ctx.condition, 0.0, g) if ctx.needs[1] else None
    return gx, gy


def nonzero(a: Any) -> Tuple[Any, ...]:
    """The indices of the nonzero elements of ``a``, as ``numpy.nonzero`` (C order)."""
    if not isinstance(a, Array):
        return np.nonzero(np.asarray(a))
    flat = a.reshape(-1)
    mask = flat != 0  # a float32 mask on the device
    count = int(mask.astype(np.int64).sum().item())  # the one host read
    positions = _core._mask_positions(mask, count)
    if a.ndim == 0:
        return (positions,)
    out = []
    stride = 1
    for n in reversed(a.shape):
        out.append((positions // stride) % n if n > 1 else positions * 0)
        stride *= n
    return tuple(reversed(out))


# ----------------------------------------------------------------------------- joining
def _result_dtype(arrays: Sequence[Any], dtype: Any, where: str) -> np.dtype:
    """``dtype`` if given, else the promotion of the arrays' dtypes (fastmetal's table:
    dtypes.promote); NumPy data of a dtype fastmetal lacks takes the one it converts to."""
    if dtype is not None:
        return dtypes.native_dtype(dtype, f"fastmetal.{where}")
    names = []
    for a in arrays:
        d = a.dtype if isinstance(a, Array) else np.asarray(a).dtype
        if d.kind not in "biuf":
            raise TypeError(f"[fastmetal.{where}] expected real arrays, got dtype {d}")
        if d not in dtypes.DTYPES:  # int8, uint16, ...: as asarray widens them
            d = np.dtype(np.int64) if d.kind in "iu" and d.itemsize < 8 else np.dtype(np.float64)
        names.append(d.name)
    out = names[0]
    for n in names[1:]:
        out = dtypes.promote(out, n).name
    return np.dtype(out)


def _sequence(arrays: Any, where: str) -> list:
    if isinstance(arrays, (Array, np.ndarray)) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"[fastmetal.{where}] expected a sequence (list or tuple) of arrays, "
                        f"got {type(arrays).__name__}")
    if not arrays:
        raise ValueError(f"[fastmetal.{where}] expected at least one array, got none "
                         f"(need at least one array to concatenate)")
    for a in arrays:
        _require_array(a, where)
    return list(arrays)


def _device(arrays: Sequence[Any], out: Any, where: str) -> Optional[str]:
    found = {a.device for a in list(arrays) + [out] if isinstance(a, Array)}
    if len(found) > 1:
        raise ValueError(f"[fastmetal.{where}] expected arrays on one device, got "
                         f"{sorted(found)}")
    return found.pop() if found else None


@op(grads=("arrays",), sequences=("arrays",), passes=True, higher_order=True)
def concatenate(arrays: Any, axis: Optional[int] = 0, out: Any = None, dtype: Any = None,
                casting: str = "same_kind") -> Any:
    """Join ``arrays`` along ``axis`` (flattened first when ``axis`` is None), as
    ``numpy.concatenate``: the shapes must agree except along ``axis``; the dtype is their
    promotion (fastmetal.result_type of the arrays) or ``dtype``;
    ``out`` a NumPy array or fastmetal.Array of the result's shape (fastmetal's out= rules).
    On the device: one copy per input into its slice of the result. ``casting`` is accepted
    for NumPy's signature; values are converted as ``astype`` does."""
    where = "concatenate"
    arrays = _sequence(arrays, where)
    device = _device(arrays, out, where)
    as_numpy = device is None and out is None
    target = _result_dtype(arrays, dtype, where)
    parts = [a if isinstance(a, Array) else _core.asarray(
        np.asarray(a), dtype=_result_dtype([a], None, where), device=device) for a in arrays]
    if axis is None:
        parts = [p.reshape(-1) for p in parts]
        axis = 0
    ndim = parts[0].ndim
    if ndim == 0:
        raise ValueError(f"[fastmetal.{where}] expected arrays of at least one dimension, got "
                         f"a 0-d array (zero-dimensional arrays cannot be concatenated)")
    axis = layouts.normalize_axis(axis, ndim, f"fastmetal.{where}")
    for i, p in enumerate(parts):
        if p.ndim != ndim:
            raise ValueError(f"[fastmetal.{where}] expected arrays of {ndim} dimensions, got "
                             f"{p.ndim} for array {i}")
        if any(p.shape[d] != parts[0].shape[d] for d in range(ndim) if d != axis):
            raise ValueError(f"[fastmetal.{where}] expected shapes that agree except along axis "
                             f"{axis}, got {parts[0].shape} and {p.shape} (array {i})")
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    result = _core.empty(tuple(shape), dtype=target, device=device or parts[0].device)
    start = 0
    for p in parts:
        n = p.shape[axis]
        if n and p.size:
            key = (slice(None),) * axis + (slice(start, start + n),)
            result[key] = p  # the copy kernel (a dtype conversion where they differ)
        start += n
    if out is not None:  # a new result, then out= by the rules of every op's out=
        return _core._store_out(where, result, out)
    return result.numpy() if as_numpy else result


@concatenate.vjp
def _concatenate_vjp(ctx: Any, g: Array) -> tuple:
    # Each input's gradient is its slice of the result's (flattened inputs: reshaped back).
    shapes = ctx.shapes["arrays"]
    flat = ctx.axis is None
    along = 0 if flat else layouts.normalize_axis(ctx.axis, len(shapes[0]),
                                                  "fastmetal.concatenate")
    grads, start = [], 0
    for shape, want in zip(shapes, ctx.needs):
        size = int(np.prod(shape, dtype=np.int64)) if flat else shape[along]
        if want:
            piece = g[(slice(None),) * along + (slice(start, start + size),)]
            grads.append(piece.reshape(shape) if flat else piece)
        else:
            grads.append(None)
        start += size
    return tuple(grads)


def stack(arrays: Any, axis: int = 0, out: Any = None, dtype: Any = None,
          casting: str = "same_kind") -> Any:
    """Join ``arrays`` of one shape along a new axis ``axis``, as ``numpy.stack``
    (``concatenate`` of each with a new axis of length 1)."""
    where = "stack"
    arrays = _sequence(arrays, where)
    shapes = {tuple(a.shape) if isinstance(a, Array) else np.shape(a) for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"[fastmetal.{where}] expected arrays of one shape, got "
                         f"{sorted(shapes)} (all input arrays must have the same shape)")
    ndim = len(shapes.pop()) + 1
    axis = layouts.normalize_axis(axis, ndim, f"fastmetal.{where}")
    device = _device(arrays, out, where)
    target = _result_dtype(arrays, dtype, where)
    expanded = []
    for a in arrays:
        if not isinstance(a, Array):
            a = _core.asarray(np.asarray(a), dtype=_result_dtype([a], None, where),
                              device=device)
        shape = tuple(a.shape)  # a new axis of length 1 by reshape: recorded (differentiable)
        expanded.append(a.reshape(shape[:axis] + (1,) + shape[axis:]))
    result = concatenate(expanded, axis=axis, out=out, dtype=target if out is None else None)
    return result.numpy() if device is None and out is None else result


# ----------------------------------------------------------------------------- views
def transpose(a: Any, axes: Any = None) -> Any:
    """``a`` with its axes permuted (reversed by default), as ``numpy.transpose``: a view."""
    if not isinstance(a, Array):
        return np.transpose(a, axes)
    return a.transpose(axes) if axes is not None else a.transpose()  # recorded (autograd)


def permute(a: Any, *dims: Any) -> Any:
    """``a`` with its axes in the order ``dims``, as ``torch.permute`` (``dims`` a tuple or
    the axes as separate arguments): a view."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    if not isinstance(a, Array):
        return np.transpose(a, dims)
    ndim = a.ndim
    if len(dims) != ndim:
        raise ValueError(f"[fastmetal.permute] expected {ndim} dims for an array of dimension "
                         f"{ndim}, got {len(dims)}")
    return a.transpose(tuple(dims))


def swapaxes(a: Any, axis1: int, axis2: int) -> Any:
    """``a`` with ``axis1`` and ``axis2`` interchanged, as ``numpy.swapaxes``: a view."""
    if not isinstance(a, Array):
        return np.swapaxes(a, axis1, axis2)
    where = "fastmetal.swapaxes"
    i = layouts.normalize_axis(axis1, a.ndim, where)
    j = layouts.normalize_axis(axis2, a.ndim, where)
    order = list(range(a.ndim))
    order[i], order[j] = order[j], order[i]
    return a.transpose(tuple(order))


def moveaxis(a: Any, source: Any, destination: Any) -> Any:
    """``a`` with the axes ``source`` moved to ``destination`` (ints or sequences of one
    length), the others in their order, as ``numpy.moveaxis``: a view."""
    if not isinstance(a, Array):
        return np.moveaxis(a, source, destination)
    where = "fastmetal.moveaxis"
    src = list(source) if isinstance(source, (tuple, list)) else [source]
    dst = list(destination) if isinstance(destination, (tuple, list)) else [destination]
    if len(src) != len(dst):
        raise ValueError(f"[{where}] expected source and destination of one length, got "
                         f"{len(src)} and {len(dst)}")
    src = [layouts.normalize_axis(s, a.ndim, where) for s in src]
    dst = [layouts.normalize_axis(d, a.ndim, where) for d in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError(f"[{where}] expected distinct axes, got repeated axes in "
                         f"{source!r} -> {destination!r}")
    order = [n for n in range(a.ndim) if n not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return a.transpose(tuple(order))


def squeeze(a: Any, axis: Any = None) -> Any:
    """``a`` without its axes of length 1 (all, or those in ``axis``), as
    ``numpy.squeeze``: a view."""
    if not isinstance(a, Array):
        return np.squeeze(a, axis)
    return a.squeeze(axis)
