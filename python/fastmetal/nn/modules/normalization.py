"""Normalization layers over a sample's own values, as ``torch.nn``'s: LayerNorm, GroupNorm
and RMSNorm (PyTorch's parameter names: ``weight``, ``bias``)."""
from __future__ import annotations

import numbers

import numpy as np

from ...ops.checks import check_bool, positive_int
from ...ops.creation import ones, zeros
from ...ops.normalization import group_norm, layer_norm, rms_norm
from .module import Module, Parameter

__all__ = ['LayerNorm', 'GroupNorm', 'RMSNorm']


def _eps(eps, cls, allow_none=False):
    if eps is None and allow_none:
        return None
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"[fastmetal.nn.{cls}] expected eps to be a number >= 0"
                         f"{' or None' if allow_none else ''}, got {eps!r}")
    return float(eps)


def _shape(normalized_shape, cls):
    items = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) \
        else normalized_shape
    try:
        return tuple(positive_int(d, "normalized_shape", cls) for d in items)
    except TypeError:
        raise TypeError(f"[fastmetal.nn.{cls}] expected normalized_shape to be an int or a "
                        f"sequence of positive ints, got {normalized_shape!r}") from None


def _dtype(dtype):
    return "float16" if dtype in ("float16", np.float16) else "float32"


class LayerNorm(Module):
    """Layer normalization over the last dimensions (``normalized_shape``), as
    ``torch.nn.LayerNorm``: ``weight`` (ones) and ``bias`` (zeros) of that shape where
    ``elementwise_affine`` (``bias=False``: no bias)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape, "LayerNorm")
        self.eps = _eps(eps, "LayerNorm")
        check_bool(elementwise_affine, "elementwise_affine", "LayerNorm")
        check_bool(bias, "bias", "LayerNorm")
        self.elementwise_affine = bool(elementwise_affine)
        dt = _dtype(dtype)
        if self.elementwise_affine:
            self.weight = Parameter(ones(self.normalized_shape, dtype=dt, device=device))
            if bias:
                self.bias = Parameter(zeros(self.normalized_shape, dtype=dt, device=device))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class GroupNorm(Module):
    """Group normalization, as ``torch.nn.GroupNorm``: ``num_channels`` in ``num_groups``
    groups (which must divide them), ``weight`` (ones) and ``bias`` (zeros) per channel
    where ``affine``."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None,
                 dtype=None):
        super().__init__()
        self.num_groups = positive_int(num_groups, "num_groups", "GroupNorm")
        self.num_channels = positive_int(num_channels, "num_channels", "GroupNorm")
        if self.num_channels % self.num_groups:
            raise ValueError(f"[fastmetal.nn.GroupNorm] expected num_groups to divide "
                             f"num_channels ({self.num_channels}), got {self.num_groups}")
        self.eps = _eps(eps, "GroupNorm")
        check_bool(affine, "affine", "GroupNorm")
        self.affine = bool(affine)
        dt = _dtype(dtype)
        if self.affine:
            self.weight = Parameter(ones((self.num_channels,), dtype=dt, device=device))
            self.bias = Parameter(zeros((self.num_channels,), dtype=dt, device=device))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x):
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class RMSNorm(Module):
    """Root-mean-square normalization over the last dimensions, as ``torch.nn.RMSNorm``:
    ``x / sqrt(mean(x**2) + eps) * weight``; ``eps=None`` is the machine epsilon of the
    input's dtype; ``weight`` (ones) where ``elementwise_affine``."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape, "RMSNorm")
        self.eps = _eps(eps, "RMSNorm", allow_none=True)
        check_bool(elementwise_affine, "elementwise_affine", "RMSNorm")
        self.elementwise_affine = bool(elementwise_affine)
        if self.elementwise_affine:
            self.weight = Parameter(ones(self.normalized_shape, dtype=_dtype(dtype),
                                         device=device))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")
