"""Sorting and searching, under the Array API standard's names: ``argsort``, ``sort``,
``searchsorted``, ``unique_values`` / ``unique_counts`` / ``unique_inverse`` /
``unique_all`` and ``nonzero``.

The orders are found by NumPy on the host (a copy of the data where the device's memory is
not host-visible): index results only, which have no gradient. sort's values are then
gathered on the device from x, so sort is differentiable.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .. import _core
from .._core import Array
from . import layouts, manipulation, views
from .standard import _require, take

__all__ = ["argsort", "sort", "searchsorted", "unique_values", "unique_counts",
           "unique_inverse", "unique_all", "nonzero"]


def _host(x: Array) -> np.ndarray:
    return np.asarray(x.numpy())


def _index_array(host: np.ndarray, device: str) -> Array:
    # asarray, not ascontiguousarray: that makes a 0-d array 1-d (unique_inverse of a 0-d x)
    return _core.asarray(np.asarray(host, dtype=np.int64, order="C"), dtype=np.int64,
                         device=device)


def argsort(x: Any, /, *, axis: int = -1, descending: bool = False,
            stable: bool = True) -> Array:
    """int64 indices that sort ``x`` along ``axis`` (NaN last), as the Array API's
    ``argsort``; ``descending`` keeps equal elements in their order (stable either way).
    Computed by NumPy on the host (``kind="stable"``): an index result, not differentiable;
    the indices are copied to ``x``'s device."""
    _require(x, "argsort")
    if x.ndim == 0:
        raise ValueError("[fastmetal.argsort] expected an array of dimension >= 1, got a 0-d "
                         "array")
    ax = layouts.normalize_axis(axis, x.ndim, "fastmetal.argsort")
    h = _host(x)
    if descending:
        # Ascending stable order of the reversed array, reversed: descending keys with equal
        # ones in their original order; then NaN moved back to the end (stably).
        n = h.shape[ax]
        order = n - 1 - np.flip(np.argsort(np.flip(h, axis=ax), axis=ax, kind="stable"),
                                axis=ax)
        if h.dtype.kind == "f":
            nan = np.take_along_axis(np.isnan(h), order, axis=ax)
            order = np.take_along_axis(order, np.argsort(nan, axis=ax, kind="stable"), axis=ax)
    else:
        order = np.argsort(h, axis=ax, kind="stable")
    return _index_array(order, x.device)


def sort(x: Any, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Array:
    """``x`` sorted along ``axis`` (NaN last), as the Array API's ``sort``: the order from
    :func:`argsort` (NumPy on the host), the values gathered on the device from ``x``, so the
    gradient flows back to the elements' places."""
    _require(x, "sort")
    order = argsort(x, axis=axis, descending=descending, stable=stable)
    ax = layouts.normalize_axis(axis, x.ndim, "fastmetal.sort")
    # flat positions of the sorted elements in x's C order: one 1-D gather
    h = order.numpy()
    grids = np.indices(h.shape, sparse=True)
    index = list(grids)
    index[ax] = h
    flat = np.ravel_multi_index(tuple(np.broadcast_arrays(*index)), h.shape) if h.size else \
        np.zeros(h.shape, np.int64)
    gathered = take(views.reshape(x, -1), _index_array(flat.reshape(-1), x.device), axis=0)
    return views.reshape(gathered, tuple(x.shape))


def searchsorted(x1: Any, x2: Any, /, *, side: str = "left", sorter: Any = None) -> Array:
    """int64 insertion points of ``x2`` in the sorted 1-D ``x1``, as the Array API's
    ``searchsorted`` (``side`` 'left' or 'right'; ``sorter``: indices that sort ``x1``).
    Computed by NumPy on the host: an index result, not differentiable."""
    _require(x1, "searchsorted", "x1")
    if x1.ndim != 1:
        raise ValueError(f"[fastmetal.searchsorted] expected a 1-D x1, got dimension {x1.ndim}")
    if side not in ("left", "right"):
        raise ValueError(f"[fastmetal.searchsorted] expected side 'left' or 'right', got "
                         f"{side!r}")
    values = _host(x2) if isinstance(x2, Array) else np.asarray(x2)
    order = None if sorter is None else (_host(sorter) if isinstance(sorter, Array)
                                         else np.asarray(sorter))
    return _index_array(np.searchsorted(_host(x1), values, side=side, sorter=order),
                        x1.device)


def _unique(x: Any, where: str, **want: bool) -> tuple:
    _require(x, where)
    h = _host(x).reshape(-1)
    return np.unique(h, equal_nan=False, **want)


def unique_values(x: Any, /) -> Array:
    """The distinct values of ``x`` (flattened, sorted; each NaN distinct), as the Array
    API's ``unique_values``. Found by NumPy on the host and copied to ``x``'s device; not
    differentiable (the values are data of x, but which ones is an index decision)."""
    values = _unique(x, "unique_values")
    return _core.asarray(values, dtype=x.dtype, device=x.device)


# The standard's named tuples (tuples, with the fields by name too).
class _UniqueCounts(NamedTuple):
    values: Array
    counts: Array


class _UniqueInverse(NamedTuple):
    values: Array
    inverse_indices: Array


class _UniqueAll(NamedTuple):
    values: Array
    indices: Array
    inverse_indices: Array
    counts: Array


def unique_counts(x: Any, /) -> tuple:
    """``(values, counts)`` (a named tuple): :func:`unique_values` and how often each occurs (int64), as the
    Array API's ``unique_counts`` (NumPy on the host)."""
    values, counts = _unique(x, "unique_counts", return_counts=True)
    return _UniqueCounts(_core.asarray(values, dtype=x.dtype, device=x.device),
                         _index_array(counts, x.device))


def unique_inverse(x: Any, /) -> tuple:
    """``(values, inverse_indices)`` (a named tuple): :func:`unique_values` and, in ``x``'s shape, the index
    of each element's value, as the Array API's ``unique_inverse`` (NumPy on the host)."""
    values, inverse = _unique(x, "unique_inverse", return_inverse=True)
    return _UniqueInverse(_core.asarray(values, dtype=x.dtype, device=x.device),
                          _index_array(inverse.reshape(x.shape), x.device))


def unique_all(x: Any, /) -> tuple:
    """``(values, indices, inverse_indices, counts)`` (a named tuple), as the Array API's ``unique_all``
    (``indices``: the first occurrence of each value in flattened ``x``; NumPy on the host)."""
    values, first, inverse, counts = _unique(x, "unique_all", return_index=True,
                                             return_inverse=True, return_counts=True)
    return _UniqueAll(_core.asarray(values, dtype=x.dtype, device=x.device),
                      _index_array(first, x.device),
                      _index_array(inverse.reshape(x.shape), x.device),
                      _index_array(counts, x.device))


def nonzero(x: Any, /) -> tuple:
    """The indices of the nonzero elements of ``x`` (NaN counts), one int64 Array per
    dimension in C order, as the Array API's ``nonzero`` (a 0-d ``x`` is a ValueError, as the
    standard says). On the device, reading one count to the host to size the result."""
    _require(x, "nonzero")
    if x.ndim == 0:
        raise ValueError("[fastmetal.nonzero] expected an array of dimension >= 1, got a 0-d "
                         "array")
    return manipulation.nonzero(x)
