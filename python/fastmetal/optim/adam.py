"""``torch.optim.Adam`` and ``AdamW``, fused kernels over several parameters per launch."""
from __future__ import annotations

import math

from ..ops.elementwise import multiply
from .optimizer import Optimizer, _number, _zeros_like

__all__ = ['Adam', 'AdamW']


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
            multiply(param, decay, out=param)
