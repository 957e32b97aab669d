"""Matrix products: ``matmul`` (``numpy.matmul`` semantics) and the dense layer
``linear`` / ``linear_backward`` (``torch.nn.functional.linear`` semantics), built on one
GEMM: the tiled MSL kernel of ``metal/matmul.metal`` on GPUs, the conv2d engine's
register-blocked CPU GEMM on the ``cpu`` device.

NumPy in, NumPy out; a ``fastmetal.Array`` argument gives ``fastmetal.Array`` results on
its device. Computation is float32 (other dtypes are converted). Bad shapes raise
``ValueError`` worded ``[fastmetal.matmul] expected ..., got ...``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _core
from ..autograd.declare import needed, op, refuse_recording
from ..autograd.tape import is_grad_enabled
from .elementwise import multiply

__all__ = ["matmul", "linear", "linear_backward", "dot"]


@op(grads=("a", "b"), saves=("a", "b"), higher_order=True)
def matmul(a, b, out=None):
    """Matrix product of two arrays, as ``numpy.matmul``.

    1-D operands are promoted (a leading / trailing 1 that is removed from the result),
    leading batch dimensions broadcast. ``out``: a NumPy array or ``fastmetal.Array`` of
    the result's shape and a floating dtype (fastmetal's out= rules: docs/API.md).
    """
    return _core._matmul(a, b, out)


def _swap_last(x):
    if isinstance(x, _core.Array):
        nd = x.ndim
        return x.transpose(tuple(range(nd - 2)) + (nd - 1, nd - 2))
    return np.swapaxes(x, -1, -2)


@matmul.vjp
def _matmul_vjp(ctx, g):
    a = ctx.a if isinstance(ctx.a, _core.Array) else np.asarray(ctx.a, np.float32)
    b = ctx.b if isinstance(ctx.b, _core.Array) else np.asarray(ctx.b, np.float32)
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    a2 = a.reshape((1, a.shape[0])) if a_vec else a
    b2 = b.reshape((b.shape[0], 1)) if b_vec else b
    g2 = g.reshape(tuple(g.shape[:g.ndim - (0 if b_vec else 1)]) + (1,) +
                   (() if b_vec else (g.shape[-1],))) if a_vec else g
    if b_vec:
        g2 = g2.reshape(tuple(g2.shape) + (1,))
    ga = gb = None
    if ctx.needs[0]:  # dL/da = g @ b^T, summed over broadcast batch dims by the tape
        ga = matmul(g2, _swap_last(b2))
        if a_vec:
            ga = ga.reshape(tuple(ga.shape[:-2]) + (ga.shape[-1],))
    if ctx.needs[1]:  # dL/db = a^T @ g
        gb = matmul(_swap_last(a2), g2)
        if b_vec:
            gb = gb.reshape(tuple(gb.shape[:-1]))
    return ga, gb


@op(grads=("input", "weight", "bias"), saves=("input", "weight"), higher_order=True)
def linear(input, weight, bias=None):  # noqa: A002 (PyTorch's name)
    """``input @ weight.T + bias`` for ``input`` of shape ``(*, in_features)``, ``weight``
    ``(out_features, in_features)`` and ``bias`` ``(out_features,)`` or None, as
    ``torch.nn.functional.linear``."""
    return _core._linear(input, weight, bias)


@linear.vjp
def _linear_vjp(ctx, g):
    if is_grad_enabled():  # create_graph: the same products, recorded (second order)
        return _linear_vjp_recorded(ctx, g)
    return _core._linear_backward(g, ctx.input, ctx.weight,
                                  needed(ctx, ("input", "weight", "bias")))


def _linear_vjp_recorded(ctx, g):
    x, w = ctx.input, ctx.weight
    rows = g.reshape(-1, g.shape[-1]) if g.ndim != 2 else g
    gx = matmul(g, w) if ctx.needs[0] else None
    gw = matmul(_swap_last(rows), x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x) \
        if ctx.needs[1] else None
    gb = rows.sum(axis=0) if ctx.needs[2] else None
    return gx, gw, gb


def linear_backward(grad_output, x, weight, needs=("input", "weight", "bias")) -> tuple[Any, Any, Any]:
    """Gradients of :func:`linear`: ``(grad_input, grad_weight, grad_bias)`` with None for
    those not in ``needs`` (a collection of ``"input"``, ``"weight"``, ``"bias"``).

    grad_input = grad_output @ weight, grad_weight = grad_output^T x (over all leading
    dimensions), grad_bias = grad_output summed over all leading dimensions.
    """
    refuse_recording("fastmetal.linear_backward", grad_output, x, weight)
    return _core._linear_backward(grad_output, x, weight, needs)


def dot(a, b, out=None):
    """Dot product as ``numpy.dot``: a product for 0-d operands, the inner product of two
    1-D arrays (a 0-d result), ``matmul`` for 2-D ones, and for N-D operands the sum over
    the last axis of ``a`` and the second-to-last of ``b`` (result shape
    ``a.shape[:-1] + b.shape[:-2] + b.shape[-1:]``), all through :func:`matmul` on the
    device. float32 (other dtypes converted, as ``matmul``)."""
    a_nd = a.ndim if isinstance(a, _core.Array) else np.ndim(a)
    b_nd = b.ndim if isinstance(b, _core.Array) else np.ndim(b)
    if a_nd == 0 or b_nd == 0:
        return multiply(a, b, out=out)  # the public op: it records a gradient
    if b_nd <= 2:  # matmul's broadcasting over a's leading axes is dot's rule here
        return matmul(a, b, out)
    a_arr = a if isinstance(a, _core.Array) else _core.asarray(np.asarray(a, np.float32))
    b_arr = b if isinstance(b, _core.Array) else _core.asarray(np.asarray(b, np.float32),
                                                               device=a_arr.device)
    n = a_arr.shape[-1]
    k = b_arr.shape[-2]
    if n != k:
        raise ValueError(f"[fastmetal.dot] expected a.shape[-1] == b.shape[-2], got shapes "
                         f"{a_arr.shape} and {b_arr.shape} (shapes not aligned)")
    b_moved = b_arr.transpose(*([b_nd - 2] + [d for d in range(b_nd) if d != b_nd - 2]))
    result = matmul(a_arr.reshape(-1, n), b_moved.reshape(n, -1))
    shape = tuple(a_arr.shape[:-1]) + tuple(b_arr.shape[:-2]) + tuple(b_arr.shape[-1:])
    result = result.reshape(shape)
    if out is not None:
        return _core._store_out("dot", result, out)
    if not isinstance(a, _core.Array) and not isinstance(b, _core.Array):
        return result.numpy()
    return result
