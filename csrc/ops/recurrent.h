// The recurrent layers' time loops (LSTM, GRU, Elman RNN), as PyTorch's: the input part of
// every step (xg = x @ W_ih^T + b_ih over the whole sequence) comes in precomputed; each
// step is one matrix product h_{t-1} @ W_hh^T and one fused gate kernel
// (metal/recurrent.metal), the loop in C++ so a step costs no Python. The backward loops run
// the fused gradient kernels and one product with W_hh a step; the weight gradients are
// single products over the whole sequence, done by the caller (python/fastmetal/ops/recurrent.py).
//
// States are kept in one array of T + 1 slots per direction: forward, slot 0 holds h0 and
// slot t + 1 the state after time t; reverse, slot t holds the state at time t and slot T
// holds h0. So the states before the steps (slots [0, T) forward, [1, T] reverse) are one
// contiguous block, the operand of the weight gradient.
#pragma once
#include <vector>

#include "core/array.h"

namespace fm {

// xg (T, B, 4H), h0, c0 (B, H), w_hh (4H, H), b_hh (4H,) -> {y (2, T + 1, B, H): the h and c
// slots, gates (T, B, 4H): the activated i, f, g, o}.
std::vector<Array> lstm_layer(const Array& xg, const Array& h0, const Array& c0,
                              const Array& w_hh, const Array& b_hh, bool reverse);
// grad (2, T + 1, B, H): y's gradient -> {dxg (T, B, 4H) (also the gradient of the
// h_{t-1} @ W_hh^T products), dh0, dc0 (B, H), without the gradient of y's h0/c0 slots}.
std::vector<Array> lstm_layer_backward(const Array& grad, const Array& y, const Array& gates,
                                       const Array& w_hh, bool reverse);
// xg (T, B, 3H), h0 (B, H), w_hh (3H, H), b_hh (3H,) -> {y (T + 1, B, H), saved (T, B, 4H):
// r, z, n and h_n + b_hn}.
std::vector<Array> gru_layer(const Array& xg, const Array& h0, const Array& w_hh,
                             const Array& b_hh, bool reverse);
// -> {dxg (T, B, 3H), dhg (T, B, 3H) (the gradient of h_{t-1} @ W_hh^T + b_hh), dh0}.
std::vector<Array> gru_layer_backward(const Array& grad, const Array& y, const Array& saved,
                                      const Array& w_hh, bool reverse);
// xg (T, B, H), h0 (B, H), w_hh (H, H), b_hh (H,) -> y (T + 1, B, H).
Array rnn_layer(const Array& xg, const Array& h0, const Array& w_hh, const Array& b_hh,
                bool reverse, bool relu);
// -> {dxg (T, B, H) (also the gradient of the products and of b_hh), dh0}.
std::vector<Array> rnn_layer_backward(const Array& grad, const Array& y, const Array& w_hh,
                                      bool reverse, bool relu);

}  // namespace fm
