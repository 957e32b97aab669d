"""Advanced indexing of fastmetal.Array, as NumPy, for one index array per key:

* an integer index array (a NumPy integer array, a list of ints or an int64 Array):
  ``a[idx]``, ``a[:, idx]``, ``a[..., idx, None]`` gather along that axis
  (``result.shape = before + idx.shape + after``); negative indices count from the end;
* a boolean mask (a NumPy bool array, a list of bools, or a float32/float16 Array, the
  masks fastmetal's comparisons return: nonzero, NaN included, is True) covering
  ``mask.ndim`` consecutive axes: ``a[a > 0]``, ``a[mask, 1:]``.

Reading gives a new array (a copy, as NumPy); assignment (``a[idx] = v``, ``a[mask] = v``)
writes in place, ``v`` broadcast to the indexed shape. Everything runs on the array's
device (metal/index.metal), except two reads of small host data: the bounds of an int64
Array index and the count of an Array mask's nonzero elements (one number), both through
``.numpy()``. Out-of-bounds indices raise IndexError, as NumPy. Not supported (IndexError):
several index arrays in one key, an index array together with integer indices, 0-d
masks. Repeated indices in an assignment: one of the values wins, which one is
unspecified (NumPy: the last).
"""
from __future__ import annotations

import operator
from typing import Any, Tuple

import numpy as np

from . import _core, _views
from ._core import Array


def is_advanced(k: Any) -> bool:
    """True for entries of an index key that are not basic (int, slice, None, ...)."""
    if isinstance(k, Array):
        return True
    if isinstance(k, np.ndarray):
        return k.ndim > 0 or k.dtype.kind != "i"
    return isinstance(k, list)


def has_advanced(key: Any) -> bool:
    items = key if isinstance(key, tuple) else (key,)
    return any(is_advanced(k) for k in items)


def _is_int(k: Any) -> bool:
    if isinstance(k, (bool, np.bool_)) or is_advanced(k) or k is None or k is Ellipsis or \
            isinstance(k, slice):
        return False
    try:
        operator.index(k)
    except TypeError:
        return False
    return True


def _classify(k: Any, where: str) -> Tuple[str, Any]:
    """("int", int64 NumPy array or int64 Array) or ("mask", bool NumPy array or float Array)."""
    if isinstance(k, Array):
        if k.dtype == np.int64:
            return "int", k
        return "mask", k
    arr = np.asarray(k)
    if isinstance(k, list) and arr.size == 0:
        arr = arr.astype(np.int64)  # NumPy: an empty list is an (empty) integer index
    if arr.dtype.kind == "b":
        return "mask", arr
    if arr.dtype.kind in "iu":
        return "int", arr.astype(np.int64)
    raise IndexError(f"[{where}] expected integer or boolean index arrays (or a fastmetal "
                     f"mask), got an array of dtype {arr.dtype}")


class Plan:
    """A key with one index array: the basic view it applies to, the axis, the indices."""

    def __init__(self, view: Array, axis: int, index: Any, shape: Tuple[int, ...]):
        self.view, self.axis, self.index, self.shape = view, axis, index, shape


def _check_bounds(idx: Any, n: int, axis: int, where: str) -> None:
    host = idx.numpy() if isinstance(idx, Array) else idx  # a host read for Array indices
    if host.size == 0:
        return
    lo, hi = int(host.min()), int(host.max())
    bad = lo if lo < -n else hi if hi >= n else None
    if bad is not None:
        raise IndexError(f"[{where}] expected indices in [-{n}, {n}) for axis {axis}, got {bad} "
                         f"(index {bad} is out of bounds for axis {axis} with size {n})")


def plan(a: Array, key: Any, where: str, for_write: bool) -> Plan:
    items = key if isinstance(key, tuple) else (key,)
    adv = [i for i, k in enumerate(items) if is_advanced(k)]
    if len(adv) > 1:
        raise IndexError(f"[{where}] expected at most one index array in a key (several are "
                         f"not supported), got {len(adv)}")
    if any(_is_int(k) for k in items):
        raise IndexError(f"[{where}] expected slices, None or ... beside an index array "
                         f"(integers together with an index array are not supported), got "
                         f"{key!r}")
    pos = adv[0]
    kind, idx = _classify(items[pos], where)
    m = 1 if kind == "int" else idx.ndim
    if m == 0:
        raise IndexError(f"[{where}] expected a mask of at least one dimension, got a 0-d mask")
    slices = sum(1 for k in items if isinstance(k, slice))
    ellipsis_dims = max(0, a.ndim - slices - m)
    # Where the index array's axes start, in `a` and in the basic view.
    src_axis = out_axis = 0
    for k in items[:pos]:
        if k is Ellipsis:
            src_axis += ellipsis_dims
            out_axis += ellipsis_dims
        elif k is None:
            out_axis += 1
        else:
            src_axis += 1
            out_axis += 1
    basic = items[:pos] + (slice(None),) * m + items[pos + 1:]
    view = a[basic]
    dims = view.shape[out_axis:out_axis + m]
    if kind == "int":
        _check_bounds(idx, dims[0], src_axis, where)
        shape = view.shape[:out_axis] + tuple(idx.shape) + view.shape[out_axis + 1:]
        return Plan(view, out_axis, idx, shape)
    if tuple(idx.shape) != tuple(dims):
        bad = next((i for i in range(m) if i >= len(dims) or idx.shape[i] != dims[i]), 0)
        size = dims[bad] if bad < len(dims) else 0
        raise IndexError(f"[{where}] expected a mask of shape {tuple(dims)}, got shape "
                         f"{tuple(idx.shape)} (boolean index did not match indexed array along "
                         f"axis {src_axis + bad}; size of axis is {size} but size of "
                         f"corresponding boolean axis is {idx.shape[bad]})")
    merged = view.shape[:out_axis] + (int(np.prod(dims, dtype=np.int64)),) + \
        view.shape[out_axis + m:]
    layout = _views.nocopy_reshape((view._offset, view.shape, view._strides), merged)
    if layout is not None:
        view = view._view(layout[0], list(layout[1]), list(layout[2]))
    elif for_write:
        raise IndexError(f"[{where}] expected the masked axes of a view to be mergeable into "
                         f"one without a copy (assign through a contiguous array), got shape "
                         f"{view.shape} with strides {view._strides}")
    else:
        view = view.reshape(merged)  # a copy: reading gives a copy anyway
    if isinstance(idx, Array):
        flat = idx.reshape(-1)
        count = int((flat != 0).astype(np.int64).sum().item())  # the one host read
        positions: Any = _core._mask_positions(flat, count)
    else:
        positions = np.flatnonzero(idx).astype(np.int64)
    shape = view.shape[:out_axis] + (int(positions.shape[0]),) + view.shape[out_axis + 1:]
    return Plan(view, out_axis, positions, shape)


def getitem(a: Array, key: Any, where: str) -> Array:
    p = plan(a, key, where, for_write=False)
    return _core._take(p.view, p.axis, p.index)


def setitem(a: Array, key: Any, value: Any, where: str, as_array: Any) -> None:
    """`as_array(value, dtype)`: the value as an Array of the target's dtype on its device."""
    p = plan(a, key, where, for_write=True)
    v = as_array(value, p.view.dtype)
    offset, shape, strides = _views.broadcast_to((v._offset, v.shape, v._strides), p.shape, where)
    if int(np.prod(p.shape, dtype=np.int64)) == 0:
        return
    _core._put(p.view, p.axis, p.index, v._view(offset, list(shape), list(strides)))


def _host_key(key: Any) -> Any:
    """The key with its Arrays read to NumPy (int64 indices; float masks: nonzero)."""
    def host(k: Any) -> Any:
        if isinstance(k, Array):
            v = k.numpy()
            return v if k.dtype == np.int64 else (v != 0)
        return k
    return tuple(host(k) for k in key) if isinstance(key, tuple) else host(key)


def scatter_add(z: Array, key: Any, g: Array) -> None:
    """z[key] += g for a contiguous z, where repeated indices add up (the gradient of an
    advanced read). The positions the key selects are worked out by NumPy on the host (from
    the index data only); the values move on the device, in rounds that each write every
    position at most once."""
    positions = np.arange(z.size, dtype=np.int64).reshape(tuple(z.shape))[_host_key(key)]
    positions = positions.reshape(-1)
    if positions.size == 0:
        return
    flat_z = z.reshape(-1)
    flat_g = g.reshape(-1)
    order = np.argsort(positions, kind="stable")
    sorted_pos = positions[order]
    starts = np.r_[True, sorted_pos[1:] != sorted_pos[:-1]]
    run_start = np.maximum.accumulate(np.where(starts, np.arange(sorted_pos.size), 0))
    rank = np.empty_like(order)
    rank[order] = np.arange(sorted_pos.size) - run_start  # occurrence number of each position
    for r in range(int(rank.max()) + 1):
        sel = np.nonzero(rank == r)[0]
        where = positions[sel]
        flat_z[where] = flat_z[where] + flat_g[sel] if r else flat_g[sel]
