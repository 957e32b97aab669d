"""Learning-rate schedules, as ``torch.optim.lr_scheduler``'s: each changes the ``lr`` of its
optimizer's param groups when ``step()`` is called (after ``optimizer.step()``), giving the
same sequence of learning rates as PyTorch's (their recursive "chainable" forms, so that
schedules compose the same way). ``get_last_lr()``, ``state_dict()``,
``load_state_dict()``."""
from __future__ import annotations

import math
import numbers
from collections import Counter

import numpy as np

from ..ops.checks import positive_int
from .optimizer import Optimizer, _number

__all__ = ["LRScheduler", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
           "LambdaLR", "LinearLR", "OneCycleLR", "ReduceLROnPlateau"]


def _check_optimizer(optimizer, cls):
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"[fastmetal.optim.lr_scheduler.{cls}] expected a fastmetal.optim "
                        f"optimizer, got {type(optimizer).__name__}")


class LRScheduler:
    """Base class: ``base_lrs`` (each group's ``initial_lr``), ``last_epoch`` (the number of
    ``step()`` calls; the constructor makes the first, to epoch 0) and ``get_lr()``, the
    groups' learning rates at ``last_epoch``."""

    def __init__(self, optimizer, last_epoch=-1):
        cls = type(self).__name__
        _check_optimizer(optimizer, cls)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        elif any("initial_lr" not in g for g in optimizer.param_groups):
            raise KeyError(f"[fastmetal.optim.lr_scheduler.{cls}] expected param groups with "
                           "'initial_lr' when resuming (last_epoch != -1), got none")
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self.step()

    def get_lr(self):
        # The one method a schedule defines (as torch's LRScheduler): the group lrs now.
        raise NotImplementedError(f"[fastmetal.optim.lr_scheduler.{type(self).__name__}] "
                                  "expected a get_lr() method returning one learning rate per "
                                  "param group, got a subclass without one")

    def get_last_lr(self):
        """The learning rates the last ``step()`` set, one per param group."""
        return list(self._last_lr)

    def step(self):
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self):
        """Everything but the optimizer (and functions: LambdaLR's lambdas)."""
        return {k: v for k, v in self.__dict__.items()
                if k != "optimizer" and not callable(v) and k != "lr_lambdas"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)


class StepLR(LRScheduler):
    """Every ``step_size`` epochs the learning rate is multiplied by ``gamma``."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        _check_optimizer(optimizer, "StepLR")
        self.step_size = positive_int(step_size, "step_size", "optim.StepLR")
        self.gamma = _number(gamma, "gamma", "StepLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]


class MultiStepLR(LRScheduler):
    """The learning rate is multiplied by ``gamma`` at each epoch in ``milestones``."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        _check_optimizer(optimizer, "MultiStepLR")
        self.milestones = Counter(positive_int(m, "milestones", "optim.MultiStepLR")
                                  for m in milestones)
        self.gamma = _number(gamma, "gamma", "MultiStepLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return [g["lr"] for g in self.optimizer.param_groups]
        factor = self.gamma ** self.milestones[self.last_epoch]
        return [g["lr"] * factor for g in self.optimizer.param_groups]


class ExponentialLR(LRScheduler):
    """The learning rate is multiplied by ``gamma`` every epoch."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        _check_optimizer(optimizer, "ExponentialLR")
        self.gamma = _number(gamma, "gamma", "ExponentialLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]


class CosineAnnealingLR(LRScheduler):
    """``eta_min + (base_lr - eta_min) (1 + cos(pi t / T_max)) / 2``, as PyTorch's (its
    recursive form, which keeps going past ``T_max`` as a cosine of period ``2 T_max``)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):  # noqa: N803
        _check_optimizer(optimizer, "CosineAnnealingLR")
        self.T_max = positive_int(T_max, "T_max", "optim.CosineAnnealingLR")
        self.eta_min = _number(eta_min, "eta_min", "CosineAnnealingLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        groups, t, T, lo = self.optimizer.param_groups, self.last_epoch, self.T_max, self.eta_min
        if t == 0:
            return [g["lr"] for g in groups]
        if self._step_count == 1 and t > 0:
            return [lo + (base - lo) * (1 + math.cos(t * math.pi / T)) / 2
                    for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [g["lr"] + (base - lo) * (1 - math.cos(math.pi / T)) / 2
                    for base, g in zip(self.base_lrs, groups)]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
                * (g["lr"] - lo) + lo for g in groups]


class LambdaLR(LRScheduler):
    """``base_lr * lr_lambda(epoch)``; one function, or one per param group."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        _check_optimizer(optimizer, "LambdaLR")
        n = len(optimizer.param_groups)
        fns = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(fns) != n or not all(callable(f) for f in fns):
            raise ValueError(f"[fastmetal.optim.lr_scheduler.LambdaLR] expected a function or "
                             f"{n} functions (one per param group), got {lr_lambda!r}")
        self.lr_lambdas = fns
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self.lr_lambdas)]


class LinearLR(LRScheduler):
    """The learning rate's factor goes linearly from ``start_factor`` to ``end_factor`` over
    ``total_iters`` epochs, then stays."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        _check_optimizer(optimizer, "LinearLR")
        self.start_factor = _number(start_factor, "start_factor", "LinearLR", 0.0, 1.0)
        self.end_factor = _number(end_factor, "end_factor", "LinearLR", 0.0, 1.0)
        if self.start_factor == 0.0:
            raise ValueError("[fastmetal.optim.lr_scheduler.LinearLR] expected start_factor "
                             "in (0, 1], got 0")
        self.total_iters = positive_int(total_iters, "total_iters", "optim.LinearLR")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        groups, t = self.optimizer.param_groups, self.last_epoch
        s, e, n = self.start_factor, self.end_factor, self.total_iters
        if t == 0:
            return [g["lr"] * s for g in groups]
        if t > n:
            return [g["lr"] for g in groups]
        return [g["lr"] * (1.0 + (e - s) / (n * s + (t - 1) * (e - s))) for g in groups]


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith and Topin), as PyTorch's: from ``max_lr / div_factor`` up to
    ``max_lr`` over ``pct_start`` of the steps, then down to ``initial_lr /
    final_div_factor`` (``three_phase``: back to the initial rate first), cosine or linear;
    the momentum (or Adam's beta1) cycles the other way between ``max_momentum`` and
    ``base_momentum``. Called once per batch."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True,
                 base_momentum=0.85, max_momentum=0.95, div_factor=25.0,
                 final_div_factor=1e4, three_phase=False, last_epoch=-1):
        where = "fastmetal.optim.lr_scheduler.OneCycleLR"
        _check_optimizer(optimizer, "OneCycleLR")
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError(f"[{where}] expected total_steps, or epochs and "
                                 "steps_per_epoch, got neither")
            total_steps = positive_int(epochs, "epochs", "optim.OneCycleLR") * \
                positive_int(steps_per_epoch, "steps_per_epoch", "optim.OneCycleLR")
        self.total_steps = positive_int(total_steps, "total_steps", "optim.OneCycleLR")
        pct = _number(pct_start, "pct_start", "OneCycleLR", 0.0, 1.0)
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"[{where}] expected anneal_strategy 'cos' or 'linear', got "
                             f"{anneal_strategy!r}")
        self.anneal_strategy = anneal_strategy
        n = self.total_steps
        if three_phase:
            self._phases = [(float(pct * n) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                            (float(2 * pct * n) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                            (n - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        else:
            self._phases = [(float(pct * n) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                            (n - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
        groups = optimizer.param_groups
        max_lrs = list(max_lr) if isinstance(max_lr, (list, tuple)) else [max_lr] * len(groups)
        if len(max_lrs) != len(groups):
            raise ValueError(f"[{where}] expected max_lr to be a number or one per param group "
                             f"({len(groups)}), got {len(max_lrs)}")
        self.cycle_momentum = bool(cycle_momentum)
        self._use_beta1 = False
        if self.cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(f"[{where}] expected an optimizer with momentum or betas for "
                                 "cycle_momentum=True, got one without")
            self._use_beta1 = "betas" in optimizer.defaults
        if last_epoch == -1:
            for group, top in zip(groups, max_lrs):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
                if self.cycle_momentum:
                    self._set_momentum(group, max_momentum)
                    group["max_momentum"], group["base_momentum"] = max_momentum, base_momentum
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group, value):
        if self._use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"[fastmetal.optim.lr_scheduler.OneCycleLR] expected at most "
                             f"total_steps={self.total_steps} steps, got step {step}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr0, lr1, m0, m1) in enumerate(self._phases):
                if step <= end or i == len(self._phases) - 1:
                    pct = (step - start) / (end - start)
                    lrs.append(self._anneal(group[lr0], group[lr1], pct))
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(group[m0], group[m1], pct))
                    break
                start = end
        return lrs


class ReduceLROnPlateau:
    """Multiply the learning rate by ``factor`` when ``step(metric)`` has not improved for
    ``patience`` epochs (``mode`` "min" or "max"; ``threshold`` relative or absolute), then
    wait ``cooldown`` epochs; never below ``min_lr``, as PyTorch's."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4,
                 threshold_mode="rel", cooldown=0, min_lr=0.0, eps=1e-8):
        where = "fastmetal.optim.lr_scheduler.ReduceLROnPlateau"
        _check_optimizer(optimizer, "ReduceLROnPlateau")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"[{where}] expected mode 'min'/'max' and threshold_mode "
                             f"'rel'/'abs', got {mode!r}, {threshold_mode!r}")
        factor = _number(factor, "factor", "ReduceLROnPlateau")
        if factor >= 1.0:
            raise ValueError(f"[{where}] expected factor < 1, got {factor!r}")
        self.optimizer, self.mode, self.factor = optimizer, mode, factor
        self.patience = int(_number(patience, "patience", "ReduceLROnPlateau"))
        self.threshold, self.threshold_mode = float(threshold), threshold_mode
        self.cooldown = int(_number(cooldown, "cooldown", "ReduceLROnPlateau"))
        n = len(optimizer.param_groups)
        self.min_lrs = list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr] * n
        self.eps = float(eps)
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = self.cooldown_counter = 0
        self.last_epoch = 0
        self._last_lr = [g["lr"] for g in optimizer.param_groups]

    def _better(self, a):
        if self.mode == "min":
            bar = self.best * (1 - self.threshold) if self.threshold_mode == "rel" \
                else self.best - self.threshold
            return a < bar
        bar = self.best * (1 + self.threshold) if self.threshold_mode == "rel" \
            else self.best + self.threshold
        return a > bar

    def step(self, metrics):
        if hasattr(metrics, "item"):
            metrics = metrics.item()
        if isinstance(metrics, (bool, np.bool_)) or not isinstance(metrics, numbers.Real):
            raise TypeError("[fastmetal.optim.lr_scheduler.ReduceLROnPlateau.step] expected "
                            f"the metric as a number, got {metrics!r}")
        current = float(metrics)
        self.last_epoch += 1
        if self._better(current):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for group, floor in zip(self.optimizer.param_groups, self.min_lrs):
                new = max(group["lr"] * self.factor, floor)
                if group["lr"] - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self):
        return list(self._last_lr)

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)
