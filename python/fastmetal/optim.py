"""Optimizers (``fastmetal.nn.optim``): SGD, Adam and Adadelta with PyTorch's update formulas,
each step one fused kernel per parameter that updates the parameter and its state in place
on the parameter's device (``metal/training.metal``), and the StepLR schedule.

An optimizer takes what ``parameters()`` of a ``fastmetal.nn`` layer returns (or the layer
itself): the parameter ``layer.weight`` has its gradient in ``layer.weight_grad``. Parameters
whose gradient is ``None`` are skipped, as in PyTorch.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _core
from .layers import _check_bool, _positive_int

__all__ = ["Optimizer", "SGD", "Adam", "Adadelta", "StepLR"]


def _number(value, name, cls, low=0.0, high=math.inf, high_open=False):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"[fastmetal.nn.optim.{cls}] expected {name} to be a number, "
                        f"got {value!r}")
    v = float(value)
    if not (low <= v and (v < high if high_open else v <= high)):
        bracket = ")" if high_open else "]"
        raise ValueError(f"[fastmetal.nn.optim.{cls}] expected {name} in [{low}, {high}"
                         f"{bracket}, got {value!r}")
    return v


def _slots_of(params, cls):
    from .layers import Parameters, _slots  # layers imports nothing from here
    if isinstance(params, Parameters):
        slots = list(params.slots)
    elif callable(getattr(params, "parameters", None)):
        ps = params.parameters()
        slots = list(ps.slots) if isinstance(ps, Parameters) else _slots(params)
    else:
        raise TypeError(f"[fastmetal.nn.optim.{cls}] expected what parameters() of a "
                        f"fastmetal.nn layer returns (or the layer), got "
                        f"{type(params).__name__}")
    if not slots:
        raise ValueError(f"[fastmetal.nn.optim.{cls}] expected at least one parameter, got none")
    return slots


def _zeros_like(p):
    if isinstance(p, _core.Array):
        return _core.zeros(p.shape, device=p.device)
    return np.zeros(np.shape(p), np.float32)


class Optimizer:
    """Base class: ``param_groups[0]`` holds the hyper-parameters (``lr`` is what StepLR
    changes), ``state[i]`` the per-parameter buffers."""

    _kind = ""

    def __init__(self, params, defaults):
        self._slots = _slots_of(params, type(self).__name__)
        self.param_groups = [dict(defaults)]
        self.state = [dict() for _ in self._slots]

    @property
    def lr(self):
        return self.param_groups[0]["lr"]

    def zero_grad(self):
        """Forget the gradients (set ``<name>_grad`` of every parameter to None)."""
        for owner, name in self._slots:
            setattr(owner, name + "_grad", None)

    def step(self):
        group = self.param_groups[0]
        for i, (owner, name) in enumerate(self._slots):
            grad = getattr(owner, name + "_grad", None)
            if grad is None:
                continue
            param = getattr(owner, name)
            state = self.state[i]
            s1, s2, hyper = self._prepare(param, state, group)
            _core._optimizer_step(self._kind, param, grad, s1, s2, hyper)
            self._after(state)

    def _after(self, state):
        pass


class SGD(Optimizer):
    """``torch.optim.SGD``: ``g = grad + weight_decay * p``; with momentum, ``buf = g`` on the
    first step, then ``buf = momentum * buf + (1 - dampening) * g``, and ``g = buf`` (or
    ``g + momentum * buf`` with ``nesterov``); ``p -= lr * g``."""

    _kind = "sgd"

    def __init__(self, params, lr=1e-3, momentum=0.0, weight_decay=0.0, *, dampening=0.0,
                 nesterov=False):
        lr = _number(lr, "lr", "SGD")
        momentum = _number(momentum, "momentum", "SGD")
        weight_decay = _number(weight_decay, "weight_decay", "SGD")
        dampening = _number(dampening, "dampening", "SGD")
        _check_bool(nesterov, "nesterov", "optim.SGD")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("[fastmetal.nn.optim.SGD] expected momentum > 0 and dampening 0 "
                             f"with nesterov, got momentum={momentum}, dampening={dampening}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      dampening=dampening, nesterov=bool(nesterov)))

    def _prepare(self, param, state, group):
        first = 0
        if group["momentum"] != 0 and "momentum_buffer" not in state:
            state["momentum_buffer"] = _zeros_like(param)
            first = 1
        buf = state.get("momentum_buffer")
        hyper = dict(lr=group["lr"], momentum=group["momentum"], dampening=group["dampening"],
                     weight_decay=group["weight_decay"], nesterov=float(group["nesterov"]),
                     first=float(first))
        return (buf if buf is not None else _zeros_like_cached(state, param)), None, hyper


def _zeros_like_cached(state, param):
    # SGD without momentum binds an unused state buffer.
    if "_unused" not in state:
        state["_unused"] = _zeros_like(param)
    return state["_unused"]


class Adam(Optimizer):
    """``torch.optim.Adam`` (``amsgrad=False``): ``m = lerp(m, g, 1 - beta1)``, ``v = beta2 v +
    (1 - beta2) g^2``, ``p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``
    with ``g = grad + weight_decay * p``."""

    _kind = "adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        lr = _number(lr, "lr", "Adam")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"[fastmetal.nn.optim.Adam] expected betas to be a pair of "
                             f"numbers in [0, 1), got {betas!r}")
        b1 = _number(betas[0], "betas[0]", "Adam", 0.0, 1.0, high_open=True)
        b2 = _number(betas[1], "betas[1]", "Adam", 0.0, 1.0, high_open=True)
        eps = _number(eps, "eps", "Adam")
        weight_decay = _number(weight_decay, "weight_decay", "Adam")
        super().__init__(params, dict(lr=lr, betas=(b1, b2), eps=eps, weight_decay=weight_decay))

    def _prepare(self, param, state, group):
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = _zeros_like(param)
            state["exp_avg_sq"] = _zeros_like(param)
        t = state["step"] + 1
        b1, b2 = group["betas"]
        hyper = dict(lr=group["lr"], beta1=b1, beta2=b2, eps=group["eps"],
                     weight_decay=group["weight_decay"],
                     step_size=group["lr"] / (1.0 - b1 ** t),
                     sqrt_bias2=math.sqrt(1.0 - b2 ** t))
        return state["exp_avg"], state["exp_avg_sq"], hyper

    def _after(self, state):
        state["step"] += 1


class Adadelta(Optimizer):
    """``torch.optim.Adadelta``: ``sq = rho sq + (1 - rho) g^2``, ``delta = sqrt(acc + eps) /
    sqrt(sq + eps) * g``, ``acc = rho acc + (1 - rho) delta^2``, ``p -= lr * delta`` with
    ``g = grad + weight_decay * p``."""

    _kind = "adadelta"

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0):
        lr = _number(lr, "lr", "Adadelta")
        rho = _number(rho, "rho", "Adadelta", 0.0, 1.0)
        eps = _number(eps, "eps", "Adadelta")
        weight_decay = _number(weight_decay, "weight_decay", "Adadelta")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay))

    def _prepare(self, param, state, group):
        if "square_avg" not in state:
            state["square_avg"] = _zeros_like(param)
            state["acc_delta"] = _zeros_like(param)
        hyper = dict(lr=group["lr"], rho=group["rho"], eps=group["eps"],
                     weight_decay=group["weight_decay"])
        return state["square_avg"], state["acc_delta"], hyper


class StepLR:
    """``torch.optim.lr_scheduler.StepLR``: every ``step_size`` calls of :meth:`step` the
    learning rate is multiplied by ``gamma`` (applied recursively, as PyTorch)."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"[fastmetal.nn.optim.StepLR] expected a fastmetal.nn.optim "
                            f"optimizer, got {type(optimizer).__name__}")
        self.step_size = _positive_int(step_size, "step_size", "optim.StepLR")
        self.optimizer = optimizer
        self.gamma = _number(gamma, "gamma", "StepLR")
        self.base_lr = optimizer.param_groups[0]["lr"]
        self.last_epoch = 0

    def step(self):
        self.last_epoch += 1
        if self.last_epoch % self.step_size == 0:
            self.optimizer.param_groups[0]["lr"] *= self.gamma

    def get_last_lr(self):
        return [self.optimizer.param_groups[0]["lr"]]
