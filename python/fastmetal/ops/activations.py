"""Activation functions with a parameter, as ``torch.nn.functional``'s: ``leaky_relu`` and
``elu``, built from the op table's differentiable functions (``silu`` and the others
without a parameter are lines of the table), and ``dropout2d``, which zeroes whole
channels with a mask drawn from ``fastmetal.random`` (so ``fm.manual_seed`` fixes it)."""
from __future__ import annotations

import numpy as np

from .. import _core
from . import random as _random
from .checks import real_number
from .elementwise import FUNCTIONS as E
from .manipulation import where

__all__ = ["leaky_relu", "elu", "dropout2d"]


def leaky_relu(input, negative_slope=0.01):  # noqa: A002 (PyTorch's name)
    """``x`` where ``x > 0``, else ``negative_slope * x``, as
    ``torch.nn.functional.leaky_relu`` (gradient ``negative_slope`` at 0, as PyTorch's)."""
    slope = real_number(negative_slope, "negative_slope", "leaky_relu")
    return where(E["greater"](input, 0.0), input, E["multiply"](input, slope))


def elu(input, alpha=1.0):  # noqa: A002 (PyTorch's name)
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``, as ``torch.nn.functional.elu``.
    The exponential only sees the non-positive part, so no overflow reaches the gradient."""
    alpha = real_number(alpha, "alpha", "elu")
    positive = E["greater"](input, 0.0)
    tail = where(positive, 0.0, input)
    return where(positive, input, E["multiply"](E["subtract"](E["exp"](tail), 1.0), alpha))


def dropout2d(input, p=0.5, training=True):  # noqa: A002 (PyTorch's name)
    """Zero each channel of ``(N, C, H, W)`` (or ``(C, H, W)``) input with probability ``p``
    and scale the rest by ``1 / (1 - p)``, as ``torch.nn.functional.dropout2d``: one draw per
    (sample, channel) from ``fastmetal.random``'s generator. Identity when not ``training``."""
    op = "dropout2d"
    p = real_number(p, "p", op)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"[fastmetal.{op}] expected p in [0, 1], got {p!r}")
    shape = tuple(input.shape) if hasattr(input, "shape") else np.shape(input)
    if len(shape) not in (3, 4):
        raise ValueError(f"[fastmetal.{op}] expected (N, C, H, W) or (C, H, W) input, got "
                         f"shape {shape}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return E["multiply"](input, 0.0)
    device = input.device if isinstance(input, _core.Array) else None
    keep = _random.bernoulli(1.0 - p, shape[:-2] + (1, 1), device=device)
    return E["multiply"](input, E["multiply"](keep, 1.0 / (1.0 - p)))
