"""Bitwise functions of integers and bool, under the Array API standard's names and NumPy's
(``bitwise_left_shift`` and ``left_shift``, ``bitwise_invert`` and ``invert``): on the device,
as NumPy's integer ufuncs (metal/int_math.metal: shifts by a negative count or by the width
or more give 0, or the sign for ``>>``). Floats are a TypeError naming the dtype. Integer
results have no gradient."""
from __future__ import annotations

from typing import Any

from .. import _core

__all__ = ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
           "bitwise_right_shift", "bitwise_invert", "left_shift", "right_shift", "invert",
           "bitwise_not"]


def bitwise_and(x1: Any, x2: Any, /, *, out: Any = None) -> Any:
    """``x1 & x2``, broadcast as NumPy (integers and bool)."""
    return _core.binary("bitwise_and", x1, x2, out)


def bitwise_or(x1: Any, x2: Any, /, *, out: Any = None) -> Any:
    """``x1 | x2``, broadcast as NumPy (integers and bool)."""
    return _core.binary("bitwise_or", x1, x2, out)


def bitwise_xor(x1: Any, x2: Any, /, *, out: Any = None) -> Any:
    """``x1 ^ x2``, broadcast as NumPy (integers and bool)."""
    return _core.binary("bitwise_xor", x1, x2, out)


def bitwise_left_shift(x1: Any, x2: Any, /, *, out: Any = None) -> Any:
    """``x1 << x2`` for integers (bool shifts as int64): 0 for counts outside [0, width)."""
    return _core.binary("left_shift", x1, x2, out)


def bitwise_right_shift(x1: Any, x2: Any, /, *, out: Any = None) -> Any:
    """``x1 >> x2`` for integers, arithmetic (the sign fills): the sign for counts outside
    [0, width)."""
    return _core.binary("right_shift", x1, x2, out)


def bitwise_invert(x: Any, /, *, out: Any = None) -> Any:
    """``~x``: every bit flipped for integers, logical not for bool."""
    return _core.unary("bitwise_invert", x, out)


left_shift = bitwise_left_shift
right_shift = bitwise_right_shift
invert = bitwise_invert
bitwise_not = bitwise_invert
