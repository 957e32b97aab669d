"""The loss Modules, as ``torch.nn``'s: each calls its function of fastmetal/ops/losses.py
(``cross_entropy``: ops/training.py), with ``reduction`` chosen when it is built."""
from __future__ import annotations

from ...ops.losses import (REDUCTIONS, binary_cross_entropy, binary_cross_entropy_with_logits,
                           huber_loss, kl_div, l1_loss, mse_loss, nll_loss, smooth_l1_loss)
from ...ops.training import cross_entropy
from .module import Module

__all__ = ["CrossEntropyLoss", "MSELoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss", "L1Loss",
           "SmoothL1Loss", "HuberLoss", "KLDivLoss"]


class _Loss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        if reduction not in REDUCTIONS:
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
        # the mean over N (cross_entropy checked the (N, C) shape) times N
        return loss * float(len(logits)) if self.reduction == "sum" else loss


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


class L1Loss(_Loss):
    """:func:`~fastmetal.nn.functional.l1_loss` as a Module."""

    def forward(self, input, target):
        return l1_loss(input, target, self.reduction)


class SmoothL1Loss(_Loss):
    """:func:`~fastmetal.nn.functional.smooth_l1_loss` as a Module (``reduction``, ``beta``)."""

    def __init__(self, reduction="mean", beta=1.0):
        super().__init__(reduction)
        self.beta = beta

    def forward(self, input, target):
        return smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(_Loss):
    """:func:`~fastmetal.nn.functional.huber_loss` as a Module (``reduction``, ``delta``)."""

    def __init__(self, reduction="mean", delta=1.0):
        super().__init__(reduction)
        self.delta = delta

    def forward(self, input, target):
        return huber_loss(input, target, self.reduction, self.delta)


class KLDivLoss(Module):
    """:func:`~fastmetal.nn.functional.kl_div` as a Module (``reduction`` may also be
    ``"batchmean"``; ``log_target``)."""

    def __init__(self, reduction="mean", log_target=False):
        super().__init__()
        if reduction not in (*REDUCTIONS, "batchmean"):
            raise ValueError("[fastmetal.nn.KLDivLoss] expected reduction 'mean', 'batchmean', "
                             f"'sum' or 'none', got {reduction!r}")
        self.reduction, self.log_target = reduction, log_target

    def forward(self, input, target):
        return kl_div(input, target, self.reduction, self.log_target)
