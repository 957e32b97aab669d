"""Transformer layers, as ``torch.nn``'s: TransformerEncoderLayer (self-attention and a
feed-forward block, post- or pre-norm) and TransformerEncoder (a stack of copies of one)."""
from __future__ import annotations

import copy

import numpy as np

from ...ops.checks import check_bool, positive_int
from ...ops.elementwise import gelu as _gelu
from ...ops.elementwise import relu as _relu
from .. import init
from .attention import MultiheadAttention
from .container import ModuleList
from .dropout import Dropout
from .linear import Linear
from .module import Module
from .normalization import LayerNorm

__all__ = ["TransformerEncoderLayer", "TransformerEncoder"]

_ACTIVATIONS = {"relu": _relu, "gelu": _gelu}


class TransformerEncoderLayer(Module):
    """One encoder block, as ``torch.nn.TransformerEncoderLayer``: submodules ``self_attn``
    (MultiheadAttention), ``linear1`` ``(dim_feedforward, d_model)``, ``dropout``,
    ``linear2``, ``norm1``, ``norm2``, ``dropout1``, ``dropout2`` under PyTorch's names, so
    a PyTorch ``state_dict`` loads.

    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``: with
    ``norm_first`` ``x + sa(norm1(x))`` then ``x + ff(norm2(x))``, else
    ``norm1(x + sa(x))`` then ``norm2(x + ff(x))``; ``ff(x) = linear2(dropout(act(linear1(x))))``.
    ``src`` is ``(S, N, E)`` (``(N, S, E)`` with ``batch_first``) or ``(S, E)``; masks as
    MultiheadAttention's (bool ``True``: may not attend; float: added). ``is_causal``
    without ``src_mask`` applies the causal mask. ``activation``: ``"relu"``, ``"gelu"``
    (exact, erf) or a callable (a function or a Module). ``seed``/``rng`` make the
    initialisation and dropout masks reproducible (as Linear's and Dropout's).
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, *,
                 seed=None, rng=None, device=None):
        super().__init__()
        cls = "TransformerEncoderLayer"
        d_model = positive_int(d_model, "d_model", cls)
        dim_feedforward = positive_int(dim_feedforward, "dim_feedforward", cls)
        check_bool(norm_first, "norm_first", cls)
        check_bool(batch_first, "batch_first", cls)
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise RuntimeError(f"[fastmetal.nn.{cls}] expected activation 'relu', 'gelu' "
                                   f"or a callable, got {activation!r}")
            activation = _ACTIVATIONS[activation]
        elif not callable(activation):
            raise TypeError(f"[fastmetal.nn.{cls}] expected activation 'relu', 'gelu' or a "
                            f"callable, got {type(activation).__name__}")
        rng = init._rng_for(cls, seed, rng)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, rng=rng, device=device)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, rng=rng, device=device)
        self.dropout = Dropout(dropout, rng=rng)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, rng=rng, device=device)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device)
        self.dropout1 = Dropout(dropout, rng=rng)
        self.dropout2 = Dropout(dropout, rng=rng)
        self.activation = activation  # a Module activation registers (no parameters)

    @property
    def batch_first(self):
        return self.self_attn.batch_first

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


def _reseed(module, salt):
    """A deep copy's dropout layers would draw the original's masks: give each a seed of
    its own, a function of the original's seed and the copy's index (reproducible)."""
    for m in module.modules():
        if hasattr(m, "_next_seed"):
            m._next_seed = int(np.random.default_rng([m._next_seed, salt]).integers(0, 2**63))


class TransformerEncoder(Module):
    """``num_layers`` deep copies of ``encoder_layer`` (``layers``, a ModuleList) and an
    optional final ``norm``, as ``torch.nn.TransformerEncoder``: ``forward(src, mask=None,
    src_key_padding_mask=None, is_causal=None)`` runs them in turn. The copies start with
    the layer's parameters (as PyTorch's: initialise after building, or load a state_dict);
    their dropout layers draw masks of their own. ``enable_nested_tensor`` and
    ``mask_check`` are accepted for PyTorch's signature (no nested tensors here: padded
    positions are computed, not skipped)."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        super().__init__()
        cls = "TransformerEncoder"
        if not isinstance(encoder_layer, Module):
            raise TypeError(f"[fastmetal.nn.{cls}] expected encoder_layer to be a Module, got "
                            f"{type(encoder_layer).__name__}")
        self.num_layers = positive_int(num_layers, "num_layers", cls)
        layers = []
        for i in range(self.num_layers):
            layer = copy.deepcopy(encoder_layer)
            _reseed(layer, i + 1)
            layers.append(layer)
        self.layers = ModuleList(layers)
        self.norm = norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        return x if self.norm is None else self.norm(x)
