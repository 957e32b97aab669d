"""Normalization and softmax, as ``torch.nn.functional``: ``batch_norm``, ``group_norm``,
``layer_norm``, ``rms_norm``, ``softmax`` and ``logsumexp`` (``log_softmax`` is in
training.py, on the same kernels).

Each is one fused kernel per pass (metal/normalization.metal; on the CPU a multithreaded C++
path): statistics and normalisation forward, one backward, its gradient declared beside it.
float32 and float16 data (float16 computes and accumulates in float32); statistics are
float32. The weight and bias gradients of layer/rms/group norm are summed in an order fixed
by the shape: the same bits on every run and any number of threads. Bad input raises
``ValueError``/``TypeError`` worded ``"[fastmetal.layer_norm] expected ..., got ..."``.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import _core
from ..autograd.declare import op
from .elementwise import FUNCTIONS as E

__all__ = ["batch_norm", "group_norm", "layer_norm", "rms_norm", "softmax", "logsumexp"]


def _shape(x):
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def _dtype(x):
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _real(v, name, where, allow_none=False):
    if v is None and allow_none:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"[fastmetal.{where}] expected {name} to be a real number, got {v!r}")
    return float(v)


def _flag(v, name, where):
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"[fastmetal.{where}] expected {name} to be True or False, got {v!r}")
    return bool(v)


def _vector_shape(v, want, name, where):
    if v is not None and _shape(v) != tuple(want):
        raise ValueError(f"[fastmetal.{where}] expected {name} of shape {tuple(want)}, got "
                         f"{_shape(v)}")


def _wanted(ctx, grads):
    """The gradients (per name of ``grads``) from a backward that returned dx, dweight,
    dbias, keeping only what ctx.needs asks for."""
    return tuple(g if want else None for g, want in zip(grads, ctx.needs))


# --------------------------------------------------------------------------- batch_norm
@op(grads=("input", "weight", "bias"), saves=("input", "weight"), aux=True)
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,  # noqa: A002
               momentum=0.1, eps=1e-5):
    """Batch normalization over ``(N, C)`` or ``(N, C, *)``, as
    ``torch.nn.functional.batch_norm``: each channel ``c`` is normalised by the mean and the
    biased variance of its ``N * prod(*)`` values (``training=True``) or by
    ``running_mean[c]`` / ``running_var[c]`` (``training=False``), then scaled by
    ``weight[c]`` and shifted by ``bias[c]``. While training, ``running_mean`` and
    ``running_var`` (fastmetal Arrays, or None) are updated in place:
    ``(1 - momentum) * running + momentum * batch``, with the unbiased variance.
    """
    where = "batch_norm"
    shape = _shape(input)
    if len(shape) < 2:
        raise ValueError(f"[fastmetal.{where}] expected an input of at least 2 dimensions "
                         f"(N, C, *), got shape {shape}")
    training = _flag(training, "training", where)
    momentum = _real(momentum, "momentum", where)
    eps = _real(eps, "eps", where)
    C = shape[1]
    for v, name in ((running_mean, "running_mean"), (running_var, "running_var"),
                    (weight, "weight"), (bias, "bias")):
        _vector_shape(v, (C,), name, where)
    y, mean, rstd = _core._batch_norm(input, weight, bias, running_mean, running_var, training,
                                      momentum, eps)
    return y, (mean, rstd, training)


@batch_norm.vjp
def _batch_norm_vjp(ctx, g):
    mean, rstd, training = ctx.aux
    return _wanted(ctx, _core._batch_norm_backward(g, ctx.input, ctx.weight, mean, rstd,
                                                   training))


# --------------------------------------------------------------------------- group_norm
@op(grads=("input", "weight", "bias"), saves=("input", "weight"), aux=True)
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002
    """Group normalization, as ``torch.nn.functional.group_norm``: the ``C`` channels of
    ``input`` ``(N, C, *)`` in ``num_groups`` groups, each sample's group normalised by its
    own mean and biased variance, then ``weight[c]`` and ``bias[c]`` per channel."""
    where = "group_norm"
    shape = _shape(input)
    if len(shape) < 2:
        raise ValueError(f"[fastmetal.{where}] expected an input of at least 2 dimensions "
                         f"(N, C, *), got shape {shape}")
    if not _is_int(num_groups):
        raise TypeError(f"[fastmetal.{where}] expected num_groups to be an int, got "
                        f"{num_groups!r}")
    eps = _real(eps, "eps", where)
    _vector_shape(weight, (shape[1],), "weight", where)
    _vector_shape(bias, (shape[1],), "bias", where)
    y, mean, rstd = _core._group_norm(input, int(num_groups), weight, bias, eps)
    return y, (int(num_groups), mean, rstd)


@group_norm.vjp
def _group_norm_vjp(ctx, g):
    groups, mean, rstd = ctx.aux
    affine = ctx.needs[1] or ctx.needs[2]
    if not affine:
        return _core._group_norm_backward(g, ctx.input, groups, ctx.weight, mean, rstd,
                                          False), None, None
    return _wanted(ctx, _core._group_norm_backward(g, ctx.input, groups, ctx.weight, mean,
                                                   rstd, True))


# --------------------------------------------------------------------------- layer / rms
def _normalized(input, normalized_shape, where):
    if _is_int(normalized_shape):
        normalized_shape = (normalized_shape,)
    try:
        ns = tuple(normalized_shape)
    except TypeError:
        ns = None
    if not ns or not all(_is_int(d) for d in ns):
        raise TypeError(f"[fastmetal.{where}] expected normalized_shape to be an int or a "
                        f"non-empty sequence of ints, got {normalized_shape!r}")
    shape = _shape(input)
    if len(ns) > len(shape) or tuple(shape[len(shape) - len(ns):]) != tuple(int(d) for d in ns):
        raise ValueError(f"[fastmetal.{where}] expected the input's last dimensions to be "
                         f"normalized_shape {tuple(ns)}, got input shape {shape}")
    return tuple(int(d) for d in ns)


@op(grads=("input", "weight", "bias"), saves=("input", "weight"), aux=True)
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: A002
    """Layer normalization, as ``torch.nn.functional.layer_norm``: each slice over the last
    ``len(normalized_shape)`` dimensions is normalised by its mean and biased variance, then
    multiplied by ``weight`` and shifted by ``bias`` (both of ``normalized_shape``)."""
    where = "layer_norm"
    ns = _normalized(input, normalized_shape, where)
    eps = _real(eps, "eps", where)
    _vector_shape(weight, ns, "weight", where)
    _vector_shape(bias, ns, "bias", where)
    y, mean, rstd = _core._layer_norm(input, len(ns), weight, bias, eps)
    return y, (ns, mean, rstd)


@layer_norm.vjp
def _layer_norm_vjp(ctx, g):
    ns, mean, rstd = ctx.aux
    if not (ctx.needs[1] or ctx.needs[2]):
        return _core._layer_norm_backward(g, ctx.input, len(ns), ctx.weight, mean, rstd,
                                          False), None, None
    dx, dw, db = _core._layer_norm_backward(g, ctx.input, len(ns), ctx.weight, mean, rstd, True)
    return _wanted(ctx, (dx, dw.reshape(ns), db.reshape(ns)))


@op(grads=("input", "weight"), saves=("input", "weight"), aux=True)
def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002
    """Root-mean-square normalization, as ``torch.nn.functional.rms_norm``:
    ``x / sqrt(mean(x**2) + eps) * weight`` over the last ``len(normalized_shape)``
    dimensions; ``eps=None`` is the machine epsilon of the input's dtype."""
    where = "rms_norm"
    ns = _normalized(input, normalized_shape, where)
    if eps is None:
        dt = _dtype(input)
        eps = float(np.finfo(dt if dt == np.float16 else np.float32).eps)
    eps = _real(eps, "eps", where)
    _vector_shape(weight, ns, "weight", where)
    y, rstd = _core._rms_norm(input, len(ns), weight, eps)
    return y, (ns, rstd)


@rms_norm.vjp
def _rms_norm_vjp(ctx, g):
    ns, rstd = ctx.aux
    if not ctx.needs[1]:
        return _core._rms_norm_backward(g, ctx.input, len(ns), ctx.weight, rstd, False), None
    dx, dw = _core._rms_norm_backward(g, ctx.input, len(ns), ctx.weight, rstd, True)
    return _wanted(ctx, (dx, dw.reshape(ns)))


# --------------------------------------------------------------------------- softmax
def _axis(x, axis, dim, where):
    if dim is not None:
        if axis != -1:
            raise TypeError(f"[fastmetal.{where}] expected axis or dim, not both, got "
                            f"axis={axis!r}, dim={dim!r}")
        axis = dim
    if not _is_int(axis):
        raise TypeError(f"[fastmetal.{where}] expected dim to be an int, got {axis!r}")
    nd = max(len(_shape(x)), 1)
    if not -nd <= axis < nd:
        raise ValueError(f"[fastmetal.{where}] expected dim in [{-nd}, {nd}) for a "
                         f"{len(_shape(x))}-D input, got {axis}")
    return int(axis) % nd


@op(grads=("input",), saves=("out",), aux=True)
def softmax(input, axis=-1, *, dim=None):  # noqa: A002
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``, as ``torch.softmax(input,
    dim=axis)`` (``dim=`` is accepted for ``axis``); a NaN, a ``+inf`` or a slice of
    ``-inf`` makes its slice NaN, as PyTorch."""
    axis = _axis(input, axis, dim, "softmax")
    return _core._softmax(input, axis, False), axis


@softmax.vjp
def _softmax_vjp(ctx, g):
    return _core._softmax_backward(g, ctx.out, ctx.aux, False)  # aux: the checked axis


def _lse_axes(x, axis, where):
    nd = len(_shape(x))
    if axis is None:
        return tuple(range(nd))
    items = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    for a in items:
        if not _is_int(a):
            raise TypeError(f"[fastmetal.{where}] expected axis to be None, an int or a tuple "
                            f"of ints, got {axis!r}")
        if not -nd <= a < max(nd, 1) or (nd == 0 and a not in (0, -1)):
            raise ValueError(f"[fastmetal.{where}] expected axis in [{-nd}, {nd}) for an "
                             f"array of {nd} dimensions, got {a}")
    axes = tuple(sorted(int(a) % max(nd, 1) for a in items))
    if len(set(axes)) != len(axes):
        raise ValueError(f"[fastmetal.{where}] expected distinct axes, got {axis!r}")
    return axes if nd else ()


@op(grads=("x",), saves=("x", "out"), aux=True)
def logsumexp(x, axis=None, keepdims=False):
    """``log(sum(exp(x)))`` over ``axis`` (None: every axis; an int or a tuple), computed as
    ``m + log(sum(exp(x - m)))`` with ``m`` the max (0 where the max is infinite), as
    ``scipy.special.logsumexp`` and ``torch.logsumexp``: no overflow for large ``x``, ``inf``
    for a slice holding ``+inf``, ``-inf`` for a slice of ``-inf`` (or an empty one)."""
    axes = _lse_axes(x, axis, "logsumexp")
    keepdims = _flag(keepdims, "keepdims", "logsumexp")
    return _core._logsumexp(x, axis, keepdims), (axes, keepdims)


@logsumexp.vjp
def _logsumexp_vjp(ctx, g):
    axes, keepdims = ctx.aux
    out = ctx.out
    if not keepdims:
        kept = tuple(1 if i in axes else n for i, n in enumerate(ctx.x.shape))
        out, g = out.reshape(kept), g.reshape(kept)
    return E["multiply"](g, E["exp"](E["subtract"](ctx.x, out)))
