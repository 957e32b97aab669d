"""The NumPy surface of fastmetal.Array beyond what _array.py installs: the operators
``//``, ``%``, ``divmod`` (and their reflected and in-place forms), the methods ``prod``,
``cumsum``, ``permute``, ``swapaxes``, ``moveaxis``, and NumPy dispatch of the functions
fastmetal implements (``np.where``, ``np.concatenate``, ``np.dot``, ...; see FUNCTIONS).

Kept apart from _array.py on purpose: it only adds to the Array class, and it wraps the
``__array_function__`` / ``__array_ufunc__`` that _array.py installed, handling the names
below and passing everything else on unchanged. The rule (docs/API.md, "NumPy functions on
Arrays"): a NumPy function or ufunc that fastmetal implements runs on the Array's device
and returns an Array; any other one runs in NumPy on a host view and returns NumPy
(host-visible devices only; elsewhere TypeError).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import _core, creation, linalg, manipulation, reductions
from .arithmetic import divmod as _divmod
from ._core import Array

# The operand rule and the operator makers of _array.py (they call the table's functions,
# which record gradients).
from ._array import _binary_operator, _inplace_operator, _operand


def _divmod_operator(reflected: bool) -> Callable[[Array, Any], Any]:
    def op(self: Array, other: Any) -> Any:
        if not _operand(other):
            return NotImplemented
        return _divmod(other, self) if reflected else _divmod(self, other)
    return op


def _prod(self: Array, axis: Any = None, keepdims: bool = False) -> Any:
    """fastmetal.prod(self, axis=axis, keepdims=keepdims)."""
    return reductions.prod(self, axis=axis, keepdims=keepdims)


def _cumsum(self: Array, axis: Any = None) -> Any:
    """fastmetal.cumsum(self, axis=axis)."""
    return reductions.cumsum(self, axis=axis)


def _permute(self: Array, *dims: Any) -> Array:
    """fastmetal.permute(self, *dims): the axes in the order dims (PyTorch's method)."""
    return manipulation.permute(self, *dims)


def _swapaxes(self: Array, axis1: int, axis2: int) -> Array:
    """fastmetal.swapaxes(self, axis1, axis2)."""
    return manipulation.swapaxes(self, axis1, axis2)


def _moveaxis(self: Array, source: Any, destination: Any) -> Array:
    """fastmetal.moveaxis(self, source, destination)."""
    return manipulation.moveaxis(self, source, destination)


# NumPy function name -> the fastmetal function that implements it (same arguments).
FUNCTIONS: dict = {
    "where": manipulation.where, "nonzero": manipulation.nonzero,
    "concatenate": manipulation.concatenate, "stack": manipulation.stack,
    "transpose": manipulation.transpose, "swapaxes": manipulation.swapaxes,
    "moveaxis": manipulation.moveaxis, "squeeze": manipulation.squeeze,
    "dot": linalg.dot, "prod": reductions.prod, "cumsum": reductions.cumsum,
    "zeros_like": creation.zeros_like, "ones_like": creation.ones_like,
    "full_like": creation.full_like, "empty_like": creation.empty_like,
}


def _has_array(objs: Any) -> bool:
    for o in objs:
        if isinstance(o, Array):
            return True
        if isinstance(o, (list, tuple)) and _has_array(o):
            return True
    return False


def _install() -> None:
    previous_function = Array.__array_function__
    previous_ufunc = Array.__array_ufunc__

    def __array_function__(self: Array, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        fn = FUNCTIONS.get(getattr(func, "__name__", ""))
        if fn is not None and (_has_array(args) or _has_array(kwargs.values())):
            return fn(*args, **kwargs)
        return previous_function(self, func, types, args, kwargs)

    def __array_ufunc__(self: Array, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if ufunc.__name__ == "divmod" and method == "__call__" and \
                set(kwargs) <= {"out"} and all(_operand(x) for x in inputs):
            return _divmod(*inputs, out=kwargs.get("out"))
        return previous_ufunc(self, ufunc, method, *inputs, **kwargs)

    methods: dict = {
        "__array_function__": __array_function__, "__array_ufunc__": __array_ufunc__,
        "__floordiv__": _binary_operator("floor_divide", reflected=False),
        "__rfloordiv__": _binary_operator("floor_divide", reflected=True),
        "__ifloordiv__": _inplace_operator("floor_divide"),
        "__mod__": _binary_operator("remainder", reflected=False),
        "__rmod__": _binary_operator("remainder", reflected=True),
        "__imod__": _inplace_operator("remainder"),
        "__divmod__": _divmod_operator(reflected=False),
        "__rdivmod__": _divmod_operator(reflected=True),
        "prod": _prod, "cumsum": _cumsum, "permute": _permute, "swapaxes": _swapaxes,
        "moveaxis": _moveaxis,
    }
    for name, fn in methods.items():
        fn.__qualname__ = f"Array.{name}"
        setattr(Array, name, fn)


_install()
