"""Resampling layers, as ``torch.nn``'s: Upsample (nearest)."""
from __future__ import annotations

from ...ops import pooling as _pooling
from .module import Module

__all__ = ['Upsample']


class Upsample(Module):
    """:func:`fastmetal.nn.functional.interpolate` as a layer, as ``torch.nn.Upsample``:
    exactly one of ``size`` and ``scale_factor``; ``mode="nearest"`` only."""

    def __init__(self, size=None, scale_factor=None, mode="nearest"):
        super().__init__()
        if (size is None) == (scale_factor is None):
            raise ValueError("[fastmetal.nn.Upsample] expected exactly one of size and "
                             f"scale_factor, got size={size!r}, scale_factor={scale_factor!r}")
        if mode != "nearest":
            raise ValueError("[fastmetal.nn.Upsample] expected mode='nearest' (the only mode "
                             f"fastmetal has), got mode={mode!r}")
        self.size, self.scale_factor, self.mode = size, scale_factor, mode

    def forward(self, x):
        return _pooling.interpolate(x, self.size, self.scale_factor, self.mode)

    def extra_repr(self):
        what = f"size={self.size!r}" if self.size is not None else \
            f"scale_factor={self.scale_factor!r}"
        return f"{what}, mode={self.mode!r}"
