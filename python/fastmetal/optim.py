"""Optimizers (``fastmetal.nn.optim``): SGD, Adam, AdamW and Adadelta with PyTorch's update
formulas, each step one fused kernel per parameter that updates the parameter and its state
in place on the parameter's device (``metal/training.metal``), and the StepLR schedule.

An optimizer takes what PyTorch's take: any iterable of parameters (``model.parameters()``,
a list, the sum of two lists) or of param-group dicts (``{"params": [...], "lr": ...}``,
each group's own hyper-parameters overriding the defaults). ``step()`` reads each
parameter's ``.grad`` (written by ``loss.backward()``) and skips parameters without one.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _core
from ._core import Array
from .layers import _check_bool, _positive_int

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "StepLR"]


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


def _items(params, cls, where=""):
    """The elements of an iterable of parameters (or of param groups), as a list; `where`
    names the group (" for param_groups[i]['params']")."""
    if isinstance(params, Array):
        raise TypeError(f"[fastmetal.nn.optim.{cls}] expected an iterable of parameters{where} "
                        "(model.parameters(), a list), got one Array (wrap it: [p])")
    try:
        return list(params)
    except TypeError:
        raise TypeError(f"[fastmetal.nn.optim.{cls}] expected an iterable of parameters or of "
                        f"param-group dicts{where}, got {type(params).__name__}") from None


def _param_list(params, cls, where):
    items = _items(params, cls, f" for {where}")
    for i, p in enumerate(items):
        if not isinstance(p, Array):
            raise TypeError(f"[fastmetal.nn.optim.{cls}] expected {where} to hold "
                            f"fastmetal.Arrays, got {type(p).__name__} at index {i}")
        if p.dtype not in (np.float32, np.float16):
            raise TypeError(f"[fastmetal.nn.optim.{cls}] expected float parameters, got dtype "
                            f"{p.dtype} at index {i}")
    return items


def _zeros_like(p):
    return _core.zeros(tuple(p.shape), dtype=p.dtype, device=p.device)


class Optimizer:
    """Base class: ``param_groups`` (each a dict with ``"params"`` and its hyper-parameters;
    ``lr`` is what StepLR changes) and ``state`` (per-parameter buffers, by parameter id)."""

    _kind = ""

    def __init__(self, params, defaults):
        cls = type(self).__name__
        items = _items(params, cls)
        groups = items if items and all(isinstance(g, dict) for g in items) else \
            [{"params": items}]
        self.defaults = dict(defaults)
        self.param_groups = []
        seen = set()
        for gi, group in enumerate(groups):
            if "params" not in group:
                raise ValueError(f"[fastmetal.nn.optim.{cls}] expected every param group to "
                                 f"have 'params', got keys {sorted(group)} in group {gi}")
            unknown = set(group) - set(defaults) - {"params"}
            if unknown:
                raise ValueError(f"[fastmetal.nn.optim.{cls}] expected group options among "
                                 f"{sorted(defaults)}, got {sorted(unknown)} in group {gi}")
            ps = _param_list(group["params"], cls, f"param_groups[{gi}]['params']")
            for p in ps:
                if id(p) in seen:
                    raise ValueError(f"[fastmetal.nn.optim.{cls}] expected each parameter in "
                                     "one group once, got one twice")
                seen.add(id(p))
            merged = dict(defaults)
            merged.update({k: v for k, v in group.items() if k != "params"})
            merged = self._validate(merged)
            merged["params"] = ps
            self.param_groups.append(merged)
        if not seen:
            raise ValueError(f"[fastmetal.nn.optim.{cls}] expected at least one parameter, "
                             "got an empty list")
        self.state: dict = {}

    def _validate(self, group):
        return group

    @property
    def lr(self):
        return self.param_groups[0]["lr"]

    def zero_grad(self, set_to_none=True):
        """Forget the gradients of every parameter (None, or zeros with set_to_none=False)."""
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    p.grad = _zeros_like(p)

    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                state = self.state.setdefault(id(p), {})
                s1, s2, hyper = self._prepare(p, state, group)
                self._before(p, group)
                _core._optimizer_step(self._kind, p, grad, s1, s2, hyper)
                self._after(state)

    def _before(self, param, group):
        pass

    def _after(self, state):
        pass


class SGD(Optimizer):
    """``torch.optim.SGD``: ``g = grad + weight_decay * p``; with momentum, ``buf = g`` on the
    first step, then ``buf = momentum * buf + (1 - dampening) * g``, and ``g = buf`` (or
    ``g + momentum * buf`` with ``nesterov``); ``p -= lr * g``."""

    _kind = "sgd"

    def __init__(self, params, lr=1e-3, momentum=0.0, weight_decay=0.0, *, dampening=0.0,
                 nesterov=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      dampening=dampening, nesterov=nesterov))

    def _validate(self, g):
        g["lr"] = _number(g["lr"], "lr", "SGD")
        g["momentum"] = _number(g["momentum"], "momentum", "SGD")
        g["weight_decay"] = _number(g["weight_decay"], "weight_decay", "SGD")
        g["dampening"] = _number(g["dampening"], "dampening", "SGD")
        _check_bool(g["nesterov"], "nesterov", "optim.SGD")
        if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
            raise ValueError("[fastmetal.nn.optim.SGD] expected momentum > 0 and dampening 0 "
                             f"with nesterov, got momentum={g['momentum']}, "
                             f"dampening={g['dampening']}")
        g["nesterov"] = bool(g["nesterov"])
        return g

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
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _validate(self, g):
        cls = type(self).__name__
        g["lr"] = _number(g["lr"], "lr", cls)
        betas = g["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"[fastmetal.nn.optim.{cls}] expected betas to be a pair of "
                             f"numbers in [0, 1), got {betas!r}")
        g["betas"] = (_number(betas[0], "betas[0]", cls, 0.0, 1.0, high_open=True),
                      _number(betas[1], "betas[1]", cls, 0.0, 1.0, high_open=True))
        g["eps"] = _number(g["eps"], "eps", cls)
        g["weight_decay"] = _number(g["weight_decay"], "weight_decay", cls)
        return g

    def _prepare(self, param, state, group):
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = _zeros_like(param)
            state["exp_avg_sq"] = _zeros_like(param)
        t = state["step"] + 1
        b1, b2 = group["betas"]
        hyper = dict(lr=group["lr"], beta1=b1, beta2=b2, eps=group["eps"],
                     weight_decay=self._l2(group),
                     step_size=group["lr"] / (1.0 - b1 ** t),
                     sqrt_bias2=math.sqrt(1.0 - b2 ** t))
        return state["exp_avg"], state["exp_avg_sq"], hyper

    def _l2(self, group):
        return group["weight_decay"]

    def _after(self, state):
        state["step"] += 1


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled weight decay, ``p *= 1 - lr *
    weight_decay`` before the Adam step (which then has no L2 term); default
    ``weight_decay=1e-2``."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr, betas, eps, weight_decay)

    def _l2(self, group):
        return 0.0

    def _before(self, param, group):
        decay = 1.0 - group["lr"] * group["weight_decay"]
        if decay != 1.0:
            _core.binary("multiply", param, decay, param)


class Adadelta(Optimizer):
    """``torch.optim.Adadelta``: ``sq = rho sq + (1 - rho) g^2``, ``delta = sqrt(acc + eps) /
    sqrt(sq + eps) * g``, ``acc = rho acc + (1 - rho) delta^2``, ``p -= lr * delta`` with
    ``g = grad + weight_decay * p``."""

    _kind = "adadelta"

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay))

    def _validate(self, g):
        g["lr"] = _number(g["lr"], "lr", "Adadelta")
        g["rho"] = _number(g["rho"], "rho", "Adadelta", 0.0, 1.0)
        g["eps"] = _number(g["eps"], "eps", "Adadelta")
        g["weight_decay"] = _number(g["weight_decay"], "weight_decay", "Adadelta")
        return g

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
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_epoch = 0

    def step(self):
        self.last_epoch += 1
        if self.last_epoch % self.step_size == 0:
            for g in self.optimizer.param_groups:
                g["lr"] *= self.gamma

    def get_last_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]
