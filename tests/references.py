"""Independent references the tests hold fastmetal to (NumPy, float64)."""
from __future__ import annotations

import math

import numpy as np


def gelu_reference(x):
    """Exact GELU in float64: x/2 * erfc(-x/sqrt2), without scipy."""
    x = np.asarray(x, dtype=np.float64)
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    return 0.5 * x * erfc(-x / math.sqrt(2.0)) if x.size else x.copy()


def numpy_reference(spec, *args):
    """Evaluate an op table's NumPy reference in float64 (args are float64 arrays)."""
    scope = {"np": np, "gelu_reference": gelu_reference}
    scope.update(zip(("x", "y"), args))
    with np.errstate(all="ignore"):
        return np.asarray(eval(spec.numpy, scope), dtype=np.float64)
