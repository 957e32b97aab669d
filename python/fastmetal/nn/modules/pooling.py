"""Pooling layers, as ``torch.nn``'s: MaxPool2d."""
from __future__ import annotations

from ...ops import training as F
from .module import Module

__all__ = ['MaxPool2d']


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
