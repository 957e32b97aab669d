"""PyTorch's function names and argument habits, beside NumPy's: ``cat``, ``clamp``,
``flatten``, ``unsqueeze``, ``split``, ``chunk``, ``randn`` / ``rand`` / ``randint`` /
``randn_like`` / ``rand_like`` (fastmetal.random's Philox generator: the same numbers on
every device, seeded by ``fastmetal.manual_seed``) and ``from_numpy``; PyTorch's dtype
aliases (``torch.double is torch.float64``, ...) as fastmetal's NumPy dtypes.

Each is made of fastmetal's differentiable ops (views, ``concatenate``, ``clip``), so the
gradients need no code here. The Array's methods of the same names (array/surface.py) call
these.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import numpy as np

from .. import _core
from .._core import Array
from . import layouts, manipulation, random, views
from .dtypes import DTYPES, NAMES, native_dtype
from .standard import clip

__all__ = ["double", "float_", "half", "long", "int_", "cat", "clamp", "flatten", "unsqueeze", "split", "chunk", "randn", "rand", "randint",
           "randn_like", "rand_like", "from_numpy"]


# PyTorch's dtype aliases: torch.double == torch.float64, float float32, half float16, long
# int64, int int32. Named with an underscore where PyTorch's name is a builtin, so this
# module's float() and int() stay Python's; fastmetal exports them as float and int.
double = np.dtype(np.float64)
float_ = np.dtype(np.float32)
half = np.dtype(np.float16)
long = np.dtype(np.int64)
int_ = np.dtype(np.int32)


def _require(a: Any, where: str, name: str = "input") -> None:
    if not isinstance(a, Array):
        raise TypeError(f"[fastmetal.{where}] expected {name} to be a fastmetal.Array, got "
                        f"{type(a).__name__}")


def cat(tensors: Any, dim: int = 0, *, axis: Optional[int] = None, out: Any = None) -> Any:
    """Join arrays along ``dim``, as ``torch.cat`` (``fastmetal.concatenate`` with PyTorch's
    argument names; ``axis=`` is accepted too)."""
    if axis is not None:
        if dim != 0:
            raise TypeError(f"[fastmetal.cat] expected dim= or axis= (the same argument), got "
                            f"both: dim={dim!r}, axis={axis!r}")
        dim = axis
    return manipulation.concatenate(tensors, axis=dim, out=out)


def clamp(input: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002
    """``input`` limited to ``[min, max]``, as ``torch.clamp``: :func:`fastmetal.clip`."""
    if min is None and max is None:
        raise ValueError("[fastmetal.clamp] expected at least one of min and max, got neither "
                         "(torch.clamp's rule)")
    return clip(input, min, max)


def flatten(input: Any, start_dim: int = 0, end_dim: int = -1) -> Array:
    """Axes ``start_dim`` through ``end_dim`` merged into one, as ``torch.flatten`` (a view
    where the strides allow it, else a copy); a 0-d array becomes 1-D."""
    _require(input, "flatten")
    where = "fastmetal.flatten"
    if input.ndim == 0:
        return views.reshape(input, 1)
    start = layouts.normalize_axis(start_dim, input.ndim, where)
    end = layouts.normalize_axis(end_dim, input.ndim, where)
    if start > end:
        raise ValueError(f"[{where}] expected start_dim <= end_dim, got start_dim={start_dim} "
                         f"and end_dim={end_dim} for an array of dimension {input.ndim}")
    shape = tuple(input.shape)
    target = shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:]
    return views.reshape(input, target)


def unsqueeze(input: Any, dim: int) -> Array:
    """A view with an axis of length 1 inserted at ``dim`` (``-input.ndim - 1 <= dim <=
    input.ndim``), as ``torch.unsqueeze``."""
    _require(input, "unsqueeze")
    d = layouts.as_int(dim, "fastmetal.unsqueeze", "dim")
    if not -input.ndim - 1 <= d <= input.ndim:
        raise IndexError(f"[fastmetal.unsqueeze] expected dim in [{-input.ndim - 1}, "
                         f"{input.ndim}] for an array of dimension {input.ndim}, got {d}")
    return views.expand_dims(input, d)


def split(tensor: Any, split_size_or_sections: Any, dim: int = 0) -> tuple:
    """Views of ``tensor`` along ``dim``, as ``torch.split``: pieces of
    ``split_size_or_sections`` elements (the last one shorter), or of the sizes in a list
    (which must add up to the axis' length). Not NumPy's ``split`` (which takes the number of
    pieces or the split points)."""
    _require(tensor, "split", "tensor")
    where = "fastmetal.split"
    ax = layouts.normalize_axis(dim, tensor.ndim, where)
    n = tensor.shape[ax]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [layouts.as_int(s, where, "section size") for s in split_size_or_sections]
        if any(s < 0 for s in sizes) or sum(sizes) != n:
            raise ValueError(f"[{where}] expected section sizes >= 0 that add up to {n} (the "
                             f"length of dim {dim}), got {list(sizes)}")
    else:
        size = layouts.as_int(split_size_or_sections, where, "split_size")
        if size <= 0 and n > 0 or size < 0:
            raise ValueError(f"[{where}] expected split_size > 0, got {size}")
        sizes = [min(size, n - i) for i in range(0, n, size)] if n else [0]
    head = (slice(None),) * ax
    out, start = [], 0
    for s in sizes:
        out.append(views.getitem(tensor, head + (slice(start, start + s),)))
        start += s
    return tuple(out)


def chunk(input: Any, chunks: int, dim: int = 0) -> tuple:
    """At most ``chunks`` views of ``input`` along ``dim``, each ``ceil(n / chunks)`` long
    (the last one shorter), as ``torch.chunk``."""
    _require(input, "chunk")
    c = layouts.as_int(chunks, "fastmetal.chunk", "chunks")
    if c <= 0:
        raise ValueError(f"[fastmetal.chunk] expected chunks > 0, got {c}")
    ax = layouts.normalize_axis(dim, input.ndim, "fastmetal.chunk")
    n = input.shape[ax]
    return split(input, max(1, -(-n // c)), ax)


# ----------------------------------------------------------------------------- random
def _size(size: tuple, where: str) -> tuple:
    """randn(2, 3), randn((2, 3)) or randn([2, 3]) -> (2, 3)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    for d in size:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (numbers.Integral,)):
            raise TypeError(f"[fastmetal.{where}] expected sizes as ints (randn(2, 3) or "
                            f"randn((2, 3))), got {d!r}")
        if d < 0:
            raise ValueError(f"[fastmetal.{where}] expected sizes >= 0, got {tuple(size)}")
    return tuple(int(d) for d in size)


def _leaf(a: Array, requires_grad: bool) -> Array:
    return a.requires_grad_(True) if requires_grad else a


def randn(*size: Any, dtype: Any = None, device: Optional[str] = None, generator: Any = None,
          requires_grad: bool = False) -> Array:
    """Samples of the standard normal distribution, as ``torch.randn(*size)``
    (:func:`fastmetal.random.normal`: the same numbers on every device)."""
    a = random.normal(_size(size, "randn"), dtype=dtype or "float32", device=device,
                      generator=generator)
    return _leaf(a, requires_grad)


def rand(*size: Any, dtype: Any = None, device: Optional[str] = None, generator: Any = None,
         requires_grad: bool = False) -> Array:
    """Samples of the uniform distribution on ``[0, 1)``, as ``torch.rand(*size)``
    (:func:`fastmetal.random.uniform`)."""
    a = random.uniform(_size(size, "rand"), dtype=dtype or "float32", device=device,
                       generator=generator)
    return _leaf(a, requires_grad)


def randint(low: Any, high: Any = None, size: Any = None, *, dtype: Any = None,
            device: Optional[str] = None, generator: Any = None) -> Array:
    """Integers drawn uniformly from ``[low, high)``, as ``torch.randint(low, high, size)``
    or ``torch.randint(high, size)``: int64 by default (``dtype`` any of fastmetal's dtypes
    but bool; the values must fit it). Each is ``low + floor(u * (high - low))`` with ``u`` of
    :func:`fastmetal.random.uniform` (24 random bits), so ``high - low`` is at most 2**24."""
    where = "fastmetal.randint"
    if size is None and high is not None and isinstance(high, (tuple, list)):
        low, high, size = 0, low, high  # randint(high, size)
    if high is None or size is None:
        raise TypeError(f"[{where}] expected randint(low, high, size) or randint(high, size), "
                        f"got low={low!r}, high={high!r}, size={size!r}")
    lo = layouts.as_int(low, where, "low")
    hi = layouts.as_int(high, where, "high")
    if not lo < hi:
        raise ValueError(f"[{where}] expected low < high, got low={lo}, high={hi}")
    if hi - lo > 2**24:
        raise ValueError(f"[{where}] expected high - low <= 2**24 (24 random bits per "
                         f"draw), got {hi - lo}")
    target = np.dtype(np.int64) if dtype is None else native_dtype(dtype, where)
    shape = _size(tuple(size) if isinstance(size, (tuple, list)) else (size,), "randint")
    u = random.uniform(shape, device=device, generator=generator)
    k = (u * float(hi - lo)).astype(np.int64)  # truncation = floor for u >= 0
    k = manipulation.where(k > hi - lo - 1, hi - lo - 1, k) + lo
    return k if target == np.int64 else k.astype(target)


def _like(input: Any, where: str) -> tuple:
    _require(input, where)
    if input.dtype.kind != "f":
        raise TypeError(f"[fastmetal.{where}] expected a floating Array (float16, float32 or "
                        f"float64), "
                        f"got {input.dtype}")
    return tuple(input.shape), input.dtype, input.device


def randn_like(input: Any, *, dtype: Any = None, device: Optional[str] = None,
               generator: Any = None, requires_grad: bool = False) -> Array:
    """:func:`randn` in the shape, dtype and device of ``input``, as ``torch.randn_like``."""
    shape, dt, dev = _like(input, "randn_like")
    return randn(shape, dtype=dtype or dt, device=device or dev, generator=generator,
                 requires_grad=requires_grad)


def rand_like(input: Any, *, dtype: Any = None, device: Optional[str] = None,
              generator: Any = None, requires_grad: bool = False) -> Array:
    """:func:`rand` in the shape, dtype and device of ``input``, as ``torch.rand_like``."""
    shape, dt, dev = _like(input, "rand_like")
    return rand(shape, dtype=dtype or dt, device=device or dev, generator=generator,
                requires_grad=requires_grad)


def from_numpy(ndarray: Any) -> Array:
    """An Array of a NumPy array's values in its own dtype, as ``torch.from_numpy`` (bool,
    uint8, int32, int64, float16, float32, float64; others are a TypeError). On the cpu device the Array shares the NumPy array's memory where
    fastmetal can (C-contiguous data), as PyTorch's does; elsewhere it is a copy."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"[fastmetal.from_numpy] expected a numpy.ndarray, got "
                        f"{type(ndarray).__name__}")
    if ndarray.dtype not in DTYPES:
        raise TypeError(f"[fastmetal.from_numpy] expected a NumPy array of dtype {NAMES}, "
                        f"got {ndarray.dtype}; convert it with .astype(...) first")
    return _core.asarray(ndarray, dtype=ndarray.dtype)
