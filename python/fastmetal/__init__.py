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

from ._core import Array
# The layers, bottom up: autograd (the tape and @op), ops (every function, by family; the
# only Python that calls _core), array (the Array's Python surface), optim, distributed, nn,
# data.
from .autograd.functional import grad, value_and_grad
from .autograd.tape import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .ops.capture import CompileWarning, compile  # noqa: A004
from .ops.devices import (configuration_problems as _configuration_problems, default_device,
                          device, devices, set_default_device, synchronize)
from .ops.creation import (arange, asarray, empty, empty_like, full, full_like, linspace,
                           ones, ones_like, zeros, zeros_like)
# One function per line of metal/elementwise_ops.tbl (defined by name in ops/elementwise).
from .ops.elementwise import *  # noqa: F401,F403
from .ops.elementwise import __all__ as _elementwise_names
from .ops.arithmetic import divmod  # noqa: A004
from .ops.views import expand_dims
from .ops.numerics import derivative, fourier_series, gradient
from .ops.random import seed as manual_seed  # torch.manual_seed's name for fm.random.seed
from .ops.conv import conv2d, conv2d_backward
from .ops.reductions import (sum, mean, var, std, max, min, argmax, argmin, prod, cumsum,  # noqa: A004
                             cumprod)
from .ops.linalg import matmul, linear, linear_backward, dot
from .ops.manipulation import (where, concatenate, stack, transpose, permute, swapaxes, moveaxis,
                               squeeze)
from .ops.training import (dropout, dropout_backward, log_softmax, log_softmax_backward,
                           max_pool2d, max_pool2d_backward)
from .ops.normalization import logsumexp, softmax
from .ops.losses import (binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy,
                         mse_loss, nll_loss)
# The Array API standard's names and PyTorch's function names (beside NumPy's above).
from .ops.dtype_info import (__array_api_version__, __array_namespace_info__, bool, uint8, int32,
                             int64, float16, float32, float64, finfo, iinfo, isdtype,
                             result_type, can_cast)  # noqa: A004
from .ops.standard import (concat, permute_dims, pow, clip, all, any, broadcast_to,
                           broadcast_arrays, flip, roll, repeat, tile, eye, tril, triu, meshgrid,
                           take, tensordot, vecdot, matrix_transpose, isnan, signbit, isinf,
                           isfinite, logical_not, logical_and, logical_or, logical_xor,
                           count_nonzero)  # noqa: A004
from .ops.sorting import (argsort, sort, searchsorted, unique_values, unique_counts,
                          unique_inverse, unique_all, nonzero)
from .ops.bitwise import (bitwise_and, bitwise_or, bitwise_xor, bitwise_left_shift,
                          bitwise_right_shift, bitwise_invert, left_shift, right_shift, invert,
                          bitwise_not)
from .ops.standard import (e, pi, inf, nan, newaxis, reshape, astype, positive, conj, real, imag,
                           unstack, cumulative_sum, cumulative_prod, diff, take_along_axis,
                           from_dlpack)
from .ops.habits import (cat, clamp, flatten, unsqueeze, split, chunk, randn, rand, randint,
                         randn_like, rand_like, from_numpy)
# PyTorch's dtype aliases (fm.double is fm.float64, as torch.double is torch.float64); after
# this line float and int name dtypes in this module, as in torch's namespace.
from .ops.habits import double, half, long, float_ as float, int_ as int  # noqa: A004
from .array import surface as _surface  # noqa: F401  (attaches Array's methods)
from . import accelerator, autograd, data, distributed, nn, optim, random
from .serialization import load, save

try:
    __version__ = _metadata.version("fastmetal")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

# FASTMETAL_* variables that were not understood: say so once, here, naming the variable
# and the accepted values (the default is used instead).
def _warn_about_configuration():
    for problem in _configuration_problems():
        _warnings.warn(problem, RuntimeWarning, stacklevel=3)


_warn_about_configuration()

__all__ = [
    "__version__",
    # devices and arrays
    "Array",
    "asarray",
    "default_device",
    "device",
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
    # a step captured once and replayed (ops/capture.py)
    "compile", "CompileWarning",
    # numerical differentiation
    "gradient",
    "derivative",
    "fourier_series",
    # convolution
    "conv2d",
    "conv2d_backward",
    # reductions and linear algebra
    "sum", "mean", "var", "std", "max", "min", "argmax", "argmin", "prod", "cumsum", "cumprod",
    "matmul", "linear", "linear_backward", "dot",
    # training
    "cross_entropy", "dropout", "dropout_backward", "log_softmax", "log_softmax_backward",
    "max_pool2d", "max_pool2d_backward", "softmax", "logsumexp",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss", "nll_loss",
    "manual_seed", "save", "load", "accelerator", "autograd", "data", "distributed", "nn",
    "optim", "random",
    # the Array API standard: its version, dtypes, introspection (dtype_info.py), functions
    # (standard.py), sorting and searching (sorting.py)
    "__array_api_version__", "__array_namespace_info__", "bool", "uint8", "int32", "int64", "float16", "float32", "float64",
    "finfo", "iinfo", "isdtype",
    "result_type", "can_cast", "concat", "permute_dims", "pow", "clip", "all", "any",
    "broadcast_to", "broadcast_arrays", "flip", "roll", "repeat", "tile", "eye", "tril", "triu",
    "meshgrid", "take", "tensordot", "vecdot", "matrix_transpose", "isnan", "signbit", "isinf", "isfinite",
    "logical_not", "logical_and",
    "logical_or", "logical_xor", "count_nonzero", "argsort", "sort", "searchsorted",
    "unique_values", "unique_counts", "unique_inverse", "unique_all", "nonzero",
    # bitwise functions (bitwise.py)
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
    "bitwise_invert", "left_shift", "right_shift", "invert", "bitwise_not",
    # the standard's constants and the rest of its functions (standard.py)
    "e", "pi", "inf", "nan", "newaxis", "reshape", "astype", "positive", "conj", "real", "imag",
    "unstack", "cumulative_sum", "cumulative_prod", "diff", "take_along_axis", "from_dlpack",
    # PyTorch's function names (habits.py)
    "cat", "clamp", "flatten", "unsqueeze", "split", "chunk", "randn", "rand", "randint",
    "randn_like", "rand_like", "from_numpy",
    # PyTorch's dtype aliases (habits.py)
    "double", "float", "half", "long", "int",
]


def __dir__():
    return sorted(__all__)
