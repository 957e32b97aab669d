"""Elementwise arithmetic that is more than one line of the op table: ``divmod``."""
from __future__ import annotations

from typing import Any, Tuple

from .. import _core
from .elementwise import FUNCTIONS as F  # recorded: remainder is differentiable

__all__ = ["divmod"]


def divmod(x: Any, y: Any, out: Any = None) -> Tuple[Any, Any]:  # noqa: A001 (NumPy's name)
    """``(x // y, x % y)``, as ``numpy.divmod`` and Python's ``divmod``: the results of
    :func:`fastmetal.floor_divide` and :func:`fastmetal.remainder` (float32, float16 or int64
    operands, broadcast). ``out`` is None or a pair of arrays for the two results."""
    if out is None:
        out = (None, None)
    if not isinstance(out, tuple) or len(out) != 2:
        raise TypeError(f"[fastmetal.divmod] expected out to be None or a pair of arrays, got "
                        f"{type(out).__name__}")
    if out[0] is None:
        return F["floor_divide"](x, y), F["remainder"](x, y, out[1])
    # Both results read x and y as they were: the quotient is computed before out[1] (which
    # may share memory with x or y) is written, and goes into out[0] after.
    quotient = F["floor_divide"](x, y)
    remainder = F["remainder"](x, y, out[1])
    return _core._store_out("divmod", quotient, out[0]), remainder
