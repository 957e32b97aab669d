"""Fully connected layers, as ``torch.nn``'s: Linear and Identity."""
from __future__ import annotations

import math

from ...ops.checks import check_bool, positive_int
from ...ops.linalg import linear as _linear
from .. import init
from .module import Module

__all__ = ['Linear', 'Identity']


class Linear(Module):
    """``y = x @ weight.T + bias``, as ``torch.nn.Linear``: weight ``(out_features,
    in_features)``, bias ``(out_features,)``."""

    def __init__(self, in_features, out_features, bias=True, *, seed=None, rng=None,
                 device=None):
        super().__init__()
        self.in_features = positive_int(in_features, "in_features", "Linear")
        self.out_features = positive_int(out_features, "out_features", "Linear")
        check_bool(bias, "bias", "Linear")
        rng = init._rng_for("Linear", seed, rng)
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight = init._uniform_parameter(rng, bound, (self.out_features, self.in_features),
                                         device)
        self.bias = init._uniform_parameter(rng, bound, (self.out_features,), device) if bias \
            else None

    def forward(self, x):
        return _linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Identity(Module):
    """Returns its input (any extra arguments are ignored), as ``torch.nn.Identity``."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x
