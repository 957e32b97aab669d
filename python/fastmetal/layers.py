"""The layers of ``fastmetal.nn``, as PyTorch's: Linear, Conv2d, the activations, pooling,
dropout, Flatten, LogSoftmax and Identity. Each is a :class:`~fastmetal.module.Module`
whose ``forward`` calls fastmetal's differentiable functions; ``loss.backward()`` gives
every parameter its ``.grad``. A layer instance may be used any number of times.

Initialisation as PyTorch's (``kaiming_uniform_(a=sqrt(5))``: weight and bias uniform in
``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``), drawn from NumPy with ``seed`` or ``rng``
(keyword-only); ``device`` places the parameters (default: the default device).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _core
from . import training as F
from ._elementwise import FUNCTIONS as _E
from .conv import conv2d as _conv2d
from .linalg import linear as _linear
from .module import Module, Parameter

__all__ = ["Linear", "Conv2d", "ReLU", "Sigmoid", "Tanh", "GELU", "Softplus", "Identity",
           "MaxPool2d", "Dropout", "Flatten", "LogSoftmax"]


def _rng_for(cls, seed, rng):
    if seed is not None and rng is not None:
        raise ValueError(f"[fastmetal.nn.{cls}] expected at most one of seed and rng, got both")
    if rng is None:
        return np.random.default_rng(seed)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"[fastmetal.nn.{cls}] expected rng to be a numpy.random.Generator, "
                        f"got {type(rng).__name__}")
    return rng


def _positive_int(value, name, cls):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"[fastmetal.nn.{cls}] expected {name} to be a positive int, "
                        f"got {value!r}")
    if value < 1:
        raise ValueError(f"[fastmetal.nn.{cls}] expected {name} to be a positive int, "
                         f"got {value!r}")
    return int(value)


def _check_bool(value, name, cls):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"[fastmetal.nn.{cls}] expected {name} to be True or False, "
                        f"got {value!r}")


def _uniform_parameter(rng, bound, shape, device):
    host = rng.uniform(-bound, bound, size=shape).astype(np.float32)
    return Parameter(_core.asarray(host, device=device))


class Linear(Module):
    """``y = x @ weight.T + bias``, as ``torch.nn.Linear``: weight ``(out_features,
    in_features)``, bias ``(out_features,)``."""

    def __init__(self, in_features, out_features, bias=True, *, seed=None, rng=None,
                 device=None):
        super().__init__()
        self.in_features = _positive_int(in_features, "in_features", "Linear")
        self.out_features = _positive_int(out_features, "out_features", "Linear")
        _check_bool(bias, "bias", "Linear")
        rng = _rng_for("Linear", seed, rng)
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight = _uniform_parameter(rng, bound, (self.out_features, self.in_features),
                                         device)
        self.bias = _uniform_parameter(rng, bound, (self.out_features,), device) if bias \
            else None

    def forward(self, x):
        return _linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


def _kernel_size(value):
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError("[fastmetal.nn.Conv2d] expected kernel_size to be an int or a pair "
                             f"of 2 ints, got {len(value)} values: {value!r}")
        return (_positive_int(value[0], "kernel_size", "Conv2d"),
                _positive_int(value[1], "kernel_size", "Conv2d"))
    k = _positive_int(value, "kernel_size", "Conv2d")
    return (k, k)


class Conv2d(Module):
    """2-D convolution layer, as ``torch.nn.Conv2d`` (``padding_mode="zeros"``); ``padding``
    may also be ``"valid"`` or ``"same"``. weight ``(out_channels, in_channels // groups,
    kH, kW)``, bias ``(out_channels,)`` or None."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, *, seed=None, rng=None, device=None):
        super().__init__()
        self.in_channels = _positive_int(in_channels, "in_channels", "Conv2d")
        self.out_channels = _positive_int(out_channels, "out_channels", "Conv2d")
        self.kernel_size = _kernel_size(kernel_size)
        # Same checks and normal form as the functional op (stride/padding/dilation/groups).
        self.stride, self.padding, self.dilation, self.groups = _core._conv2d_spec(
            stride, padding, dilation, groups, "nn.Conv2d")
        if self.in_channels % self.groups:
            raise ValueError(f"[fastmetal.nn.Conv2d] expected in_channels ({self.in_channels}) "
                             f"to be divisible by groups ({self.groups})")
        if self.out_channels % self.groups:
            raise ValueError(f"[fastmetal.nn.Conv2d] expected out_channels "
                             f"({self.out_channels}) to be divisible by groups ({self.groups})")
        _check_bool(bias, "bias", "Conv2d")
        rng = _rng_for("Conv2d", seed, rng)
        kh, kw = self.kernel_size
        fan_in = self.in_channels // self.groups * kh * kw
        bound = 1.0 / math.sqrt(fan_in)
        shape = (self.out_channels, self.in_channels // self.groups, kh, kw)
        self.weight = _uniform_parameter(rng, bound, shape, device)
        self.bias = _uniform_parameter(rng, bound, (self.out_channels,), device) if bias \
            else None

    def forward(self, x):
        return _conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                       dilation=self.dilation, groups=self.groups)

    def extra_repr(self):
        extra = ""
        if self.stride != (1, 1):
            extra += f", stride={self.stride}"
        if self.padding != (0, 0):
            extra += f", padding={self.padding!r}"
        if self.dilation != (1, 1):
            extra += f", dilation={self.dilation}"
        if self.groups != 1:
            extra += f", groups={self.groups}"
        if self.bias is None:
            extra += ", bias=False"
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}{extra}"


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
        for name, v in (("beta", beta), ("threshold", threshold)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
                raise TypeError(f"[fastmetal.nn.Softplus] expected {name} to be a number, "
                                f"got {v!r}")
        if beta <= 0:
            raise ValueError(f"[fastmetal.nn.Softplus] expected beta > 0, got {beta!r}")
        self.beta, self.threshold = float(beta), float(threshold)

    def forward(self, x):
        if self.beta == 1.0:
            return _E["softplus"](x)
        return _E["softplus"](x * self.beta) * (1.0 / self.beta)


class Identity(Module):
    """Returns its input (any extra arguments are ignored), as ``torch.nn.Identity``."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class MaxPool2d(Module):
    """:func:`fastmetal.max_pool2d` as a layer."""

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        F._pool_spec(kernel_size, stride, padding, "nn.MaxPool2d")  # validate now
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class Dropout(Module):
    """:func:`fastmetal.dropout` as a layer: in training mode each call draws a new mask
    (seeds ``seed0, seed0 + 1, ...``, ``seed0`` from ``seed``/``rng``: a seed makes the whole
    sequence reproducible on every device); in eval mode the identity."""

    def __init__(self, p=0.5, *, seed=None, rng=None):
        super().__init__()
        F._dropout_key(p, 0, "nn.Dropout")
        self.p = float(p)
        rng = _rng_for("Dropout", seed, rng)
        self._next_seed = int(rng.integers(0, 2**63))

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        seed = self._next_seed
        self._next_seed = (seed + 1) % 2**64
        return F.dropout(x, self.p, seed=seed)

    def extra_repr(self):
        return f"p={self.p}"


class Flatten(Module):
    """Merges dims ``start_dim .. end_dim`` (default: all but the batch dim)."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        for name, v in (("start_dim", start_dim), ("end_dim", end_dim)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
                raise TypeError(f"[fastmetal.nn.Flatten] expected {name} to be an int, got {v!r}")
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)

    def forward(self, x):
        shape = tuple(x.shape)
        nd = len(shape)
        s = self.start_dim + nd if self.start_dim < 0 else self.start_dim
        e = self.end_dim + nd if self.end_dim < 0 else self.end_dim
        if not (0 <= s < max(nd, 1) and 0 <= e < max(nd, 1) and s <= e):
            raise ValueError(f"[fastmetal.nn.Flatten] expected start_dim <= end_dim inside a "
                             f"{nd}-D input, got start_dim={self.start_dim}, "
                             f"end_dim={self.end_dim}")
        new = shape[:s] + (int(np.prod(shape[s:e + 1], dtype=np.int64)),) + shape[e + 1:]
        return x.reshape(new) if isinstance(x, _core.Array) else np.reshape(x, new)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


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
