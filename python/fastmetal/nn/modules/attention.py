"""Attention layers, as ``torch.nn``'s: MultiheadAttention (on the fused
``scaled_dot_product_attention``)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from ... import _core
from ...ops import training as _training
from ...ops.attention import scaled_dot_product_attention as _sdpa
from ...ops.checks import check_bool, positive_int
from ...ops.creation import zeros as _zeros
from ...ops.elementwise import exp as _exp
from ...ops.linalg import linear as _linear
from ...ops.linalg import matmul as _matmul
from .. import init
from .linear import Linear
from .module import Module, Parameter

__all__ = ['MultiheadAttention']

_CLS = "MultiheadAttention"


def _additive(mask, what, dtype=np.float32):
    """A PyTorch MHA mask as an additive one: a boolean mask's True means "may not attend"
    (-inf), the opposite of scaled_dot_product_attention's; float masks are added as they are."""
    if mask is None or isinstance(mask, _core.Array):
        return mask
    dt = getattr(mask, "dtype", None)
    if dt is not None and (dt == np.bool_ or str(dt) in ("bool", "torch.bool")):
        return np.where(np.asarray(mask, dtype=np.bool_), -np.inf, 0.0).astype(dtype)
    try:
        return np.asarray(mask, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise TypeError(f"[fastmetal.nn.{_CLS}] expected {what} to be a bool or float array, "
                        f"got {type(mask).__name__}") from e


class MultiheadAttention(Module):
    """Multi-head attention, as ``torch.nn.MultiheadAttention``: ``in_proj_weight``
    ``(3 E, E)`` and ``in_proj_bias`` ``(3 E,)`` project query, key and value; ``out_proj`` (a
    Linear) the concatenated heads; ``state_dict`` keys as PyTorch's, so its weights load.
    Inputs ``(L, N, E)`` (``(N, L, E)`` with ``batch_first``) or unbatched ``(L, E)``.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)`` returns ``(output, weights)``: weights
    ``(N, L, S)`` averaged over heads (``(N, H, L, S)`` without averaging), or None when
    ``need_weights`` is False. Masks as PyTorch's: a boolean ``True`` keeps a position out,
    float masks are added; ``attn_mask`` ``(L, S)`` or ``(N * H, L, S)``, ``key_padding_mask``
    ``(N, S)``. ``is_causal`` without ``attn_mask`` applies the causal mask (PyTorch asks for
    the mask too and trusts it is causal; so does this layer when both are given). The
    output always comes from the fused kernel (memory O(L + S)); the weights, when asked for,
    are computed besides it (an ``L x S`` matrix per head). Dropout on the attention weights
    in training mode uses a new seed per call (``seed``/``rng`` as Dropout's).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, batch_first=False, *,
                 seed=None, rng=None, device=None):
        super().__init__()
        self.embed_dim = positive_int(embed_dim, "embed_dim", _CLS)
        self.num_heads = positive_int(num_heads, "num_heads", _CLS)
        if self.embed_dim % self.num_heads:
            raise ValueError(f"[fastmetal.nn.{_CLS}] expected embed_dim divisible by num_heads, "
                             f"got embed_dim={embed_dim}, num_heads={num_heads}")
        self.head_dim = self.embed_dim // self.num_heads
        if isinstance(dropout, (bool, np.bool_)) or not isinstance(dropout, numbers.Real) \
                or not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"[fastmetal.nn.{_CLS}] expected dropout to be a float in [0, 1), "
                             f"got {dropout!r}")
        self.dropout = float(dropout)
        check_bool(bias, "bias", _CLS)
        check_bool(batch_first, "batch_first", _CLS)
        self.batch_first = bool(batch_first)
        rng = init._rng_for(_CLS, seed, rng)
        E = self.embed_dim
        # PyTorch's initialisation: Xavier-uniform in_proj_weight, zero biases, out_proj's
        # weight as a Linear's.
        self.in_proj_weight = init._uniform_parameter(rng, math.sqrt(6.0 / (E + 3 * E)), (3 * E, E),
                                                      device)
        self.in_proj_bias = Parameter(_zeros((3 * E,), device=device)) if bias else None
        self.out_proj = Linear(E, E, bias=bias, rng=rng, device=device)
        if bias:
            init.zeros_(self.out_proj.bias)
        self._next_seed = init._seed_for(rng)

    def _project(self, x, part):
        E = self.embed_dim
        w = self.in_proj_weight[part * E:(part + 1) * E]
        b = None if self.in_proj_bias is None else self.in_proj_bias[part * E:(part + 1) * E]
        return _linear(x, w, b)

    def _heads(self, x, seq_first):
        """(T, N, E) (seq_first) or (N, T, E) -> a (N, H, T, head_dim) view, no copy: the fused
        op reads head-split views in place (and lays its output out the same way)."""
        a, b = x.shape[0], x.shape[1]
        x = x.reshape((a, b, self.num_heads, self.head_dim))
        return x.permute(1, 2, 0, 3) if seq_first else x.permute(0, 2, 1, 3)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        E, H = self.embed_dim, self.num_heads
        nd = len(query.shape)
        if nd not in (2, 3) or len(key.shape) != nd or len(value.shape) != nd:
            raise ValueError(f"[fastmetal.nn.{_CLS}] expected query, key and value all 3-D "
                             f"(batched) or all 2-D (unbatched), got {tuple(query.shape)}, "
                             f"{tuple(key.shape)}, {tuple(value.shape)}")
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.shape[-1] != E:
                raise ValueError(f"[fastmetal.nn.{_CLS}] expected {name}'s last dim to be "
                                 f"embed_dim={E}, got shape {tuple(x.shape)}")
        batched = nd == 3
        # Projections in the inputs' own layout (contiguous as given: a transposed copy costs
        # more than the projection), heads split as views.
        seq_first = not (batched and self.batch_first)
        if not batched:  # (T, E) -> (T, 1, E)
            query, key, value = (x.reshape((x.shape[0], 1, E)) for x in (query, key, value))
        (L, N), S = ((query.shape[0], query.shape[1]) if seq_first
                     else (query.shape[1], query.shape[0])), key.shape[0 if seq_first else 1]
        if tuple(key.shape) != tuple(value.shape) or key.shape[1 if seq_first else 0] != N:
            raise ValueError(f"[fastmetal.nn.{_CLS}] expected key and value of one batch and "
                             f"length, the batch of query, got {tuple(key.shape)}, "
                             f"{tuple(value.shape)}")
        q = self._heads(self._project(query, 0), seq_first)
        k = self._heads(self._project(key, 1), seq_first)
        v = self._heads(self._project(value, 2), seq_first)

        mask = _additive(attn_mask, "attn_mask")
        if mask is not None:
            ms = tuple(mask.shape)
            if ms == (L, S):
                pass
            elif ms == (N * H, L, S) or (not batched and ms == (H, L, S)):
                mask = mask.reshape((N, H, L, S))
            else:
                raise ValueError(f"[fastmetal.nn.{_CLS}] expected attn_mask of shape {(L, S)} "
                                 f"or {(N * H, L, S)}, got {ms}")
        kpm = _additive(key_padding_mask, "key_padding_mask")
        if kpm is not None:
            want = (N, S) if batched else (S,)
            if tuple(kpm.shape) != want:
                raise ValueError(f"[fastmetal.nn.{_CLS}] expected key_padding_mask of shape "
                                 f"{want}, got {tuple(kpm.shape)}")
            kpm = kpm.reshape((N, 1, 1, S))
            mask = kpm if mask is None else mask + kpm
        causal = bool(is_causal) and attn_mask is None

        p = self.dropout if self.training else 0.0
        seed = None
        if p > 0.0:
            seed = self._next_seed
            self._next_seed = (seed + 1) % 2**64
        o = _sdpa(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, seed=seed)
        # The output is laid out as q: back to (T, N, E) / (N, T, E) without a copy.
        o = o.permute(2, 0, 1, 3).reshape((L, N, E)) if seq_first \
            else o.permute(0, 2, 1, 3).reshape((N, L, E))
        out = self.out_proj(o)
        if not batched:
            out = out.reshape((L, E))
        if not need_weights:
            return out, None

        scores = _matmul(q, k.swapaxes(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        if causal:
            scores = scores + np.triu(np.full((L, S), -np.inf, np.float32), 1)
        if mask is not None:
            scores = scores + mask
        weights = _exp(_training.log_softmax(scores, -1))
        if p > 0.0:  # the kernel's mask: the same Philox draw over the (N, H, L, S) weights
            weights = _training.dropout(weights, p, seed=seed)
        if average_attn_weights:
            weights = weights.mean(axis=1)
        return out, (weights if batched else weights[0])

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")
