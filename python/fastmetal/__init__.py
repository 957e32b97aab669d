"""fastmetal: GPU compute kernels written in Metal Shading Language, called from NumPy.

On a Mac the kernels run on the Apple GPU through Metal; everywhere the same kernel
source also runs on the CPU (and on NVIDIA GPUs where the CUDA backend was built).
The public API is ``__all__`` (docs/API.md describes each name).

    >>> import numpy as np, fastmetal as fm
    >>> fm.sigmoid(np.zeros(3, np.float32))
    array([0.5, 0.5, 0.5], dtype=float32)
"""
import importlib.metadata as _metadata
import warnings as _warnings

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
from ._elementwise import (
    abs,
    add,
    cos,
    divide,
    exp,
    gelu,
    log,
    maximum,
    minimum,
    multiply,
    negative,
    power,
    reciprocal,
    relu,
    sigmoid,
    sin,
    softplus,
    sqrt,
    square,
    subtract,
    tanh,
)
from .numerics import derivative, fourier_series, gradient
from .conv import conv2d, conv2d_backward
from . import nn

try:
    __version__ = _metadata.version("fastmetal")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

# FASTMETAL_* variables that were not understood: say so once, here, naming the variable
# and the accepted values (the default is used instead).
def _warn_about_configuration():
    for problem in _core._config_problems():
        _warnings.warn(problem, RuntimeWarning, stacklevel=3)


_warn_about_configuration()

__all__ = [
    "__version__",
    # devices and arrays
    "Array",
    "asarray",
    "default_device",
    "devices",
    "empty",
    "ones",
    "set_default_device",
    "synchronize",
    "zeros",
    # elementwise, unary
    "sigmoid",
    "relu",
    "tanh",
    "exp",
    "log",
    "sin",
    "cos",
    "sqrt",
    "abs",
    "negative",
    "square",
    "reciprocal",
    "softplus",
    "gelu",
    # elementwise, binary
    "add",
    "subtract",
    "multiply",
    "divide",
    "power",
    "maximum",
    "minimum",
    # numerical differentiation
    "gradient",
    "derivative",
    "fourier_series",
    # convolution
    "conv2d",
    "conv2d_backward",
    "nn",
]


def __dir__():
    return sorted(__all__)
