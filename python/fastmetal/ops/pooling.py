"""Average pooling and nearest-neighbour resampling with PyTorch's semantics
(``torch.nn.functional.avg_pool2d``, ``adaptive_avg_pool2d``, ``interpolate(mode="nearest")``),
each differentiable, its gradient a kernel of ``metal/pooling.metal`` (one thread per input
element gathers what it received, in a fixed order: no atomics). Computation is float32;
NumPy in gives NumPy out, a ``fastmetal.Array`` in gives Arrays on its device. Bad
arguments raise ``ValueError``/``TypeError`` worded ``"[fastmetal.avg_pool2d] expected ...,
got ..."``.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _core
from .._core import Array
from ..autograd.declare import op
from .training import _is_int, _pool_spec

__all__ = ["avg_pool2d", "adaptive_avg_pool2d", "interpolate"]


def _spatial(input, where, ndims=(3, 4)):
    shape = tuple(input.shape) if isinstance(input, Array) else np.shape(input)
    if len(shape) not in ndims:
        want = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"[fastmetal.{where}] expected a {want} input, got shape {shape}")
    return shape


@op(grads=("input",), aux=True)
def avg_pool2d(input, kernel_size, stride=None, padding=0):  # noqa: A002 (PyTorch's name)
    """2-D average pooling, as ``torch.nn.functional.avg_pool2d`` with its defaults
    (``ceil_mode=False``, ``count_include_pad=True``): each output is the sum of its window
    (zero padding included) divided by ``kh * kw``.

    ``input`` is ``(N, C, H, W)`` or ``(C, H, W)``; ``kernel_size``, ``stride`` (default:
    ``kernel_size``) and ``padding`` are an int or an ``(h, w)`` pair, with
    ``padding <= kernel_size // 2``. Output ``(..., (H + 2 ph - kh) // sh + 1,
    (W + 2 pw - kw) // sw + 1)``.
    """
    (kh, kw), (sh, sw), (ph, pw) = _pool_spec(kernel_size, stride, padding, "avg_pool2d")
    shape = _spatial(input, "avg_pool2d")
    spec = (shape[-2], shape[-1], kh, kw, sh, sw, ph, pw)
    return _core._avg_pool2d(input, kh, kw, sh, sw, ph, pw), spec


@avg_pool2d.vjp
def _avg_pool2d_vjp(ctx, g):  # aux: the input's size and the checked window
    return _core._avg_pool2d_backward(g, *ctx.aux)


def _output_size(output_size, h, w, where):
    """adaptive_avg_pool2d's output_size: an int, or a pair of ints or None (None keeps the
    input's size on that axis)."""
    what = "output_size to be a positive int or a pair of positive ints or None"
    items = tuple(output_size) if isinstance(output_size, (tuple, list)) else \
        (output_size, output_size)
    if len(items) != 2:
        raise ValueError(f"[fastmetal.{where}] expected {what}, got {output_size!r}")
    out = []
    for v, keep in zip(items, (h, w)):
        if v is None:
            out.append(keep)
            continue
        if not _is_int(v):
            raise TypeError(f"[fastmetal.{where}] expected {what}, got {output_size!r}")
        if v < 1:
            raise ValueError(f"[fastmetal.{where}] expected {what}, got {output_size!r}")
        out.append(int(v))
    return out[0], out[1]


@op(grads=("input",), aux=True)
def adaptive_avg_pool2d(input, output_size):  # noqa: A002 (PyTorch's name)
    """2-D adaptive average pooling, as ``torch.nn.functional.adaptive_avg_pool2d``: output
    ``(i, j)`` averages rows ``[floor(i H / oh), ceil((i + 1) H / oh))`` and the columns
    likewise. ``input`` ``(N, C, H, W)`` or ``(C, H, W)``; ``output_size`` an int or an
    ``(oh, ow)`` pair whose ``None`` entries keep the input's size.
    """
    shape = _spatial(input, "adaptive_avg_pool2d")
    oh, ow = _output_size(output_size, shape[-2], shape[-1], "adaptive_avg_pool2d")
    return _core._adaptive_avg_pool2d(input, oh, ow), (shape[-2], shape[-1])


@adaptive_avg_pool2d.vjp
def _adaptive_avg_pool2d_vjp(ctx, g):  # aux: the input's size
    return _core._adaptive_avg_pool2d_backward(g, *ctx.aux)


def _per_axis(value, n, name, where, kind):
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,) * n
    if len(items) != n:
        raise ValueError(f"[fastmetal.{where}] expected {name} to be one {kind} or {n} of them "
                         f"(one per spatial axis), got {value!r}")
    return items


def _resample_plan(shape, size, scale_factor, where):
    """(out sizes, scales) per spatial axis, as PyTorch's interpolate: a size given, or
    floor(in * scale_factor) with the scale kept for the index rule (0.0: none)."""
    spatial = shape[2:]
    n = len(spatial)
    if (size is None) == (scale_factor is None):
        raise ValueError(f"[fastmetal.{where}] expected exactly one of size and scale_factor, "
                         f"got size={size!r}, scale_factor={scale_factor!r}")
    if size is not None:
        sizes = _per_axis(size, n, "size", where, "positive int")
        for v in sizes:
            if not _is_int(v):
                raise TypeError(f"[fastmetal.{where}] expected size to be a positive int or "
                                f"{n} of them, got {size!r}")
            if v < 1:
                raise ValueError(f"[fastmetal.{where}] expected size to be a positive int or "
                                 f"{n} of them, got {size!r}")
        return tuple(int(v) for v in sizes), (0.0,) * n
    scales = _per_axis(scale_factor, n, "scale_factor", where, "positive number")
    out = []
    for v, length in zip(scales, spatial):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
            raise TypeError(f"[fastmetal.{where}] expected scale_factor to be a positive "
                            f"number or {n} of them, got {scale_factor!r}")
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"[fastmetal.{where}] expected scale_factor to be a positive "
                             f"finite number or {n} of them, got {scale_factor!r}")
        o = math.floor(float(length) * float(v))
        if o < 1:
            raise ValueError(f"[fastmetal.{where}] expected scale_factor to give an output of "
                             f"at least 1, got {v!r} for an input of size {length} "
                             f"(floor({length} * {v}) = {o})")
        out.append(o)
    return tuple(out), tuple(float(v) for v in scales)


def _as_planes(a, shape):
    """`a` reshaped without recording (inside a declared op: the op is the graph's node)."""
    if isinstance(a, Array):
        return a.reshape(*shape)
    return np.reshape(np.asarray(a), shape)


@op(grads=("input",), aux=True)
def interpolate(input, size=None, scale_factor=None, mode="nearest"):  # noqa: A002
    """Resampling, as ``torch.nn.functional.interpolate`` with ``mode="nearest"`` (the only
    mode here): ``(N, C, L)`` or ``(N, C, H, W)`` input, exactly one of ``size`` (an int or
    one per spatial axis) and ``scale_factor`` (a number or one per axis; the output is
    ``floor(in * scale_factor)``). Output index ``i`` reads PyTorch's source index:
    ``i`` where the sizes match, ``i // 2`` where the output is twice the input, else
    ``min(floor(i * scale), in - 1)`` in float32 with ``scale = 1 / scale_factor`` (given)
    or ``in / out``.
    """
    where = "interpolate"
    if mode != "nearest":
        raise ValueError(f"[fastmetal.{where}] expected mode='nearest' (the only mode "
                         f"fastmetal has), got mode={mode!r}")
    shape = _spatial(input, where, ndims=(3, 4))
    sizes, scales = _resample_plan(shape, size, scale_factor, where)
    if len(shape) == 3:  # (N, C, L): one row of L
        x = _as_planes(input, (shape[0], shape[1], 1, shape[2]))
        y = _core._interpolate_nearest(x, 1, sizes[0], 0.0, scales[0])
        out = _as_planes(y, (shape[0], shape[1], sizes[0]))
    else:
        out = _core._interpolate_nearest(input, sizes[0], sizes[1], scales[0], scales[1])
    return out, (shape, scales)


@interpolate.vjp
def _interpolate_vjp(ctx, g):  # aux: the input's shape and the scales the forward used
    shape, scales = ctx.aux
    if len(shape) == 3:
        g2 = _as_planes(g, (shape[0], shape[1], 1, g.shape[-1]))
        gi = _core._interpolate_nearest_backward(g2, 1, shape[2], 0.0, scales[0])
        return _as_planes(gi, shape)
    return _core._interpolate_nearest_backward(g, shape[2], shape[3], scales[0], scales[1])
