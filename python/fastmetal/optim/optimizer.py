"""The optimizers' base class (``fastmetal.optim``; ``fastmetal.nn.optim`` is the same module): SGD, Adam, AdamW and Adadelta with PyTorch's update
formulas, each step one fused kernel per parameter that updates the parameter and its state
in place on the parameter's device (``metal/training.metal``); the schedules are in lr_scheduler.py.

An optimizer takes what PyTorch's take: any iterable of parameters (``model.parameters()``,
a list, the sum of two lists) or of param-group dicts (``{"params": [...], "lr": ...}``,
each group's own hyper-parameters overriding the defaults). ``step()`` reads each
parameter's ``.grad`` (written by ``loss.backward()``) and skips parameters without one.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .._core import Array
from ..autograd.tape import no_grad
from ..ops.creation import zeros
from ..ops.training import optimizer_step

__all__ = ["Optimizer"]


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
    return zeros(tuple(p.shape), dtype=p.dtype, device=p.device)


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

    @no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                state = self.state.setdefault(id(p), {})
                s1, s2, hyper = self._prepare(p, state, group)
                self._before(p, group)
                optimizer_step(self._kind, p, grad, s1, s2, hyper)
                self._after(state)

    def _before(self, param, group):
        pass

    def _after(self, state):
        pass
