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

from . import _core
from ._declare import needed, op

__all__ = ["matmul", "linear", "linear_backward"]


@op(grads=("a", "b"), saves=("a", "b"))
def matmul(a, b, out=None):
    """Matrix product of two arrays, as ``numpy.matmul``.

    1-D operands are promoted (a leading / trailing 1 that is removed from the result),
    leading batch dimensions broadcast. ``out``: a NumPy array or a contiguous float32
    ``fastmetal.Array`` of the result's shape.
    """
    if out is None or isinstance(out, _core.Array):
        return _core._matmul(a, b, out)
    if not isinstance(out, np.ndarray):
        raise TypeError("[fastmetal.matmul] expected out to be a NumPy array or "
                        f"fastmetal.Array, got {type(out).__name__}")
    if not out.flags.writeable:
        raise ValueError("[fastmetal.matmul] expected a writeable out, got a read-only array")
    r = _core._matmul(a, b, None)
    # An Array result may live where the host cannot see it: .numpy() copies it then.
    r_host = r.numpy() if isinstance(r, _core.Array) else np.asarray(r)
    if out.shape != r_host.shape:
        raise ValueError(f"[fastmetal.matmul] expected out of shape {r_host.shape}, "
                         f"got shape {out.shape}")
    np.copyto(out, r_host, casting="same_kind")
    return out


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


@op(grads=("input", "weight", "bias"), saves=("input", "weight"))
def linear(input, weight, bias=None):  # noqa: A002 (PyTorch's name)
    """``input @ weight.T + bias`` for ``input`` of shape ``(*, in_features)``, ``weight``
    ``(out_features, in_features)`` and ``bias`` ``(out_features,)`` or None, as
    ``torch.nn.functional.linear``."""
    return _core._linear(input, weight, bias)


@linear.vjp
def _linear_vjp(ctx, g):
    return _core._linear_backward(g, ctx.input, ctx.weight,
                                  needed(ctx, ("input", "weight", "bias")))


def linear_backward(grad_output, x, weight, needs=("input", "weight", "bias")) -> tuple[Any, Any, Any]:
    """Gradients of :func:`linear`: ``(grad_input, grad_weight, grad_bias)`` with None for
    those not in ``needs`` (a collection of ``"input"``, ``"weight"``, ``"bias"``).

    grad_input = grad_output @ weight, grad_weight = grad_output^T x (over all leading
    dimensions), grad_bias = grad_output summed over all leading dimensions.
    """
    return _core._linear_backward(grad_output, x, weight, needs)
