"""The Array's views and copies as differentiable ops: indexing (read and write), reshape,
transpose, squeeze, expand_dims, ravel / flatten / copy, astype and to. Each is declared
with its gradient beside it (``op``; ``public=False`` where it is a method, not a function
of fastmetal); the Array's methods (fastmetal/array/surface.py) call these.

Views share the Array's memory: their (offset, shape, strides) come from ``layouts``; basic
indexing never copies, advanced indexing (index arrays, masks) gathers on the device
(``indexing``)."""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .. import _core
from .._core import Array
from ..autograd.declare import op
from ..autograd import tape
from ..autograd.tape import is_grad_enabled
from . import dtypes, indexing, layouts
from .devices import host_visible
from .elementwise import FUNCTIONS as _F


def _where(method: str) -> str:
    return f"fastmetal.Array.{method}"


def _layout(a: Array) -> layouts.Layout:
    return a._offset, a.shape, a._strides


def _view(a: Array, layout: layouts.Layout) -> Array:
    offset, shape, strides = layout
    return a._view(offset, list(shape), list(strides))


def contiguous(a: Array) -> bool:
    if a.size == 0:
        return True
    want = layouts.contiguous_strides(a.shape)
    return all(n == 1 or s == w for n, s, w in zip(a.shape, a._strides, want))


# The views and copies are differentiable: each is declared with its gradient beside it
# (fastmetal._declare.op; `public=False`: they are methods, not functions of fastmetal).
@op(grads=("self",), saves=("key",), name="getitem", public=False)  # an Array key: saved
def getitem(self: Array, key: Any) -> Array:
    """Basic indexing (ints, slices with any step, None, ...): a view, never a copy.
    One index array (integers, or a boolean / fastmetal float mask) in the key: a new
    array gathered on the device (see fastmetal._indexing)."""
    if indexing.has_advanced(key):
        return indexing.getitem(self, key, _where("__getitem__"))
    return _view(self, layouts.index(_layout(self), key, _where("__getitem__")))


@getitem.vjp
def _getitem_vjp(ctx: Any, g: Array) -> Array:
    # Zeros with g written where the elements were read; repeated indices add up.
    z = _core.zeros(ctx.shapes["self"], dtype=g.dtype, device=g.device)
    if indexing.has_advanced(ctx.key):
        indexing.scatter_add(z, ctx.key, g)
    else:
        target = _view(z, layouts.index(_layout(z), ctx.key, _where("__getitem__")))
        if target.size:
            _core.unary("copy", g, target)
    return z


def _getitem_add_into(target: Array, ctx: Any, g: Array) -> bool:
    """The tape's in-place form of _getitem_vjp (autograd/tape.py's _add_in_place): g added
    into target's elements that the basic key read. False for advanced keys."""
    if indexing.has_advanced(ctx.key) or tuple(target.shape) != tuple(ctx.shapes["self"]):
        return False
    part = _view(target, layouts.index(_layout(target), ctx.key, _where("__getitem__")))
    if part.size:
        _core.binary("add", part, g, part)
    return True


_getitem_vjp.add_into = _getitem_add_into


@op(grads=("self",), passes=True, name="reshape", public=False, higher_order=True)
def reshape(self: Array, *shape: Any, order: str = "C") -> Array:
    """The same elements in `shape` (one dimension may be -1), in C order: a view when the
    strides allow it (NumPy's rule), else a contiguous copy."""
    where = _where("reshape")
    if order != "C":
        raise ValueError(f"[{where}] expected order='C', got order={order!r}")
    target = layouts.resolve_shape(self.size, layouts.parse_shape(shape, where), where)
    layout = layouts.nocopy_reshape(_layout(self), target)
    if layout is not None:
        return _view(self, layout)
    return _view(contiguous_copy(self), (0, target, layouts.contiguous_strides(target)))


def reshaped(g: Array, shape: tuple) -> Array:
    """g in the shape of an input it came from: a view where g is contiguous (the usual
    case, and the cheap one: backward runs this on every reshape), else reshape's copy."""
    if contiguous(g) and not g._requires_grad:  # create_graph: reshape records
        return g._view(g._offset, list(shape), list(layouts.contiguous_strides(shape)))
    return reshape(g, shape)


@reshape.vjp
def _reshape_vjp(ctx: Any, g: Array) -> Array:
    return reshaped(g, ctx.shapes["self"])


@op(grads=("self",), passes=True, name="transpose", public=False, higher_order=True)
def transpose(self: Array, *axes: Any) -> Array:
    """A view with the axes permuted (reversed when no axes are given)."""
    return _view(self, layouts.transpose(_layout(self), axes, _where("transpose")))


@transpose.vjp
def _transpose_vjp(ctx: Any, g: Array) -> Array:
    axes = ctx.axes[0] if len(ctx.axes) == 1 and isinstance(ctx.axes[0], (tuple, list)) \
        else ctx.axes
    if not axes or axes == (None,):
        return transpose(g)
    nd = len(ctx.shapes["self"])
    perm = [int(a) % nd for a in axes]
    return transpose(g, tuple(int(i) for i in np.argsort(perm)))


@op(grads=("self",), passes=True, name="squeeze", public=False, higher_order=True)
def squeeze(self: Array, axis: Any = None) -> Array:
    """A view without the axes of length 1 (all of them, or those in `axis`)."""
    return _view(self, layouts.squeeze(_layout(self), axis, _where("squeeze")))


@squeeze.vjp
def _squeeze_vjp(ctx: Any, g: Array) -> Array:
    return reshaped(g, ctx.shapes["self"])


@op(grads=("a",), passes=True, higher_order=True)
def expand_dims(a: Array, axis: Any) -> Array:
    """Expand the shape of `a`: insert axes of length 1 at `axis` (int or tuple), as
    numpy.expand_dims. Returns a view of `a` (no copy)."""
    if not isinstance(a, Array):
        raise TypeError(f"[fastmetal.expand_dims] expected a fastmetal.Array, got "
                        f"{type(a).__name__}")
    return _view(a, layouts.expand_dims(_layout(a), axis, "fastmetal.expand_dims"))


@expand_dims.vjp
def _expand_dims_vjp(ctx: Any, g: Array) -> Array:
    return reshaped(g, ctx.shapes["a"])


def ravel(self: Array) -> Array:
    """1-D: a view when the array is C-contiguous, else a copy."""
    if contiguous(self):
        return reshape(self, -1)
    return flatten(self)


def flatten(self: Array) -> Array:
    """1-D copy, always (a new allocation on the same device)."""
    return reshape(contiguous_copy(self), -1)


def contiguous_copy(self: Array) -> Array:
    """A contiguous copy on the same device (the `copy` kernel: bit-exact)."""
    return _F["copy"](self)


def astype(self: Array, dtype: Any, copy: bool = True) -> Array:
    """This array in `dtype` (any of fastmetal's), converted on its device as NumPy's astype
    on x86-64: to a float rounds to nearest even (float16: inf beyond 65504); float to int64
    or int32 truncates toward zero (NaN, inf and values outside the type give its lowest
    value); float to uint8 through int64, keeping the low 8 bits; integers to integers keep
    the low bits; to bool: nonzero is True (NaN too). Same dtype: a copy (or self with
    copy=False)."""
    target = dtypes.native_dtype(dtype, _where("astype"))
    if target == self.dtype:
        return contiguous_copy(self) if copy else self
    if target.kind != "f":  # integers and bool have no gradient: the result leaves the graph
        return _core.asarray(self, dtype=target)
    return convert(self, target)


@op(grads=("self",), name="astype", public=False, higher_order=True)
def convert(self: Array, dtype: Any) -> Array:
    return _core.asarray(self, dtype=dtype)


@convert.vjp
def _convert_vjp(ctx: Any, g: Array) -> Array:
    return g  # the tape converts it back to the input's dtype


def to(self: Array, device: str) -> Array:
    """This array on `device` (self if it is already there; else a copy via the host)."""
    if not isinstance(device, str):
        raise TypeError(f"[{_where('to')}] expected a device name (str), got "
                        f"{type(device).__name__}")
    if device == self.device:
        return self
    return move(self, device)


@op(grads=("self",), saves=("self",), name="to", public=False, higher_order=True)
def move(self: Array, device: str) -> Array:
    source = self if contiguous(self) else contiguous_copy(self)
    return _core.asarray(source.numpy(), dtype=self.dtype, device=device)


@move.vjp
def _move_vjp(ctx: Any, g: Array) -> Array:
    return move(g, ctx.self.device)


# ----------------------------------------------------------------------------- setitem
def setitem(self: Array, key: Any, value: Any) -> None:
    """Write `value` (a number, array-like or Array on this device, broadcast to the
    indexed view) into the indexed view, on the device, through the copy kernel."""
    where = _where("__setitem__")
    if is_grad_enabled() and (self._requires_grad or
                              (isinstance(value, Array) and value._requires_grad)):
        raise RuntimeError(f"[{where}] expected Arrays outside the graph (assignment into an "
                           "Array is not differentiable in fastmetal), got one that requires "
                           "grad; build the result out of place (fastmetal.concatenate, "
                           "masks and arithmetic), or assign inside fastmetal.no_grad()")
    if indexing.has_advanced(key):
        indexing.setitem(self, key, value, where,
                          lambda v, dtype: value_array(self, v, dtype, where, fresh=False))
        return
    target = getitem(self, key)
    value = value_array(self, value, target.dtype, where, fresh=not host_visible(self))
    layout = layouts.broadcast_to(_layout(value), target.shape, where)
    if target.size == 0:
        return
    _core.unary("copy", _view(value, layout), target)


def value_array(self: Array, value: Any, dtype: Any, where: str, fresh: bool) -> Array:
    """An assigned value as an Array of `dtype` on self's device. fresh: an Array value of
    that dtype is copied (the copy kernel reads it while writing the target; on devices
    where fastmetal cannot tell whether they overlap, it reads from a fresh copy)."""
    if isinstance(value, Array):
        if value.device != self.device:
            raise ValueError(f"[{where}] expected a value on device '{self.device}', got "
                             f"'{value.device}'")
        if value.dtype != dtype:
            value = astype(value, dtype)
        elif fresh:
            value = contiguous_copy(value)
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


tape.ENGINE["astype"] = convert  # backward(create_graph=True) converts gradients with it
