"""Dropout layers, as ``torch.nn``'s: Dropout and Dropout2d."""
from __future__ import annotations

from ...ops import activations as A
from ...ops import training as F
from ...ops.capture import dynamic
from .. import init
from ...ops.checks import real_number
from .module import Module

__all__ = ['Dropout', 'Dropout2d']


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
        def draw():  # re-run at each replay of a compiled step (fastmetal.compile)
            seed = self._next_seed
            self._next_seed = (seed + 1) % 2**64
            return F.dropout(x, self.p, seed=seed)

        return dynamic(draw)

    def extra_repr(self):
        return f"p={self.p}"


class Dropout2d(Module):
    """:func:`~fastmetal.nn.functional.dropout2d` as a layer: whole channels zeroed in
    training mode (masks from ``fastmetal.random``), the identity in eval mode."""

    def __init__(self, p=0.5):
        super().__init__()
        real_number(p, "p", "nn.Dropout2d")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"[fastmetal.nn.Dropout2d] expected p in [0, 1], got {p!r}")
        self.p = float(p)

    def forward(self, x):
        return A.dropout2d(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"
