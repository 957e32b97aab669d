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

from .. import _core
from ..autograd.declare import needed, op, refuse_recording

__all__ = ["conv2d", "conv2d_backward"]


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
