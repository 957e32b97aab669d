"""``fastmetal.nn.utils``: gradient clipping, as ``torch.nn.utils``."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .._core import Array
from ..autograd.tape import no_grad
from ..ops import training
from ..ops.creation import zeros

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
    if math.isinf(norm_type) and any(g.size == 0 for g in grads):
        raise RuntimeError(f"[{where}] expected non-empty gradients for the inf norm (a max "
                           f"of no elements has no identity, as torch), got one of shape "
                           f"{next(tuple(g.shape) for g in grads if g.size == 0)}")
    with no_grad():
        # A few launches for all the gradients (ops/training.py): the norm and the factor
        # stay on the device.
        total, scale = training.grad_norm(grads, norm_type, max_norm)
        if error_if_nonfinite and not math.isfinite(float(total.item())):
            raise RuntimeError(f"[{where}] expected a finite total norm of the gradients, got "
                               f"{total.item()}")
        training.grad_scale_(grads, scale)
    return total
