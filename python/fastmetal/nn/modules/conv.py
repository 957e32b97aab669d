"""Convolution layers, as ``torch.nn``'s: Conv2d, Conv1d, ConvTranspose2d."""
from __future__ import annotations

import math

from ...ops.checks import check_bool, positive_int
from ...ops.conv import conv1d as _conv1d
from ...ops.conv import conv2d as _conv2d
from ...ops.conv import conv_transpose2d as _conv_transpose2d
from ...ops.conv import _single, conv2d_spec, conv_transpose2d_spec
from .. import init
from .module import Module

__all__ = ['Conv2d', 'Conv1d', 'ConvTranspose2d']


def _kernel_size(value, cls="Conv2d", n=2):
    if isinstance(value, (tuple, list)):
        if len(value) != n:
            what = "a pair of 2 ints" if n == 2 else "a 1-tuple"
            raise ValueError(f"[fastmetal.nn.{cls}] expected kernel_size to be an int or {what}, "
                             f"got {len(value)} values: {value!r}")
        return tuple(positive_int(v, "kernel_size", cls) for v in value)
    k = positive_int(value, "kernel_size", cls)
    return (k,) * n


def _channels(module, cls):
    """in/out channels divisible by groups, as PyTorch checks them."""
    if module.in_channels % module.groups:
        raise ValueError(f"[fastmetal.nn.{cls}] expected in_channels ({module.in_channels}) "
                         f"to be divisible by groups ({module.groups})")
    if module.out_channels % module.groups:
        raise ValueError(f"[fastmetal.nn.{cls}] expected out_channels "
                         f"({module.out_channels}) to be divisible by groups ({module.groups})")


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
        _channels(self, "Conv2d")
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
        return _conv_repr(self, (("stride", (1, 1)), ("padding", (0, 0)), ("dilation", (1, 1)),
                                 ("groups", 1)))


class Conv1d(Module):
    """1-D convolution layer, as ``torch.nn.Conv1d`` (``padding_mode="zeros"``): weight
    ``(out_channels, in_channels // groups, kernel_size)``, bias ``(out_channels,)`` or None,
    both uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``, ``fan_in = in_channels // groups *
    kernel_size`` (PyTorch's default initialisation)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, *, seed=None, rng=None, device=None):
        super().__init__()
        self.in_channels = positive_int(in_channels, "in_channels", "Conv1d")
        self.out_channels = positive_int(out_channels, "out_channels", "Conv1d")
        self.kernel_size = _kernel_size(kernel_size, "Conv1d", 1)
        # conv2d's checks on the unit-height pairs; stored as 1-tuples, as PyTorch's.
        s, p, d = (_single(v, n, "nn.Conv1d") for v, n in
                   ((stride, "stride"), (padding, "padding"), (dilation, "dilation")))
        (_, s), p, (_, d), self.groups = conv2d_spec(
            (1, s), p if isinstance(p, str) else (0, p), (1, d), groups, "nn.Conv1d")
        self.stride, self.dilation = (s,), (d,)
        self.padding = p if isinstance(p, str) else (p[1],)
        _channels(self, "Conv1d")
        check_bool(bias, "bias", "Conv1d")
        rng = init._rng_for("Conv1d", seed, rng)
        bound = 1.0 / math.sqrt(self.in_channels // self.groups * self.kernel_size[0])
        shape = (self.out_channels, self.in_channels // self.groups, self.kernel_size[0])
        self.weight = init._uniform_parameter(rng, bound, shape, device)
        self.bias = init._uniform_parameter(rng, bound, (self.out_channels,), device) if bias \
            else None

    def forward(self, x):
        padding = self.padding if isinstance(self.padding, str) else self.padding[0]
        return _conv1d(x, self.weight, self.bias, stride=self.stride[0], padding=padding,
                       dilation=self.dilation[0], groups=self.groups)

    def extra_repr(self):
        return _conv_repr(self, (("stride", (1,)), ("padding", (0,)), ("dilation", (1,)),
                                 ("groups", 1)))


class ConvTranspose2d(Module):
    """2-D transposed convolution layer, as ``torch.nn.ConvTranspose2d``: weight
    ``(in_channels, out_channels // groups, kH, kW)``, bias ``(out_channels,)`` or None, both
    uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]`` with PyTorch's ``fan_in`` for this
    weight, ``out_channels // groups * kH * kW``. ``forward(x, output_size=None)``:
    ``output_size`` (the last two entries used) picks the output_padding that gives that
    size, as PyTorch."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, *, seed=None, rng=None,
                 device=None):
        super().__init__()
        self.in_channels = positive_int(in_channels, "in_channels", "ConvTranspose2d")
        self.out_channels = positive_int(out_channels, "out_channels", "ConvTranspose2d")
        self.kernel_size = _kernel_size(kernel_size, "ConvTranspose2d")
        (self.stride, self.padding, self.output_padding, self.groups,
         self.dilation) = conv_transpose2d_spec(stride, padding, output_padding, groups,
                                                dilation, "nn.ConvTranspose2d")
        _channels(self, "ConvTranspose2d")
        check_bool(bias, "bias", "ConvTranspose2d")
        rng = init._rng_for("ConvTranspose2d", seed, rng)
        kh, kw = self.kernel_size
        bound = 1.0 / math.sqrt(self.out_channels // self.groups * kh * kw)
        shape = (self.in_channels, self.out_channels // self.groups, kh, kw)
        self.weight = init._uniform_parameter(rng, bound, shape, device)
        self.bias = init._uniform_parameter(rng, bound, (self.out_channels,), device) if bias \
            else None

    def _output_padding(self, x, output_size):
        """PyTorch's rule: the output_padding (below the stride) that reaches output_size."""
        if output_size is None:
            return self.output_padding
        size = [int(v) for v in output_size][-2:]
        if len(size) != 2:
            raise ValueError(f"[fastmetal.nn.ConvTranspose2d] expected output_size to end with "
                             f"(H_out, W_out), got {output_size!r}")
        pads = []
        for d in range(2):
            n = x.shape[-2 + d]
            least = (n - 1) * self.stride[d] - 2 * self.padding[d] + \
                self.dilation[d] * (self.kernel_size[d] - 1) + 1
            if not least <= size[d] < least + self.stride[d]:
                raise ValueError(f"[fastmetal.nn.ConvTranspose2d] expected output_size between "
                                 f"{least} and {least + self.stride[d] - 1} on axis {d}, got "
                                 f"{output_size!r}")
            pads.append(size[d] - least)
        return tuple(pads)

    def forward(self, x, output_size=None):
        return _conv_transpose2d(x, self.weight, self.bias, stride=self.stride,
                                 padding=self.padding,
                                 output_padding=self._output_padding(x, output_size),
                                 groups=self.groups, dilation=self.dilation)

    def extra_repr(self):
        return _conv_repr(self, (("stride", None), ("padding", (0, 0)), ("output_padding", (0, 0)),
                                 ("dilation", (1, 1)), ("groups", 1)))


def _conv_repr(m, defaults):
    """PyTorch's extra_repr of a convolution: channels and kernel, then each option that
    differs from its default (a default of None: always shown), then bias=False."""
    extra = "".join(f", {name}={getattr(m, name)!r}" for name, default in defaults
                    if default is None or getattr(m, name) != default)
    if m.bias is None:
        extra += ", bias=False"
    return f"{m.in_channels}, {m.out_channels}, kernel_size={m.kernel_size}{extra}"
