// The fused gates of one time step of the recurrent layers (LSTM, GRU, Elman RNN), with
// PyTorch's gate order and formulas, and their fused gradients. The host computes the input
// part of every step at once (x @ W_ih^T + b_ih over the whole sequence) and, per step,
// h_{t-1} @ W_hh^T; one kernel then forms the gates, the new state and what the gradient
// reads. One thread per (unit, row) of the step: no barriers, so the CPU runs them as plain
// loops (fm_math.h's branch-free sigmoid and tanh, so the loop over units vectorises, and
// the same functions as fastmetal.sigmoid / tanh on every device). Rows are contiguous:
// xg and hg (batch, G * hidden), states (batch, hidden).
//
// Templates over the element type T: float (FM_INSTANTIATE, every backend, under the
// names the float32 kernels always had) and double (the _float64 names,
// FM_INSTANTIATE_DISCRETE: the CPU and CUDA; Apple GPUs have no double), whose fm_sigmoid /
// fm_tanh are fm_math64.h's (declared before the templates, so the calls find them).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "fm_math.h"
#include "fm_math64.h"
#include "recurrent_args.h"
using namespace metal;

// ---------------------------------------------------------------------------------- LSTM
// Gates i, f, g, o: pre = xg + hg + b_hh; c = f * c_prev + i * g; h = o * tanh(c).
// gates keeps the activated i, f, g, o for the gradient. Grid: (hidden, batch).
template <typename T>
kernel void lstm_gates_forward(device const T* xg [[buffer(0)]],
                               device const T* hg [[buffer(1)]],
                               device const T* b_hh [[buffer(2)]],
                               device const T* c_prev [[buffer(3)]],
                               device T* h [[buffer(4)]],
                               device T* c [[buffer(5)]],
                               device T* gates [[buffer(6)]],
                               constant RecurrentArgs& a [[buffer(7)]],
                               uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t H = uint64_t(a.hidden);
  const uint64_t row = b * 4 * H;
  const T i = fm_sigmoid(xg[row + k] + hg[row + k] + b_hh[k]);
  const T f = fm_sigmoid(xg[row + H + k] + hg[row + H + k] + b_hh[H + k]);
  const T g = fm_tanh(xg[row + 2 * H + k] + hg[row + 2 * H + k] + b_hh[2 * H + k]);
  const T o = fm_sigmoid(xg[row + 3 * H + k] + hg[row + 3 * H + k] + b_hh[3 * H + k]);
  const uint64_t s = b * H + k;
  const T cn = f * c_prev[s] + i * g;
  c[s] = cn;
  h[s] = o * fm_tanh(cn);
  gates[row + k] = i;
  gates[row + H + k] = f;
  gates[row + 2 * H + k] = g;
  gates[row + 3 * H + k] = o;
}

// The step's gradient: dh = dh_out + dh_rec (the output's gradient and the next step's
// through W_hh), dc = dc_out + dc_next + dh * o * (1 - tanh(c)^2). Writes the gradient of
// the pre-activations (dgates, that of xg and of hg alike) and dc_next = dc * f in place
// (each thread reads and writes only its own element). Grid: (hidden, batch).
template <typename T>
kernel void lstm_gates_backward(device const T* dh_out [[buffer(0)]],
                                device const T* dh_rec [[buffer(1)]],
                                device const T* dc_out [[buffer(2)]],
                                device T* dc_next [[buffer(3)]],
                                device const T* gates [[buffer(4)]],
                                device const T* c_prev [[buffer(5)]],
                                device const T* c [[buffer(6)]],
                                device T* dgates [[buffer(7)]],
                                constant RecurrentArgs& a [[buffer(8)]],
                                uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t H = uint64_t(a.hidden);
  const uint64_t row = b * 4 * H;
  const uint64_t s = b * H + k;
  const T i = gates[row + k], f = gates[row + H + k];
  const T g = gates[row + 2 * H + k], o = gates[row + 3 * H + k];
  const T tc = fm_tanh(c[s]);
  const T dh = dh_out[s] + dh_rec[s];
  const T dc = dc_out[s] + dc_next[s] + dh * o * (T(1) - tc * tc);
  dgates[row + k] = dc * g * i * (T(1) - i);
  dgates[row + H + k] = dc * c_prev[s] * f * (T(1) - f);
  dgates[row + 2 * H + k] = dc * i * (T(1) - g * g);
  dgates[row + 3 * H + k] = dh * tc * o * (T(1) - o);
  dc_next[s] = dc * f;
}

// ----------------------------------------------------------------------------------- GRU
// Gates r, z, n (PyTorch's): r = sigmoid(x_r + h_r + b_hr), z likewise,
// n = tanh(x_n + r * (h_n + b_hn)), h = (1 - z) * n + z * h_prev. saved keeps r, z, n and
// h_n + b_hn for the gradient. Grid: (hidden, batch).
template <typename T>
kernel void gru_gates_forward(device const T* xg [[buffer(0)]],
                              device const T* hg [[buffer(1)]],
                              device const T* b_hh [[buffer(2)]],
                              device const T* h_prev [[buffer(3)]],
                              device T* h [[buffer(4)]],
                              device T* saved [[buffer(5)]],
                              constant RecurrentArgs& a [[buffer(6)]],
                              uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t H = uint64_t(a.hidden);
  const uint64_t row = b * 3 * H;
  const T r = fm_sigmoid(xg[row + k] + hg[row + k] + b_hh[k]);
  const T z = fm_sigmoid(xg[row + H + k] + hg[row + H + k] + b_hh[H + k]);
  const T hn = hg[row + 2 * H + k] + b_hh[2 * H + k];
  const T n = fm_tanh(xg[row + 2 * H + k] + r * hn);
  const uint64_t s = b * H + k;
  h[s] = (T(1) - z) * n + z * h_prev[s];
  const uint64_t srow = b * 4 * H;
  saved[srow + k] = r;
  saved[srow + H + k] = z;
  saved[srow + 2 * H + k] = n;
  saved[srow + 3 * H + k] = hn;
}

// dh = dh_out + dh_rec + dh_direct (dh_direct: the previous call's z * dh, updated in
// place). Writes dxg (the gradient of x_r, x_z, x_n) and dhg (of h_r, h_z, h_n: the same
// but r * dn for h_n). Grid: (hidden, batch).
template <typename T>
kernel void gru_gates_backward(device const T* dh_out [[buffer(0)]],
                               device const T* dh_rec [[buffer(1)]],
                               device T* dh_direct [[buffer(2)]],
                               device const T* saved [[buffer(3)]],
                               device const T* h_prev [[buffer(4)]],
                               device T* dxg [[buffer(5)]],
                               device T* dhg [[buffer(6)]],
                               constant RecurrentArgs& a [[buffer(7)]],
                               uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t H = uint64_t(a.hidden);
  const uint64_t s = b * H + k;
  const uint64_t srow = b * 4 * H, row = b * 3 * H;
  const T r = saved[srow + k], z = saved[srow + H + k];
  const T n = saved[srow + 2 * H + k], hn = saved[srow + 3 * H + k];
  const T dh = dh_out[s] + dh_rec[s] + dh_direct[s];
  const T dn = dh * (T(1) - z) * (T(1) - n * n);
  const T dz = dh * (h_prev[s] - n) * z * (T(1) - z);
  const T dr = dn * hn * r * (T(1) - r);
  dxg[row + k] = dr;
  dxg[row + H + k] = dz;
  dxg[row + 2 * H + k] = dn;
  dhg[row + k] = dr;
  dhg[row + H + k] = dz;
  dhg[row + 2 * H + k] = dn * r;
  dh_direct[s] = dh * z;
}

// ------------------------------------------------------------------------------ Elman RNN
// h = tanh(xg + hg + b_hh), or relu. Grid: (hidden, batch).
template <typename T>
kernel void rnn_gates_forward(device const T* xg [[buffer(0)]],
                              device const T* hg [[buffer(1)]],
                              device const T* b_hh [[buffer(2)]],
                              device T* h [[buffer(3)]],
                              constant RecurrentArgs& a [[buffer(4)]],
                              uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t s = b * uint64_t(a.hidden) + k;
  const T pre = xg[s] + hg[s] + b_hh[k];
  // relu keeps NaN as NaN (PyTorch's), which max(pre, 0) would not.
  h[s] = a.relu != 0 ? select(pre, T(0), pre <= T(0)) : fm_tanh(pre);
}

// dpre = (dh_out + dh_rec) * (1 - h^2) for tanh, * (h > 0) for relu. Grid: (hidden, batch).
template <typename T>
kernel void rnn_gates_backward(device const T* dh_out [[buffer(0)]],
                               device const T* dh_rec [[buffer(1)]],
                               device const T* h [[buffer(2)]],
                               device T* dpre [[buffer(3)]],
                               constant RecurrentArgs& a [[buffer(4)]],
                               uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t s = b * uint64_t(a.hidden) + k;
  const T dh = dh_out[s] + dh_rec[s];
  const T y = h[s];
  dpre[s] = a.relu != 0 ? select(T(0), dh, y > T(0)) : dh * (T(1) - y * y);
}

FM_INSTANTIATE("lstm_gates_forward", lstm_gates_forward, float);
FM_INSTANTIATE("lstm_gates_backward", lstm_gates_backward, float);
FM_INSTANTIATE("gru_gates_forward", gru_gates_forward, float);
FM_INSTANTIATE("gru_gates_backward", gru_gates_backward, float);
FM_INSTANTIATE("rnn_gates_forward", rnn_gates_forward, float);
FM_INSTANTIATE("rnn_gates_backward", rnn_gates_backward, float);
#if FM_HAS_DOUBLE
FM_INSTANTIATE_DISCRETE("lstm_gates_forward_float64", lstm_gates_forward, double);
FM_INSTANTIATE_DISCRETE("lstm_gates_backward_float64", lstm_gates_backward, double);
FM_INSTANTIATE_DISCRETE("gru_gates_forward_float64", gru_gates_forward, double);
FM_INSTANTIATE_DISCRETE("gru_gates_backward_float64", gru_gates_backward, double);
FM_INSTANTIATE_DISCRETE("rnn_gates_forward_float64", rnn_gates_forward, double);
FM_INSTANTIATE_DISCRETE("rnn_gates_backward_float64", rnn_gates_backward, double);
#endif
