"""Average pooling and resampling with PyTorch's semantics
(``torch.nn.functional.avg_pool2d``, ``adaptive_avg_pool2d``, ``interpolate``), each
differentiable. The default avg_pool2d, adaptive pooling and nearest resampling are kernels of
``metal/pooling.metal`` (their gradients: one thread per input element gathers what it
received, in a fixed order: no atomics). avg_pool2d's ``ceil_mode`` / ``count_include_pad=False``
/ ``divisor_override`` and (bi)linear resampling are linear maps separable over the two axes:
they run as two matrix products with one small ``(out, in)`` weight matrix per axis (built on
the host), ``A_h @ x @ A_w.T``, and their gradients as ``A_h.T @ g @ A_w`` (exact; the work
is ``in`` multiply-adds per output instead of a window's, fine for the images these options
see). Computation is float32;
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
from .creation import asarray
from .linalg import matmul
from .training import _is_int, _pool_spec

__all__ = ["avg_pool2d", "adaptive_avg_pool2d", "interpolate"]


def _spatial(input, where, ndims=(3, 4)):
    shape = tuple(input.shape) if isinstance(input, Array) else np.shape(input)
    if len(shape) not in ndims:
        want = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"[fastmetal.{where}] expected a {want} input, got shape {shape}")
    return shape


def _pool_axis(n, k, s, p, ceil_mode, count_include_pad):
    """(out, weights (out, n) float64): PyTorch's output size and, per output, 1 / the window
    size on this axis over the window's input positions (the 2-D divisor is the product of
    the two axes', with or without the padding)."""
    out = (n + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:  # the last window must start inside the image
        out -= 1
    a = np.zeros((out, n))
    for i in range(out):
        start = i * s - p
        end = min(start + k, n + p)
        lo, hi = max(start, 0), min(end, n)
        a[i, lo:hi] = 1.0 / ((end - start) if count_include_pad else (hi - lo))
    return out, a


def _constant(a, like):
    """A float32 host matrix as an operand beside `like` (an Array on its device, or NumPy)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    return asarray(a, device=like.device) if isinstance(like, Array) else a


def _separable(x, ah, awt):
    return matmul(matmul(ah, x), awt)


@op(grads=("input",), aux=True)
def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True, divisor_override=None):
    """2-D average pooling, as ``torch.nn.functional.avg_pool2d``: each output is the sum of
    its window divided by ``kh * kw`` (``count_include_pad=True``: zero padding counted; with
    ``ceil_mode`` a last window that reaches past the padded input counts only up to its
    end), or by the number of input elements in it (``count_include_pad=False``), or by
    ``divisor_override``.

    ``input`` is ``(N, C, H, W)`` or ``(C, H, W)``; ``kernel_size``, ``stride`` (default:
    ``kernel_size``) and ``padding`` are an int or an ``(h, w)`` pair, with
    ``padding <= kernel_size // 2``. Output ``(..., (H + 2 ph - kh) // sh + 1,
    (W + 2 pw - kw) // sw + 1)``, or with ``ceil_mode`` rounded up (a last window must start
    inside the input or its left padding).
    """
    where = "avg_pool2d"
    (kh, kw), (sh, sw), (ph, pw) = _pool_spec(kernel_size, stride, padding, where)
    shape = _spatial(input, where)
    for name, v in (("ceil_mode", ceil_mode), ("count_include_pad", count_include_pad)):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"[fastmetal.{where}] expected {name} to be a bool, got {v!r}")
    if divisor_override is not None and (not _is_int(divisor_override) or divisor_override < 1):
        raise ValueError(f"[fastmetal.{where}] expected divisor_override to be a positive int "
                         f"or None, got {divisor_override!r}")
    if not ceil_mode and count_include_pad and divisor_override is None:  # the kernel
        spec = (shape[-2], shape[-1], kh, kw, sh, sw, ph, pw)
        return _core._avg_pool2d(input, kh, kw, sh, sw, ph, pw), spec
    h, w = shape[-2], shape[-1]
    if h + 2 * ph < kh or w + 2 * pw < kw:
        raise ValueError(f"[fastmetal.{where}] expected the padded input ({h + 2 * ph} x "
                         f"{w + 2 * pw}) to be at least the kernel size ({kh}, {kw})")
    _, ah = _pool_axis(h, kh, sh, ph, ceil_mode, count_include_pad)
    _, aw = _pool_axis(w, kw, sw, pw, ceil_mode, count_include_pad)
    if divisor_override is not None:  # the window's elements summed, one divisor
        ah, aw = (ah > 0) / float(divisor_override), (aw > 0).astype(np.float64)
    mats = (_constant(ah, input), _constant(aw.T, input))
    return _separable(input, *mats), mats


@avg_pool2d.vjp
def _avg_pool2d_vjp(ctx, g):  # aux: the input's size and the window, or the two matrices
    if len(ctx.aux) == 2:
        ah, awt = ctx.aux
        return _separable(g, ah.T, awt.T)
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


def _linear_axis(n_in, n_out, scale_factor, align_corners):
    """The (n_out, n_in) float64 weights of PyTorch's linear interpolation on one axis
    (area_pixel_compute_source_index, in float32 as PyTorch computes it for float32):
    align_corners maps the corner pixels' centres onto each other; otherwise output i reads
    source (i + 0.5) * scale - 0.5, clamped at 0, with scale = 1 / scale_factor where one was
    given, else in / out. An axis whose size does not change is copied, whatever the scale
    (as PyTorch does)."""
    if n_in == n_out:
        return np.eye(n_in)
    f32 = np.float32
    i = np.arange(n_out, dtype=f32)
    if align_corners:
        scale = f32((n_in - 1) / (n_out - 1)) if n_out > 1 else f32(0)
        src = scale * i
    else:
        scale = f32(1.0 / scale_factor) if scale_factor > 0 else f32(n_in / n_out)
        src = np.maximum(scale * (i + f32(0.5)) - f32(0.5), f32(0))
    i0 = np.minimum(src.astype(np.int64), n_in - 1)
    i1 = np.where(i0 < n_in - 1, i0 + 1, i0)
    l1 = (src - i0.astype(f32)).astype(np.float64)
    a = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    np.add.at(a, (rows, i0), 1.0 - l1)
    np.add.at(a, (rows, i1), l1)
    return a


_MODES = {"nearest": (3, 4), "linear": (3,), "bilinear": (4,)}


@op(grads=("input",), aux=True)
def interpolate(input, size=None, scale_factor=None, mode="nearest",  # noqa: A002
                align_corners=None):
    """Resampling, as ``torch.nn.functional.interpolate`` with ``mode="nearest"`` (``(N, C,
    L)`` or ``(N, C, H, W)``), ``"linear"`` (``(N, C, L)``) or ``"bilinear"`` (``(N, C, H,
    W)``): exactly one of ``size`` (an int or one per spatial axis) and ``scale_factor`` (a
    number or one per axis; the output is ``floor(in * scale_factor)``).

    nearest: output index ``i`` reads PyTorch's source index: ``i`` where the sizes match,
    ``i // 2`` where the output is twice the input, else ``min(floor(i * scale), in - 1)`` in
    float32 with ``scale = 1 / scale_factor`` (given) or ``in / out``.
    linear / bilinear: the weighted mean of the two nearest source pixels per axis;
    ``align_corners=True`` maps the corner pixels' centres onto each other (source ``i *
    (in - 1) / (out - 1)``), ``False`` (the default, None) the corners of the pixels
    (source ``(i + 0.5) * scale - 0.5``, clamped at 0); an axis whose size does not change
    is copied.
    """
    where = "interpolate"
    if mode not in _MODES:
        raise ValueError(f"[fastmetal.{where}] expected mode to be one of {sorted(_MODES)}, "
                         f"got mode={mode!r}")
    if mode == "nearest" and align_corners is not None:
        raise ValueError(f"[fastmetal.{where}] expected align_corners=None with "
                         f"mode='nearest' (it only applies to the linear modes), got "
                         f"align_corners={align_corners!r}")
    if align_corners is not None and not isinstance(align_corners, (bool, np.bool_)):
        raise TypeError(f"[fastmetal.{where}] expected align_corners to be a bool or None, "
                        f"got {align_corners!r}")
    shape = _spatial(input, where, ndims=(3, 4))
    if len(shape) not in _MODES[mode]:
        want = " or ".join(f"{n}-D" for n in _MODES[mode])
        raise ValueError(f"[fastmetal.{where}] expected a {want} input for mode={mode!r}, got "
                         f"shape {shape}")
    sizes, scales = _resample_plan(shape, size, scale_factor, where)
    if mode != "nearest":
        mats = [_linear_axis(n, o, sc, bool(align_corners))
                for n, o, sc in zip(shape[2:], sizes, scales)]
        if len(mats) == 1:  # (N, C, L): one matrix on the last axis
            awt = _constant(mats[0].T, input)
            return matmul(input, awt), ("linear", awt)
        ah, awt = _constant(mats[0], input), _constant(mats[1].T, input)
        return _separable(input, ah, awt), ("bilinear", ah, awt)
    if len(shape) == 3:  # (N, C, L): one row of L
        x = _as_planes(input, (shape[0], shape[1], 1, shape[2]))
        y = _core._interpolate_nearest(x, 1, sizes[0], 0.0, scales[0])
        out = _as_planes(y, (shape[0], shape[1], sizes[0]))
    else:
        out = _core._interpolate_nearest(input, sizes[0], sizes[1], scales[0], scales[1])
    return out, ("nearest", shape, scales)


@interpolate.vjp
def _interpolate_vjp(ctx, g):  # aux: the mode, then its matrices or the shape and scales
    kind, *rest = ctx.aux
    if kind == "linear":
        return matmul(g, rest[0].T)
    if kind == "bilinear":
        ah, awt = rest
        return _separable(g, ah.T, awt.T)
    shape, scales = rest
    if len(shape) == 3:
        g2 = _as_planes(g, (shape[0], shape[1], 1, g.shape[-1]))
        gi = _core._interpolate_nearest_backward(g2, 1, shape[2], 0.0, scales[0])
        return _as_planes(gi, shape)
    return _core._interpolate_nearest_backward(g, shape[2], shape[3], scales[0], scales[1])
