"""View arithmetic on (offset, shape, strides), in elements, shared by every device.

Each function takes the layout of an array and returns the layout of a view of it, the
way NumPy computes it, without touching memory. `fastmetal.Array._view` then checks that
the view stays inside the storage. Errors carry the NumPy exception types and the message
prefix of the public method that raised them (`where`).
"""
from __future__ import annotations

import operator
from typing import Any, Optional, Sequence, Tuple

import numpy as np

Layout = Tuple[int, Tuple[int, ...], Tuple[int, ...]]  # offset, shape, strides


def contiguous_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    strides = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _type_name(obj: object) -> str:
    return type(obj).__name__


def as_int(value: Any, where: str, what: str) -> int:
    """An integer argument (int, numpy integer or __index__), never bool or float."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"[{where}] expected an integer {what}, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"[{where}] expected an integer {what}, got "
                        f"{_type_name(value)}") from None


def normalize_axis(axis: Any, ndim: int, where: str) -> int:
    a = as_int(axis, where, "axis")
    if not -ndim <= a < ndim:
        raise np.exceptions.AxisError(
            f"[{where}] expected axis in [-{ndim}, {ndim}) for an array of dimension {ndim}, "
            f"got {a}")
    return a % ndim if ndim else a


def _axis_tuple(axis: Any, ndim: int, where: str) -> Tuple[int, ...]:
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    out = tuple(normalize_axis(a, ndim, where) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"[{where}] expected distinct axes, got repeated axis in {axis!r}")
    return out


# ----------------------------------------------------------------------------- indexing
def index(layout: Layout, key: Any, where: str) -> Layout:
    """Basic indexing: ints, slices (any step), None and one Ellipsis, as NumPy."""
    offset, shape, strides = layout
    items = key if isinstance(key, tuple) else (key,)
    consumed = 0
    ellipses = 0
    for k in items:
        if k is Ellipsis:
            ellipses += 1
        elif k is None:
            continue
        elif isinstance(k, slice):
            consumed += 1
        elif isinstance(k, (bool, np.bool_)):
            raise IndexError(f"[{where}] expected basic indices (int, slice, None, ...), got "
                             f"a boolean index (boolean masks are not supported)")
        elif isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu":
            consumed += 1  # a 0-d integer array is an integer, as in NumPy
        elif isinstance(k, (list, np.ndarray)) or hasattr(k, "__array__"):
            raise IndexError(f"[{where}] expected basic indices (int, slice, None, ...), got "
                             f"{_type_name(k)} (advanced indexing is not supported)")
        else:
            try:
                operator.index(k)
            except TypeError:
                raise IndexError(
                    f"[{where}] expected basic indices (int, slice, None, ...), got "
                    f"{_type_name(k)}") from None
            consumed += 1
    if ellipses > 1:
        raise IndexError(f"[{where}] expected at most one ellipsis ('...'), got {ellipses}")
    ndim = len(shape)
    if consumed > ndim:
        raise IndexError(f"[{where}] expected at most {ndim} indices for an array of dimension "
                         f"{ndim}, got {consumed}")
    new_shape: list = []
    new_strides: list = []
    axis = 0
    empty = any(n == 0 for n in shape)
    for k in items:
        if k is Ellipsis:
            for _ in range(ndim - consumed):
                new_shape.append(shape[axis])
                new_strides.append(strides[axis])
                axis += 1
        elif k is None:
            new_shape.append(1)
            new_strides.append(0)
        elif isinstance(k, slice):
            n = shape[axis]
            start, stop, step = k.indices(n)  # ValueError for step 0, TypeError for floats
            length = len(range(start, stop, step))
            if length > 0 and not empty:
                offset += start * strides[axis]
            new_shape.append(length)
            new_strides.append(strides[axis] * step)
            axis += 1
        else:
            i = operator.index(k)
            n = shape[axis]
            if not -n <= i < n:
                raise IndexError(f"[{where}] expected an index in [-{n}, {n}) for axis {axis} "
                                 f"of size {n}, got {i}")
            if not empty:
                offset += (i % n) * strides[axis]
            axis += 1
    new_shape.extend(shape[axis:])
    new_strides.extend(strides[axis:])
    return offset, tuple(new_shape), tuple(new_strides)


# ----------------------------------------------------------------------------- reshape
def parse_shape(args: Tuple[Any, ...], where: str) -> Tuple[int, ...]:
    """reshape(2, 3), reshape((2, 3)) or reshape([2, 3]) -> (2, 3) (may hold one -1)."""
    if len(args) == 1 and not isinstance(args[0], (int, np.integer)) and \
            hasattr(args[0], "__iter__"):
        args = tuple(args[0])
    return tuple(as_int(d, where, "dimension") for d in args)


def resolve_shape(size: int, shape: Tuple[int, ...], where: str) -> Tuple[int, ...]:
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1:
        raise ValueError(f"[{where}] expected at most one unknown (-1) dimension, got "
                         f"shape {shape}")
    if any(d < -1 for d in shape):
        raise ValueError(f"[{where}] expected dimensions >= 0 (or one -1), got shape {shape}")
    known = 1
    for d in shape:
        if d != -1:
            known *= d
    if unknown:
        if known == 0 or size % known:
            raise ValueError(f"[{where}] expected a shape that fits {size} elements, got "
                             f"shape {shape}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    elif known != size:
        raise ValueError(f"[{where}] expected a shape of {size} elements, got shape {shape} "
                         f"({known} elements)")
    return shape


def nocopy_reshape(layout: Layout, new_shape: Tuple[int, ...]) -> Optional[Layout]:
    """New strides for `new_shape` over the same elements in C order, or None if the old
    strides cannot express it (NumPy's _attempt_nocopy_reshape)."""
    offset, shape, strides = layout
    if any(n == 0 for n in shape):
        return offset, new_shape, contiguous_strides(new_shape)
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    old_dims = [n for n, _ in old]
    old_strides = [s for _, s in old]
    new_strides = [0] * len(new_shape)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new_shape) and oi < len(old_dims):
        np_ = new_shape[ni]
        op = old_dims[oi]
        while np_ != op:
            if np_ < op:
                np_ *= new_shape[nj]
                nj += 1
            else:
                op *= old_dims[oj]
                oj += 1
        for ok in range(oi, oj - 1):
            if old_dims[ok + 1] * old_strides[ok + 1] != old_strides[ok]:
                return None
        new_strides[nj - 1] = old_strides[oj - 1]
        for nk in range(nj - 1, ni, -1):
            new_strides[nk - 1] = new_strides[nk] * new_shape[nk]
        ni, nj = nj, nj + 1
        oi, oj = oj, oj + 1
    last = new_strides[ni - 1] if ni >= 1 else 1
    for nk in range(ni, len(new_shape)):
        new_strides[nk] = last
    return offset, new_shape, tuple(new_strides)


# ----------------------------------------------------------------------------- axes
def transpose(layout: Layout, axes: Tuple[Any, ...], where: str) -> Layout:
    offset, shape, strides = layout
    ndim = len(shape)
    if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
        axes = tuple(axes[0]) if axes[0] is not None else ()
    if not axes:
        order: Tuple[int, ...] = tuple(reversed(range(ndim)))
    else:
        if len(axes) != ndim:
            raise ValueError(f"[{where}] expected {ndim} axes for an array of dimension "
                             f"{ndim}, got {len(axes)}")
        order = _axis_tuple(axes, ndim, where)
    return offset, tuple(shape[a] for a in order), tuple(strides[a] for a in order)


def squeeze(layout: Layout, axis: Any, where: str) -> Layout:
    offset, shape, strides = layout
    if axis is None:
        drop = {i for i, n in enumerate(shape) if n == 1}
    elif not shape:  # as NumPy: a 0-d array accepts axis 0 or -1, and stays 0-d
        _axis_tuple(axis, 1, where)
        drop = set()
    else:
        drop = set(_axis_tuple(axis, len(shape), where))
        for a in drop:
            if shape[a] != 1:
                raise ValueError(f"[{where}] expected axes of size 1 to squeeze, got axis {a} "
                                 f"of size {shape[a]}")
    keep = [i for i in range(len(shape)) if i not in drop]
    return offset, tuple(shape[i] for i in keep), tuple(strides[i] for i in keep)


def expand_dims(layout: Layout, axis: Any, where: str) -> Layout:
    offset, shape, strides = layout
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    out_ndim = len(shape) + len(axes)
    new = set(_axis_tuple(axes, out_ndim, where))
    it = iter(zip(shape, strides))
    new_shape, new_strides = [], []
    for i in range(out_ndim):
        n, s = (1, 0) if i in new else next(it)
        new_shape.append(n)
        new_strides.append(s)
    return offset, tuple(new_shape), tuple(new_strides)


def broadcast_to(layout: Layout, target: Tuple[int, ...], where: str) -> Layout:
    """The layout of an array broadcast to `target` (stride 0 along new or size-1 axes).
    As NumPy's assignment, leading size-1 axes beyond `target`'s dimension are dropped."""
    offset, shape, strides = layout
    shape_l, strides_l = list(shape), list(strides)
    while len(shape_l) > len(target) and shape_l[0] == 1:
        shape_l.pop(0)
        strides_l.pop(0)
    fail = ValueError(f"[{where}] expected a value that broadcasts to shape {tuple(target)}, "
                      f"got shape {tuple(shape)}")
    if len(shape_l) > len(target):
        raise fail
    lead = len(target) - len(shape_l)
    out_strides = [0] * lead
    for n, s, t in zip(shape_l, strides_l, target[lead:]):
        if n == t:
            out_strides.append(s)
        elif n == 1:
            out_strides.append(0)
        else:
            raise fail
    return offset, tuple(target), tuple(out_strides)
