"""``torch.optim.SGD``, fused kernels over several parameters per launch."""
from __future__ import annotations

from ..ops import elementwise as E
from ..ops.checks import check_bool
from .optimizer import Optimizer, _number, _zeros_like

__all__ = ['SGD']


class SGD(Optimizer):
    """``torch.optim.SGD``: ``g = grad + weight_decay * p``; with momentum, ``buf = g`` on the
    first step, then ``buf = momentum * buf + (1 - dampening) * g``, and ``g = buf`` (or
    ``g + momentum * buf`` with ``nesterov``); ``p -= lr * g``."""

    _kind = "sgd"
    _float64 = True

    def __init__(self, params, lr=1e-3, momentum=0.0, weight_decay=0.0, *, dampening=0.0,
                 nesterov=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      dampening=dampening, nesterov=nesterov))

    def _validate(self, g):
        g["lr"] = _number(g["lr"], "lr", "SGD")
        g["momentum"] = _number(g["momentum"], "momentum", "SGD")
        g["weight_decay"] = _number(g["weight_decay"], "weight_decay", "SGD")
        g["dampening"] = _number(g["dampening"], "dampening", "SGD")
        check_bool(g["nesterov"], "nesterov", "optim.SGD")
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


    def _update64(self, param, grad, state, group):
        """float64: the same update in double with fastmetal's ops, in PyTorch's order
        (``buf.mul_(momentum).add_(g, alpha=1 - dampening)``, ``p.add_(g, alpha=-lr)``)."""
        buf, _, hyper = self._prepare(param, state, group)
        g = grad
        if hyper["weight_decay"] != 0:
            g = E.add(g, E.multiply(param, hyper["weight_decay"]))
        if hyper["momentum"] != 0:
            if hyper["first"]:
                E.copy(g, out=buf)
            else:
                E.add(E.multiply(buf, hyper["momentum"]),
                      E.multiply(g, 1.0 - hyper["dampening"]), out=buf)
            g = E.add(g, E.multiply(buf, hyper["momentum"])) if hyper["nesterov"] else buf
        E.add(param, E.multiply(g, -hyper["lr"]), out=param)


def _zeros_like_cached(state, param):
    # SGD without momentum binds an unused state buffer.
    if "_unused" not in state:
        state["_unused"] = _zeros_like(param)
    return state["_unused"]
