"""Loss functions, as ``torch.nn.functional``'s (their Modules: fastmetal/nn/modules/loss.py):
binary cross-entropy on probabilities and on logits, mean squared error and
negative log-likelihood; ``fastmetal.cross_entropy`` (ops/training.py) is the fused one.

Each loss is built from differentiable ops (the elementwise kernels ``bce``,
``bce_logits`` of ``metal/elementwise_ops.tbl`` carry their own gradients), so its gradient
needs no code here. ``reduction`` is ``"mean"`` (default), ``"sum"`` or ``"none"``.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _core
from .elementwise import FUNCTIONS as _E
from .manipulation import where
from .reductions import mean as _mean
from .reductions import sum as _sum
from .training import _labels

__all__ = ["binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss", "nll_loss",
           "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div"]
REDUCTIONS = ("mean", "sum", "none")


def _shape(a):
    return tuple(a.shape) if hasattr(a, "shape") else np.shape(a)


def _check(op, input, target, reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"[fastmetal.{op}] expected reduction 'mean', 'sum' or 'none', got "
                         f"{reduction!r}")
    if _shape(input) != _shape(target):
        raise ValueError(f"[fastmetal.{op}] expected target of the input's shape "
                         f"{_shape(input)}, got {_shape(target)}")


def _reduce(loss, reduction):
    if reduction == "mean":
        return _mean(loss)
    if reduction == "sum":
        return _sum(loss)
    return loss


def _weighted(loss, weight):
    return loss if weight is None else loss * weight


def binary_cross_entropy(input, target, weight=None, reduction="mean"):
    """``-(t log(x) + (1 - t) log(1 - x))`` of probabilities ``input`` against ``target`` (same
    shape), times ``weight`` (broadcast), reduced, as ``torch.nn.functional.binary_cross_entropy``.
    Each log is clamped at -100 as PyTorch's, so a saturated sigmoid (0 or 1) gives a finite
    loss; the gradient ``(x - t) / max(x (1 - x), 1e-12)`` is PyTorch's too. Inputs outside
    [0, 1] give NaN (PyTorch raises)."""
    _check("binary_cross_entropy", input, target, reduction)
    return _reduce(_weighted(_E["bce"](input, target), weight), reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean",
                                     pos_weight=None):
    """Binary cross-entropy of ``sigmoid(input)`` computed from the logits without overflow:
    ``softplus(x) - x t`` (with ``pos_weight`` p: ``(1 - t) x + (1 + (p - 1) t) softplus(-x)``),
    times ``weight``, reduced, as ``torch.nn.functional.binary_cross_entropy_with_logits``."""
    _check("binary_cross_entropy_with_logits", input, target, reduction)
    if pos_weight is None:
        loss = _E["bce_logits"](input, target)
    else:
        log_weight = (pos_weight - 1.0) * target + 1.0
        loss = (1.0 - target) * input + log_weight * _E["softplus"](-input)
    return _reduce(_weighted(loss, weight), reduction)


def mse_loss(input, target, reduction="mean"):
    """``(input - target)**2`` reduced, as ``torch.nn.functional.mse_loss`` (same shapes)."""
    _check("mse_loss", input, target, reduction)
    return _reduce(_E["square"](input - target) if isinstance(input, _core.Array) else
                   _E["square"](_E["subtract"](input, target)), reduction)


def nll_loss(input, target, reduction="mean"):
    """Negative log-likelihood of ``(N, C)`` log-probabilities at ``N`` integer class labels,
    ``-input[i, target[i]]`` reduced, as ``torch.nn.functional.nll_loss``."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"[fastmetal.nll_loss] expected reduction 'mean', 'sum' or 'none', "
                         f"got {reduction!r}")
    shape = _shape(input)
    labels = _labels(target, "nll_loss")
    if len(shape) != 2 or labels.shape != (shape[0],):
        raise ValueError(f"[fastmetal.nll_loss] expected input (N, C) and target (N,), got "
                         f"{shape} and {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= shape[1]):
        raise ValueError(f"[fastmetal.nll_loss] expected target in [0, {shape[1]}), got "
                         f"{labels[(labels < 0) | (labels >= shape[1])][0]}")
    # One-hot selection: a product with a host-made 0/1 mask, so the gradient is a mask too.
    one_hot = np.zeros(shape, np.float32)
    one_hot[np.arange(shape[0]), labels] = -1.0
    if isinstance(input, _core.Array):
        one_hot = _core.asarray(one_hot, device=input.device)
    picked = _sum(input * one_hot if isinstance(input, _core.Array) else
                  _E["multiply"](input, one_hot), axis=1)
    return _reduce(picked, reduction)


def _difference(input, target):
    return input - target if isinstance(input, _core.Array) else _E["subtract"](input, target)


def _positive(value, name, op, allow_zero):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or \
            not (value >= 0 if allow_zero else value > 0) or not math.isfinite(value):
        raise ValueError(f"[fastmetal.{op}] expected {name} to be a finite number "
                         f"{'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def l1_loss(input, target, reduction="mean"):
    """``|input - target|`` reduced, as ``torch.nn.functional.l1_loss`` (same shapes; the
    gradient at 0 is 0, as PyTorch's)."""
    _check("l1_loss", input, target, reduction)
    return _reduce(_E["abs"](_difference(input, target)), reduction)


def smooth_l1_loss(input, target, reduction="mean", beta=1.0):
    """``0.5 d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (``d = input -
    target``), reduced, as ``torch.nn.functional.smooth_l1_loss``; ``beta=0`` is l1_loss."""
    _check("smooth_l1_loss", input, target, reduction)
    beta = _positive(beta, "beta", "smooth_l1_loss", allow_zero=True)
    d = _difference(input, target)
    if beta == 0.0:
        return _reduce(_E["abs"](d), reduction)
    ad = _E["abs"](d)
    loss = where(_E["less"](ad, beta), _E["square"](d) * (0.5 / beta), ad - 0.5 * beta)
    return _reduce(loss, reduction)


def huber_loss(input, target, reduction="mean", delta=1.0):
    """``0.5 d**2`` where ``|d| <= delta``, else ``delta (|d| - 0.5 delta)`` (``d = input -
    target``), reduced, as ``torch.nn.functional.huber_loss``."""
    _check("huber_loss", input, target, reduction)
    delta = _positive(delta, "delta", "huber_loss", allow_zero=False)
    d = _difference(input, target)
    ad = _E["abs"](d)
    loss = where(_E["less_equal"](ad, delta), _E["square"](d) * 0.5, (ad - 0.5 * delta) * delta)
    return _reduce(loss, reduction)


def kl_div(input, target, reduction="mean", log_target=False):
    """Pointwise KL divergence of log-probabilities ``input`` from ``target``, as
    ``torch.nn.functional.kl_div``: ``target (log target - input)`` (0 where target is 0), or
    ``exp(target) (target - input)`` with ``log_target``. ``reduction`` also takes
    ``"batchmean"`` (the sum divided by the batch size: the true KL divergence); ``"mean"``
    averages over every element, as PyTorch's."""
    op = "kl_div"
    _check(op, input, target, "mean" if reduction == "batchmean" else reduction)
    if log_target:
        loss = _E["exp"](target) * _difference(target, input)
    else:
        # log(1) where target is 0: 0 * log(0) is 0 (as xlogy), with finite gradients.
        safe = where(_E["greater"](target, 0.0), target, 1.0)
        loss = _E["multiply"](target, _E["log"](safe)) - _E["multiply"](target, input)
    if reduction == "batchmean":
        shape = _shape(input)
        return _sum(loss) * (1.0 / (shape[0] if shape else 1))
    return _reduce(loss, reduction)
