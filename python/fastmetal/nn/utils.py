"""``fastmetal.nn.utils``: gradient clipping, as ``torch.nn.utils``."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .._core import Array
from ..autograd.tape import no_grad
from ..ops import elementwise as E
from ..ops.creation import zeros
from ..ops.reductions import max as _max
from ..ops.reductions import sum as _sum

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """Scale the gradients of ``parameters`` in place so that their joint ``norm_type``-norm
    is at most ``max_norm``, as ``torch.nn.utils.clip_grad_norm_``; returns the norm before
    clipping (a 0-d Array). Stays on the device: the scale ``min(max_norm / (norm + 1e-6),
    1)`` is an Array, no value is read back (unless ``error_if_nonfinite``)."""
    where = "fastmetal.nn.utils.clip_grad_norm_"
    params = [parameters] if isinstance(parameters, Array) else list(parameters)
    for name, v in (("max_norm", max_norm), ("norm_type", norm_type)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
            raise TypeError(f"[{where}] expected {name} to be a number, got {v!r}")
    if not norm_type > 0:
        raise ValueError(f"[{where}] expected norm_type > 0 (or inf), got {norm_type!r}")
    grads = [p.grad for p in params if isinstance(p, Array) and p.grad is not None]
    if not grads:
        return zeros(())
    devices = {g.device for g in grads}
    if len(devices) > 1:
        raise ValueError(f"[{where}] expected gradients on one device, got {sorted(devices)}")
    with no_grad():
        if math.isinf(norm_type):
            norms = [_max(E.abs(g.astype("float32"))) for g in grads]
            total = norms[0]
            for n in norms[1:]:
                total = E.maximum(total, n)
        else:
            p = float(norm_type)
            total = None
            for g in grads:
                g32 = g if g.dtype == np.float32 else g.astype("float32")
                # The 2-norm (the common case) as a sum of squares: two cheap ops, not
                # abs + a general power (exp and log per element).
                part = _sum(E.square(g32)) if p == 2.0 else _sum(E.power(E.abs(g32), p))
                total = part if total is None else total + part
            total = E.sqrt(total) if p == 2.0 else E.power(total, 1.0 / p)
        if error_if_nonfinite and not math.isfinite(float(total.item())):
            raise RuntimeError(f"[{where}] expected a finite total norm of the gradients, got "
                               f"{total.item()}")
        scale = E.minimum(float(max_norm) / (total + 1e-6), 1.0)
        for g in grads:
            E.multiply(g, scale if g.dtype == np.float32 else scale.astype(g.dtype), out=g)
    return total
