"""Pooling layers, as ``torch.nn``'s: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d."""
from __future__ import annotations

from ...ops import pooling as _pooling
from ...ops import training as F
from .module import Module

__all__ = ['MaxPool2d', 'AvgPool2d', 'AdaptiveAvgPool2d']


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


class AvgPool2d(Module):
    """:func:`fastmetal.nn.functional.avg_pool2d` as a layer (PyTorch's defaults:
    ``ceil_mode=False``, ``count_include_pad=True``)."""

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        F._pool_spec(kernel_size, stride, padding, "nn.AvgPool2d")  # validate now
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return _pooling.avg_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """:func:`fastmetal.nn.functional.adaptive_avg_pool2d` as a layer; ``output_size`` an int
    or a pair whose ``None`` entries keep the input's size."""

    def __init__(self, output_size):
        super().__init__()
        _pooling._output_size(output_size, 1, 1, "nn.AdaptiveAvgPool2d")  # validate now
        self.output_size = output_size

    def forward(self, x):
        return _pooling.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"
