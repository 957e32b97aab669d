"""Loss functions, as ``torch.nn.functional``'s (their Modules: fastmetal/nn/modules/loss.py):
cross-entropy and negative log-likelihood (class weights, ignore_index, label smoothing,
``(N, C, d1, ...)`` inputs; the plain ``(N, C)`` case takes the fused kernel of
ops/training.py), binary cross-entropy on probabilities and on logits, mean squared error,
L1 / smooth L1 / Huber and KL divergence.

Each loss is built from differentiable ops (the elementwise kernels ``bce``,
``bce_logits`` of ``metal/elementwise_ops.tbl`` carry their own gradients), so its gradient
needs no code here. ``reduction`` is ``"mean"`` (default), ``"sum"`` or ``"none"``.
"""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from .. import _core
from .elementwise import FUNCTIONS as _E
from .manipulation import where
from .reductions import mean as _mean
from .reductions import sum as _sum
from .capture import tracing
from .training import _is_int, cross_entropy_fused, log_softmax

__all__ = ["cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss", "nll_loss",
           "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div"]
REDUCTIONS = ("mean", "sum", "none")
FUSED_MAX_CLASSES = 1024  # cross_entropy's fused kernel on GPUs (see cross_entropy)


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


def _class_targets(target, op):
    """Class-index targets on the host (an int64 Array is read once: their range is checked
    there before anything indexes with them; on a GPU this waits for the work computing them)."""
    if isinstance(target, _core.Array):
        if target.dtype != np.int64:
            raise TypeError(f"[fastmetal.{op}] expected target as class indices (a NumPy "
                            f"integer array, a sequence or an int64 fastmetal.Array), got a "
                            f"{target.dtype} fastmetal.Array")
        return target.numpy()
    arr = np.asarray(target)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"[fastmetal.{op}] expected target with an integer dtype, "
                        f"got {arr.dtype}")
    return arr


def _float_like(a):
    dt = a.dtype if isinstance(a, _core.Array) else getattr(a, "dtype", None)
    return dt is not None and np.dtype(dt).kind == "f"


def _class_weight(weight, classes, op):
    """``weight`` (C,) on the host (float64, for the mean's denominator) and as an Array."""
    if weight is None:
        return None
    host = weight.numpy() if isinstance(weight, _core.Array) else np.asarray(weight)
    if host.dtype.kind not in "fiu" or host.shape != (classes,):
        raise ValueError(f"[fastmetal.{op}] expected weight to be a float array of shape "
                         f"({classes},) (one weight per class), got shape {host.shape} of "
                         f"dtype {host.dtype}")
    return host.astype(np.float64)


def _as_device_array(a, like):
    return _core.asarray(np.ascontiguousarray(a, dtype=np.float32), device=like.device)


def _nll(logp, t, weight, ignore_index, reduction, smoothing, op):
    """Weighted NLL of log-probabilities ``logp`` (N, C, d...) at host class indices ``t``
    (N, d...), PyTorch's semantics, with label smoothing ``smoothing`` (cross_entropy's).

    The picked log-probabilities are one device gather at host-made flat indices; ignored
    targets pick element 0 with coefficient 0, so their loss and gradient are 0. The mean
    divides by the sum of the weights of the non-ignored targets (all ignored: NaN, with a
    zero gradient, as PyTorch's)."""
    shape = tuple(logp.shape)
    n, classes, rest = shape[0], shape[1], shape[2:]
    inner = int(np.prod(rest, dtype=np.int64))
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= classes))
    if bad.any():
        raise _core.IndexOutOfRange(f"[fastmetal.{op}] expected target in [0, {classes}) (or "
                         f"ignore_index={ignore_index}), got {t[bad].flat[0]}")
    tc = np.where(valid, t, 0).astype(np.int64).reshape(n, inner)
    idx = (np.arange(n, dtype=np.int64)[:, None] * (classes * inner) + tc * inner
           + np.arange(inner, dtype=np.int64)[None, :]).reshape(-1)
    w_t = valid.reshape(n, inner).astype(np.float64)
    if weight is not None:
        w_t = w_t * weight[tc]
    picked = logp.reshape(-1)[idx].reshape(t.shape)
    loss = picked * _as_device_array((smoothing - 1.0) * w_t.reshape(t.shape), logp)
    if smoothing > 0.0:
        if weight is None:
            total = _sum(logp, axis=1)
        else:
            total = _sum(logp * _as_device_array(weight.reshape((1, classes) + (1,) * len(rest)),
                                                 logp), axis=1)
        loss = loss + total * _as_device_array(
            valid * (-smoothing / classes), logp)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return _sum(loss)
    denominator = float(w_t.sum())
    if denominator == 0.0:  # nothing counted: NaN, and no gradient (PyTorch's)
        return _sum(loss) * 0.0 + float("nan")
    return _sum(loss) * (1.0 / denominator)


def _check_reduction(reduction, op):
    if reduction not in REDUCTIONS:
        raise ValueError(f"[fastmetal.{op}] expected reduction 'mean', 'sum' or 'none', "
                         f"got {reduction!r}")


def _class_input(input, op):
    """The input as an Array with the class axis second (unbatched (C,) -> (1, C)) and the
    target's expected shape; whether the input was NumPy (NumPy in gives NumPy out)."""
    was_numpy = not isinstance(input, _core.Array)
    x = _core.asarray(np.asarray(input, dtype=np.float32)) if was_numpy else input
    shape = tuple(x.shape)
    if len(shape) == 0:
        raise ValueError(f"[fastmetal.{op}] expected input of shape (C,), (N, C) or "
                         f"(N, C, d1, ...), got shape ()")
    unbatched = len(shape) == 1
    if unbatched:
        x = x.reshape((1, shape[0]))
    return x, unbatched, was_numpy


def _target_shape(x, unbatched):
    shape = tuple(x.shape)
    return () if unbatched else (shape[0],) + shape[2:]


def _finish(loss, unbatched, reduction, was_numpy):
    if unbatched and reduction == "none":
        loss = loss.reshape(())
    return loss.numpy() if was_numpy else loss


def _check_target_shape(t, x, unbatched, op):
    want = _target_shape(x, unbatched)
    if t.shape != want:
        raise ValueError(f"[fastmetal.{op}] expected target of shape {want} (the input "
                         f"{tuple(x.shape) if not unbatched else (x.shape[1],)} without its "
                         f"class axis), got shape {t.shape}")
    return t.reshape((1,)) if unbatched else t


def _ignore_index(ignore_index, op):
    if not _is_int(ignore_index):
        raise TypeError(f"[fastmetal.{op}] expected ignore_index to be an int, got "
                        f"{ignore_index!r}")
    return int(ignore_index)


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """Negative log-likelihood of log-probabilities ``input`` at integer class indices
    ``target``, as ``torch.nn.functional.nll_loss``: input ``(N, C)``, ``(N, C, d1, ...)``
    or unbatched ``(C,)``, target ``(N,)``, ``(N, d1, ...)`` or ``()``. The loss of each
    target is ``-weight[t] * input[..., t, ...]`` (0 where ``t == ignore_index``);
    ``"mean"`` divides the sum by the sum of the weights of the non-ignored targets (NaN if
    all are ignored). ``weight``: one float per class (not differentiated)."""
    op = "nll_loss"
    _check_reduction(reduction, op)
    ignore_index = _ignore_index(ignore_index, op)
    x, unbatched, was_numpy = _class_input(input, op)
    t = _check_target_shape(_class_targets(target, op), x, unbatched, op)
    w = _class_weight(weight, x.shape[1], op)
    return _finish(_nll(x, t, w, ignore_index, reduction, 0.0, op), unbatched, reduction,
                   was_numpy)


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0):
    """Cross-entropy of logits ``input`` against ``target``, as
    ``torch.nn.functional.cross_entropy``: ``nll_loss(log_softmax(input, 1), ...)``.

    ``input``: ``(N, C)``, ``(N, C, d1, ...)`` or unbatched ``(C,)``. ``target``: class
    indices (integers: NumPy, a sequence, or an int64 Array), shape ``(N,)``,
    ``(N, d1, ...)`` or ``()``, each in ``[0, C)`` or ``ignore_index``; or class
    probabilities (floats) of the input's shape. ``weight``: one float per class.
    ``reduction``: ``"mean"`` (for class indices, the sum divided by the sum of the weights
    of the non-ignored targets; NaN when all are ignored), ``"sum"`` or ``"none"``.
    ``label_smoothing`` ε in [0, 1] mixes the target with the uniform distribution:
    ``(1 - ε) nll + ε / C * (-sum_c weight[c] log p_c)``, as PyTorch's.

    The plain case (``(N, C)`` logits, class indices none of which is ignore_index, no
    weight or smoothing, reduction mean/sum) is one fused kernel whose gradient
    ``(softmax - one_hot) / N`` is computed with the loss; the others are log_softmax plus a
    gather, built from differentiable ops. Gradients flow to ``input`` (and to probability
    targets that are Arrays requiring grad).
    """
    op = "cross_entropy"
    _check_reduction(reduction, op)
    ignore_index = _ignore_index(ignore_index, op)
    if isinstance(label_smoothing, (bool, np.bool_)) or \
            not isinstance(label_smoothing, numbers.Real) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"[fastmetal.{op}] expected label_smoothing to be a float in "
                         f"[0, 1], got {label_smoothing!r}")
    smoothing = float(label_smoothing)
    x, unbatched, was_numpy = _class_input(input, op)
    classes = x.shape[1]
    w = _class_weight(weight, classes, op)
    if _float_like(target) and tuple(target.shape) == \
            ((classes,) if unbatched else tuple(x.shape)):
        return _finish(_cross_entropy_probabilities(x, target, w, ignore_index, reduction,
                                                    smoothing, unbatched),
                       unbatched, reduction, was_numpy)
    # The fused kernel runs a row per GPU thread, serial over the classes: past
    # FUSED_MAX_CLASSES the row-parallel log_softmax and a gather are the better road, unless
    # the backend has its own fused routine (the CPU's, vectorised over the row: any C).
    plain = (len(x.shape) == 2 and w is None and smoothing == 0.0 and reduction != "none"
             and x.shape[0] > 0 and (classes <= FUSED_MAX_CLASSES or _native_fused(x.device)))
    on_device = isinstance(target, _core.Array) and target.dtype == np.int64
    if plain and on_device and not unbatched and tracing():
        # fastmetal.compile records this step: the labels stay on the device (no host read,
        # so ignore_index is not looked for; the kernel turns a label outside [0, C) into NaN).
        if tuple(target.shape) != (x.shape[0],):
            raise ValueError(f"[fastmetal.{op}] expected target of shape ({x.shape[0]},), got "
                             f"shape {tuple(target.shape)}")
        return _fused(x, target, reduction)
    t = _check_target_shape(_class_targets(target, op), x, unbatched, op)
    if plain and not (t == ignore_index).any():
        bad = (t < 0) | (t >= classes)
        if bad.any():
            raise _core.IndexOutOfRange(f"[fastmetal.{op}] expected target in [0, {classes}) (or "
                             f"ignore_index={ignore_index}), got {t[bad][0]}")
        # An int64 Array target is read in place by the kernel (checked above on the host).
        labels = target if on_device and not unbatched else t.astype(np.int64, copy=False)
        return _finish(_fused(x, labels, reduction), unbatched, reduction, was_numpy)
    logp = log_softmax(x, 1)
    return _finish(_nll(logp, t, w, ignore_index, reduction, smoothing, op), unbatched,
                   reduction, was_numpy)


@functools.lru_cache(maxsize=None)
def _native_fused(device):
    return bool(_core._has_native_op(device, "cross_entropy"))


def _fused(x, labels, reduction):
    """The fused kernel's mean (ops/training.py), times N for ``"sum"``."""
    loss = cross_entropy_fused(x, labels)
    return loss * float(x.shape[0]) if reduction == "sum" else loss


def _cross_entropy_probabilities(x, target, weight, ignore_index, reduction, smoothing,
                                 unbatched):
    """PyTorch's cross-entropy against class probabilities: ``-sum_c w_c t_c log p_c`` per
    position, the mean dividing by the number of positions (N * d1 * ...)."""
    op = "cross_entropy"
    if ignore_index != -100:  # PyTorch refuses it too
        raise RuntimeError(f"[fastmetal.{op}] expected ignore_index to be left at -100 with "
                           f"class-probability (float) targets, got {ignore_index}")
    shape = tuple(x.shape)
    classes = shape[1]
    t = target if isinstance(target, _core.Array) else _as_device_array(target, x)
    if unbatched:
        t = t.reshape((1, classes))
    if smoothing > 0.0:
        t = t * (1.0 - smoothing) + smoothing / classes
    if weight is not None:
        t = t * _as_device_array(weight.reshape((1, classes) + (1,) * (len(shape) - 2)), x)
    loss = -_sum(log_softmax(x, 1) * t, axis=1)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return _sum(loss)
    return _mean(loss)


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
