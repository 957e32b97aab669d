"""Learning-rate schedules, as ``torch.optim.lr_scheduler``'s: each changes the ``lr`` of
its optimizer's param groups when ``step()`` is called."""
from __future__ import annotations

from ..ops.checks import positive_int
from .optimizer import Optimizer, _number

__all__ = ['StepLR']


class StepLR:
    """``torch.optim.lr_scheduler.StepLR``: every ``step_size`` calls of :meth:`step` the
    learning rate is multiplied by ``gamma`` (applied recursively, as PyTorch)."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"[fastmetal.nn.optim.StepLR] expected a fastmetal.nn.optim "
                            f"optimizer, got {type(optimizer).__name__}")
        self.step_size = positive_int(step_size, "step_size", "optim.StepLR")
        self.optimizer = optimizer
        self.gamma = _number(gamma, "gamma", "StepLR")
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_epoch = 0

    def step(self):
        self.last_epoch += 1
        if self.last_epoch % self.step_size == 0:
            for g in self.optimizer.param_groups:
                g["lr"] *= self.gamma

    def get_last_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]
