"""Activation layers, as ``torch.nn``'s: ReLU, Sigmoid, Tanh, GELU, Softplus, SiLU, LeakyReLU, ELU,
LogSoftmax, Softmax."""
from __future__ import annotations

import numbers

import numpy as np

from ...ops import activations as A
from ...ops import training as F
from ...ops.normalization import softmax as _softmax
from ...ops.elementwise import FUNCTIONS as _E
from ...ops.checks import real_number
from .module import Module

__all__ = ['ReLU', 'Sigmoid', 'Tanh', 'GELU', 'Softplus', 'SiLU', 'LeakyReLU', 'ELU', 'LogSoftmax',
           'Softmax']


class _Activation(Module):
    _op = ""

    def forward(self, x):
        return _E[self._op](x)


class ReLU(_Activation):
    """``max(x, 0)``; gradient 0 at 0, as PyTorch."""
    _op = "relu"


class Sigmoid(_Activation):
    """``1 / (1 + exp(-x))``."""
    _op = "sigmoid"


class Tanh(_Activation):
    """Hyperbolic tangent."""
    _op = "tanh"


class GELU(Module):
    """GELU, exact erf form (``approximate="none"``, the only form), as ``torch.nn.GELU``."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate != "none":
            raise ValueError(f"[fastmetal.nn.GELU] expected approximate='none', got "
                             f"{approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return _E["gelu"](x)


class Softplus(Module):
    """``log(1 + exp(beta x)) / beta``, as ``torch.nn.Softplus``; computed exactly at every x
    (PyTorch switches to ``x`` where ``beta x > threshold``; the two differ by less than
    ``exp(-threshold)``)."""

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        real_number(beta, "beta", "nn.Softplus")
        real_number(threshold, "threshold", "nn.Softplus")
        if beta <= 0:
            raise ValueError(f"[fastmetal.nn.Softplus] expected beta > 0, got {beta!r}")
        self.beta, self.threshold = float(beta), float(threshold)

    def forward(self, x):
        if self.beta == 1.0:
            return _E["softplus"](x)
        return _E["softplus"](x * self.beta) * (1.0 / self.beta)


class LogSoftmax(Module):
    """:func:`fastmetal.log_softmax` along ``dim`` as a layer."""

    def __init__(self, dim=-1):
        super().__init__()
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, numbers.Integral):
            raise TypeError(f"[fastmetal.nn.LogSoftmax] expected dim to be an int, got {dim!r}")
        self.dim = int(dim)

    def forward(self, x):
        return F.log_softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class SiLU(_Activation):
    """``x * sigmoid(x)`` (swish), as ``torch.nn.SiLU``."""
    _op = "silu"


class LeakyReLU(Module):
    """:func:`~fastmetal.nn.functional.leaky_relu` as a layer."""

    def __init__(self, negative_slope=0.01):
        super().__init__()
        real_number(negative_slope, "negative_slope", "nn.LeakyReLU")
        self.negative_slope = float(negative_slope)

    def forward(self, x):
        return A.leaky_relu(x, self.negative_slope)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}"


class ELU(Module):
    """:func:`~fastmetal.nn.functional.elu` as a layer."""

    def __init__(self, alpha=1.0):
        super().__init__()
        real_number(alpha, "alpha", "nn.ELU")
        self.alpha = float(alpha)

    def forward(self, x):
        return A.elu(x, self.alpha)

    def extra_repr(self):
        return f"alpha={self.alpha}"


class Softmax(Module):
    """:func:`fastmetal.softmax` along ``dim`` as a layer, as ``torch.nn.Softmax``."""

    def __init__(self, dim=-1):
        super().__init__()
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, numbers.Integral):
            raise TypeError(f"[fastmetal.nn.Softmax] expected dim to be an int, got {dim!r}")
        self.dim = int(dim)

    def forward(self, x):
        return _softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"
