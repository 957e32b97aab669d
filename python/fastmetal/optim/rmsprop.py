"""``torch.optim.RMSprop`` and ``torch.optim.Adagrad``, written with fastmetal's elementwise ops
(a few kernels per parameter, in place on its device)."""
from __future__ import annotations

from ..ops import elementwise as E
from ..ops.checks import check_bool
from ..ops.creation import full
from .optimizer import Optimizer, _number, _zeros_like

__all__ = ["RMSprop", "Adagrad"]


def _decayed(param, grad, weight_decay):
    return grad if weight_decay == 0 else E.add(grad, E.multiply(param, weight_decay))


class RMSprop(Optimizer):
    """``torch.optim.RMSprop``: ``v = alpha v + (1 - alpha) g^2`` (centred: minus the square of
    ``m = alpha m + (1 - alpha) g``), ``p -= lr g / (sqrt(v) + eps)``, with momentum ``buf =
    momentum buf + g / (sqrt(v) + eps)``, ``p -= lr buf``; ``g = grad + weight_decay p``."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                 centered=False):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered))

    def _validate(self, g):
        for name in ("lr", "eps", "weight_decay", "momentum"):
            g[name] = _number(g[name], name, "RMSprop")
        g["alpha"] = _number(g["alpha"], "alpha", "RMSprop", 0.0, 1.0)
        check_bool(g["centered"], "centered", "optim.RMSprop")
        g["centered"] = bool(g["centered"])
        return g

    def _update(self, param, grad, state, group):
        if "square_avg" not in state:
            state["step"] = 0
            state["square_avg"] = _zeros_like(param)
            if group["momentum"] > 0:
                state["momentum_buffer"] = _zeros_like(param)
            if group["centered"]:
                state["grad_avg"] = _zeros_like(param)
        state["step"] += 1
        alpha = group["alpha"]
        g = _decayed(param, grad, group["weight_decay"])
        sq = state["square_avg"]
        E.add(E.multiply(sq, alpha, out=sq), E.multiply(E.square(g), 1.0 - alpha), out=sq)
        if group["centered"]:
            ga = state["grad_avg"]
            E.add(E.multiply(ga, alpha, out=ga), E.multiply(g, 1.0 - alpha), out=ga)
            avg = E.add(E.sqrt(E.subtract(sq, E.square(ga))), group["eps"])
        else:
            avg = E.add(E.sqrt(sq), group["eps"])
        if group["momentum"] > 0:
            buf = state["momentum_buffer"]
            E.add(E.multiply(buf, group["momentum"], out=buf), E.divide(g, avg), out=buf)
            E.subtract(param, E.multiply(buf, group["lr"]), out=param)
        else:
            E.subtract(param, E.multiply(E.divide(g, avg), group["lr"]), out=param)


class Adagrad(Optimizer):
    """``torch.optim.Adagrad``: ``s += g^2``, ``p -= clr g / (sqrt(s) + eps)`` with ``clr = lr
    / (1 + (t - 1) lr_decay)`` at step t and ``g = grad + weight_decay p``; ``s`` starts at
    ``initial_accumulator_value``."""

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10):
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps))

    def _validate(self, g):
        for name in ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"):
            g[name] = _number(g[name], name, "Adagrad")
        return g

    def _update(self, param, grad, state, group):
        if "sum" not in state:
            state["step"] = 0
            state["sum"] = full(tuple(param.shape), group["initial_accumulator_value"],
                                dtype="float32", device=param.device)
        state["step"] += 1
        g = _decayed(param, grad, group["weight_decay"])
        clr = group["lr"] / (1.0 + (state["step"] - 1) * group["lr_decay"])
        total = state["sum"]
        E.add(total, E.square(g), out=total)
        E.subtract(param, E.multiply(E.divide(g, E.add(E.sqrt(total), group["eps"])), clr),
                   out=param)
