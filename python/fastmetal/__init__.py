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
# One function per line of metal/elementwise_ops.tbl (defined by name in _elementwise).
from ._elementwise import *  # noqa: F401,F403
from ._elementwise import __all__ as _elementwise_names
from . import _autograd  # requires_grad, backward(), detach() on Array; the tape
from ._autograd import (enable_grad, grad, is_grad_enabled, no_grad, set_grad_enabled,
                        value_and_grad)
from . import _array  # Array operators, views and NumPy dispatch
from ._array import expand_dims
from .numerics import derivative, fourier_series, gradient
from .conv import conv2d, conv2d_backward
from .reductions import sum, mean, var, std, max, min, argmax, argmin, prod, cumsum  # noqa: A004
from .linalg import matmul, linear, linear_backward, dot
from .creation import arange, linspace, full, zeros_like, ones_like, full_like, empty_like
from .manipulation import (where, concatenate, stack, transpose, permute, swapaxes, moveaxis,
                           squeeze)
from .arithmetic import divmod  # noqa: A004
from . import _numpy_surface  # noqa: F401  (Array's //, %, divmod, prod, ...; NumPy dispatch)
from . import training
from .training import (cross_entropy, dropout, dropout_backward, log_softmax,
                       log_softmax_backward, max_pool2d, max_pool2d_backward)
from .losses import (binary_cross_entropy, binary_cross_entropy_with_logits, mse_loss,
                     nll_loss)
from . import nn
from . import random

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
    # creation (creation.py)
    "arange", "linspace", "full", "zeros_like", "ones_like", "full_like", "empty_like",
    # joining, selecting, rearranging (manipulation.py)
    "where", "concatenate", "stack", "transpose", "permute", "swapaxes", "moveaxis", "squeeze",
    # elementwise (metal/elementwise_ops.tbl)
    *_elementwise_names,
    "expand_dims",
    "divmod",
    # automatic differentiation
    "grad", "value_and_grad", "no_grad", "enable_grad", "is_grad_enabled", "set_grad_enabled",
    # numerical differentiation
    "gradient",
    "derivative",
    "fourier_series",
    # convolution
    "conv2d",
    "conv2d_backward",
    # reductions and linear algebra
    "sum", "mean", "var", "std", "max", "min", "argmax", "argmin", "prod", "cumsum",
    "matmul", "linear", "linear_backward", "dot",
    # training
    "cross_entropy", "dropout", "dropout_backward", "log_softmax", "log_softmax_backward",
    "max_pool2d", "max_pool2d_backward",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss", "nll_loss",
    "nn",
    "random",
]


def __dir__():
    return sorted(__all__)
