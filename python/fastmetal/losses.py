"""Loss functions, as ``torch.nn.functional``'s (the functions) and ``torch.nn``'s (the
Modules): binary cross-entropy on probabilities and on logits, mean squared error and
negative log-likelihood; ``fastmetal.cross_entropy`` (training.py) is the fused one.

Each loss is built from differentiable ops (the elementwise kernels ``bce``,
``bce_logits`` of ``metal/elementwise_ops.tbl`` carry their own gradients), so its gradient
needs no code here. ``reduction`` is ``"mean"`` (default), ``"sum"`` or ``"none"``.
"""
from __future__ import annotations

import numpy as np

from . import _core
from ._elementwise import FUNCTIONS as _E
from .module import Module
from .reductions import mean as _mean
from .reductions import sum as _sum
from .training import _labels, cross_entropy

__all__ = ["binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss", "nll_loss"]
MODULES = ["CrossEntropyLoss", "MSELoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss"]
_REDUCTIONS = ("mean", "sum", "none")


def _shape(a):
    return tuple(a.shape) if hasattr(a, "shape") else np.shape(a)


def _check(op, input, target, reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"[fastmetal.{op}] expected reduction 'mean', 'sum' or 'none', got "
                         f"{reduction!r}")
    if _shape(input) != _shape(target):
        raise ValueError(f"[fastmetal.{op}] expected target of the input's shape "
                         f"{_shape(input)}, got {_shape(target)}")


def _reduce(loss, reduction):
    if reduction == "mean":
        return _mean(loss)
    if reduction == "sum":
        return _sum(loss)
    return loss


def _weighted(loss, weight):
    return loss if weight is None else loss * weight


def binary_cross_entropy(input, target, weight=None, reduction="mean"):
    """``-(t log(x) + (1 - t) log(1 - x))`` of probabilities ``input`` against ``target`` (same
    shape), times ``weight`` (broadcast), reduced, as ``torch.nn.functional.binary_cross_entropy``.
    Each log is clamped at -100 as PyTorch's, so a saturated sigmoid (0 or 1) gives a finite
    loss; the gradient ``(x - t) / max(x (1 - x), 1e-12)`` is PyTorch's too. Inputs outside
    [0, 1] give NaN (PyTorch raises)."""
    _check("binary_cross_entropy", input, target, reduction)
    return _reduce(_weighted(_E["bce"](input, target), weight), reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean",
                                     pos_weight=None):
    """Binary cross-entropy of ``sigmoid(input)`` computed from the logits without overflow:
    ``softplus(x) - x t`` (with ``pos_weight`` p: ``(1 - t) x + (1 + (p - 1) t) softplus(-x)``),
    times ``weight``, reduced, as ``torch.nn.functional.binary_cross_entropy_with_logits``."""
    _check("binary_cross_entropy_with_logits", input, target, reduction)
    if pos_weight is None:
        loss = _E["bce_logits"](input, target)
    else:
        log_weight = (pos_weight - 1.0) * target + 1.0
        loss = (1.0 - target) * input + log_weight * _E["softplus"](-input)
    return _reduce(_weighted(loss, weight), reduction)


def mse_loss(input, target, reduction="mean"):
    """``(input - target)**2`` reduced, as ``torch.nn.functional.mse_loss`` (same shapes)."""
    _check("mse_loss", input, target, reduction)
    return _reduce(_E["square"](input - target) if isinstance(input, _core.Array) else
                   _E["square"](_E["subtract"](input, target)), reduction)


def nll_loss(input, target, reduction="mean"):
    """Negative log-likelihood of ``(N, C)`` log-probabilities at ``N`` integer class labels,
    ``-input[i, target[i]]`` reduced, as ``torch.nn.functional.nll_loss``."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"[fastmetal.nll_loss] expected reduction 'mean', 'sum' or 'none', "
                         f"got {reduction!r}")
    shape = _shape(input)
    labels = _labels(target, "nll_loss")
    if len(shape) != 2 or labels.shape != (shape[0],):
        raise ValueError(f"[fastmetal.nll_loss] expected input (N, C) and target (N,), got "
                         f"{shape} and {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= shape[1]):
        raise ValueError(f"[fastmetal.nll_loss] expected target in [0, {shape[1]}), got "
                         f"{labels[(labels < 0) | (labels >= shape[1])][0]}")
    # One-hot selection: a product with a host-made 0/1 mask, so the gradient is a mask too.
    one_hot = np.zeros(shape, np.float32)
    one_hot[np.arange(shape[0]), labels] = -1.0
    if isinstance(input, _core.Array):
        one_hot = _core.asarray(one_hot, device=input.device)
    picked = _sum(input * one_hot if isinstance(input, _core.Array) else
                  _E["multiply"](input, one_hot), axis=1)
    return _reduce(picked, reduction)


class _Loss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"[fastmetal.nn.{type(self).__name__}] expected reduction "
                             f"'mean', 'sum' or 'none', got {reduction!r}")
        self.reduction = reduction

    def extra_repr(self):
        return "" if self.reduction == "mean" else f"reduction={self.reduction!r}"


class CrossEntropyLoss(_Loss):
    """:func:`fastmetal.cross_entropy` as a Module: ``loss_fn(logits, labels)`` returns the
    loss (reduction ``"mean"`` or ``"sum"``)."""

    def __init__(self, reduction="mean"):
        super().__init__(reduction)
        if reduction == "none":
            raise ValueError("[fastmetal.nn.CrossEntropyLoss] expected reduction 'mean' or "
                             "'sum', got 'none'")

    def forward(self, logits, labels):
        loss = cross_entropy(logits, labels)
        return loss * float(_shape(logits)[0]) if self.reduction == "sum" else loss


class MSELoss(_Loss):
    """:func:`mse_loss` as a Module."""

    def forward(self, input, target):
        return mse_loss(input, target, self.reduction)


class NLLLoss(_Loss):
    """:func:`nll_loss` as a Module."""

    def forward(self, input, target):
        return nll_loss(input, target, self.reduction)


class BCELoss(_Loss):
    """:func:`binary_cross_entropy` as a Module (``weight``, ``reduction``)."""

    def __init__(self, weight=None, reduction="mean"):
        super().__init__(reduction)
        self.weight_ = weight

    def forward(self, input, target):
        return binary_cross_entropy(input, target, self.weight_, self.reduction)


class BCEWithLogitsLoss(_Loss):
    """:func:`binary_cross_entropy_with_logits` as a Module (``weight``, ``reduction``,
    ``pos_weight``)."""

    def __init__(self, weight=None, reduction="mean", pos_weight=None):
        super().__init__(reduction)
        self.weight_, self.pos_weight = weight, pos_weight

    def forward(self, input, target):
        return binary_cross_entropy_with_logits(input, target, self.weight_, self.reduction,
                                                self.pos_weight)
