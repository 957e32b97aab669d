"""Array creation with NumPy's names and semantics: ``arange``, ``linspace``, ``full`` and
the ``*_like`` functions (``zeros_like``, ``ones_like``, ``full_like``, ``empty_like``).

Each returns a ``fastmetal.Array`` on ``device`` (default: the default device; for
``*_like`` of an Array, that Array's device). dtypes follow fastmetal's rule for Python
scalars: ints give int64 (``arange(5)``, ``full(3, 7)``), floats float32 (the default floating
dtype; ``dtype="float64"`` asks for double), bools bool; ``dtype`` may be any of fastmetal's.

``arange`` and ``linspace`` compute their values with NumPy on the host (so they are
NumPy's values, rounded once to the result dtype) and copy them to the device once; ``full``
and the ``*_like`` functions fill on the device (the copy kernel from one broadcast element).
"""
from __future__ import annotations

import numbers
from typing import Any, Optional

import numpy as np

from .. import _core
from .dtypes import DTYPES as _DTYPES
from .dtypes import native_dtype
from .devices import HOST_VISIBLE
from .._core import Array

__all__ = ["asarray", "zeros", "ones", "empty", "arange", "linspace", "full", "zeros_like",
           "ones_like", "full_like", "empty_like"]


# ----------------------------------------------------------------------------- asarray, zeros, ...
def asarray(obj: Any, dtype: Any = None, device: Optional[str] = None,
            copy: Optional[bool] = None) -> Array:
    """An Array of ``obj`` (an Array, NumPy array, buffer, nested sequence or number) in
    ``dtype`` on ``device``, as the Array API's ``asarray``: ``copy=None`` shares memory
    where it can (NumPy data on host-visible devices, an Array already of that dtype and
    device) and copies otherwise; ``copy=True`` always copies; ``copy=False`` never does and
    raises ValueError where a copy would be needed (another dtype or device, a sequence)."""
    if copy is None:
        return _core.asarray(obj, dtype=dtype, device=device)
    if not isinstance(copy, (bool, np.bool_)):
        raise TypeError(f"[fastmetal.asarray] expected copy to be True, False or None, got "
                        f"{copy!r}")
    if copy:
        if isinstance(obj, Array):
            result = _core.asarray(obj, dtype=dtype, device=device)
            return _core.unary("copy", result) if _shares(result, obj) else result
        return _core.asarray(np.array(obj, copy=True), dtype=dtype, device=device)
    result = _core.asarray(obj, dtype=dtype, device=device)
    if isinstance(obj, Array) and _shares(result, obj):
        return result
    if isinstance(obj, np.ndarray) and (obj.size == 0 and result.dtype == obj.dtype or
                                        _shares(result, obj)):
        return result
    raise ValueError(f"[fastmetal.asarray] expected an object usable without a copy "
                     f"(copy=False), got a {type(obj).__name__} that needs one for device "
                     f"'{result.device}' and dtype {result.dtype} (copy=None allows it)")


def _shares(a: Array, b: Any) -> bool:
    """Whether Array `a` is `b` or views memory of `b` (an Array or NumPy array); only
    host-visible memory can be compared, so device memory elsewhere counts as not shared."""
    if a is b:
        return True
    if a.device not in HOST_VISIBLE or (isinstance(b, Array) and b.device != a.device):
        return False
    if not a.size:
        return False
    return bool(np.shares_memory(a.numpy(), b.numpy() if isinstance(b, Array) else b))


def _sizes(args: tuple, where: str) -> tuple:
    """(shape, dtype, device) of zeros(2, 3), zeros((2, 3)), zeros([2, 3]) and NumPy's
    positional zeros(shape, dtype)."""
    if not args:
        raise TypeError(f"[fastmetal.{where}] expected a shape (zeros(2, 3) or zeros((2, 3))), "
                        f"got none")
    if isinstance(args[0], (int, np.integer)) and not isinstance(args[0], (bool, np.bool_)):
        for d in args:
            if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
                raise TypeError(f"[fastmetal.{where}] expected sizes as ints (or one shape "
                                f"tuple), got {args!r}")
        return tuple(int(d) for d in args), None, None
    if len(args) > 3:
        raise TypeError(f"[fastmetal.{where}] expected (shape, dtype, device) or sizes as "
                        f"ints, got {len(args)} positional arguments")
    rest = list(args[1:]) + [None] * (3 - len(args))
    return args[0], rest[0], rest[1]


def _given(shape: Any, sizes: tuple) -> tuple:
    """The positional arguments of zeros / ones / empty as one tuple: the Array API's
    ``shape`` parameter (positional or keyword), then PyTorch's further sizes."""
    return sizes if shape is None and not sizes else (shape,) + sizes


def _made(where: str, maker: Any, args: tuple, dtype: Any, device: Any,
          requires_grad: bool) -> Array:
    shape, pos_dtype, pos_device = _sizes(args, where)
    if pos_dtype is not None and dtype is not None or pos_device is not None and \
            device is not None:
        raise TypeError(f"[fastmetal.{where}] expected dtype and device once each, got them "
                        f"both by position and by name")
    dtype = pos_dtype if dtype is None else dtype
    device = pos_device if device is None else device
    out = maker(shape, dtype=np.float32 if dtype is None else dtype, device=device)
    return out.requires_grad_(True) if requires_grad else out


def zeros(shape: Any = None, *sizes: Any, dtype: Any = None, device: Optional[str] = None,
          requires_grad: bool = False) -> Array:
    """A new Array of zeros (float32 by default), as ``numpy.zeros(shape, dtype)``, the Array
    API's ``zeros(shape, *, dtype, device)`` and ``torch.zeros(*size)``: the shape as one
    tuple (by position or ``shape=``) or as ints."""
    return _made("zeros", _core.zeros, _given(shape, sizes), dtype, device, requires_grad)


def ones(shape: Any = None, *sizes: Any, dtype: Any = None, device: Optional[str] = None,
         requires_grad: bool = False) -> Array:
    """A new Array of ones, as :func:`zeros` (``ones(2, 3)`` or ``ones((2, 3))``)."""
    return _made("ones", _core.ones, _given(shape, sizes), dtype, device, requires_grad)


def empty(shape: Any = None, *sizes: Any, dtype: Any = None, device: Optional[str] = None,
          requires_grad: bool = False) -> Array:
    """A new uninitialised Array, as :func:`zeros` (``empty(2, 3)`` or ``empty((2, 3))``)."""
    return _made("empty", _core.empty, _given(shape, sizes), dtype, device, requires_grad)



def _target_dtype(dtype: Any, inferred: np.dtype, where: str) -> np.dtype:
    """The fastmetal dtype of a result: `dtype` if given (it must be native), else the
    NumPy dtype `inferred` from Python scalars mapped by the dtype rule (ints -> int64,
    floats -> float32, bool -> bool)."""
    if dtype is not None:
        return native_dtype(dtype, f"fastmetal.{where}")
    if inferred.kind == "b":
        return np.dtype(np.bool_)
    if inferred.kind in "iu":
        return np.dtype(np.int64)
    return np.dtype(np.float16) if inferred == np.float16 else np.dtype(np.float32)


def _upload(host: np.ndarray, dtype: np.dtype, device: Optional[str]) -> Array:
    with np.errstate(over="ignore", invalid="ignore"):  # as the conversion kernels
        host = np.ascontiguousarray(host.astype(dtype, copy=False))
    return _core.asarray(host, dtype=dtype, device=device)


def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None, *,
           device: Optional[str] = None) -> Array:
    """Evenly spaced values in ``[start, stop)``, as ``numpy.arange`` (``arange(stop)``,
    ``arange(start, stop)``, ``arange(start, stop, step)``): int64 for integer arguments,
    float32 for float ones (NumPy: float64); with ``dtype=`` the values NumPy's
    ``arange(..., dtype=dtype)`` gives."""
    args = [v for v in (start, stop, step) if v is not None]
    for v in args:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.generic)):
            raise TypeError(f"[fastmetal.arange] expected real numbers for start, stop and "
                            f"step, got {type(v).__name__}")
    if step is not None and step == 0:
        raise ValueError("[fastmetal.arange] expected a nonzero step, got 0 "
                         "(Maximum allowed size exceeded)")
    host = np.arange(start, stop, step) if stop is not None or step is not None \
        else np.arange(start)
    target = _target_dtype(dtype, host.dtype, "arange")
    if dtype is not None and host.dtype != target:
        host = np.arange(start, stop, step, dtype=target) if stop is not None or \
            step is not None else np.arange(start, dtype=target)
    return _upload(host, target, device)


def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True,
             retstep: bool = False, dtype: Any = None, axis: int = 0, *,
             device: Optional[str] = None) -> Any:
    """``num`` evenly spaced samples from ``start`` to ``stop`` (inclusive unless
    ``endpoint=False``), as ``numpy.linspace``: computed in float64 by NumPy, stored as
    float32 (or ``dtype``); ``retstep=True`` returns ``(samples, step)`` with ``step`` a
    Python float. ``start``/``stop`` may be arrays (the samples go along ``axis``)."""
    if isinstance(num, (bool, np.bool_)) or not isinstance(num, (numbers.Integral,)):
        raise TypeError(f"[fastmetal.linspace] expected an integer num, got "
                        f"{type(num).__name__}")
    if num < 0:
        raise ValueError(f"[fastmetal.linspace] expected num >= 0, got {num}")
    host, step = np.linspace(np.asarray(start, dtype=np.float64),
                             np.asarray(stop, dtype=np.float64), int(num), endpoint=endpoint,
                             retstep=True, axis=axis)
    target = _target_dtype(dtype, np.dtype(np.float64), "linspace")
    if target.kind == "i":  # NumPy floors toward -inf for integer dtypes
        host = np.floor(host)
    result = _upload(host, target, device)
    return (result, float(step)) if retstep else result


def _fill_value_dtype(value: Any, where: str) -> np.dtype:
    if isinstance(value, Array):
        if value.size != 1:
            raise ValueError(f"[{where}] expected a scalar fill value, got an Array of shape "
                             f"{value.shape}")
        return value.dtype
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"[{where}] expected a real fill value, got {type(value).__name__}")
    if arr.ndim != 0:
        raise ValueError(f"[{where}] expected a scalar fill value, got shape {arr.shape} "
                         f"(use fastmetal.asarray and broadcasting for array fills)")
    return arr.dtype


def _filled(shape: Any, value: Any, dtype: np.dtype, device: Optional[str]) -> Array:
    out = _core.empty(shape, dtype=dtype, device=device)
    if out.size:
        out[...] = value  # one broadcast element through the copy kernel, on the device
    return out


def full(shape: Any, fill_value: Any, dtype: Any = None, *,
         device: Optional[str] = None, requires_grad: bool = False) -> Array:
    """A new Array of ``shape`` (a tuple, or one int) filled with ``fill_value``, as
    ``numpy.full`` and ``torch.full``: the dtype of the value by default (an int: int64; a
    float or bool: float32)."""
    inferred = _fill_value_dtype(fill_value, "fastmetal.full")
    out = _filled(shape, fill_value, _target_dtype(dtype, inferred, "full"), device)
    return out.requires_grad_(True) if requires_grad else out


def _like(a: Any, dtype: Any, shape: Any, device: Optional[str], where: str):
    if isinstance(a, Array):
        inferred, a_shape, a_device = a.dtype, a.shape, a.device
    else:
        host = np.asarray(a)
        if host.dtype.kind not in "biuf":
            raise TypeError(f"[fastmetal.{where}] expected a real array, got dtype "
                            f"{host.dtype}")
        inferred, a_shape, a_device = host.dtype, host.shape, None
    inferred = np.dtype(inferred)
    # The prototype's own dtype where fastmetal has it (the dtype rule); others as asarray
    # widens them.
    if dtype is None and inferred in _DTYPES:
        target = inferred
        dev = device or a_device or _core.default_device()
        if target == np.float64 and not _core._device_capabilities(dev)["float64"]:
            target = np.dtype(np.float32)  # NumPy float64 computes in float32 there (metal)
    else:
        target = _target_dtype(dtype, inferred, where)
    return target, (a_shape if shape is None else shape), (device or a_device)


def empty_like(prototype: Any, dtype: Any = None, *, shape: Any = None,
               device: Optional[str] = None) -> Array:
    """A new uninitialised Array with the shape and dtype of ``prototype`` (an Array or
    array-like), on its device, as ``numpy.empty_like``."""
    target, s, dev = _like(prototype, dtype, shape, device, "empty_like")
    return _core.empty(s, dtype=target, device=dev)


def zeros_like(a: Any, dtype: Any = None, *, shape: Any = None,
               device: Optional[str] = None) -> Array:
    """A new Array of zeros with the shape and dtype of ``a``, on its device, as
    ``numpy.zeros_like``."""
    target, s, dev = _like(a, dtype, shape, device, "zeros_like")
    return _core.zeros(s, dtype=target, device=dev)


def ones_like(a: Any, dtype: Any = None, *, shape: Any = None,
              device: Optional[str] = None) -> Array:
    """A new Array of ones with the shape and dtype of ``a``, on its device, as
    ``numpy.ones_like``."""
    target, s, dev = _like(a, dtype, shape, device, "ones_like")
    return _core.ones(s, dtype=target, device=dev)


def full_like(a: Any, fill_value: Any, dtype: Any = None, *, shape: Any = None,
              device: Optional[str] = None) -> Array:
    """A new Array with the shape and dtype of ``a``, on its device, filled with
    ``fill_value`` (converted to that dtype, as ``numpy.full_like``)."""
    _fill_value_dtype(fill_value, "fastmetal.full_like")
    target, s, dev = _like(a, dtype, shape, device, "full_like")
    return _filled(s, fill_value, target, dev)
