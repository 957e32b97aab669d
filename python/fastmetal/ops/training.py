"""Functional training ops: max pooling, dropout, log-softmax and the fused cross-entropy
(the public ``cross_entropy`` is ops/losses.py's).

Each has PyTorch's semantics (``torch.nn.functional``), a gradient for autograd declared
beside it, and its explicit backward as a public function too. Arguments are validated before any work; bad input raises
``ValueError``/``TypeError`` worded ``"[fastmetal.max_pool2d] expected ..., got ..."``.
Computation is float32; NumPy in gives NumPy out, a ``fastmetal.Array`` in gives Arrays on
its device. The kernels are in ``metal/training.metal``.
"""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from .. import _core
from ..autograd import tape
from ..autograd.declare import op, refuse_recording
from . import elementwise as E
from .capture import cell, dynamic
from .views import astype

__all__ = ["max_pool2d", "max_pool2d_backward", "dropout", "dropout_backward", "log_softmax",
           "log_softmax_backward"]


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _pair(value, name, op, minimum):
    what = f"{name} to be an int >= {minimum} or a pair of them"
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2:
        raise ValueError(f"[fastmetal.{op}] expected {what}, got {value!r}")
    for v in items:
        if not _is_int(v):
            raise TypeError(f"[fastmetal.{op}] expected {what}, got {value!r}")
        if v < minimum:
            raise ValueError(f"[fastmetal.{op}] expected {what}, got {value!r}")
    return int(items[0]), int(items[1])


def _pool_spec(kernel_size, stride, padding, op):
    k = _pair(kernel_size, "kernel_size", op, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
        else _pair(stride, "stride", op, 1)
    p = _pair(padding, "padding", op, 0)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ValueError(f"[fastmetal.{op}] expected padding to be at most half of the kernel "
                         f"size (kernel_size={k}), got padding={p}")
    return k, s, p


@op(grads=("input",), saves=("input",), aux=True)
def max_pool2d(input, kernel_size, stride=None, padding=0):  # noqa: A002 (PyTorch's name)
    """2-D max pooling, as ``torch.nn.functional.max_pool2d`` (dilation 1, floor mode).

    ``input`` is ``(N, C, H, W)`` or ``(C, H, W)``; ``kernel_size``, ``stride`` (default:
    ``kernel_size``) and ``padding`` are an int or an ``(h, w)`` pair, with
    ``padding <= kernel_size // 2``. Padding never wins a window. Output
    ``(..., (H + 2 ph - kh) // sh + 1, (W + 2 pw - kw) // sw + 1)``. A NaN in a window is its
    maximum (as PyTorch).
    """
    (kh, kw), (sh, sw), (ph, pw) = _pool_spec(kernel_size, stride, padding, "max_pool2d")
    return _core._max_pool2d(input, kh, kw, sh, sw, ph, pw), (kh, kw, sh, sw, ph, pw)


@max_pool2d.vjp
def _max_pool2d_vjp(ctx, g):  # aux: the checked window, so backward checks nothing again
    return _core._max_pool2d_backward(g, ctx.input, *ctx.aux)


def max_pool2d_backward(grad_output, x, kernel_size, stride=None, padding=0):
    """Gradient of :func:`max_pool2d` with respect to ``x`` (``x`` and the arguments of the
    forward call). Each window's gradient goes to its maximum: the first in row-major order
    on ties, as PyTorch; where windows overlap, the gradients of the windows an element wins
    are summed."""
    (kh, kw), (sh, sw), (ph, pw) = _pool_spec(kernel_size, stride, padding,
                                              "max_pool2d_backward")
    refuse_recording("fastmetal.max_pool2d_backward", grad_output, x)
    return _core._max_pool2d_backward(grad_output, x, kh, kw, sh, sw, ph, pw)


def _dropout_key(p, seed, op):
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
        raise TypeError(f"[fastmetal.{op}] expected p to be a float in [0, 1), got {p!r}")
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"[fastmetal.{op}] expected p to be a float in [0, 1), got {p!r}")
    if not _is_int(seed):
        raise TypeError(f"[fastmetal.{op}] expected seed to be an int in [0, 2**64), got {seed!r}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"[fastmetal.{op}] expected seed to be an int in [0, 2**64), "
                         f"got {seed!r}")
    threshold, scale = _dropout_scale(p)
    return threshold, scale, int(seed) & 0xFFFFFFFF, int(seed) >> 32


@functools.lru_cache(maxsize=64)  # NumPy scalar arithmetic is slow; a model has few p's
def _dropout_scale(p):
    threshold = math.ceil(p * 2**24)  # exact: keep where the 24 random bits >= threshold
    scale = float(np.float32(1.0) / np.float32(1.0 - p))  # PyTorch: x * (1 / (1 - p)) in float32
    return threshold, scale


@op(grads=("input",), aux=True)
def dropout(input, p=0.5, *, seed, training=True):  # noqa: A002 (PyTorch's name)
    """Dropout, as ``torch.nn.functional.dropout``: each element is zeroed with probability
    ``p`` and the others are scaled by ``1 / (1 - p)``; with ``training=False`` (or ``p == 0``)
    ``input`` is returned as it is.

    The mask is a pure function of ``seed`` (an int in ``[0, 2**64)``) and the element's
    index in C order: element ``i`` is kept where the high 24 bits of word ``i % 4`` of
    Philox-4x32-10 (counter ``(i // 4, 0, 0, 0)``, key ``(seed % 2**32, seed // 2**32)``) are at
    least ``ceil(p * 2**24)``. So a seed gives the same mask on every device; use a new seed
    for each call, and the same one for :func:`dropout_backward`.
    """
    threshold, scale, k0, k1 = _dropout_key(p, seed, "dropout")
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"[fastmetal.dropout] expected training to be True or False, "
                        f"got {training!r}")
    if not training or threshold == 0:
        return input, None
    key = cell()  # the key of this call, which a compiled step's replay rewrites
    key[0] = (threshold, scale, k0, k1)
    return _core._dropout(input, threshold, scale, k0, k1), key


@dropout.vjp
def _dropout_vjp(ctx, g):  # aux: the mask's key, as the forward computed it
    key = ctx.aux
    return dynamic(lambda: _core._dropout(g, *key[0]))


def dropout_backward(grad_output, p, *, seed):
    """Gradient of :func:`dropout` (training mode) with respect to its input: the same mask
    and scale, recomputed from ``p`` and ``seed``, applied to ``grad_output``."""
    refuse_recording("fastmetal.dropout_backward", grad_output)
    threshold, scale, k0, k1 = _dropout_key(p, seed, "dropout_backward")
    if threshold == 0:
        return grad_output
    return _core._dropout(grad_output, threshold, scale, k0, k1)


def _axis(x, axis, op):
    if not _is_int(axis):
        raise TypeError(f"[fastmetal.{op}] expected axis to be an int, got {axis!r}")
    nd = len(x.shape) if hasattr(x, "shape") else np.ndim(x)
    if not -nd <= axis < nd:
        raise ValueError(f"[fastmetal.{op}] expected axis in [{-nd}, {nd}) for a {nd}-D input, "
                         f"got {axis}")
    return int(axis) % nd


@op(grads=("input",), saves=("out",), aux=True)
def log_softmax(input, axis=-1, *, dim=None):  # noqa: A002 (PyTorch's name)
    """``input - logsumexp(input, axis)``, as ``torch.log_softmax(input, dim=axis)`` (``dim=``
    is accepted for ``axis``, as PyTorch names it); the max is subtracted first, so any
    finite logits give finite results."""
    if dim is not None:
        if axis != -1:
            raise TypeError(f"[fastmetal.log_softmax] expected axis or dim, not both, got "
                            f"axis={axis!r}, dim={dim!r}")
        axis = dim
    axis = _axis(input, axis, "log_softmax")
    return _core._softmax(input, axis, True), axis  # normalization.metal: float16 too


@log_softmax.vjp
def _log_softmax_vjp(ctx, g):
    return _core._softmax_backward(g, ctx.out, ctx.aux, True)  # aux: the checked axis


def log_softmax_backward(grad_output, output, axis=-1):
    """Gradient of :func:`log_softmax` with respect to its input, from its ``output``:
    ``grad_output - exp(output) * sum(grad_output, axis)``."""
    refuse_recording("fastmetal.log_softmax_backward", grad_output, output)
    return _core._softmax_backward(grad_output, output,
                                   _axis(output, axis, "log_softmax_backward"), True)


@op(grads=("logits",), aux=True, name="_cross_entropy_fused", public=False)
def cross_entropy_fused(logits, labels):
    """Mean cross-entropy of ``(N, C)`` logits against ``N`` integer class labels in
    ``[0, C)``: the loss as a 0-d array. ops/losses.cross_entropy, the public function, takes
    this road for its plain case, with NumPy labels it checked or an int64 Array read in
    place on its device (its range checked on the host where the memory is the host's, else
    by the kernel: a NaN loss; see _cross_entropy).

    One fused kernel computes the loss and, when the logits require grad, keeps its gradient
    ``(softmax(logits) - one_hot(labels)) / N`` for ``backward()``. log-softmax is computed
    max-shifted, so logits as large as ``±1e30`` give the same finite numbers as PyTorch.
    """
    return _core._cross_entropy(logits, labels)


@cross_entropy_fused.vjp
def _cross_entropy_vjp(ctx, g):
    if tape.is_ones(g):  # loss.backward(): the fused gradient as it is
        return ctx.aux
    return ctx.aux * g  # the fused gradient, scaled by the loss's own gradient


def optimizer_steps(kind, params, grads, states1, states2, hypers):
    """One optimizer update of every ``params[i]`` and its state buffers ``states1[i]``,
    ``states2[i]`` (None for "sgd") in place, with ``grads[i]`` and ``hypers[i]`` (its
    hyper-parameters by name): fused kernels, several tensors per launch (``kind``: "sgd",
    "adam", "adadelta"). Not differentiable: optimizers call it under ``no_grad``."""
    _core._optimizer_steps(kind, list(params), list(grads), list(states1), list(states2),
                           list(hypers))


def grad_norm(grads, norm_type, max_norm):
    """The total ``norm_type``-norm of ``grads`` (fastmetal Arrays of float16/32/64 on one
    device) as a 0-d float32 Array, and the clipping factor ``min(max_norm / (norm + 1e-6),
    1)`` as a one-element float32 Array, both computed on the device (``clip_grad_norm_``):
    a few gradients per launch, deterministic (metal/grad_clip.metal). Not differentiable."""
    return _core._grad_norm(list(grads), float(norm_type), float(max_norm))


def grad_scale_(grads, scale):
    """Every gradient times the factor ``scale`` (``grad_norm``'s) in place, in its dtype;
    contiguous ones a few per launch. Not differentiable."""
    for g in _core._grad_scale(list(grads), scale):  # strided views, written in place
        E.multiply(g, astype(scale, g.dtype, copy=False), out=g)
