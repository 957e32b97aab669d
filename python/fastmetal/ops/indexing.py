"""Advanced indexing of fastmetal.Array, as NumPy, for one index array per key:

* an integer index array (a NumPy integer array, a list of ints or an int64 Array):
  ``a[idx]``, ``a[:, idx]``, ``a[..., idx, None]`` gather along that axis
  (``result.shape = before + idx.shape + after``); negative indices count from the end;
* a boolean mask (a NumPy bool array, a list of bools, a bool Array as fastmetal's
  comparisons return, or a float Array: nonzero, NaN included, is True) covering
  ``mask.ndim`` consecutive axes: ``a[a > 0]``, ``a[mask, 1:]``.

Reading gives a new array (a copy, as NumPy); assignment (``a[idx] = v``, ``a[mask] = v``)
writes in place, ``v`` broadcast to the indexed shape. Everything runs on the array's
device (metal/index.metal), except two reads of small host data: the bounds of an int64
Array index and the count of an Array mask's nonzero elements (one number), both through
``.numpy()``. Out-of-bounds indices raise IndexError, as NumPy. A 0-d mask adds an axis of
length 1 (True) or 0 (False) in its place, as NumPy (not supported beside other index arrays:
IndexError). Repeated indices in an assignment: one of the values wins, which one is
unspecified (NumPy: the last).

Several index arrays in one key (``a[[0, 2], [1, 3]]``, ``a[i, :, j]``; integers beside an
index array count as 0-d index arrays and masks as their ``nonzero()`` arrays, as NumPy):
they are broadcast together, the indexed axes are brought together (where the index arrays
are not adjacent in the key, in front, as NumPy places the result's broadcast axes) and
merged into one, and the flat index ``sum(i_k * stride_k)`` (int64 arithmetic, on the
device for Array indices) gathers along it.
"""
from __future__ import annotations

import operator
from typing import Any, Tuple

import numpy as np

from .. import _core
from . import layouts, manipulation
from .._core import Array


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
    """("int", int64 NumPy array or int64 Array) or ("mask", bool NumPy array, bool Array or
    float Array)."""
    if isinstance(k, Array):
        if k.dtype == np.int64:
            return "int", k
        if k.dtype.kind in "iu":  # int32, uint8 indices: as int64
            return "int", k.astype(np.int64)
        return "mask", k  # bool (or a float mask: nonzero is True)
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
    if len(adv) > 1 or any(_is_int(k) for k in items):
        return _plan_several(a, items, where, for_write)
    pos = adv[0]
    kind, idx = _classify(items[pos], where)
    m = 1 if kind == "int" else idx.ndim
    if m == 0:
        return _plan_scalar_mask(a, items, pos, idx, where, for_write)
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
    layout = layouts.nocopy_reshape((view._offset, view.shape, view._strides), merged)
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


def _plan_scalar_mask(a: Array, items: Tuple[Any, ...], pos: int, mask: Any, where: str,
                      for_write: bool) -> Plan:
    """A 0-d mask, as NumPy: a new axis in its place, of length 1 where the mask is True and
    0 where it is False (``x[True]`` has shape ``(1, *x.shape)``). The new axis (a basic view)
    is indexed by ``[0]`` or ``[]``; an Array mask is read from the device (one value)."""
    truth = bool(mask.numpy() if isinstance(mask, Array) else mask)
    view = a[items[:pos] + (None,) + items[pos + 1:]]
    # The new axis's place in the view: the axes the items before the mask give.
    consumed = sum(1 for k in items if k is not None and k is not Ellipsis) - 1
    axis = 0
    for k in items[:pos]:
        axis += max(0, a.ndim - consumed) if k is Ellipsis else 1
    index = np.zeros(1 if truth else 0, dtype=np.int64)
    return Plan(view, axis, index, view.shape[:axis] + (len(index),) + view.shape[axis + 1:])


def getitem(a: Array, key: Any, where: str) -> Array:
    p = plan(a, key, where, for_write=False)
    return _core._take(p.view, p.axis, p.index)


def setitem(a: Array, key: Any, value: Any, where: str, as_array: Any) -> None:
    """`as_array(value, dtype)`: the value as an Array of the target's dtype on its device."""
    p = plan(a, key, where, for_write=True)
    v = as_array(value, p.view.dtype)
    offset, shape, strides = layouts.broadcast_to((v._offset, v.shape, v._strides), p.shape, where)
    if int(np.prod(p.shape, dtype=np.int64)) == 0:
        return
    _core._put(p.view, p.axis, p.index, v._view(offset, list(shape), list(strides)))


def _plan_several(a: Array, items: Tuple[Any, ...], where: str, for_write: bool) -> Plan:
    """A key with several index arrays (or integers beside one): one merged axis, one flat
    index (see the module docstring)."""
    # Masks become their nonzero() index arrays, integers 0-d index arrays.
    expanded: list = []
    for k in items:
        if _is_int(k):
            expanded.append(("int", np.asarray(operator.index(k), dtype=np.int64)))
        elif is_advanced(k):
            kind, idx = _classify(k, where)
            if kind == "mask":
                if idx.ndim == 0:
                    raise IndexError(f"[{where}] expected a mask of at least one dimension, "
                                     f"got a 0-d mask")
                parts = manipulation.nonzero(idx) if isinstance(idx, Array) else np.nonzero(idx)
                expanded.extend(("int", p if isinstance(p, Array) else p.astype(np.int64))
                                for p in parts)
            else:
                expanded.append(("int", idx))
        else:
            expanded.append(("basic", k))
    consumed = sum(1 for kind, k in expanded if kind == "int" or
                   (k is not None and k is not Ellipsis))
    if consumed > a.ndim:
        raise IndexError(f"[{where}] expected at most {a.ndim} indices for an array of "
                         f"dimension {a.ndim}, got {consumed} (too many indices)")
    fill = a.ndim - consumed
    flat: list = []
    for kind, k in expanded:
        if kind == "basic" and k is Ellipsis:
            flat.extend([("basic", slice(None))] * fill)
            fill = 0
        else:
            flat.append((kind, k))
    flat.extend([("basic", slice(None))] * fill)
    # The basic view (index arrays as full slices) and where each index array's axis is.
    view = a[tuple(slice(None) if kind == "int" else k for kind, k in flat)]
    axes, arrays = [], []
    out_axis = 0
    for kind, k in flat:
        if kind == "int":
            axes.append(out_axis)
            arrays.append(k)
            out_axis += 1
        elif k is None or isinstance(k, slice):
            out_axis += 1
    positions = [i for i, (kind, _) in enumerate(flat) if kind == "int"]
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    dims = [view.shape[ax] for ax in axes]
    # Broadcast the index arrays, check their bounds, make them non-negative.
    shapes = [tuple(i.shape) for i in arrays]
    try:
        bshape = np.broadcast_shapes(*shapes)
    except ValueError:
        raise IndexError(f"[{where}] expected index arrays that broadcast together, got shapes "
                         f"{' '.join(str(s) for s in shapes)} (shape mismatch)") from None
    normalized = []
    for ax, idx, n in zip(axes, arrays, dims):
        _check_bounds(idx, n, ax, where)
        if isinstance(idx, Array):
            normalized.append(manipulation.where(idx < 0, idx + n, idx))
        else:
            normalized.append(np.where(idx < 0, idx + n, idx))
    flat_index: Any = None
    stride = 1
    for idx, n in reversed(list(zip(normalized, dims))):
        term = idx * stride if stride != 1 else idx
        flat_index = term if flat_index is None else term + flat_index
        stride *= n
    device_index = any(isinstance(i, Array) for i in arrays)
    if device_index and not isinstance(flat_index, Array):
        flat_index = _core.asarray(np.asarray(flat_index, dtype=np.int64), dtype="int64",
                                   device=a.device)
    if isinstance(flat_index, Array):
        if tuple(flat_index.shape) != tuple(bshape):  # a broadcast view, copied
            offset, shape, strides = layouts.broadcast_to(
                (flat_index._offset, flat_index.shape, flat_index._strides), tuple(bshape), where)
            flat_index = flat_index._view(offset, list(shape), list(strides)).copy()
    else:
        flat_index = np.ascontiguousarray(np.broadcast_to(flat_index, bshape), dtype=np.int64)
    # The indexed axes together (in front where the index arrays were not adjacent), merged.
    front = axes[0] if adjacent else 0
    rest = [d for d in range(view.ndim) if d not in axes]
    order = rest[:front] + axes + rest[front:]
    basic = view
    view = view.transpose(order)
    merged = view.shape[:front] + (int(np.prod(dims, dtype=np.int64)),) + \
        view.shape[front + len(axes):]
    shape = view.shape[:front] + tuple(bshape) + view.shape[front + len(axes):]
    layout = layouts.nocopy_reshape((view._offset, view.shape, view._strides), merged)
    if layout is not None:
        view = view._view(layout[0], list(layout[1]), list(layout[2]))
    elif for_write:
        return _plan_whole(basic, axes, normalized, rest, front, shape, where)
    else:
        view = view.reshape(merged)  # a copy: reading gives a copy anyway
    return Plan(view, front, flat_index, shape)


def _plan_whole(basic: Array, axes: list, indices: list, rest: list, front: int,
                shape: Tuple[int, ...], where: str) -> Plan:
    """An assignment whose indexed axes cannot be merged in place (index arrays apart in the
    key): index the whole basic view as one axis instead, with one flat index per element of
    the result (the indexed axes' indices and every other axis's positions, each times its
    C-order stride), where that view is one C-contiguous run."""
    flat = layouts.nocopy_reshape((basic._offset, basic.shape, basic._strides), (basic.size,))
    if flat is None:
        raise IndexError(f"[{where}] expected the indexed axes of a view to be mergeable into "
                         f"one without a copy (assign through a contiguous array), got shape "
                         f"{basic.shape} with strides {basic._strides}")
    strides = layouts.contiguous_strides(basic.shape)
    nb = len(shape) - len(rest)  # the broadcast index dimensions, at `front`
    ndim = len(shape)
    total: Any = 0
    for ax, idx in zip(axes, indices):
        # the index's dimensions (right-aligned among the nb broadcast ones) at `front`
        placed = (1,) * (front + nb - idx.ndim) + tuple(idx.shape) + (1,) * (ndim - front - nb)
        total = total + (idx * strides[ax]).reshape(placed)
    positions = list(range(front)) + list(range(front + nb, ndim))
    for d, pos in zip(rest, positions):
        n = basic.shape[d]
        term = np.arange(n, dtype=np.int64).reshape((1,) * pos + (n,) + (1,) * (ndim - pos - 1))
        total = total + term * strides[d]
    if isinstance(total, Array):
        offset, bshape, bstrides = layouts.broadcast_to(
            (total._offset, total.shape, total._strides), shape, where)
        total = total._view(offset, list(bshape), list(bstrides)).copy()
    else:
        total = np.ascontiguousarray(np.broadcast_to(total, shape), dtype=np.int64)
    view = basic._view(flat[0], list(flat[1]), list(flat[2]))
    return Plan(view, 0, total, shape)



def _host_key(key: Any) -> Any:
    """The key with its Arrays read to NumPy (int64 indices; float masks: nonzero)."""
    def host(k: Any) -> Any:
        if isinstance(k, Array):
            v = k.numpy()
            return v.astype(np.int64) if k.dtype.kind in "iu" else (v != 0)
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
