"""The dtypes an Array can have, and the check that a requested dtype is one of them.

bool, uint8, int32, int64, float16, float32 on every device; float64 on cpu and cuda (Apple
GPUs have no double: asking for it on metal is a TypeError, and NumPy float64 input computes
in float32 there). Promotion is the C++ core's (csrc/ops/arguments.cpp), reached through
``promote``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _core

DTYPES = tuple(np.dtype(n) for n in
               ("bool", "uint8", "int32", "int64", "float16", "float32", "float64"))
NAMES = ", ".join(d.name for d in DTYPES[:-1]) + " or " + DTYPES[-1].name  # for messages


def native_dtype(dtype: Any, where: str) -> np.dtype:
    """`dtype` as one of the dtypes Arrays have, else TypeError."""
    try:
        target = np.dtype(dtype)
    except TypeError:
        target = None
    # (None is tested first: np.dtype(...) == None compares with float64, NumPy's default)
    if target is None or target not in DTYPES:
        raise TypeError(f"[{where}] expected dtype {NAMES}, got {dtype!r}")
    return target


def promote(x: str, y: str) -> np.dtype:
    """The dtype two operands promote to: dtype names, or 'python_bool' / 'python_int' /
    'python_float' for Python scalars (weak: they take the other operand's dtype)."""
    return np.dtype(_core._promote(x, y))
