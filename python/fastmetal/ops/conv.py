"""2-D convolution, forward and backward, with the semantics of ``torch.nn.functional.conv2d``.

Both functions validate every argument before doing any work and raise ``ValueError`` /
``TypeError`` worded ``"[fastmetal.conv2d] expected ..., got ..."``.

Dtypes: computation is float32. float16, float64, integer and bool inputs are converted to
float32 and the results are float32 (API.md's dtype rule; Apple GPUs have no float64).
Complex, object and string dtypes raise ``TypeError``.

Return types: NumPy in, NumPy out; if any array argument is a ``fastmetal.Array`` the
results are ``fastmetal.Array`` objects on its device.

Implementation: on the ``cpu`` device the CPU's own convolution algorithms run; on GPU
devices the Metal Shading Language kernels of ``metal/conv2d.metal`` (tiled implicit
GEMMs in threadgroup memory, direct kernels for depthwise layers, tree reductions).
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import _core
from .._core import Array
from ..autograd.declare import needed, op, refuse_recording

__all__ = ["conv2d", "conv2d_backward", "conv1d", "conv_transpose2d"]


@op(grads=("input", "weight", "bias"), saves=("input", "weight"))
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D cross-correlation, as ``torch.nn.functional.conv2d``.

    Parameters
    ----------
    input : array_like or fastmetal.Array
        ``(N, C_in, H, W)``, or unbatched ``(C_in, H, W)`` (the result is then
        ``(C_out, H_out, W_out)``).
    weight : array_like or fastmetal.Array
        ``(C_out, C_in / groups, kH, kW)``.
    bias : array_like, optional
        ``(C_out,)``, added to every output pixel of its channel.
    stride, dilation : int or (int, int)
        Positive; one value for both axes or ``(height, width)``.
    padding : int, (int, int), "valid" or "same"
        Zero padding on both sides of each axis. ``"valid"`` is no padding. ``"same"`` pads
        so that the output has the input's size: a total of ``dilation * (k - 1)`` per axis,
        ``total // 2`` at the top/left and the rest at the bottom/right (as PyTorch);
        it requires ``stride == 1``.
    groups : int
        Input and output channels are split into ``groups`` independent convolutions;
        ``groups == C_in`` (with ``C_out`` a multiple of it) is a depthwise convolution.

    Returns
    -------
    ``(N, C_out, H_out, W_out)`` float32, where
    ``H_out = (H + pad_top + pad_bottom - dilation * (kH - 1) - 1) // stride + 1``.
    """
    return _core.conv2d(input, weight, bias, stride, padding, dilation, groups)


@conv2d.vjp
def _conv2d_vjp(ctx, g):
    return _core.conv2d_backward(g, ctx.input, ctx.weight, ctx.stride, ctx.padding,
                                 ctx.dilation, ctx.groups,
                                 needed(ctx, ("input", "weight", "bias")))


def conv2d_backward(grad_output, input, weight, stride=1, padding=0, dilation=1, groups=1,
                    needs=("input", "weight", "bias")):
    """Gradients of :func:`conv2d` with respect to its input, weight and bias.

    ``grad_output`` is the gradient of the loss with respect to ``conv2d``'s output (its
    shape); ``input``, ``weight`` and the hyper-parameters are those of the forward call.
    ``needs`` names the gradients to compute, any of ``"input"``, ``"weight"``, ``"bias"``
    (a single name may be given as a string); only those are computed.

    Returns
    -------
    ``(grad_input, grad_weight, grad_bias)`` with ``None`` for each gradient not in
    ``needs``; shapes are those of ``input``, ``weight`` and ``(C_out,)``. ``grad_bias`` is
    ``grad_output`` summed over batch and pixels (the forward call's bias is not needed).
    """
    refuse_recording("fastmetal.conv2d_backward", grad_output, input, weight)
    return _core.conv2d_backward(grad_output, input, weight, stride, padding, dilation, groups,
                                 needs)


def conv2d_spec(stride, padding, dilation, groups, where):
    """conv2d's stride, padding, dilation and groups checked and in normal form (pairs;
    padding may stay "same"/"valid"), as the op checks them: for layers that check at
    construction. ``where`` names the caller in errors."""
    return _core._conv2d_spec(stride, padding, dilation, groups, where)


def conv_transpose2d_spec(stride, padding, output_padding, groups, dilation, where):
    """conv_transpose2d's stride, padding, output_padding, groups and dilation checked and as
    pairs (groups an int), as the op checks them: for layers that check at construction."""
    return _core._conv_transpose2d_spec(stride, padding, output_padding, groups, dilation, where)


@op(grads=("input", "weight", "bias"), saves=("input", "weight"))
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """2-D transposed convolution, as ``torch.nn.functional.conv_transpose2d``: the gradient
    of :func:`conv2d` with respect to its input, run on conv2d's engine.

    ``input`` is ``(N, C_in, H, W)`` or unbatched ``(C_in, H, W)``; ``weight``
    ``(C_in, C_out / groups, kH, kW)``; ``bias`` ``(C_out,)``. ``stride``, ``padding``,
    ``output_padding`` and ``dilation`` are an int or an ``(h, w)`` pair; ``output_padding``
    must be smaller than the stride or the dilation on each axis. The output is
    ``H_out = (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1``
    (likewise ``W_out``), float32.
    """
    return _core._conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups,
                                   dilation)


@conv_transpose2d.vjp
def _conv_transpose2d_vjp(ctx, g):
    return _core._conv_transpose2d_backward(g, ctx.input, ctx.weight, ctx.stride, ctx.padding,
                                            ctx.output_padding, ctx.groups, ctx.dilation,
                                            needed(ctx, ("input", "weight", "bias")))


def _single(value, name, where):
    """conv1d's int-or-1-tuple argument as an int (strings pass through: padding modes)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise ValueError(f"[fastmetal.{where}] expected {name} to be an int or a 1-tuple, "
                             f"got {value!r}")
        value = value[0]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"[fastmetal.{where}] expected {name} to be an int or a 1-tuple, "
                        f"got {value!r}")
    return int(value)


def _with_unit_height(a, axis):
    """`a` with a dimension of 1 inserted at `axis` (a view; recorded for Arrays)."""
    if isinstance(a, Array):
        return a.reshape(*a.shape[:axis], 1, *a.shape[axis:])
    a = np.asarray(a)
    return a.reshape(a.shape[:axis] + (1,) + a.shape[axis:])


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D cross-correlation, as ``torch.nn.functional.conv1d``: :func:`conv2d` over a unit
    height (so its gradients are conv2d's).

    ``input`` ``(N, C_in, L)`` or unbatched ``(C_in, L)``; ``weight``
    ``(C_out, C_in / groups, k)``; ``bias`` ``(C_out,)``; ``stride``, ``padding``,
    ``dilation`` an int or a 1-tuple, ``padding`` also ``"valid"`` or ``"same"``. Output
    ``(N, C_out, L_out)``, ``L_out = (L + 2 padding - dilation (k - 1) - 1) // stride + 1``.
    """
    where = "conv1d"
    s = _single(stride, "stride", where)
    p = _single(padding, "padding", where)
    d = _single(dilation, "dilation", where)
    x_ndim, w_ndim = np.ndim(input), np.ndim(weight)
    if x_ndim not in (2, 3):
        raise ValueError(f"[fastmetal.{where}] expected a 3-D input (N, C_in, L) or a 2-D "
                         f"unbatched input (C_in, L), got shape {tuple(np.shape(input))}")
    if w_ndim != 3:
        raise ValueError(f"[fastmetal.{where}] expected a 3-D weight (C_out, C_in/groups, k), "
                         f"got shape {tuple(np.shape(weight))}")
    try:
        y = conv2d(_with_unit_height(input, x_ndim - 1), _with_unit_height(weight, 2), bias,
                   stride=(1, s), padding=p if isinstance(p, str) else (0, p), dilation=(1, d),
                   groups=groups)
    except (ValueError, TypeError) as e:  # conv2d's check, named as the caller's
        message = str(e).replace("[fastmetal.conv2d]", f"[fastmetal.{where}]", 1)
        raise type(e)(f"{message} (conv1d runs as conv2d over a unit height)") from None
    return y.reshape(*y.shape[:-2], y.shape[-1])
