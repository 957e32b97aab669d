"""Convolution layers, as ``torch.nn``'s: Conv2d."""
from __future__ import annotations

import math

from ...ops.checks import check_bool, positive_int
from ...ops.conv import conv2d as _conv2d
from ...ops.conv import conv2d_spec
from .. import init
from .module import Module

__all__ = ['Conv2d']


def _kernel_size(value):
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError("[fastmetal.nn.Conv2d] expected kernel_size to be an int or a pair "
                             f"of 2 ints, got {len(value)} values: {value!r}")
        return (positive_int(value[0], "kernel_size", "Conv2d"),
                positive_int(value[1], "kernel_size", "Conv2d"))
    k = positive_int(value, "kernel_size", "Conv2d")
    return (k, k)


class Conv2d(Module):
    """2-D convolution layer, as ``torch.nn.Conv2d`` (``padding_mode="zeros"``); ``padding``
    may also be ``"valid"`` or ``"same"``. weight ``(out_channels, in_channels // groups,
    kH, kW)``, bias ``(out_channels,)`` or None."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, *, seed=None, rng=None, device=None):
        super().__init__()
        self.in_channels = positive_int(in_channels, "in_channels", "Conv2d")
        self.out_channels = positive_int(out_channels, "out_channels", "Conv2d")
        self.kernel_size = _kernel_size(kernel_size)
        # Same checks and normal form as the functional op (stride/padding/dilation/groups).
        self.stride, self.padding, self.dilation, self.groups = conv2d_spec(
            stride, padding, dilation, groups, "nn.Conv2d")
        if self.in_channels % self.groups:
            raise ValueError(f"[fastmetal.nn.Conv2d] expected in_channels ({self.in_channels}) "
                             f"to be divisible by groups ({self.groups})")
        if self.out_channels % self.groups:
            raise ValueError(f"[fastmetal.nn.Conv2d] expected out_channels "
                             f"({self.out_channels}) to be divisible by groups ({self.groups})")
        check_bool(bias, "bias", "Conv2d")
        rng = init._rng_for("Conv2d", seed, rng)
        kh, kw = self.kernel_size
        fan_in = self.in_channels // self.groups * kh * kw
        bound = 1.0 / math.sqrt(fan_in)
        shape = (self.out_channels, self.in_channels // self.groups, kh, kw)
        self.weight = init._uniform_parameter(rng, bound, shape, device)
        self.bias = init._uniform_parameter(rng, bound, (self.out_channels,), device) if bias \
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
