"""Pooling layers, as ``torch.nn``'s: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d."""
from __future__ import annotations

import numpy as np

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
    """:func:`fastmetal.nn.functional.avg_pool2d` as a layer, with PyTorch's arguments
    (``ceil_mode``, ``count_include_pad``, ``divisor_override``)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__()
        F._pool_spec(kernel_size, stride, padding, "nn.AvgPool2d")  # validate now
        for name, v in (("ceil_mode", ceil_mode), ("count_include_pad", count_include_pad)):
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError(f"[fastmetal.nn.AvgPool2d] expected {name} to be a bool, got "
                                f"{v!r}")
        if divisor_override is not None and (not F._is_int(divisor_override)
                                             or divisor_override < 1):
            raise ValueError("[fastmetal.nn.AvgPool2d] expected divisor_override to be a "
                             f"positive int or None, got {divisor_override!r}")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = bool(ceil_mode), bool(count_include_pad)
        self.divisor_override = divisor_override

    def forward(self, x):
        return _pooling.avg_pool2d(x, self.kernel_size, self.stride, self.padding,
                                   self.ceil_mode, self.count_include_pad, self.divisor_override)

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
