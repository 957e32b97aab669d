"""Resampling layers, as ``torch.nn``'s: Upsample (nearest, linear, bilinear)."""
from __future__ import annotations

from ...ops import pooling as _pooling
from .module import Module

__all__ = ['Upsample']


class Upsample(Module):
    """:func:`fastmetal.nn.functional.interpolate` as a layer, as ``torch.nn.Upsample``:
    exactly one of ``size`` and ``scale_factor``; ``mode`` ``"nearest"``, ``"linear"``
    (3-D input) or ``"bilinear"`` (4-D), ``align_corners`` for the linear modes."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None):
        super().__init__()
        if (size is None) == (scale_factor is None):
            raise ValueError("[fastmetal.nn.Upsample] expected exactly one of size and "
                             f"scale_factor, got size={size!r}, scale_factor={scale_factor!r}")
        if mode not in _pooling._MODES:
            raise ValueError(f"[fastmetal.nn.Upsample] expected mode to be one of "
                             f"{sorted(_pooling._MODES)}, got mode={mode!r}")
        if mode == "nearest" and align_corners is not None:
            raise ValueError("[fastmetal.nn.Upsample] expected align_corners=None with "
                             f"mode='nearest', got align_corners={align_corners!r}")
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners = align_corners

    def forward(self, x):
        return _pooling.interpolate(x, self.size, self.scale_factor, self.mode,
                                    self.align_corners)

    def extra_repr(self):
        what = f"size={self.size!r}" if self.size is not None else \
            f"scale_factor={self.scale_factor!r}"
        return f"{what}, mode={self.mode!r}"
