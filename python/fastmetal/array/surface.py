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
minimum, abs: wrapping as NumPy), `sum`/`prod`/`max`/`min`/`argmax`/`argmin` (exact) and
`mean` (float32); the float functions (`exp`, ...) convert them to float32. So
`(logits.argmax(1) == labels).mean()` stays on the device.

Reductions (`sum`, `mean`, `max`, `min`, `argmax`, `argmin`, `var`, `std`) and `@` call
the functions of the same name (`fastmetal.sum`, `fastmetal.matmul`, ...: ops/reductions.py
and ops/linalg.py), so the methods are differentiable as the functions are.

PyTorch's tensor habits sit beside NumPy's where they do not clash (the section "PyTorch's
habits, the Array API" below): `a.size` is NumPy's int and callable as PyTorch's `size()`;
`view`, `unsqueeze`, `flatten(start_dim, end_dim)`, `dim=`/`keepdim=`, the elementwise
functions as methods, `float()`/`half()`/`long()`, `cpu()`, `clone()`, `split`, `chunk`,
`eq`/`lt`/..., `mm`, `__format__`, `.data`; `transpose(d0, d1)` of an array of more than two
dimensions swaps two axes as PyTorch's (NumPy would refuse two axes there).
"""
from __future__ import annotations

import numbers
import sys
from typing import Any, Callable, Optional

import numpy as np

from .._core import Array
from ..autograd import tape
from ..autograd.tape import Node
from ..ops import bitwise, creation, habits, linalg, manipulation, reductions, standard, views
from ..ops.arithmetic import divmod as _divmod
from ..ops.devices import HOST_VISIBLE as _HOST_VISIBLE
from ..ops.devices import host_visible as _host_visible
from ..ops.devices import devices as _core_devices
from ..ops import layouts
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


def _binary_operator(fn: Callable, reflected: bool) -> Callable[[Array, Any], Any]:
    """An operator method calling `fn` (a table function or a bitwise one)."""
    def op(self: Array, other: Any) -> Any:
        if type(other) is not Array and not _operand(other):  # Array first: the common case
            return NotImplemented
        return fn(other, self) if reflected else fn(self, other)
    return op


def _invert(self: Array) -> Any:
    return bitwise.bitwise_invert(self)


def _inplace_operator(fn: Callable) -> Callable[[Array, Any], Any]:
    def op(self: Array, other: Any) -> Any:
        if not _operand(other):
            return NotImplemented
        return fn(self, other, out=self)
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
    # dim= / keepdim=: PyTorch's spellings (the functions resolve them; max / min with them
    # return PyTorch's (values, indices)).
    def method(self: Array, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
               keepdim: Any = None) -> Any:
        if dim is None and keepdim is None:
            return _planned(name, name)(self, axis=axis, keepdims=keepdims)
        return _planned(name, name)(self, axis=axis, keepdims=keepdims, dim=dim,
                                    keepdim=keepdim)

    def method_ddof(self: Array, axis: Any = None, ddof: int = 0, keepdims: bool = False, *,
                    correction: Any = None, dim: Any = None, keepdim: Any = None,
                    unbiased: Any = None) -> Any:
        return _planned(name, name)(self, axis=axis, ddof=ddof, keepdims=keepdims,
                                    correction=correction, dim=dim, keepdim=keepdim,
                                    unbiased=unbiased)

    chosen: Callable[..., Any] = method_ddof if with_ddof else method
    chosen.__name__ = chosen.__qualname__ = name
    chosen.__doc__ = (f"fastmetal.{name}(self, axis=axis, keepdims=keepdims"
                      f"{', ddof=ddof, correction=correction' if with_ddof else ''}); "
                      f"dim= / keepdim= as PyTorch's.")
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


def _index(self: Array) -> int:
    # The standard's __index__: 0-d integer arrays only (an Array as a Python int, e.g. a shape).
    if self.ndim != 0 or self.dtype.kind not in "iu":
        raise TypeError(f"[{_where('__index__')}] expected a 0-d integer array, got a "
                        f"{self.ndim}-d {self.dtype} array")
    return int(_item(self))


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
# NumPy ufuncs fastmetal computes outside the op table (bool results, integer kernels).
_OTHER_UFUNCS = {"isnan": standard.isnan, "isinf": standard.isinf,
                 "isfinite": standard.isfinite, "logical_and": standard.logical_and,
                 "logical_or": standard.logical_or, "logical_xor": standard.logical_xor,
                 "logical_not": standard.logical_not, "bitwise_and": bitwise.bitwise_and,
                 "bitwise_or": bitwise.bitwise_or, "bitwise_xor": bitwise.bitwise_xor,
                 "left_shift": bitwise.left_shift, "right_shift": bitwise.right_shift,
                 "invert": bitwise.invert}
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
        if name in _OTHER_UFUNCS and len(inputs) == ufunc.nin:
            fn = _OTHER_UFUNCS[name]
            return fn(*inputs) if out is None else fn(*inputs, out=out)
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


def _prod(self: Array, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
          keepdim: Any = None) -> Any:
    """fastmetal.prod(self, axis=axis, keepdims=keepdims) (dim= / keepdim= as PyTorch's)."""
    return reductions.prod(self, axis=axis, keepdims=keepdims, dim=dim, keepdim=keepdim)


def _cumsum(self: Array, axis: Any = None, *, dim: Any = None) -> Any:
    """fastmetal.cumsum(self, axis=axis) (dim= as PyTorch's)."""
    return reductions.cumsum(self, axis=axis, dim=dim)


def _cumprod(self: Array, axis: Any = None, *, dim: Any = None) -> Any:
    """fastmetal.cumprod(self, axis=axis) (dim= as PyTorch's)."""
    return reductions.cumprod(self, axis=axis, dim=dim)


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


# ----------------------------------------------------------------------------- PyTorch's habits, the Array API
# `a.size` stays NumPy's int (the element count); calling it is PyTorch's size():
# `a.size()` the shape, `a.size(dim)` one dimension. An int subclass carries the shape.
class Size(int):
    """The number of elements (an int, as NumPy's ``ndarray.size``), callable as PyTorch's
    ``Tensor.size``: ``a.size()`` is the shape tuple, ``a.size(dim)`` one dimension
    (negative dims count from the end)."""

    def __call__(self, dim: Any = None) -> Any:
        shape = tuple(self._of.shape)
        if dim is None:
            return shape
        nd = len(shape)
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"[fastmetal.Array.size] expected dim to be an int, got "
                            f"{type(dim).__name__}")
        if not -nd <= dim < nd:
            raise IndexError(f"[fastmetal.Array.size] expected dim in [{-nd}, {nd}) for an "
                             f"array of dimension {nd}, got {dim}")
        return shape[dim]

    def __reduce__(self) -> tuple:  # pickles as the plain int it is
        return int, (int(self),)


_core_size = Array.size


def _size(self: Array) -> Size:
    n = Size(_core_size.__get__(self))
    n._of = self  # the shape is read only when called
    return n


def _view(self: Array, *shape: Any) -> Array:
    """The same memory in another shape, as ``torch.Tensor.view`` (one dimension may be -1):
    RuntimeError where the strides do not allow a view (use ``reshape``, which copies
    then). ``view(dtype)`` (reinterpreting bits) is not supported."""
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer, tuple, list)):
        raise TypeError(f"[fastmetal.Array.view] expected a shape (ints or one tuple), got "
                        f"{shape[0]!r} (view(dtype) is not supported; use astype)")
    where = "fastmetal.Array.view"
    target = layouts.resolve_shape(self.size, layouts.parse_shape(shape, where), where)
    if layouts.nocopy_reshape((self._offset, self.shape, self._strides), target) is None:
        raise RuntimeError(f"[{where}] expected an Array whose strides allow shape {target} "
                           f"without a copy, got shape {tuple(self.shape)} with strides "
                           f"{tuple(self._strides)} (use .reshape(...), which copies)")
    return views.reshape(self, target)


def _view_as(self: Array, other: Array) -> Array:
    """``self.view(other.shape)``, as ``torch.Tensor.view_as``."""
    return _view(self, tuple(other.shape))


def _reshape_as(self: Array, other: Array) -> Array:
    """``self.reshape(other.shape)``, as ``torch.Tensor.reshape_as``."""
    return views.reshape(self, tuple(other.shape))


def _expand(self: Array, *sizes: Any) -> Array:
    """A broadcast view to ``sizes`` (-1 keeps a dimension), as ``torch.Tensor.expand``."""
    where = "fastmetal.Array.expand"
    target = list(layouts.parse_shape(sizes, where))
    lead = len(target) - self.ndim
    for i in range(max(lead, 0), len(target)):
        if target[i] == -1:
            target[i] = self.shape[i - lead]
    if lead < 0 or any(d < 0 for d in target):
        raise ValueError(f"[{where}] expected sizes that {tuple(self.shape)} broadcasts to "
                         f"(-1 only for existing dimensions), got {tuple(sizes)}")
    return standard.broadcast_to(self, tuple(target))


def _expand_as(self: Array, other: Array) -> Array:
    """``self.expand(other.shape)``, as ``torch.Tensor.expand_as``."""
    return standard.broadcast_to(self, tuple(other.shape))


def _flatten(self: Array, start_dim: Any = 0, end_dim: int = -1) -> Array:
    """NumPy's ``flatten()`` (a 1-D copy; ``flatten('C')``), or with dims PyTorch's
    ``flatten(start_dim=0, end_dim=-1)``: those axes merged (a view where possible)."""
    if isinstance(start_dim, str):  # NumPy's flatten(order)
        if start_dim != "C":
            raise ValueError(f"[fastmetal.Array.flatten] expected order 'C', got {start_dim!r}")
        return views.flatten(self)
    if start_dim == 0 and end_dim == -1:
        return views.flatten(self)
    return habits.flatten(self, start_dim, end_dim)


def _squeeze(self: Array, axis: Any = None, *, dim: Any = None) -> Array:
    """A view without axes of length 1 (all, or those in ``axis``; ``dim=`` is PyTorch's
    spelling). Naming an axis whose length is not 1 is a ValueError, as NumPy's."""
    if dim is not None:
        if axis is not None:
            raise TypeError("[fastmetal.Array.squeeze] expected axis= or dim= (the same "
                            "argument), got both")
        axis = dim
    return views.squeeze(self, axis)


def _cast(name: str, dtype: str) -> Callable[..., Any]:
    def method(self: Array) -> Array:
        return self if self.dtype == dtype else views.astype(self, dtype)
    method.__name__ = name
    method.__doc__ = (f"This Array in {dtype} (itself if it is already), as PyTorch's "
                      f"``Tensor.{name}()``.")
    return method


def _named(device: str) -> str:
    return device


def _cpu(self: Array) -> Array:
    """This Array on the cpu device (itself if it is there), as ``torch.Tensor.cpu``."""
    return views.to(self, device="cpu")


def _cuda(self: Array, device: Any = None) -> Array:
    """This Array on the cuda device, as ``torch.Tensor.cuda`` (PyTorch's method names the
    device); RuntimeError where this fastmetal has no cuda device."""
    gpu = _named(device="cuda")
    if device not in (None, 0, gpu, f"{gpu}:0"):
        raise ValueError(f"[fastmetal.Array.cuda] expected device None or 0 (one GPU), got "
                         f"{device!r}")
    if gpu not in _core_devices():
        raise RuntimeError(f"[fastmetal.Array.cuda] expected a cuda device, got none (this "
                           f"fastmetal's devices: {_core_devices()})")
    return views.to(self, device=gpu)


def _to(self: Array, *args: Any, **kwargs: Any) -> Array:
    """This Array on a device and/or in a dtype, as ``torch.Tensor.to``: ``to(device)``,
    ``to(dtype)``, ``to(device, dtype)``, ``to(other_array)`` or by name (``device=``,
    ``dtype=``); itself where nothing changes."""
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None)
    kwargs.pop("copy", None)
    if kwargs:
        raise TypeError(f"[fastmetal.Array.to] expected device= and dtype=, got "
                        f"{sorted(kwargs)}")
    for arg in args:
        if isinstance(arg, Array):
            device, dtype = arg.device, arg.dtype
        elif isinstance(arg, str) and arg in _core_devices():
            device = arg
        else:
            dtype = arg
    out = self
    if dtype is not None and np.dtype(dtype) != self.dtype:
        out = views.astype(out, dtype)
    return views.to(out, device) if device is not None else out


def _transpose(self: Array, *axes: Any) -> Array:
    """The axes permuted (reversed when none are given), as NumPy's ``transpose``; two axes
    of an array of more than two dimensions are swapped, as PyTorch's ``transpose(d0, d1)``."""
    if len(axes) == 2 and self.ndim > 2 and all(
            isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))
            for d in axes):
        return manipulation.swapaxes(self, axes[0], axes[1])
    return views.transpose(self, *axes)


def _contiguous(self: Array) -> Array:
    """Itself if C-contiguous, else a contiguous copy, as ``torch.Tensor.contiguous``."""
    return self if views.contiguous(self) else views.contiguous_copy(self)


def _t(self: Array) -> Array:
    """The transpose of a 0-, 1- or 2-D Array (a view), as ``torch.Tensor.t``."""
    if self.ndim > 2:
        raise ValueError(f"[fastmetal.Array.t] expected an array of dimension <= 2, got "
                         f"{self.ndim} (use .transpose(...) or .mT)")
    return views.transpose(self)


def _mm(self: Array, other: Any) -> Array:
    """The matrix product of two 2-D Arrays, as ``torch.Tensor.mm``."""
    if self.ndim != 2 or not isinstance(other, Array) or other.ndim != 2:
        raise ValueError(f"[fastmetal.Array.mm] expected two 2-D Arrays, got dimensions "
                         f"{self.ndim} and {getattr(other, 'ndim', type(other).__name__)}")
    return _planned("matmul", "mm")(self, other)


def _matmul_method(self: Array, other: Any) -> Array:
    """``self @ other``, as ``torch.Tensor.matmul``."""
    return _planned("matmul", "matmul")(self, other)


def _format(self: Array, spec: str) -> str:
    """``f"{a:.4f}"`` for one-element Arrays (formats the value, as PyTorch's 0-d tensors
    and NumPy's scalars); other Arrays take only the empty format."""
    if self.size == 1:
        return format(_item(self), spec)
    if spec:
        raise TypeError(f"[fastmetal.Array.__format__] expected a one-element Array for "
                        f"format spec {spec!r}, got shape {tuple(self.shape)}")
    return str(self)


def _data(self: Array) -> Array:
    """The same memory outside the graph (``detach()``), as PyTorch's ``Tensor.data``."""
    return tape.detach(self)


def _fill_(self: Array, value: Any) -> Array:
    """Every element set to ``value`` in place, as ``torch.Tensor.fill_`` (refused for an
    Array that requires grad, outside ``no_grad()``)."""
    views.setitem(self, Ellipsis, value)
    return self


def _zero_(self: Array) -> Array:
    """Every element set to 0 in place, as ``torch.Tensor.zero_``."""
    return _fill_(self, 0)


def _mT(self: Array) -> Array:
    """The last two axes swapped (a view), as the Array API's ``mT``."""
    return standard.matrix_transpose(self)


def _to_device(self: Array, device: str, /, *, stream: Any = None) -> Array:
    """This Array on ``device`` (itself if it is there), as the Array API's ``to_device``."""
    if stream is not None:
        raise ValueError(f"[fastmetal.Array.to_device] expected stream=None, got {stream!r}")
    return views.to(self, device)


def _array_namespace(self: Array, /, *, api_version: Optional[str] = None) -> Any:
    """The fastmetal module, as the Array API's ``__array_namespace__``."""
    if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
        raise ValueError(f"[fastmetal.Array.__array_namespace__] expected api_version None or "
                         f"one of 2021.12 ... 2024.12, got {api_version!r}")
    return sys.modules[__name__.split(".")[0]]  # the package (the top layer: no import)


def _all(self: Array, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
         keepdim: Any = None) -> Array:
    """fastmetal.all(self, axis=axis, keepdims=keepdims) (a float mask until bool)."""
    return standard.all(self, axis=axis, keepdims=keepdims, dim=dim, keepdim=keepdim)


def _any(self: Array, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
         keepdim: Any = None) -> Array:
    """fastmetal.any(self, axis=axis, keepdims=keepdims) (a float mask until bool)."""
    return standard.any(self, axis=axis, keepdims=keepdims, dim=dim, keepdim=keepdim)


def _method(fn: Callable[..., Any], doc: str) -> Callable[..., Any]:
    def method(self: Array, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *args, **kwargs)
    method.__doc__ = doc
    return method


def _predicate_method(fn: Callable[[Any], Any]) -> Callable[[Array], Any]:
    def method(self: Array) -> Any:
        return fn(self)
    method.__doc__ = f"fastmetal.{fn.__name__}(self): bool."
    return method


# Elementwise functions as methods (a.exp(), a.pow(2), ...): every public unary op of the
# table but those PyTorch keeps in torch.nn.functional; binary ones take `other`.
_UNARY_METHODS = ("sigmoid", "relu", "tanh", "exp", "log", "sin", "cos", "sqrt", "abs",
                  "negative", "square", "reciprocal", "tan", "asin", "acos", "atan", "sinh",
                  "cosh", "asinh", "acosh", "atanh", "log1p", "expm1", "log2", "log10",
                  "floor", "ceil", "trunc", "round", "sign")
_BINARY_METHODS = {"pow": "power", "add": "add", "sub": "subtract", "mul": "multiply",
                   "div": "divide", "maximum": "maximum", "minimum": "minimum",
                   "remainder": "remainder", "atan2": "atan2", "hypot": "hypot",
                   "logaddexp": "logaddexp", "eq": "equal", "ne": "not_equal", "lt": "less",
                   "le": "less_equal", "gt": "greater", "ge": "greater_equal"}


def _unary_method(name: str) -> Callable[..., Any]:
    def method(self: Array) -> Any:
        return _F[name](self)
    method.__doc__ = f"fastmetal.{name}(self)."
    return method


def _binary_method(name: str) -> Callable[..., Any]:
    def method(self: Array, other: Any) -> Any:
        return _F[name](self, other)
    method.__doc__ = f"fastmetal.{name}(self, other)."
    return method


def _habit_methods() -> dict:
    methods: dict = {
        "size": property(_size, doc=Size.__doc__),
        "view": _view, "view_as": _view_as, "reshape_as": _reshape_as, "expand": _expand,
        "expand_as": _expand_as, "flatten": _flatten, "squeeze": _squeeze,
        "unsqueeze": _method(habits.unsqueeze, "fastmetal.unsqueeze(self, dim)."),
        "split": _method(habits.split, "fastmetal.split(self, split_size_or_sections, dim=0)."),
        "chunk": _method(habits.chunk, "fastmetal.chunk(self, chunks, dim=0)."),
        "clamp": _method(habits.clamp, "fastmetal.clamp(self, min=None, max=None)."),
        "clip": _method(standard.clip, "fastmetal.clip(self, min=None, max=None)."),
        "all": _all, "any": _any,
        "float": _cast("float", "float32"), "half": _cast("half", "float16"),
        "long": _cast("long", "int64"), "double": _cast("double", "float64"),
        "int": _cast("int", "int32"), "bool": _cast("bool", "bool"),
        "byte": _cast("byte", "uint8"),
        "to": _to, "clone": views.contiguous_copy, "transpose": _transpose,
        "contiguous": _contiguous, "t": _t, "mm": _mm, "matmul": _matmul_method,
        "neg": _unary_method("negative"),
        "numel": lambda self: _core_size.__get__(self), "dim": lambda self: self.ndim,
        "__format__": _format, "data": property(_data, doc=_data.__doc__),
        "fill_": _fill_, "zero_": _zero_,
        "mT": property(_mT, doc=_mT.__doc__), "to_device": _to_device,
        "__array_namespace__": _array_namespace,
    }
    methods.update(cpu=_cpu, cuda=_cuda)
    methods["numel"].__doc__ = "The number of elements, as ``torch.Tensor.numel``."
    methods["dim"].__doc__ = "The number of dimensions, as ``torch.Tensor.dim``."
    for name in _UNARY_METHODS:
        methods[name] = _unary_method(name)
    for name in ("isnan", "isinf", "isfinite"):  # bool results (standard.py)
        methods[name] = _predicate_method(getattr(standard, name))
    for name, fn in _BINARY_METHODS.items():
        methods[name] = _binary_method(fn)
    return methods


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
        "__int__": lambda self: int(_item(self)), "__index__": _index,
        "__complex__": lambda self: complex(_item(self)),
        "__neg__": _unary_operator("negative"), "__pos__": _unary_operator("copy"),
        "__abs__": _unary_operator("abs"),
        "__pow__": _pow, "__rpow__": _rpow,
        "__matmul__": _matmul, "__rmatmul__": _rmatmul,
        "__floordiv__": _binary_operator(_F["floor_divide"], reflected=False),
        "__rfloordiv__": _binary_operator(_F["floor_divide"], reflected=True),
        "__ifloordiv__": _inplace_operator(_F["floor_divide"]),
        "__mod__": _binary_operator(_F["remainder"], reflected=False),
        "__rmod__": _binary_operator(_F["remainder"], reflected=True),
        "__imod__": _inplace_operator(_F["remainder"]),
        "__divmod__": _divmod_operator(reflected=False),
        "__rdivmod__": _divmod_operator(reflected=True),
        "__array_ufunc__": _array_ufunc, "__array_function__": _array_function,
        "__array__": _array, "__repr__": _repr,
        "numpy": _numpy, "item": _item, "tolist": _tolist, "__reduce__": _reduce,
        "reshape": views.reshape, "transpose": views.transpose, "T": property(_T),
        "squeeze": views.squeeze, "ravel": views.ravel, "flatten": views.flatten,
        "copy": views.contiguous_copy, "astype": views.astype, "to": views.to,
        "prod": _prod, "cumsum": _cumsum, "cumprod": _cumprod, "permute": _permute, "swapaxes": _swapaxes,
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
        methods[f"__{dunder}__"] = _binary_operator(_F[op], reflected=False)
        methods[f"__r{dunder}__"] = _binary_operator(_F[op], reflected=True)
        methods[f"__i{dunder}__"] = _inplace_operator(_F[op])
    methods["__ipow__"] = _inplace_operator(_F["power"])  # in place, as NumPy's a **= b
    for dunder, fn in (("and", bitwise.bitwise_and), ("or", bitwise.bitwise_or),
                       ("xor", bitwise.bitwise_xor), ("lshift", bitwise.bitwise_left_shift),
                       ("rshift", bitwise.bitwise_right_shift)):
        methods[f"__{dunder}__"] = _binary_operator(fn, reflected=False)
        methods[f"__r{dunder}__"] = _binary_operator(fn, reflected=True)
        methods[f"__i{dunder}__"] = _inplace_operator(fn)
    methods["__invert__"] = _invert
    for dunder, op in (("lt", "less"), ("le", "less_equal"), ("gt", "greater"),
                       ("ge", "greater_equal"), ("eq", "equal"), ("ne", "not_equal")):
        methods[f"__{dunder}__"] = _binary_operator(_F[op], reflected=False)
    for name in _REDUCTIONS:
        methods[name] = _reduction(name, with_ddof=name in ("var", "std"))
    methods.update(_habit_methods())  # PyTorch's habits and the Array API (above)
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
