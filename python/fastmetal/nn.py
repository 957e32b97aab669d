"""Neural-network layers with explicit forward and backward passes.

There is no autograd: a layer remembers what its ``forward`` saw, and ``backward`` takes
the gradient of the loss with respect to the layer's output and returns the gradient with
respect to its input, storing the parameter gradients on the layer.
"""
import math as _math

import numpy as _np

from . import _core
from .conv import conv2d as _conv2d
from .conv import conv2d_backward as _conv2d_backward
# The argument checks every layer shares (layers.py holds the other layers).
from .layers import _check_bool, _check_forward_called, _positive_int, _rng_for

__all__ = ["Conv2d"]


def _kernel_size(value):
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError("[fastmetal.nn.Conv2d] expected kernel_size to be an int or a pair "
                             f"of 2 ints, got {len(value)} values: {value!r}")
        return (_positive_int(value[0], "kernel_size", "Conv2d"),
                _positive_int(value[1], "kernel_size", "Conv2d"))
    k = _positive_int(value, "kernel_size", "Conv2d")
    return (k, k)


class Conv2d:
    """2-D convolution layer, as ``torch.nn.Conv2d`` (``padding_mode="zeros"``).

    Parameters are those of ``torch.nn.Conv2d``; ``padding`` may also be ``"valid"`` or
    ``"same"``. Keyword-only extras: ``seed`` (an int) or ``rng`` (a
    ``numpy.random.Generator``) for the initialisation, and ``device`` (where the
    parameters live: ``None`` keeps them as NumPy arrays; a device name stores them as
    ``fastmetal.Array``).

    Attributes
    ----------
    weight : (out_channels, in_channels // groups, kH, kW) float32
    bias : (out_channels,) float32, or None when ``bias=False``
        Initialised like PyTorch: ``kaiming_uniform_(a=sqrt(5))``, i.e. both uniform in
        ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]`` with ``fan_in = in_channels // groups * kH * kW``.
    weight_grad, bias_grad
        Set by :meth:`backward` (overwritten by each call, not accumulated); ``None`` before.

    ``forward(x)`` (or calling the layer) returns ``conv2d(x, weight, bias, ...)`` and keeps
    ``x`` for ``backward(grad_output)``, which returns the gradient with respect to ``x``.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, *, seed=None, rng=None, device=None):
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
        bound = 1.0 / _math.sqrt(fan_in)  # kaiming_uniform(a=sqrt(5)): sqrt(6/((1+5)*fan_in))
        shape = (self.out_channels, self.in_channels // self.groups, kh, kw)
        weight = rng.uniform(-bound, bound, size=shape).astype(_np.float32)
        b = rng.uniform(-bound, bound, size=self.out_channels).astype(_np.float32) if bias else None
        self.device = device
        if device is not None:
            weight = _core.asarray(weight, device=device)
            b = None if b is None else _core.asarray(b, device=device)
        self.weight = weight
        self.bias = b
        self.weight_grad = None
        self.bias_grad = None
        self._input = None

    def _args(self):
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation,
                    groups=self.groups)

    def forward(self, x):
        y = _conv2d(x, self.weight, self.bias, **self._args())
        self._input = x  # after the call: a failed forward keeps the previous input
        return y

    __call__ = forward

    def backward(self, grad_output, *, input_grad=True):
        """The gradient with respect to the input (None with ``input_grad=False``, which
        skips computing it); sets ``weight_grad`` and ``bias_grad``."""
        _check_forward_called(self._input, "Conv2d")
        needs = ("input",) if input_grad else ()
        needs += ("weight", "bias") if self.bias is not None else ("weight",)
        gx, gw, gb = _conv2d_backward(grad_output, self._input, self.weight, needs=needs,
                                     **self._args())
        self.weight_grad = gw
        self.bias_grad = gb
        return gx

    def parameters(self):
        """[weight] or [weight, bias]."""
        return [self.weight] if self.bias is None else [self.weight, self.bias]

    def __repr__(self):
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
        return (f"Conv2d({self.in_channels}, {self.out_channels}, "
                f"kernel_size={self.kernel_size}{extra})")


# The other layers and the optimizers (python/fastmetal/layers.py, optim.py).
from .layers import *  # noqa: E402,F401,F403
from .layers import __all__ as _layer_names  # noqa: E402
from . import optim  # noqa: E402,F401

__all__ += [*_layer_names, "optim"]


def __dir__():
    return sorted(__all__)
