"""The optimizers' base class (``fastmetal.optim``; ``fastmetal.nn.optim`` is the same module): SGD, Adam, AdamW and Adadelta with PyTorch's update
formulas, each step fused kernels that update the parameters and their state in place on
their device, several tensors per launch (a multi-tensor step, ``metal/training.metal``); the
schedules are in lr_scheduler.py.

An optimizer takes what PyTorch's take: any iterable of parameters (``model.parameters()``,
a list, the sum of two lists) or of param-group dicts (``{"params": [...], "lr": ...}``,
each group's own hyper-parameters overriding the defaults). ``step()`` reads each
parameter's ``.grad`` (written by ``loss.backward()``) and skips parameters without one.
"""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from .._core import Array
from ..autograd.tape import enable_grad, no_grad
from ..ops.creation import asarray, zeros
from ..ops.capture import dynamic, tracing
from ..ops.elementwise import copy
from ..ops.training import optimizer_steps

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


def _param_list(params, cls, where, float64):
    items = _items(params, cls, f" for {where}")
    for i, p in enumerate(items):
        if not isinstance(p, Array):
            raise TypeError(f"[fastmetal.nn.optim.{cls}] expected {where} to hold "
                            f"fastmetal.Arrays, got {type(p).__name__} at index {i}")
        if p.dtype == np.float64 and not float64:
            raise TypeError(f"[fastmetal.nn.optim.{cls}] expected float32 or float16 "
                            f"parameters (float64 ones: SGD and LBFGS), got dtype {p.dtype} "
                            f"at index {i}")
        if p.dtype.kind != "f":
            raise TypeError(f"[fastmetal.nn.optim.{cls}] expected float parameters, got dtype "
                            f"{p.dtype} at index {i}")
    return items


def _zeros_like(p):
    # float16 parameters keep their state in float32; float64 ones in float64
    return zeros(tuple(p.shape), dtype=np.float64 if p.dtype == np.float64 else np.float32,
                 device=p.device)


class Optimizer:
    """Base class: ``param_groups`` (each a dict with ``"params"`` and its hyper-parameters;
    ``lr`` is what the schedulers change) and ``state`` (per-parameter buffers, by parameter
    id). float32 and float16 parameters (float64 ones where the optimizer has ``_float64``:
    SGD, LBFGS); ``step(closure=None)``, ``state_dict()`` and ``load_state_dict()`` as
    PyTorch's."""

    _kind = ""
    _float64 = False  # whether _update64 (or the optimizer's own step) takes float64 ones

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
            ps = _param_list(group["params"], cls, f"param_groups[{gi}]['params']",
                             type(self)._float64)
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
                    p.grad = zeros(tuple(p.shape), dtype=p.dtype, device=p.device)

    def step(self, closure=None):
        """One update of every parameter that has a ``.grad``. ``closure``: a function that
        recomputes the loss (and its gradients) and returns it, called first with grad
        enabled, as PyTorch's; its loss is returned."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            # Re-run at each replay of a compiled step (fastmetal.compile): the step count,
            # bias corrections and learning rate are Python's.
            items = [(p, p.grad, self.state.setdefault(id(p), {}), group)
                     for group in self.param_groups for p in group["params"]
                     if p.grad is not None]
            # A key only where it can stay the same: the arguments are _prepare's, and no
            # step count changes them at every step (Adam's bias corrections).
            plain = tracing() and type(self)._update is Optimizer._update and not any(
                "step" in self.state.get(id(p), ()) for g in self.param_groups
                for p in g["params"])
            dynamic(functools.partial(self._update_all, items),
                    key=self._replay_key if plain else None)
        return loss

    def _replay_key(self):
        """What the updates' arguments depend on (fastmetal.compile skips re-running them
        while it is unchanged): every group's options, and each parameter's hyper-parameters
        and step count (optimizers with their own _update have no key: never skipped)."""
        key = []
        for group in self.param_groups:
            key.append(tuple((k, v) for k, v in group.items() if k != "params"))
            for p in group["params"]:
                state = self.state.get(id(p), {})
                key.append((state.get("step"), self._prepare(p, state, group)[2]))
        return key

    def _update_all(self, items):
        """The update of every (parameter, grad, state, group) in ``items``: the fused kernel
        of ``_kind`` for all of them together (a multi-tensor step, a few tensors per
        launch); optimizers that override ``_update`` run it per parameter. float32
        parameters are updated in place; a float16 one through float32 copies of it and its
        gradient (its state is kept in float32), rounded back once at the end; float64 ones
        one by one through ``_update64``, in double (the fused kernels are float32's)."""
        for item in items:
            if item[0].dtype == np.float64:
                self._update64(*item)
        items = [item for item in items if item[0].dtype != np.float64]
        if not items:
            return
        if type(self)._update is not Optimizer._update:
            for item in items:
                self._update_param(*item)
            return
        params, grads, states1, states2, hypers, back = [], [], [], [], [], []
        for p, grad, state, group in items:
            work = p if p.dtype == np.float32 else p.astype(np.float32)
            if work is not p:
                back.append((work, p))
            s1, s2, hyper = self._prepare(work, state, group)
            self._before(work, group)
            params.append(work)
            grads.append(grad if grad.dtype == np.float32 else grad.astype(np.float32))
            states1.append(s1)
            states2.append(s2)
            hypers.append(hyper)
        optimizer_steps(self._kind, params, grads, states1, states2, hypers)
        for _, _, state, _ in items:
            self._after(state)
        for work, p in back:
            copy(work, out=p)

    def _update_param(self, p, grad, state, group):
        """One parameter through ``_update`` (optimizers written with fastmetal's ops); float64
        ones through ``_update64``, in double."""
        if p.dtype == np.float64:
            self._update64(p, grad, state, group)
            return
        if p.dtype == np.float32:  # the common case: no conversion call on the step's path
            self._update(p, grad if grad.dtype == np.float32 else grad.astype(np.float32),
                         state, group)
            return
        work = p.astype(np.float32)
        self._update(work, grad.astype(np.float32), state, group)
        copy(work, out=p)

    def _update(self, param, grad, state, group):
        """The update of a float32 parameter (and its state) in place; optimizers written
        with fastmetal's ops override this (the fused kinds go through ``_update_all``)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel: it overrides "
                                  "_update")

    def _update64(self, param, grad, state, group):
        """The update of a float64 parameter in place, in double (the fused kernels are
        float32's): optimizers with ``_float64`` define it."""
        raise TypeError(f"[fastmetal.nn.optim.{type(self).__name__}] expected float32 or "
                        "float16 parameters (float64 ones: SGD and LBFGS), got float64")

    # -- checkpoints, as torch.optim.Optimizer's
    def _indexed(self):
        params = [p for group in self.param_groups for p in group["params"]]
        return params, {id(p): i for i, p in enumerate(params)}

    def state_dict(self):
        """``{"state": {index: {name: value}}, "param_groups": [{option: value, "params":
        [index, ...]}]}``, parameters numbered in group order as PyTorch's; state Arrays are
        copies."""
        params, index = self._indexed()
        state = {}
        for p in params:
            entries = self.state.get(id(p))
            if entries:
                state[index[id(p)]] = {k: (v.copy() if isinstance(v, Array) else v)
                                       for k, v in entries.items() if not k.startswith("_")}
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [index[id(p)] for p in g["params"]]} for g in self.param_groups]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Restore what :meth:`state_dict` gave (the same parameters, in the same groups)."""
        cls = type(self).__name__
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            raise ValueError(f"[fastmetal.optim.{cls}.load_state_dict] expected a dict with "
                             f"'state' and 'param_groups', got {state_dict!r:.80}")
        groups = state_dict["param_groups"]
        sizes = [len(g["params"]) for g in self.param_groups]
        if len(groups) != len(sizes) or [len(g["params"]) for g in groups] != sizes:
            raise ValueError(f"[fastmetal.optim.{cls}.load_state_dict] expected "
                             f"{len(sizes)} param groups of {sizes} parameters, got "
                             f"{[len(g['params']) for g in groups]}")
        params, _ = self._indexed()
        for group, saved in zip(self.param_groups, groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self.state = {}
        for key, entries in state_dict["state"].items():
            p = params[int(key)]
            self.state[id(p)] = {
                k: (asarray(v, dtype=v.dtype, device=p.device).copy()
                    if isinstance(v, (Array, np.ndarray)) else v)
                for k, v in entries.items()}

    def _before(self, param, group):
        pass

    def _after(self, state):
        pass
