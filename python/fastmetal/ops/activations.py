"""Activation functions with a parameter, as ``torch.nn.functional``'s: ``leaky_relu`` and
``elu``, built from the op table's differentiable functions (``silu`` and the others
without a parameter are lines of the table), and ``dropout2d``, which zeroes whole
channels with a mask drawn from ``fastmetal.random`` (so ``fm.manual_seed`` fixes it)."""
from __future__ import annotations

import warnings

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
    """Zero each channel of ``(N, C, H, W)`` input with probability ``p`` and scale the rest
    by ``1 / (1 - p)``, as ``torch.nn.functional.dropout2d``: one draw per (sample, channel)
    from ``fastmetal.random``'s generator. Identity when not ``training``.

    Other ranks do what PyTorch's do, with its warnings: the first two axes are (sample,
    channel) whatever follows, so 3-D input is ``(N, C, L)`` (channel-wise 1-D dropout, not
    ``(C, H, W)``), and a 2-D ``(N, F)`` input is dropped element by element (PyTorch's
    example ``mnist_rnn`` relies on it). Fewer than 2 axes is a ``ValueError``."""
    op = "dropout2d"
    p = real_number(p, "p", op)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"[fastmetal.{op}] expected p in [0, 1], got {p!r}")
    shape = tuple(input.shape) if hasattr(input, "shape") else np.shape(input)
    if len(shape) < 2:
        raise ValueError(f"[fastmetal.{op}] expected (N, C, H, W) input (at least 2 axes), "
                         f"got shape {shape}")
    if len(shape) not in (3, 4):
        warnings.warn(f"dropout2d: Received a {len(shape)}-D input to dropout2d, which is "
                      "deprecated (PyTorch's warning): dropout2d is channel-wise dropout of "
                      "(N, C, H, W) input; use dropout instead", UserWarning, stacklevel=2)
    if len(shape) == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that "
                      "channel-wise 1D dropout behavior is desired - input is interpreted as "
                      "shape (N, C, L), where C is the channel dim (PyTorch's rule; "
                      "dropout1d says so without a warning)", UserWarning, stacklevel=2)
    mask_shape = shape[:2] + (1,) * (len(shape) - 2)
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return E["multiply"](input, 0.0)
    device = input.device if isinstance(input, _core.Array) else None
    keep = _random.bernoulli(1.0 - p, mask_shape, device=device)
    return E["multiply"](input, E["multiply"](keep, 1.0 / (1.0 - p)))
