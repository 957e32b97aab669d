"""The loss Modules, as ``torch.nn``'s: each calls its function of fastmetal/ops/losses.py,
with ``reduction`` (and the other arguments) chosen when it is built."""
from __future__ import annotations

from ...ops.losses import (REDUCTIONS, binary_cross_entropy, binary_cross_entropy_with_logits,
                           cross_entropy, huber_loss, kl_div, l1_loss, mse_loss, nll_loss,
                           smooth_l1_loss)
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
    """:func:`fastmetal.cross_entropy` as a Module, as ``torch.nn.CrossEntropyLoss``:
    ``weight``, ``ignore_index``, ``reduction`` and ``label_smoothing`` chosen when it is
    built; ``loss_fn(input, target)``."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__(reduction)
        self.weight, self.ignore_index = weight, ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return cross_entropy(input, target, self.weight, self.ignore_index, self.reduction,
                             self.label_smoothing)

    def extra_repr(self):
        parts = [super().extra_repr()] + ([f"ignore_index={self.ignore_index}"]
                                          if self.ignore_index != -100 else []) + \
            ([f"label_smoothing={self.label_smoothing}"] if self.label_smoothing else [])
        return ", ".join(p for p in parts if p)


class MSELoss(_Loss):
    """:func:`mse_loss` as a Module."""

    def forward(self, input, target):
        return mse_loss(input, target, self.reduction)


class NLLLoss(_Loss):
    """:func:`nll_loss` as a Module (``weight``, ``ignore_index``, ``reduction``)."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean"):
        super().__init__(reduction)
        self.weight, self.ignore_index = weight, ignore_index

    def forward(self, input, target):
        return nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


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
