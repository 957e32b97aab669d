"""Recurrent layers' time loops (LSTM, GRU, Elman RNN), as ``torch.nn``'s, for
``fastmetal.nn.LSTM`` / ``GRU`` / ``RNN`` and their cells.

A layer direction is: ONE matrix product for the input part of every step
(``linear(x, W_ih, b_ih)`` over the whole ``(T, B, I)`` sequence), then ONE recorded op,
``lstm_layer`` / ``gru_layer`` / ``rnn_layer``, whose forward loops over the steps in C++
(``csrc/ops/recurrent.cpp``: a step is ``h_{t-1} @ W_hh^T`` and one fused gate kernel of
``metal/recurrent.metal``) and whose vjp loops back the same way with the fused gradient
kernels, then takes ``W_hh``'s and ``b_hh``'s gradients as single products over the whole
sequence. So a step costs no Python, forward or backward, and autograd goes through the
whole unrolled sequence. The vjps call kernels without gradients of their own: a
second-order gradient through them raises NotImplementedError naming the op.

A layer op returns the states in T + 1 slots (``csrc/ops/recurrent.h``): forward, slot 0
is ``h0`` and slot ``t + 1`` the state after time ``t``; reverse, slot ``t`` is the state at
time ``t`` and slot ``T`` is ``h0``. The LSTM's result stacks the h slots and the c slots.

A layer computes in its weights' dtype, float32 or float64 (the gate kernels' ``_float64``
instances, on the devices with double); ``fastmetal.nn``'s layers check that the input
and states have it (PyTorch's errors).
"""
from __future__ import annotations

from .. import _core
from ..autograd.declare import op
from .capture import dynamic
from .linalg import linear, matmul
from .manipulation import concatenate, stack
from .training import dropout

__all__: list = []  # private: fastmetal.nn's recurrent layers are the public face


def _hprev(y, T, reverse):
    """The states before each step, (T, B, H), one contiguous block of y's slots."""
    return y[1:] if reverse else y[:T]


def _weight_grads(ctx, dpre, y, T, w_index):
    """W_hh's and b_hh's gradients from the gradient of the products (T, B, G * H)."""
    gw = gb = None
    if ctx.needs[w_index]:
        h = _hprev(y, T, ctx.reverse)
        gw = matmul(dpre.reshape(-1, dpre.shape[2]).T, h.reshape(-1, h.shape[2]))
    if ctx.needs[-1]:
        gb = dpre.sum(axis=(0, 1))
    return gw, gb


@op(grads=("xg", "h0", "c0", "w_hh", "b_hh"), saves=("w_hh", "out"), aux=True,
    public=False)
def lstm_layer(xg, h0, c0, w_hh, b_hh, reverse):
    """One LSTM layer direction over xg (T, B, 4H) = x @ W_ih^T + b_ih: the result
    (2, T + 1, B, H) holds the h and the c slots."""
    return _core._lstm_layer(xg, h0, c0, w_hh, b_hh, reverse)


@lstm_layer.vjp
def _lstm_layer_vjp(ctx, g):  # aux: the activated gates
    y = ctx.out
    T = ctx.aux.shape[0]
    dxg, dh0, dc0 = _core._lstm_layer_backward(g, y, ctx.aux, ctx.w_hh, ctx.reverse)
    s0 = T if ctx.reverse else 0
    gw, gb = _weight_grads(ctx, dxg, y[0], T, 3)
    return (dxg, (dh0 + g[0, s0]) if ctx.needs[1] else None,
            (dc0 + g[1, s0]) if ctx.needs[2] else None, gw, gb)


@op(grads=("xg", "h0", "w_hh", "b_hh"), saves=("w_hh", "out"), aux=True, public=False)
def gru_layer(xg, h0, w_hh, b_hh, reverse):
    """One GRU layer direction over xg (T, B, 3H) = x @ W_ih^T + b_ih: the result
    (T + 1, B, H) holds the h slots."""
    return _core._gru_layer(xg, h0, w_hh, b_hh, reverse)


@gru_layer.vjp
def _gru_layer_vjp(ctx, g):  # aux: r, z, n and W_hn h + b_hn per step
    y = ctx.out
    T = ctx.aux.shape[0]
    dxg, dhg, dh_rec, dh_direct = _core._gru_layer_backward(g, y, ctx.aux, ctx.w_hh,
                                                            ctx.reverse)
    gw, gb = _weight_grads(ctx, dhg, y, T, 2)
    dh0 = (dh_rec + dh_direct + g[T if ctx.reverse else 0]) if ctx.needs[1] else None
    return dxg, dh0, gw, gb


@op(grads=("xg", "h0", "w_hh", "b_hh"), saves=("w_hh", "out"), public=False)
def rnn_layer(xg, h0, w_hh, b_hh, reverse, relu):
    """One Elman RNN layer direction over xg (T, B, H) = x @ W_ih^T + b_ih, tanh or relu:
    the result (T + 1, B, H) holds the h slots."""
    return _core._rnn_layer(xg, h0, w_hh, b_hh, reverse, relu)


@rnn_layer.vjp
def _rnn_layer_vjp(ctx, g):
    y = ctx.out
    T = y.shape[0] - 1
    dxg, dh = _core._rnn_layer_backward(g, y, ctx.w_hh, ctx.reverse, ctx.relu)
    gw, gb = _weight_grads(ctx, dxg, y, T, 2)
    dh0 = (dh + g[T if ctx.reverse else 0]) if ctx.needs[1] else None
    return dxg, dh0, gw, gb


def _zero_bias(w_hh):
    return _core.zeros((w_hh.shape[0],), dtype=w_hh.dtype, device=w_hh.device)


def layer_step(mode, x, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse):
    """One layer direction over x (T, B, I) from h0 (and c0): (outputs (T, B, H), h_n, c_n
    or None). b_ih / b_hh None: no bias."""
    T = x.shape[0]
    xg = linear(x, w_ih, b_ih)
    b = b_hh if b_hh is not None else _zero_bias(w_hh)
    last = 0 if reverse else T
    if mode == "LSTM":
        y = lstm_layer(xg, h0, c0, w_hh, b, reverse)
        hs = y[0, :T] if reverse else y[0, 1:]
        return hs, y[0, last], y[1, last]
    if mode == "GRU":
        y = gru_layer(xg, h0, w_hh, b, reverse)
    else:
        y = rnn_layer(xg, h0, w_hh, b, reverse, mode == "RNN_RELU")
    return (y[:T] if reverse else y[1:]), y[last], None


def _dropout(x, p, seeds):
    """fm.dropout with the next seed, the draw re-run at each replay of a compiled step
    (fastmetal.compile), as nn.Dropout's."""
    return dynamic(lambda: dropout(x, p, seed=seeds()))


def recurrent(mode, x, h0, c0, weights, num_layers, bidirectional, dropout_p, training,
              seeds):
    """The multi-layer recurrent network on time-major x (T, B, I), as torch's ``_VF``
    rnn functions: ``weights`` per layer and direction ``(w_ih, w_hh, b_ih, b_hh)``, h0 (and
    c0 for the LSTM) (num_layers * D, B, H); dropout on every layer's output but the last
    (training only), mask seeds from ``seeds()``. Returns (output (T, B, D * H), h_n, c_n or
    None)."""
    D = 2 if bidirectional else 1
    hn, cn = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(D):
            k = layer * D + d
            w_ih, w_hh, b_ih, b_hh = weights[k]
            seq, h, c = layer_step(mode, x, h0[k], None if c0 is None else c0[k], w_ih, w_hh,
                                   b_ih, b_hh, d == 1)
            outs.append(seq)
            hn.append(h)
            cn.append(c)
        x = outs[0] if D == 1 else concatenate(outs, axis=2)
        if dropout_p > 0.0 and training and layer < num_layers - 1:
            # p = 1 zeroes everything (PyTorch allows it; fm.dropout takes p < 1)
            x = x * 0.0 if dropout_p >= 1.0 else _dropout(x, dropout_p, seeds)
    return x, stack(hn), (stack(cn) if mode == "LSTM" else None)
