"""Flatten, as ``torch.nn.Flatten``."""
from __future__ import annotations

import numbers

import numpy as np

from ..._core import Array
from .module import Module

__all__ = ['Flatten']


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
        return x.reshape(new) if isinstance(x, Array) else np.reshape(x, new)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
