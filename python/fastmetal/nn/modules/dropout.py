"""Dropout layers, as ``torch.nn``'s."""
from __future__ import annotations

from ...ops import training as F
from .. import init
from .module import Module

__all__ = ['Dropout']


class Dropout(Module):
    """:func:`fastmetal.dropout` as a layer: in training mode each call draws a new mask
    (seeds ``seed0, seed0 + 1, ...``, ``seed0`` from ``seed``/``rng``, else from
    ``fastmetal.random``, which ``fm.random.seed`` seeds: a seed makes the whole
    sequence reproducible on every device); in eval mode the identity."""

    def __init__(self, p=0.5, *, seed=None, rng=None):
        super().__init__()
        F._dropout_key(p, 0, "nn.Dropout")
        self.p = float(p)
        rng = init._rng_for("Dropout", seed, rng)
        self._next_seed = init._seed_for(rng)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        seed = self._next_seed
        self._next_seed = (seed + 1) % 2**64
        return F.dropout(x, self.p, seed=seed)

    def extra_repr(self):
        return f"p={self.p}"
