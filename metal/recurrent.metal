// The fused gates of one time step of the recurrent layers (LSTM, GRU, Elman RNN), with
// PyTorch's gate order and formulas, and their fused gradients. The host computes the input
// part of every step at once (x @ W_ih^T + b_ih over the whole sequence) and, per step,
// h_{t-1} @ W_hh^T; one kernel then forms the gates, the new state and what the gradient
// reads. One thread per (unit, row) of the step: no barriers, so the CPU runs them as plain
// loops (fm_math.h's branch-free sigmoid and tanh, so the loop over units vectorises, and
// the same functions as fastmetal.sigmoid / tanh on every device). Rows are contiguous:
// xg and hg (batch, G * hidden), states (batch, hidden).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "fm_math.h"
#include "recurrent_args.h"
using namespace metal;

// ---------------------------------------------------------------------------------- LSTM
// Gates i, f, g, o: pre = xg + hg + b_hh; c = f * c_prev + i * g; h = o * tanh(c).
// gates keeps the activated i, f, g, o for the gradient. Grid: (hidden, batch).
kernel void lstm_gates_forward(device const float* xg [[buffer(0)]],
                               device const float* hg [[buffer(1)]],
                               device const float* b_hh [[buffer(2)]],
                               device const float* c_prev [[buffer(3)]],
                               device float* h [[buffer(4)]],
                               device float* c [[buffer(5)]],
                               device float* gates [[buffer(6)]],
                               constant RecurrentArgs& a [[buffer(7)]],
                               uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t H = uint64_t(a.hidden);
  const uint64_t row = b * 4 * H;
  const float i = fm_sigmoid(xg[row + k] + hg[row + k] + b_hh[k]);
  const float f = fm_sigmoid(xg[row + H + k] + hg[row + H + k] + b_hh[H + k]);
  const float g = fm_tanh(xg[row + 2 * H + k] + hg[row + 2 * H + k] + b_hh[2 * H + k]);
  const float o = fm_sigmoid(xg[row + 3 * H + k] + hg[row + 3 * H + k] + b_hh[3 * H + k]);
  const uint64_t s = b * H + k;
  const float cn = f * c_prev[s] + i * g;
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
kernel void lstm_gates_backward(device const float* dh_out [[buffer(0)]],
                                device const float* dh_rec [[buffer(1)]],
                                device const float* dc_out [[buffer(2)]],
                                device float* dc_next [[buffer(3)]],
                                device const float* gates [[buffer(4)]],
                                device const float* c_prev [[buffer(5)]],
                                device const float* c [[buffer(6)]],
                                device float* dgates [[buffer(7)]],
                                constant RecurrentArgs& a [[buffer(8)]],
                                uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t H = uint64_t(a.hidden);
  const uint64_t row = b * 4 * H;
  const uint64_t s = b * H + k;
  const float i = gates[row + k], f = gates[row + H + k];
  const float g = gates[row + 2 * H + k], o = gates[row + 3 * H + k];
  const float tc = fm_tanh(c[s]);
  const float dh = dh_out[s] + dh_rec[s];
  const float dc = dc_out[s] + dc_next[s] + dh * o * (1.0f - tc * tc);
  dgates[row + k] = dc * g * i * (1.0f - i);
  dgates[row + H + k] = dc * c_prev[s] * f * (1.0f - f);
  dgates[row + 2 * H + k] = dc * i * (1.0f - g * g);
  dgates[row + 3 * H + k] = dh * tc * o * (1.0f - o);
  dc_next[s] = dc * f;
}

// ----------------------------------------------------------------------------------- GRU
// Gates r, z, n (PyTorch's): r = sigmoid(x_r + h_r + b_hr), z likewise,
// n = tanh(x_n + r * (h_n + b_hn)), h = (1 - z) * n + z * h_prev. saved keeps r, z, n and
// h_n + b_hn for the gradient. Grid: (hidden, batch).
kernel void gru_gates_forward(device const float* xg [[buffer(0)]],
                              device const float* hg [[buffer(1)]],
                              device const float* b_hh [[buffer(2)]],
                              device const float* h_prev [[buffer(3)]],
                              device float* h [[buffer(4)]],
                              device float* saved [[buffer(5)]],
                              constant RecurrentArgs& a [[buffer(6)]],
                              uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t H = uint64_t(a.hidden);
  const uint64_t row = b * 3 * H;
  const float r = fm_sigmoid(xg[row + k] + hg[row + k] + b_hh[k]);
  const float z = fm_sigmoid(xg[row + H + k] + hg[row + H + k] + b_hh[H + k]);
  const float hn = hg[row + 2 * H + k] + b_hh[2 * H + k];
  const float n = fm_tanh(xg[row + 2 * H + k] + r * hn);
  const uint64_t s = b * H + k;
  h[s] = (1.0f - z) * n + z * h_prev[s];
  const uint64_t srow = b * 4 * H;
  saved[srow + k] = r;
  saved[srow + H + k] = z;
  saved[srow + 2 * H + k] = n;
  saved[srow + 3 * H + k] = hn;
}

// dh = dh_out + dh_rec + dh_direct (dh_direct: the previous call's z * dh, updated in
// place). Writes dxg (the gradient of x_r, x_z, x_n) and dhg (of h_r, h_z, h_n: the same
// but r * dn for h_n). Grid: (hidden, batch).
kernel void gru_gates_backward(device const float* dh_out [[buffer(0)]],
                               device const float* dh_rec [[buffer(1)]],
                               device float* dh_direct [[buffer(2)]],
                               device const float* saved [[buffer(3)]],
                               device const float* h_prev [[buffer(4)]],
                               device float* dxg [[buffer(5)]],
                               device float* dhg [[buffer(6)]],
                               constant RecurrentArgs& a [[buffer(7)]],
                               uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t H = uint64_t(a.hidden);
  const uint64_t s = b * H + k;
  const uint64_t srow = b * 4 * H, row = b * 3 * H;
  const float r = saved[srow + k], z = saved[srow + H + k];
  const float n = saved[srow + 2 * H + k], hn = saved[srow + 3 * H + k];
  const float dh = dh_out[s] + dh_rec[s] + dh_direct[s];
  const float dn = dh * (1.0f - z) * (1.0f - n * n);
  const float dz = dh * (h_prev[s] - n) * z * (1.0f - z);
  const float dr = dn * hn * r * (1.0f - r);
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
kernel void rnn_gates_forward(device const float* xg [[buffer(0)]],
                              device const float* hg [[buffer(1)]],
                              device const float* b_hh [[buffer(2)]],
                              device float* h [[buffer(3)]],
                              constant RecurrentArgs& a [[buffer(4)]],
                              uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t s = b * uint64_t(a.hidden) + k;
  const float pre = xg[s] + hg[s] + b_hh[k];
  // relu keeps NaN as NaN (PyTorch's), which max(pre, 0) would not.
  h[s] = a.relu != 0 ? select(pre, 0.0f, pre <= 0.0f) : fm_tanh(pre);
}

// dpre = (dh_out + dh_rec) * (1 - h^2) for tanh, * (h > 0) for relu. Grid: (hidden, batch).
kernel void rnn_gates_backward(device const float* dh_out [[buffer(0)]],
                               device const float* dh_rec [[buffer(1)]],
                               device const float* h [[buffer(2)]],
                               device float* dpre [[buffer(3)]],
                               constant RecurrentArgs& a [[buffer(4)]],
                               uint3 gid [[thread_position_in_grid]]) {
  const uint64_t k = gid.x, b = gid.y;  // the grid is exactly (hidden, batch): no guard
  const uint64_t s = b * uint64_t(a.hidden) + k;
  const float dh = dh_out[s] + dh_rec[s];
  const float y = h[s];
  dpre[s] = a.relu != 0 ? select(0.0f, dh, y > 0.0f) : dh * (1.0f - y * y);
}
