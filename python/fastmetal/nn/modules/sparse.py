"""Lookup-table layers, as ``torch.nn``'s: Embedding."""
from __future__ import annotations

import numpy as np

from ...autograd.tape import no_grad
from ...ops import embedding as _embedding
from ...ops import random as _random
from ...ops.checks import positive_int
from ...ops.creation import asarray
from .. import init
from .module import Module, Parameter

__all__ = ['Embedding']


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of ``embedding_dim``, as ``torch.nn.Embedding``:
    ``weight`` drawn from N(0, 1) (PyTorch's initialisation), the row ``padding_idx`` (if
    given; negative counts from the end) zero and never updated by a gradient.
    ``forward(ids)`` takes an int64 Array or NumPy integers. ``max_norm`` / ``norm_type``:
    the rows a forward picks are first shortened in place to ``max_norm`` (PyTorch's;
    ``fastmetal.nn.functional.embedding`` says how)."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, *, seed=None, rng=None,
                 device=None):
        super().__init__()
        _embedding._refuse_unbuilt_gradients("fastmetal.nn.Embedding", scale_grad_by_freq, sparse)
        self.max_norm, self.norm_type = max_norm, norm_type
        self.num_embeddings = positive_int(num_embeddings, "num_embeddings", "Embedding")
        self.embedding_dim = positive_int(embedding_dim, "embedding_dim", "Embedding")
        self.padding_idx = None if padding_idx is None else _embedding._padding_idx(
            padding_idx, self.num_embeddings, "nn.Embedding")
        rng = init._rng_for("Embedding", seed, rng)
        shape = (self.num_embeddings, self.embedding_dim)
        if rng is None:
            weight = _random.normal(shape, device=device)
        else:
            weight = asarray(rng.standard_normal(shape).astype(np.float32), device=device)
        self.weight = Parameter(weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx] = 0.0

    def forward(self, input):  # noqa: A002 (PyTorch's name)
        return _embedding.embedding(input, self.weight, self.padding_idx, self.max_norm,
                                    self.norm_type)

    def extra_repr(self):
        extra = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        extra += f", max_norm={self.max_norm}" if self.max_norm is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{extra}"
