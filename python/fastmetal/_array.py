"""fastmetal.Array as an array: operators, views, __setitem__ and NumPy dispatch.

The class itself is C++ (`fastmetal._core.Array`); the methods here are attached to it
when the package is imported. Everything runs on the Array's device through fastmetal's
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
minimum, abs: wrapping as NumPy; _numpy_surface.py), `sum`/`prod`/`max`/`min` (int64) and
`mean` (float32); the float functions (`exp`, ...) convert them to float32. So
`(logits.argmax(1) == labels).mean()` stays on the device.

Reductions (`sum`, `mean`, `max`, `min`, `argmax`, `argmin`, `var`, `std`) and `@` call
the functions of the same name (`fastmetal.sum`, `fastmetal.matmul`, ...: reductions.py and
linalg.py), so the methods are differentiable as the functions are.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np

from . import _core
from . import _indexing
from . import _views
from ._core import Array
from ._autograd import is_grad_enabled
from ._declare import op
from ._elementwise import FUNCTIONS

# The operators call the public functions (which record gradients), never _core directly.
_F = FUNCTIONS
# Devices whose memory NumPy views share: asked of each backend, not listed by name.
_HOST_VISIBLE = frozenset(d for d in _core.devices() if _core._device_capabilities(d)["host_visible"])


def _where(method: str) -> str:
    return f"fastmetal.Array.{method}"


def _layout(a: Array) -> _views.Layout:
    return a._offset, a.shape, a._strides


def _view(a: Array, layout: _views.Layout) -> Array:
    offset, shape, strides = layout
    return a._view(offset, list(shape), list(strides))


def _host_visible(a: Array) -> bool:
    return a.device in _HOST_VISIBLE


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
    from . import linalg, reductions  # they import nothing from here
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
    if not _host_visible(self) and not _contiguous(self):
        self = _copy(self)
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


# ----------------------------------------------------------------------------- views
def _contiguous(a: Array) -> bool:
    if a.size == 0:
        return True
    want = _views.contiguous_strides(a.shape)
    return all(n == 1 or s == w for n, s, w in zip(a.shape, a._strides, want))


# The views and copies are differentiable: each is declared with its gradient beside it
# (fastmetal._declare.op; `public=False`: they are methods, not functions of fastmetal).
@op(grads=("self",), name="getitem", public=False)
def _getitem(self: Array, key: Any) -> Array:
    """Basic indexing (ints, slices with any step, None, ...): a view, never a copy.
    One index array (integers, or a boolean / fastmetal float mask) in the key: a new
    array gathered on the device (see fastmetal._indexing)."""
    if _indexing.has_advanced(key):
        return _indexing.getitem(self, key, _where("__getitem__"))
    return _view(self, _views.index(_layout(self), key, _where("__getitem__")))


@_getitem.vjp
def _getitem_vjp(ctx: Any, g: Array) -> Array:
    # Zeros with g written where the elements were read; repeated indices add up.
    z = _core.zeros(ctx.shapes["self"], dtype=g.dtype, device=g.device)
    if _indexing.has_advanced(ctx.key):
        _indexing.scatter_add(z, ctx.key, g)
    else:
        target = _view(z, _views.index(_layout(z), ctx.key, _where("__getitem__")))
        if target.size:
            _core.unary("copy", g, target)
    return z


@op(grads=("self",), passes=True, name="reshape", public=False)
def _reshape(self: Array, *shape: Any, order: str = "C") -> Array:
    """The same elements in `shape` (one dimension may be -1), in C order: a view when the
    strides allow it (NumPy's rule), else a contiguous copy."""
    where = _where("reshape")
    if order != "C":
        raise ValueError(f"[{where}] expected order='C', got order={order!r}")
    target = _views.resolve_shape(self.size, _views.parse_shape(shape, where), where)
    layout = _views.nocopy_reshape(_layout(self), target)
    if layout is not None:
        return _view(self, layout)
    return _view(_copy(self), (0, target, _views.contiguous_strides(target)))


def _reshaped(g: Array, shape: tuple) -> Array:
    """g in the shape of an input it came from: a view where g is contiguous (the usual
    case, and the cheap one: backward runs this on every reshape), else reshape's copy."""
    if _contiguous(g):
        return g._view(g._offset, list(shape), list(_views.contiguous_strides(shape)))
    return _reshape(g, shape)


@_reshape.vjp
def _reshape_vjp(ctx: Any, g: Array) -> Array:
    return _reshaped(g, ctx.shapes["self"])


@op(grads=("self",), passes=True, name="transpose", public=False)
def _transpose(self: Array, *axes: Any) -> Array:
    """A view with the axes permuted (reversed when no axes are given)."""
    return _view(self, _views.transpose(_layout(self), axes, _where("transpose")))


@_transpose.vjp
def _transpose_vjp(ctx: Any, g: Array) -> Array:
    axes = ctx.axes[0] if len(ctx.axes) == 1 and isinstance(ctx.axes[0], (tuple, list)) \
        else ctx.axes
    if not axes or axes == (None,):
        return _transpose(g)
    nd = len(ctx.shapes["self"])
    perm = [int(a) % nd for a in axes]
    return _transpose(g, tuple(int(i) for i in np.argsort(perm)))


def _T(self: Array) -> Array:
    """The transposed view, as `transpose()`."""
    return _transpose(self)


@op(grads=("self",), passes=True, name="squeeze", public=False)
def _squeeze(self: Array, axis: Any = None) -> Array:
    """A view without the axes of length 1 (all of them, or those in `axis`)."""
    return _view(self, _views.squeeze(_layout(self), axis, _where("squeeze")))


@_squeeze.vjp
def _squeeze_vjp(ctx: Any, g: Array) -> Array:
    return _reshaped(g, ctx.shapes["self"])


@op(grads=("a",), passes=True)
def expand_dims(a: Array, axis: Any) -> Array:
    """Expand the shape of `a`: insert axes of length 1 at `axis` (int or tuple), as
    numpy.expand_dims. Returns a view of `a` (no copy)."""
    if not isinstance(a, Array):
        raise TypeError(f"[fastmetal.expand_dims] expected a fastmetal.Array, got "
                        f"{type(a).__name__}")
    return _view(a, _views.expand_dims(_layout(a), axis, "fastmetal.expand_dims"))


@expand_dims.vjp
def _expand_dims_vjp(ctx: Any, g: Array) -> Array:
    return _reshaped(g, ctx.shapes["a"])


def _ravel(self: Array) -> Array:
    """1-D: a view when the array is C-contiguous, else a copy."""
    if _contiguous(self):
        return _reshape(self, -1)
    return _flatten(self)


def _flatten(self: Array) -> Array:
    """1-D copy, always (a new allocation on the same device)."""
    return _reshape(_copy(self), -1)


def _copy(self: Array) -> Array:
    """A contiguous copy on the same device (the `copy` kernel: bit-exact)."""
    return _F["copy"](self)


_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64))


def native_dtype(dtype: Any, where: str) -> np.dtype:
    """`dtype` as one of the dtypes Arrays have (float32, float16, int64), else TypeError."""
    try:
        target = np.dtype(dtype)
    except TypeError:
        target = None
    if target not in _DTYPES:
        raise TypeError(f"[{where}] expected dtype float32, float16 or int64, got {dtype!r}")
    return target


def _astype(self: Array, dtype: Any, copy: bool = True) -> Array:
    """This array in `dtype` (float32, float16 or int64), converted on its device as
    NumPy's astype: to float16 rounds to nearest even (inf beyond 65504), int64 to float
    rounds to nearest, float to int64 truncates toward zero (NaN, inf and values outside
    int64 give -2**63, as NumPy on x86-64). Same dtype: a copy (or self with copy=False)."""
    target = native_dtype(dtype, _where("astype"))
    if target == self.dtype:
        return _copy(self) if copy else self
    if target == np.int64:  # integers have no gradient: the result leaves the graph
        return _core.asarray(self, dtype=target)
    return _convert(self, target)


@op(grads=("self",), name="astype", public=False)
def _convert(self: Array, dtype: Any) -> Array:
    return _core.asarray(self, dtype=dtype)


@_convert.vjp
def _convert_vjp(ctx: Any, g: Array) -> Array:
    return g  # the tape converts it back to the input's dtype


def _to(self: Array, device: str) -> Array:
    """This array on `device` (self if it is already there; else a copy via the host)."""
    if not isinstance(device, str):
        raise TypeError(f"[{_where('to')}] expected a device name (str), got "
                        f"{type(device).__name__}")
    if device == self.device:
        return self
    return _move(self, device)


@op(grads=("self",), saves=("self",), name="to", public=False)
def _move(self: Array, device: str) -> Array:
    source = self if _contiguous(self) else _copy(self)
    return _core.asarray(source.numpy(), dtype=self.dtype, device=device)


@_move.vjp
def _move_vjp(ctx: Any, g: Array) -> Array:
    return _move(g, ctx.self.device)


# ----------------------------------------------------------------------------- setitem
def _setitem(self: Array, key: Any, value: Any) -> None:
    """Write `value` (a number, array-like or Array on this device, broadcast to the
    indexed view) into the indexed view, on the device, through the copy kernel."""
    where = _where("__setitem__")
    if is_grad_enabled() and (self._requires_grad or
                              (isinstance(value, Array) and value._requires_grad)):
        raise RuntimeError(f"[{where}] expected Arrays outside the graph (assignment into an "
                           "Array is not differentiable in fastmetal), got one that requires "
                           "grad; build the result out of place (fastmetal.concatenate, "
                           "masks and arithmetic), or assign inside fastmetal.no_grad()")
    if _indexing.has_advanced(key):
        _indexing.setitem(self, key, value, where,
                          lambda v, dtype: _value_array(self, v, dtype, where, fresh=False))
        return
    target = _getitem(self, key)
    value = _value_array(self, value, target.dtype, where, fresh=not _host_visible(self))
    layout = _views.broadcast_to(_layout(value), target.shape, where)
    if target.size == 0:
        return
    _core.unary("copy", _view(value, layout), target)


def _value_array(self: Array, value: Any, dtype: Any, where: str, fresh: bool) -> Array:
    """An assigned value as an Array of `dtype` on self's device. fresh: an Array value of
    that dtype is copied (the copy kernel reads it while writing the target; on devices
    where fastmetal cannot tell whether they overlap, it reads from a fresh copy)."""
    if isinstance(value, Array):
        if value.device != self.device:
            raise ValueError(f"[{where}] expected a value on device '{self.device}', got "
                             f"'{value.device}'")
        if value.dtype != dtype:
            value = _astype(value, dtype)
        elif fresh:
            value = _copy(value)
    else:
        if isinstance(value, (str, bytes, complex)) or not (
                isinstance(value, (numbers.Real, np.ndarray, np.generic, list, tuple))):
            raise TypeError(f"[{where}] expected a real number, array-like or fastmetal.Array "
                            f"value, got {type(value).__name__}")
        host = np.asarray(value)
        if host.dtype.kind not in "fiub":
            raise TypeError(f"[{where}] expected a real (float, integer or bool) value, got "
                            f"dtype {host.dtype}")
        with np.errstate(over="ignore", invalid="ignore"):  # as the conversion kernels
            host = host.astype(dtype)
        value = _core.asarray(host, dtype=dtype, device=self.device)
    return value


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
    name = {"amax": "max", "amin": "min"}.get(name, name)
    if args and isinstance(args[0], Array):
        if name in _PLANNED:
            return _planned(name, "__array_function__")(*args, **kwargs)
        if name in _VIEW_FUNCTIONS:
            return getattr(args[0], _VIEW_FUNCTIONS[name])(*args[1:], **kwargs)
        if name == "expand_dims":
            return expand_dims(*args, **kwargs)
    what = f"numpy.{name}"
    return _fallback(what, func, args, kwargs, _devices_of(args) | _devices_of(kwargs.values()))


# ----------------------------------------------------------------------------- attach
def _install() -> None:
    methods: dict = {
        "__getitem__": _getitem, "__setitem__": _setitem, "__iter__": _iter,
        "__bool__": _bool, "__float__": lambda self: float(_item(self)),
        "__int__": lambda self: int(_item(self)),
        "__neg__": _unary_operator("negative"), "__pos__": _unary_operator("copy"),
        "__abs__": _unary_operator("abs"),
        "__pow__": _pow, "__rpow__": _rpow,
        "__matmul__": _matmul, "__rmatmul__": _rmatmul,
        "__array_ufunc__": _array_ufunc, "__array_function__": _array_function,
        "__array__": _array, "__repr__": _repr,
        "numpy": _numpy, "item": _item, "tolist": _tolist,
        "reshape": _reshape, "transpose": _transpose, "T": property(_T),
        "squeeze": _squeeze, "ravel": _ravel, "flatten": _flatten,
        "copy": _copy, "astype": _astype, "to": _to,
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
    Array.__array_priority__ = 100.0  # binary ops with ndarray come to Array first
    # Array == Array returns a mask, so Arrays are unhashable, as NumPy arrays.
    setattr(Array, "__hash__", None)


_install()
