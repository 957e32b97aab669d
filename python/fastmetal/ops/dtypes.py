"""The dtypes an Array can have, and the check that a requested dtype is one of them."""
from __future__ import annotations

from typing import Any

import numpy as np

DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int64))


def native_dtype(dtype: Any, where: str) -> np.dtype:
    """`dtype` as one of the dtypes Arrays have (float32, float16, int64), else TypeError."""
    try:
        target = np.dtype(dtype)
    except TypeError:
        target = None
    if target not in DTYPES:
        raise TypeError(f"[{where}] expected dtype float32, float16 or int64, got {dtype!r}")
    return target
