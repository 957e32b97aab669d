"""fastmetal.Array's whole Python surface, in one place: operators, methods, properties
(autograd's among them), views, __setitem__ and NumPy dispatch.

The class itself is C++ (`fastmetal._core.Array`: storage, dtype, device, shape and strides,
the buffer protocol, DLPack); everything Python adds to it is attached here, when the
package is imported, and nowhere else (tests/test_layout.py checks it). Each method calls
the public function or view op that does the work (fastmetal/ops), so that methods record
gradients exactly as the functions do. Everything runs on the Array's device through fastmetal's
kernels (the elementwise table; `copy` moves data), never through NumPy, except:
  * NumPy functions and ufuncs fastmetal does not implement run in NumPy on a host view
    on host-visible devices (cpu, metal) and return NumPy arrays; on other devices they
    raise TypeError naming the function (never a silent copy to the host).

Comparisons (`<`, `==`, ..., `fastmetal.less`, ...) return float masks: 1.0 where true,
0.0 where false, in the operation's result dtype (float32; float16 when both operands
are float16), so that masks combine with arithmetic (`(a > 0) * a`) on every device.

dtypes: float32, float16 and int64. int64 is the index dtype (what `argmax`/`argmin` of an
Array return, NumPy's intp); int64 Arrays support views and indexing, `copy`, `astype`,
`to`, `numpy`/`__array__`/buffer protocol/DLPack, comparisons (with int64 Arrays, NumPy
integer arrays and Python ints: exact, in int64; with floats: in float32, after converting
on the device) giving float32 masks, integer arithmetic (`+ - * // % **`, maximum,
minimum, abs: wrapping as NumPy), `sum`/`prod`/`max`/`min` (int64) and
`mean` (float32); the float functions (`exp`, ...) convert them to float32. So
`(logits.argmax(1) == labels).mean()` stays on the device.

Reductions (`sum`, `mean`, `max`, `min`, `argmax`, `argmin`, `var`, `std`) and `@` call
the functions of the same name (`fastmetal.sum`, `fastmetal.matmul`, ...: ops/reductions.py
and ops/linalg.py), so the methods are differentiable as the functions are.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Optional

import numpy as np

from .._core import Array
from ..autograd import tape
from ..autograd.tape import Node
from ..ops import creation, linalg, manipulation, reductions, views
from ..ops.arithmetic import divmod as _divmod
from ..ops.devices import HOST_VISIBLE as _HOST_VISIBLE
from ..ops.devices import host_visible as _host_visible
from ..ops.elementwise import FUNCTIONS

# The operators call the public functions (which record gradients), never _core directly.
_F = FUNCTIONS


def _where(method: str) -> str:
    return f"fastmetal.Array.{method}"


# ----------------------------------------------------------------------------- operators
# Operands an operator accepts; anything else gets NotImplemented so that Python can try
# the other operand's reflected method.
def _operand(obj: object) -> bool:
    # The common types first: isinstance against numbers.Real (an ABC) alone took 0.5 us.
    return type(obj) in _COMMON_OPERANDS or isinstance(
        obj, (Array, np.ndarray, np.generic, numbers.Real, list, tuple))


_COMMON_OPERANDS = frozenset({Array, float, int, bool, np.ndarray, np.float32, np.float64})


def _binary_operator(name: str, reflected: bool) -> Callable[[Array, Any], Any]:
    def op(self: Array, other: Any) -> Any:
        if type(other) is not Array and not _operand(other):  # Array first: the common case
            return NotImplemented
        fn = _F[name]
        return fn(other, self) if reflected else fn(self, other)
    return op


def _inplace_operator(name: str) -> Callable[[Array, Any], Any]:
    def op(self: Array, other: Any) -> Any:
        if not _operand(other):
            return NotImplemented
        return _F[name](self, other, out=self)
    return op


def _unary_operator(name: str) -> Callable[[Array], Any]:
    def op(self: Array) -> Any:
        return _F[name](self)
    return op


def _pow(self: Array, other: Any, modulo: Any = None) -> Any:
    if modulo is not None or not _operand(other):
        return NotImplemented
    return _F["power"](self, other)


def _rpow(self: Array, other: Any, modulo: Any = None) -> Any:
    if modulo is not None or not _operand(other):
        return NotImplemented
    return _F["power"](other, self)


def _planned(name: str, method: str) -> Callable[..., Any]:
    """The function `fastmetal.<name>` that the method or NumPy dispatch calls (reductions.py,
    linalg.py: looked up when called, so that a test may replace it)."""
    return getattr(linalg if name == "matmul" else reductions, name)


def _matmul(self: Array, other: Any) -> Any:
    if not _operand(other):
        return NotImplemented
    return _planned("matmul", "__matmul__")(self, other)


def _rmatmul(self: Array, other: Any) -> Any:
    if not _operand(other):
        return NotImplemented
    return _planned("matmul", "__rmatmul__")(other, self)


def _reduction(name: str, with_ddof: bool) -> Callable[..., Any]:
    def method(self: Array, axis: Any = None, keepdims: bool = False) -> Any:
        return _planned(name, name)(self, axis=axis, keepdims=keepdims)

    def method_ddof(self: Array, axis: Any = None, ddof: int = 0,
                    keepdims: bool = False) -> Any:
        return _planned(name, name)(self, axis=axis, ddof=ddof, keepdims=keepdims)

    chosen: Callable[..., Any] = method_ddof if with_ddof else method
    chosen.__name__ = chosen.__qualname__ = name
    chosen.__doc__ = (f"fastmetal.{name}(self, axis=axis, keepdims=keepdims"
                      f"{', ddof=ddof' if with_ddof else ''}).")
    return chosen



def _T(self: Array) -> Array:
    """The transposed view, as `transpose()`."""
    return views.transpose(self)


# ----------------------------------------------------------------------------- scalars
def _item(self: Array) -> Any:
    """The value of a one-element array as a Python float (int for int64 arrays)."""
    if self.size != 1:
        raise ValueError(f"[{_where('item')}] expected an array of one element, got "
                         f"{self.size} elements")
    return _numpy(self).reshape(-1)[0].item()


def _bool(self: Array) -> bool:
    if self.size != 1:
        raise ValueError(f"[{_where('__bool__')}] expected an array of one element (the truth "
                         f"value of {self.size} elements is ambiguous; use a reduction), got "
                         f"shape {self.shape}")
    return bool(_item(self))


def _iter(self: Array) -> Any:
    if self.ndim == 0:
        raise TypeError(f"[{_where('__iter__')}] expected an array of dimension >= 1, got a "
                        f"0-d array")
    return (self[i] for i in range(self.shape[0]))


# ----------------------------------------------------------------------------- host views
_core_numpy = Array.numpy


def _numpy(self: Array) -> np.ndarray:
    """A NumPy array of the data: a view sharing memory on host-visible devices, else a copy."""
    if not _host_visible(self) and not views.contiguous(self):
        self = views.contiguous_copy(self)
    return _core_numpy(self)


def _array(self: Array, dtype: Any = None, copy: Any = None) -> np.ndarray:
    arr = _numpy(self)
    if dtype is not None:
        arr = arr.astype(dtype, copy=False)
    if copy:
        arr = arr.copy()
    return arr


def _repr(self: Array) -> str:
    return f"fastmetal.Array({_numpy(self)!r}, device='{self.device}')"


def _tolist(self: Array) -> Any:
    """Nested Python lists of floats (ints for int64 arrays), through the host."""
    return _numpy(self).tolist()


# ----------------------------------------------------------------------------- pickling
def _reduce(self: Array) -> tuple:
    """Pickle support: the data (through the host), dtype, device, requires_grad and the
    Parameter flag; as PyTorch's, a computed Array in a graph is refused (its graph cannot be
    pickled), and .grad is not kept."""
    if self._node is not None:
        raise RuntimeError("[fastmetal.Array.__reduce__] expected a leaf Array or one outside "
                           "the graph (a computed Array's graph cannot be pickled; pickle "
                           ".detach()), got one computed by a recorded op")
    host = np.array(_numpy(self), copy=True)
    return _rebuild, (host, self.device, self._requires_grad,
                      bool(getattr(self, "_is_parameter", False)))


def _rebuild(host: np.ndarray, device: str, requires_grad: bool, is_parameter: bool) -> Array:
    """An Array from what _reduce kept (on `device`, which must exist here)."""
    a = creation.asarray(host, dtype=host.dtype, device=device)
    if requires_grad:
        a._requires_grad = True
    if is_parameter:
        a._is_parameter = True
    return a


# ----------------------------------------------------------------------------- NumPy protocols
# NumPy ufunc name -> fastmetal function name, where they differ.
_UFUNC_ALIASES = {"absolute": "abs", "positive": "copy", "true_divide": "divide"}
_FM_ONLY = {"copy"}  # table ops that are not the NumPy ufunc of the same name
_REDUCTIONS = ("sum", "mean", "max", "min", "argmax", "argmin", "var", "std")
_PLANNED = frozenset(_REDUCTIONS + ("matmul",))
# NumPy function name -> fastmetal.Array method doing the same (first argument the array).
_VIEW_FUNCTIONS = {"reshape": "reshape", "transpose": "transpose", "ravel": "ravel",
                   "squeeze": "squeeze", "copy": "copy"}


def _to_numpy_args(obj: Any) -> Any:
    if isinstance(obj, Array):
        return _numpy(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_numpy_args(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_numpy_args(v) for k, v in obj.items()}
    return obj


def _fallback(what: str, call: Callable[..., Any], args: tuple, kwargs: dict,
              devices: set) -> Any:
    """Run a NumPy function on host views of host-visible arrays, or say why not."""
    remote = sorted(d for d in devices if d not in _HOST_VISIBLE)
    if remote:
        raise TypeError(f"[fastmetal.Array] expected a NumPy function fastmetal implements "
                        f"for arrays on '{remote[0]}', got {what} (no fastmetal "
                        f"implementation; copy to the host with .numpy() explicitly)")
    return call(*_to_numpy_args(args), **_to_numpy_args(kwargs))


def _devices_of(objs: Any) -> set:
    found: set = set()
    for o in objs:
        if isinstance(o, Array):
            found.add(o.device)
        elif isinstance(o, (list, tuple)):
            found |= _devices_of(o)
        elif isinstance(o, dict):
            found |= _devices_of(o.values())
    return found


def _array_ufunc(self: Array, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
    if ufunc.__name__ == "divmod" and method == "__call__" and \
            set(kwargs) <= {"out"} and all(_operand(x) for x in inputs):
        return _divmod(*inputs, out=kwargs.get("out"))
    name = _UFUNC_ALIASES.get(ufunc.__name__, ufunc.__name__)
    out = kwargs.pop("out", None)
    if isinstance(out, tuple):
        out = out[0] if len(out) == 1 else out
    if method == "__call__" and not kwargs and not isinstance(out, tuple) and \
            all(_operand(x) for x in inputs):
        if name == "matmul" and out is None and len(inputs) == 2:
            return _planned("matmul", "__array_ufunc__")(*inputs)
        if name in FUNCTIONS and (name not in _FM_ONLY or ufunc.__name__ == "positive") \
                and len(inputs) == ufunc.nin:
            return FUNCTIONS[name](*inputs, out=out)
    if out is not None:
        kwargs["out"] = out if isinstance(out, tuple) else (out,)
    what = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
    return _fallback(what, getattr(ufunc, method), inputs, kwargs,
                     _devices_of(inputs) | _devices_of(kwargs.values()))


def _array_function(self: Array, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
    name = getattr(func, "__name__", "")
    implemented = _NUMPY_FUNCTIONS.get(name)
    if implemented is not None and (_has_array(args) or _has_array(kwargs.values())):
        return implemented(*args, **kwargs)
    name = {"amax": "max", "amin": "min"}.get(name, name)
    if args and isinstance(args[0], Array):
        if name in _PLANNED:
            return _planned(name, "__array_function__")(*args, **kwargs)
        if name in _VIEW_FUNCTIONS:
            return getattr(args[0], _VIEW_FUNCTIONS[name])(*args[1:], **kwargs)
        if name == "expand_dims":
            return views.expand_dims(*args, **kwargs)
    what = f"numpy.{name}"
    return _fallback(what, func, args, kwargs, _devices_of(args) | _devices_of(kwargs.values()))


# ----------------------------------------------------------------------------- NumPy surface beyond the table
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
# np.shape / np.ndim / np.size read metadata only: answered here on every device (on cuda
# the fallback would refuse them, as it must for functions that read the data).
_NUMPY_FUNCTIONS: dict = {
    "shape": lambda a: tuple(a.shape), "ndim": lambda a: a.ndim,
    "size": lambda a, axis=None: a.size if axis is None else a.shape[axis],
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


# ----------------------------------------------------------------------------- autograd
# The tape keeps its per-Array state in four attributes (class defaults below): _node (the
# recorded call that computed it), _requires_grad, _ones (backward()'s implicit ones) and
# grad. The methods are the tape's functions.
def _requires_grad_get(self: Array) -> bool:
    return self._requires_grad


def _requires_grad_(self: Array, requires_grad: bool = True) -> Array:
    """Set ``requires_grad`` in place and return the Array, as ``torch.Tensor.requires_grad_``."""
    tape.set_requires_grad(self, requires_grad)
    return self


def _detach(self: Array) -> Array:
    """The same memory as a new Array outside the graph (requires_grad False), as
    ``torch.Tensor.detach``."""
    return tape.detach(self)


def _is_leaf(self: Array) -> bool:
    """True unless the Array was computed by a recorded op."""
    return self._node is None


def _grad_fn(self: Array) -> Optional[Node]:
    """The recorded op that computed this Array (None for leaves)."""
    return self._node


def _retain_grad(self: Array) -> None:
    """Keep this non-leaf Array's gradient in ``.grad`` at the next backward()."""
    tape.retain_grad(self)


def _backward(self: Array, gradient: Any = None, retain_graph: Any = None,
              create_graph: bool = False) -> None:
    """Gradients of this Array with respect to the leaves it was computed from, added to
    their ``.grad``, as ``torch.Tensor.backward``. ``gradient``: the gradient of something
    with respect to this Array (its shape; may be left out for one element). The graph is
    freed after it unless ``retain_graph`` (default: ``create_graph``). ``create_graph``:
    the gradients are recorded too, so they can be differentiated again."""
    for name, value in (("retain_graph", retain_graph), ("create_graph", create_graph)):
        if not (value is None and name == "retain_graph") and \
                not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"[fastmetal.Array.backward] expected {name} to be True or "
                            f"False, got {value!r}")
    keep = bool(create_graph) if retain_graph is None else bool(retain_graph)
    tape.backward(self, gradient, keep, create_graph=bool(create_graph))


# ----------------------------------------------------------------------------- attach
def _install() -> None:
    methods: dict = {
        "__getitem__": views.getitem, "__setitem__": views.setitem, "__iter__": _iter,
        "__bool__": _bool, "__float__": lambda self: float(_item(self)),
        "__int__": lambda self: int(_item(self)),
        "__neg__": _unary_operator("negative"), "__pos__": _unary_operator("copy"),
        "__abs__": _unary_operator("abs"),
        "__pow__": _pow, "__rpow__": _rpow,
        "__matmul__": _matmul, "__rmatmul__": _rmatmul,
        "__floordiv__": _binary_operator("floor_divide", reflected=False),
        "__rfloordiv__": _binary_operator("floor_divide", reflected=True),
        "__ifloordiv__": _inplace_operator("floor_divide"),
        "__mod__": _binary_operator("remainder", reflected=False),
        "__rmod__": _binary_operator("remainder", reflected=True),
        "__imod__": _inplace_operator("remainder"),
        "__divmod__": _divmod_operator(reflected=False),
        "__rdivmod__": _divmod_operator(reflected=True),
        "__array_ufunc__": _array_ufunc, "__array_function__": _array_function,
        "__array__": _array, "__repr__": _repr,
        "numpy": _numpy, "item": _item, "tolist": _tolist, "__reduce__": _reduce,
        "reshape": views.reshape, "transpose": views.transpose, "T": property(_T),
        "squeeze": views.squeeze, "ravel": views.ravel, "flatten": views.flatten,
        "copy": views.contiguous_copy, "astype": views.astype, "to": views.to,
        "prod": _prod, "cumsum": _cumsum, "permute": _permute, "swapaxes": _swapaxes,
        "moveaxis": _moveaxis,
        # autograd
        "requires_grad": property(_requires_grad_get, tape.set_requires_grad,
                                  doc="Whether gradients flow to this Array."),
        "requires_grad_": _requires_grad_, "detach": _detach, "retain_grad": _retain_grad,
        "backward": _backward,
        "is_leaf": property(_is_leaf, doc=_is_leaf.__doc__),
        "grad_fn": property(_grad_fn, doc=_grad_fn.__doc__),
    }
    for dunder, op in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                       ("truediv", "divide")):
        methods[f"__{dunder}__"] = _binary_operator(op, reflected=False)
        methods[f"__r{dunder}__"] = _binary_operator(op, reflected=True)
        methods[f"__i{dunder}__"] = _inplace_operator(op)
    methods["__ipow__"] = _inplace_operator("power")  # in place, as NumPy's a **= b
    for dunder, op in (("lt", "less"), ("le", "less_equal"), ("gt", "greater"),
                       ("ge", "greater_equal"), ("eq", "equal"), ("ne", "not_equal")):
        methods[f"__{dunder}__"] = _binary_operator(op, reflected=False)
    for name in _REDUCTIONS:
        methods[name] = _reduction(name, with_ddof=name in ("var", "std"))
    for name, fn in methods.items():
        if callable(fn) and not isinstance(fn, property):
            fn.__qualname__ = f"Array.{name}"
        setattr(Array, name, fn)
    # The tape's per-Array state (class defaults: read on every op call, never missing).
    Array._requires_grad = False
    Array._node = None
    Array._ones = False
    Array.grad = None
    Array.__array_priority__ = 100.0  # binary ops with ndarray come to Array first
    # Array == Array returns a mask, so Arrays are unhashable, as NumPy arrays.
    setattr(Array, "__hash__", None)


_install()
