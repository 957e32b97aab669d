"""The Array API standard's dtypes and their introspection: the dtype objects (NumPy dtypes,
what ``Array.dtype`` returns), ``finfo``, ``iinfo``, ``isdtype``, ``result_type`` (the
promotion table), ``can_cast`` and ``__array_namespace_info__`` (devices, default dtypes,
the dtypes each device has).
"""
from __future__ import annotations

import builtins
from typing import Any, NamedTuple

import numpy as np

from .. import _core
from .._core import Array
from .dtypes import DTYPES, promote

__all__ = ["__array_api_version__", "__array_namespace_info__", "bool", "uint8", "int32",
           "int64", "float16", "float32", "float64", "finfo", "iinfo", "isdtype",
           "result_type", "can_cast"]

# The version of the standard these names follow (Array.__array_namespace__ returns fastmetal).
__array_api_version__ = "2024.12"

# The dtypes Arrays have, as NumPy dtypes (what Array.dtype returns, so they compare and hash
# alike).
bool = np.dtype(np.bool_)  # noqa: A001 (the standard's name; builtins.bool stays reachable)
uint8 = np.dtype(np.uint8)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)


def as_dtype(obj: Any, where: str, name: str = "dtype") -> np.dtype:
    """``obj`` (a dtype, anything ``numpy.dtype`` takes, or an Array) as a NumPy dtype."""
    if isinstance(obj, Array):
        return obj.dtype
    try:
        return np.dtype(obj)
    except TypeError:
        raise TypeError(f"[fastmetal.{where}] expected {name} to be a dtype or a "
                        f"fastmetal.Array, got {obj!r}") from None


class _FInfo(NamedTuple):
    """The standard's finfo object: Python ints and floats (numpy.finfo's are NumPy scalars)."""
    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    tiny: float
    resolution: float
    dtype: np.dtype


def finfo(type: Any) -> _FInfo:  # noqa: A002 (the standard's name)
    """Machine limits of a floating dtype (or of an Array's dtype), as the Array API's and
    ``numpy.finfo``'s (``bits``, ``eps``, ``max``, ``min``, ``smallest_normal``, ``tiny``,
    ``resolution``, ``dtype``), as Python ints and floats, as the standard asks."""
    d = as_dtype(type, "finfo", "type")
    if d.kind != "f":
        raise TypeError(f"[fastmetal.finfo] expected a floating dtype, got {d} (use "
                        f"fastmetal.iinfo for integers)")
    f = np.finfo(d)
    return _FInfo(int(f.bits), float(f.eps), float(f.max), float(f.min),
                  float(f.smallest_normal), float(f.tiny), float(f.resolution), d)


def iinfo(type: Any) -> np.iinfo:  # noqa: A002 (the standard's name)
    """Machine limits of an integer dtype (or of an Array's dtype), as ``numpy.iinfo``
    (``bits``, ``max``, ``min``, ``dtype``)."""
    d = as_dtype(type, "iinfo", "type")
    if d.kind not in "iu":
        raise TypeError(f"[fastmetal.iinfo] expected an integer dtype, got {d} (use "
                        f"fastmetal.finfo for floating dtypes)")
    return np.iinfo(d)


_KINDS = {"bool": "b", "signed integer": "i", "unsigned integer": "u", "integral": "iu",
          "real floating": "f", "complex floating": "c", "numeric": "iufc"}


def isdtype(dtype: Any, kind: Any) -> bool:
    """Whether ``dtype`` is of ``kind``: a dtype, one of the standard's kind names ('bool',
    'signed integer', 'unsigned integer', 'integral', 'real floating', 'complex floating',
    'numeric') or a tuple of them."""
    if isinstance(dtype, Array):
        raise TypeError("[fastmetal.isdtype] expected a dtype, got a fastmetal.Array (pass "
                        "its .dtype)")
    d = as_dtype(dtype, "isdtype")
    if isinstance(kind, tuple):
        return builtins.any(isdtype(d, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"[fastmetal.isdtype] expected kind to be a dtype or one of "
                             f"{sorted(_KINDS)}, got {kind!r}")
        return d.kind in _KINDS[kind]
    return d == as_dtype(kind, "isdtype", "kind")


class _NamespaceInfo:
    """The Array API's inspection object (``fastmetal.__array_namespace_info__()``)."""

    def capabilities(self) -> dict:
        """What the namespace does: boolean indexing (data-dependent shapes, read from the
        device once) yes; ``max dimensions``: 64 (``fastmetal.Array``'s limit)."""
        return {"boolean indexing": True, "data-dependent shapes": True,
                "max dimensions": 64}

    def default_device(self) -> str:
        return _core.default_device()

    def devices(self) -> list:
        return list(_core.devices())

    def default_dtypes(self, *, device: Any = None) -> dict:
        return {"real floating": float32, "complex floating": None, "integral": int64,
                "indexing": int64}

    def dtypes(self, *, device: Any = None, kind: Any = None) -> dict:
        """The standard's dtypes ``device`` has (float64 on cpu and cuda, not metal), of
        ``kind``, by name (float16 is not one of the standard's: it is left out)."""
        device = device or _core.default_device()
        out = {}
        for d in DTYPES:
            if d == np.float64 and not _core._device_capabilities(device).get("float64", True):
                continue
            if d == np.float16:
                continue
            if kind is None or isdtype(d, kind):
                out[d.name] = d
        return out


def __array_namespace_info__() -> _NamespaceInfo:
    """The Array API standard's inspection namespace: devices, default dtypes, dtypes."""
    return _NamespaceInfo()


def _operand_name(x: Any) -> str:
    if isinstance(x, builtins.bool):
        return "python_bool"
    if isinstance(x, int) and not isinstance(x, np.generic):
        return "python_int"
    if isinstance(x, float) and not isinstance(x, np.generic):
        return "python_float"
    d = as_dtype(x, "result_type", "each argument")
    if d not in DTYPES:
        raise TypeError(f"[fastmetal.result_type] expected fastmetal's dtypes (bool, uint8, "
                        f"int32, int64, float16, float32, float64), got {d}")
    return d.name


def result_type(*arrays_and_dtypes: Any) -> np.dtype:
    """The dtype fastmetal's elementwise ops give for these operands (Arrays, dtypes and, as
    the standard allows since 2023.12, Python scalars, which take the other operands' dtype):
    the Array API standard's promotion table; across kinds, as PyTorch (bool < integers <
    floats: an integer with a float gives that float)."""
    if not arrays_and_dtypes:
        raise ValueError("[fastmetal.result_type] expected at least one array or dtype, got "
                         "none")
    names = [_operand_name(x) for x in arrays_and_dtypes]
    # Arrays and dtypes first, then the scalars join the result (each scalar is weak
    # against the strong result, whatever its position).
    strong = [n for n in names if not n.startswith("python_")]
    weak = [n for n in names if n.startswith("python_")]
    order = strong + weak
    out = order[0]
    for n in order[1:]:
        out = promote(out, n).name
    return np.dtype(out)


def can_cast(from_: Any, to: Any, /) -> bool:
    """Whether ``from_`` (a dtype or Array) converts to dtype ``to`` without losing values
    by the promotion rules (``numpy.can_cast`` with casting='safe')."""
    return builtins.bool(np.can_cast(as_dtype(from_, "can_cast", "from_"),
                            as_dtype(to, "can_cast", "to"), casting="safe"))
