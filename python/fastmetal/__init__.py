"""fastmetal: GPU compute kernels written in Metal Shading Language, called from NumPy.

On a Mac the kernels run on the Apple GPU through Metal; everywhere the same kernel
source also runs on the CPU (and on NVIDIA GPUs where the CUDA backend was built).

    >>> import numpy as np, fastmetal as fm
    >>> fm.sigmoid(np.zeros(3, np.float32))
    array([0.5, 0.5, 0.5], dtype=float32)
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from . import _core
from ._core import (
    Array,
    asarray,
    default_device,
    devices,
    empty,
    ones,
    set_default_device,
    synchronize,
    zeros,
)
from ._elementwise import BINARY as _BINARY
from ._elementwise import FUNCTIONS as _FUNCTIONS
from ._elementwise import UNARY as _UNARY
from .numerics import derivative, fourier_series, gradient
from .conv import conv2d, conv2d_backward
from . import nn
from .reductions import sum, mean, var, std, max, min, argmax, argmin  # noqa: A004
from .linalg import matmul, linear, linear_backward

try:
    __version__ = version("fastmetal")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

globals().update(_FUNCTIONS)

__all__ = [
    "__version__",
    "Array",
    "asarray",
    "default_device",
    "devices",
    "empty",
    "ones",
    "set_default_device",
    "synchronize",
    "zeros",
    "gradient",
    "derivative",
    "fourier_series",
    "conv2d",
    "conv2d_backward",
    "nn",
    "sum", "mean", "var", "std", "max", "min", "argmax", "argmin",
    "matmul", "linear", "linear_backward",
    *_UNARY,
    *_BINARY,
]
