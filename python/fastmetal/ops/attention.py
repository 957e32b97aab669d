"""Fused attention: ``scaled_dot_product_attention`` as ``torch.nn.functional``'s.

One kernel pass per direction (``metal/attention_forward.metal``,
``metal/attention_backward.metal``; the CPU runs its own tiled form): the forward keeps score
tiles in fast memory with an online softmax and saves the per-row logsumexp, the backward
recomputes the scores tile by tile (FlashAttention-2). Memory is O(L + S) per batch entry
beyond the inputs and outputs: no ``L x S`` matrix is ever built.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _core
from ..autograd import tape
from ..autograd.declare import op
from .capture import uncapturable
from .random import fresh_seed
from .training import _dropout_key

__all__ = ["scaled_dot_product_attention"]

_OP = "scaled_dot_product_attention"


def _mask(attn_mask):
    """(mask, is_bool): a NumPy bool mask (or anything with a bool dtype, a torch tensor
    included) stays boolean; every other mask is additive (fastmetal Arrays hold no bools)."""
    if attn_mask is None or isinstance(attn_mask, _core.Array):
        return attn_mask, False
    dtype = getattr(attn_mask, "dtype", None)
    if dtype is not None and (dtype == np.bool_ or str(dtype) in ("bool", "torch.bool")):
        return np.asarray(attn_mask, dtype=np.bool_), True
    return attn_mask, False


def _check(dropout_p, is_causal, scale, enable_gqa, seed):
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"[fastmetal.{_OP}] expected dropout_p to be a float in [0, 1), got "
                        f"{dropout_p!r}")
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"[fastmetal.{_OP}] expected dropout_p to be a float in [0, 1), got "
                         f"{dropout_p!r}")
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"[fastmetal.{_OP}] expected {name} to be True or False, got {flag!r}")
    if scale is not None:
        if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
            raise TypeError(f"[fastmetal.{_OP}] expected scale to be a float or None, got "
                            f"{scale!r}")
        if not math.isfinite(float(scale)):
            raise ValueError(f"[fastmetal.{_OP}] expected a finite scale, got {scale!r}")
    if float(dropout_p) == 0.0:
        return 0, 1.0, 0, 0
    if seed is None:
        # The key is drawn in Python and is the same for forward and backward; a compiled
        # step would replay it unchanged: such a step runs eagerly (ops/capture.py).
        uncapturable("scaled_dot_product_attention with dropout_p > 0 (its key is drawn in "
                     "Python)")
        seed = fresh_seed()
    return _dropout_key(float(dropout_p), seed, _OP)


def _gqa(query, key, value, enable_gqa):
    """With enable_gqa, query heads (dim -3) share key/value heads in groups, as PyTorch's
    repeat_interleave: query (..., Hk * G, L, E) is seen as (..., Hk, G, L, E) and key/value as
    (..., Hk, 1, S, E), which the kernel broadcasts without a copy. Returns the operands and G
    (1 without GQA)."""
    if not enable_gqa:
        return query, key, value, 1
    qs, ks, vs = (tuple(np.shape(x)) for x in (query, key, value))
    if len(qs) < 3 or len(ks) < 3 or len(vs) < 3 or ks[-3] != vs[-3] or ks[-3] < 1 \
            or qs[-3] % ks[-3] != 0:
        raise ValueError(f"[fastmetal.{_OP}] expected with enable_gqa query heads (dim -3) a "
                         f"multiple of key's and value's, got query {qs}, key {ks}, value {vs}")
    g = qs[-3] // ks[-3]
    split = qs[:-3] + (ks[-3], g) + qs[-2:]
    return (query.reshape(split), key.reshape(ks[:-2] + (1,) + ks[-2:]),
            value.reshape(vs[:-2] + (1,) + vs[-2:]), g)


def _gqa_mask(mask, g):
    """An attention mask over query heads (dim -3 of (..., Hq, L, S)) in the GQA view."""
    if g == 1 or mask is None or np.ndim(mask) < 3 or np.shape(mask)[-3] == 1:
        return mask
    s = tuple(np.shape(mask))
    return mask.reshape(s[:-3] + (s[-3] // g, g) + s[-2:])


@op(grads=("query", "key", "value"), saves=("query", "key", "value", "attn_mask", "out"),
    aux=True)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, seed=None):
    """``softmax(query @ key^T * scale + mask) @ value``, as
    ``torch.nn.functional.scaled_dot_product_attention``, fused: memory O(L + S) per batch
    entry, so long sequences run where an ``L x S`` matrix would not fit.

    ``query`` ``(..., L, E)``, ``key`` ``(..., S, E)``, ``value`` ``(..., S, Ev)`` (float32 or
    float16, all one dtype; float16 accumulates in float32), batch dims broadcast; ``E`` and
    ``Ev`` up to 128. ``attn_mask`` broadcastable to ``(..., L, S)``: boolean (``True`` takes
    part) or additive (added to the scaled scores). ``is_causal``: key ``j`` takes part in row
    ``i`` only if ``j <= i`` (top-left aligned, as PyTorch; may be combined with a mask here).
    ``scale`` defaults to ``1 / sqrt(E)``. ``enable_gqa``: query heads (dim -3) share key and
    value heads in groups, as PyTorch's.

    A row in which no key takes part gives 0 (and no gradient), as PyTorch 2.13's SDPA.
    ``dropout_p`` drops attention weights with fastmetal's Philox generator: weight
    ``(b, i, j)`` of the ``(batch..., L, S)`` attention matrix is kept as
    ``fastmetal.dropout`` would keep element ``(b, i, j)`` of that matrix with the same seed
    (so the same on every device). ``seed`` (keyword only, not in PyTorch): the mask's seed,
    default a fresh one from ``fastmetal.random`` (``fm.random.seed`` makes it reproducible).
    The result has the broadcast batch shape; the gradient reaches query, key and value (not
    the mask).
    """
    thr, dscale, k0, k1 = _check(dropout_p, is_causal, scale, enable_gqa, seed)
    if isinstance(attn_mask, _core.Array) and attn_mask.requires_grad and tape.is_grad_enabled():
        raise RuntimeError(f"[fastmetal.{_OP}] expected an attn_mask that does not require grad "
                           "(no gradient reaches the mask; pass attn_mask.detach()), got one "
                           "that requires grad")
    q, k, v, g = _gqa(query, key, value, enable_gqa)
    mask, is_bool = _mask(attn_mask)
    mask = _gqa_mask(mask, g)
    sc = -1.0 if scale is None else float(scale)
    out, lse = _core._sdpa_forward(q, k, v, mask, is_bool, bool(is_causal), sc, thr, dscale,
                                   k0, k1)
    if g != 1:
        out = out.reshape(tuple(out.shape[:-4]) + (out.shape[-4] * g,) + tuple(out.shape[-2:]))
    return out, (lse, sc, thr, dscale, k0, k1)


@scaled_dot_product_attention.vjp
def _sdpa_vjp(ctx, grad):  # aux: the forward's logsumexp and its dropout key
    lse, sc, thr, dscale, k0, k1 = ctx.aux
    q, k, v, g = _gqa(ctx.query, ctx.key, ctx.value, ctx.enable_gqa)
    mask, is_bool = _mask(ctx.attn_mask)
    mask = _gqa_mask(mask, g)
    out = ctx.out
    if grad.dtype != out.dtype:  # the kernel reads dO in the output's dtype
        grad = grad.astype(out.dtype)
    if g != 1:
        grad = grad.reshape(tuple(np.shape(lse)) + (np.shape(grad)[-1],))
        out = out.reshape(tuple(np.shape(lse)) + (np.shape(out)[-1],))
    dq, dk, dv = _core._sdpa_backward(grad, q, k, v, mask, is_bool, bool(ctx.is_causal), sc,
                                      thr, dscale, k0, k1, out, lse)
    if g != 1:  # back from the GQA view: the group axis summed into the shared heads
        dq = dq.reshape(tuple(dq.shape[:-4]) + (dq.shape[-4] * g,) + tuple(dq.shape[-2:]))
        dk = dk.sum(axis=-3)
        dv = dv.sum(axis=-3)
    return dq, dk, dv
