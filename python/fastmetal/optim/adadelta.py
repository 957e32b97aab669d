"""``torch.optim.Adadelta``, fused kernels over several parameters per launch."""
from __future__ import annotations

from .optimizer import Optimizer, _number, _zeros_like

__all__ = ['Adadelta']


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
