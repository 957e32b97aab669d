"""Helpers the test files share: ``host`` (an Array or array-like as a NumPy array) and the
optional PyTorch reference (``torch`` is None where it is not installed; ``needs_torch``
skips a test then, saying so)."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm

try:
    import torch
except ImportError:  # the NumPy references still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def host(a):
    """`a` as a NumPy array (an Array's data through .numpy(): a copy where needed)."""
    return np.asarray(a.numpy()) if isinstance(a, fm.Array) else np.asarray(a)


def skip_without_float64(device):
    """float64 Arrays live on cpu and cuda; Apple GPUs have no double (Metal rejects them)."""
    if device == "metal":
        pytest.skip("float64: Apple GPUs have no double")
