// The kernels of a small training loop besides convolution and matmul: max pooling, dropout
// (counter-based Philox, the same mask on every device), log-softmax, fused cross-entropy and
// the fused optimizer updates. One thread per output element (or row); no barriers, so the
// CPU runs them as plain loops.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "philox.h"
#include "training_args.h"
using namespace metal;

// ---------------------------------------------------------------------------- max pooling
// PyTorch's rule: the first maximum of the window in row-major order wins (strict >), a NaN
// wins over any number and a later NaN over an earlier one; the window is clipped to the
// image (padding never wins). Returns the flat index inside the plane.
FM_FUNC int32_t pool_argmax(device const float* plane, constant PoolArgs& a, int32_t oy, int32_t ox,
                            thread float& best) {
  const int32_t y0 = oy * a.sh - a.ph, x0 = ox * a.sw - a.pw;
  const int32_t ya = max(y0, 0), yb = min(y0 + a.kh, a.h);
  const int32_t xa = max(x0, 0), xb = min(x0 + a.kw, a.w);
  int32_t arg = ya * a.w + xa;
  best = -INFINITY;
  if (yb - ya == 2 && xb - xa == 2) {
    // A whole 2 x 2 window (MNIST's): the four loads go out together, then the same
    // comparisons in the same order as the loop below (the loop's loads waited in turn).
    const int32_t k0 = ya * a.w + xa, k2 = k0 + a.w;
    const float v[4] = {plane[k0], plane[k0 + 1], plane[k2], plane[k2 + 1]};
    const int32_t at[4] = {k0, k0 + 1, k2, k2 + 1};
    FM_UNROLL for (int32_t j = 0; j < 4; ++j) {
      if (v[j] > best || isnan(v[j])) {
        best = v[j];
        arg = at[j];
      }
    }
    return arg;
  }
  for (int32_t y = ya; y < yb; ++y) {
    for (int32_t x = xa; x < xb; ++x) {
      const float v = plane[y * a.w + x];
      if (v > best || isnan(v)) {
        best = v;
        arg = y * a.w + x;
      }
    }
  }
  return arg;
}

// Grid: (OW, OH, planes).
kernel void max_pool2d_forward(device const float* x [[buffer(0)]],
                               device float* out [[buffer(1)]],
                               constant PoolArgs& a [[buffer(2)]],
                               uint3 gid [[thread_position_in_grid]]) {
  const int32_t ox = int32_t(gid.x), oy = int32_t(gid.y);
  const uint64_t p = gid.z;
  float best;
  pool_argmax(x + p * uint64_t(a.h * a.w), a, oy, ox, best);
  out[(p * uint64_t(a.oh) + uint64_t(oy)) * uint64_t(a.ow) + uint64_t(ox)] = best;
}

// Overlapping windows: one thread per input element sums the output gradients of the windows whose winner it is
// (gathered, so no atomics, and the order of the sum is fixed). Grid: (W, H, planes).
kernel void max_pool2d_backward(device const float* grad_out [[buffer(0)]],
                                device const float* x [[buffer(1)]],
                                device float* grad_in [[buffer(2)]],
                                constant PoolArgs& a [[buffer(3)]],
                                uint3 gid [[thread_position_in_grid]]) {
  const int32_t ix = int32_t(gid.x), iy = int32_t(gid.y);
  const uint64_t p = gid.z;
  device const float* plane = x + p * uint64_t(a.h * a.w);
  device const float* g = grad_out + p * uint64_t(a.oh * a.ow);
  // Windows oy with oy * sh - ph <= iy < oy * sh - ph + kh.
  const int32_t oy0 = max(0, (iy + a.ph - a.kh + a.sh) / a.sh);
  const int32_t oy1 = min(a.oh - 1, (iy + a.ph) / a.sh);
  const int32_t ox0 = max(0, (ix + a.pw - a.kw + a.sw) / a.sw);
  const int32_t ox1 = min(a.ow - 1, (ix + a.pw) / a.sw);
  const int32_t me = iy * a.w + ix;
  float acc = 0.0f;
  for (int32_t oy = oy0; oy <= oy1; ++oy) {
    for (int32_t ox = ox0; ox <= ox1; ++ox) {
      float best;
      if (pool_argmax(plane, a, oy, ox, best) == me) acc += g[oy * a.ow + ox];
    }
  }
  grad_in[p * uint64_t(a.h * a.w) + uint64_t(me)] = acc;
}

// Windows that do not overlap (stride >= kernel, the usual pooling): thread (ox, oy) owns
// the stride cell of its window (the first and last cells reach the image's edges), writes
// the gradient to the winner and zeros elsewhere: each input element is read and written
// once. Grid: (OW, OH, planes).
kernel void max_pool2d_backward_cells(device const float* grad_out [[buffer(0)]],
                                      device const float* x [[buffer(1)]],
                                      device float* grad_in [[buffer(2)]],
                                      constant PoolArgs& a [[buffer(3)]],
                                      uint3 gid [[thread_position_in_grid]]) {
  const int32_t ox = int32_t(gid.x), oy = int32_t(gid.y);
  const uint64_t p = gid.z;
  const uint64_t plane_base = p * uint64_t(a.h * a.w);
  float best;
  const int32_t win = pool_argmax(x + plane_base, a, oy, ox, best);
  const float gv = grad_out[(p * uint64_t(a.oh) + uint64_t(oy)) * uint64_t(a.ow) + uint64_t(ox)];
  const int32_t y0 = oy == 0 ? 0 : oy * a.sh - a.ph;
  const int32_t y1 = oy == a.oh - 1 ? a.h : min(a.h, (oy + 1) * a.sh - a.ph);
  const int32_t x0 = ox == 0 ? 0 : ox * a.sw - a.pw;
  const int32_t x1 = ox == a.ow - 1 ? a.w : min(a.w, (ox + 1) * a.sw - a.pw);
  for (int32_t y = y0; y < y1; ++y) {
    for (int32_t xx = x0; xx < x1; ++xx) {
      const int32_t k = y * a.w + xx;
      // relu_mask: relu_grad(value, x) = x <= 0 ? 0 : value, which is 0 off the winner anyway.
      grad_in[plane_base + uint64_t(k)] = k == win && !(a.relu_mask != 0 && best <= 0.0f) ? gv : 0.0f;
    }
  }
}

// ---------------------------------------------------------------------------- dropout
// Thread g handles elements 4g .. 4g + 3 (x contiguous). Dropout's backward is this kernel
// applied to the gradient with the same key. Where x and out start 16-byte aligned a whole
// quad moves as one float4 each way: four scalar loads at a 16-byte stride across a warp
// left MNIST's dropouts at a third of the H100's bandwidth (5.3 us for 2.4 MB).
kernel void dropout_apply(device const float* x [[buffer(0)]],
                          device float* out [[buffer(1)]],
                          constant DropoutArgs& a [[buffer(2)]],
                          uint gid [[thread_position_in_grid]]) {
  uint32_t r[4];
  philox4x32_10(gid, 0u, 0u, 0u, a.key0, a.key1, r);
  if (a.quads != 0u && gid * 4u + 3u < a.n) {
    const float4 v = *((device const float4*)(x + gid * 4u));
    *((device float4*)(out + gid * 4u)) =
        float4((r[0] >> 8) >= a.threshold ? v.x * a.scale : 0.0f,
               (r[1] >> 8) >= a.threshold ? v.y * a.scale : 0.0f,
               (r[2] >> 8) >= a.threshold ? v.z * a.scale : 0.0f,
               (r[3] >> 8) >= a.threshold ? v.w * a.scale : 0.0f);
    return;
  }
  for (uint32_t j = 0; j < 4u; ++j) {
    const uint32_t i = gid * 4u + j;
    if (i < a.n) out[i] = (r[j] >> 8) >= a.threshold ? x[i] * a.scale : 0.0f;
  }
}

// ---------------------------------------------------------------------------- softmax rows
// log-softmax of a row as (x - m) - log_sum with m the row's max and log_sum =
// log(sum(exp(x - m))), as PyTorch forms it: safe for any finite logits (|x| up to 3.4e38:
// the shifted values are <= 0, so exp cannot overflow, and the max term contributes
// exp(0) = 1), and exact where x - m is (adding m back first would round away log_sum
// next to 1e30). A row of -inf, or one with +inf or NaN, gives NaN, as PyTorch.
FM_FUNC float row_max_logsum(device const float* row, int32_t n, int32_t stride,
                             thread float& log_sum) {
  float m = -INFINITY;
  // fmax skips NaN (MSL's max is undefined for it); a NaN logit still makes s NaN below.
  for (int32_t i = 0; i < n; ++i) m = fmax(m, row[int64_t(i) * stride]);
  float s = 0.0f;
  for (int32_t i = 0; i < n; ++i) s += exp(row[int64_t(i) * stride] - m);
  log_sum = log(s);
  return m;
}

// Grid: (inner, outer).
kernel void log_softmax_forward(device const float* x [[buffer(0)]],
                                device float* out [[buffer(1)]],
                                constant SoftmaxRowArgs& a [[buffer(2)]],
                                uint2 gid [[thread_position_in_grid]]) {
  const uint64_t base = uint64_t(gid.y) * uint64_t(a.n) * uint64_t(a.inner) + gid.x;
  float log_sum;
  const float m = row_max_logsum(x + base, a.n, a.inner, log_sum);
  for (int32_t i = 0; i < a.n; ++i) {
    const uint64_t k = base + uint64_t(i) * uint64_t(a.inner);
    out[k] = (x[k] - m) - log_sum;
  }
}

// grad_x = grad_y - softmax * sum(grad_y), softmax = exp(y). Grid: (inner, outer).
kernel void log_softmax_backward(device const float* grad_out [[buffer(0)]],
                                 device const float* y [[buffer(1)]],
                                 device float* grad_in [[buffer(2)]],
                                 constant SoftmaxRowArgs& a [[buffer(3)]],
                                 uint2 gid [[thread_position_in_grid]]) {
  const uint64_t base = uint64_t(gid.y) * uint64_t(a.n) * uint64_t(a.inner) + gid.x;
  float s = 0.0f;
  for (int32_t i = 0; i < a.n; ++i) s += grad_out[base + uint64_t(i) * uint64_t(a.inner)];
  for (int32_t i = 0; i < a.n; ++i) {
    const uint64_t k = base + uint64_t(i) * uint64_t(a.inner);
    grad_in[k] = grad_out[k] - exp(y[k]) * s;
  }
}

// ---------------------------------------------------------------------------- cross-entropy
// Per row: loss_r = -log_softmax(row)[label], grad = (softmax - onehot) / rows, fused.
// A label outside [0, classes) (possible only for labels on a discrete GPU, which the host
// does not read) gives a NaN row loss and gradient row, never an out-of-bounds read.
kernel void cross_entropy_rows(device const float* logits [[buffer(0)]],
                               device const int64_t* labels [[buffer(1)]],
                               device float* row_loss [[buffer(2)]],
                               device float* grad [[buffer(3)]],
                               constant CrossEntropyArgs& a [[buffer(4)]],
                               uint gid [[thread_position_in_grid]]) {
  const uint64_t base = uint64_t(gid) * uint64_t(a.classes);
  device const float* row = logits + base;
  float log_sum;
  const float m = row_max_logsum(row, a.classes, 1, log_sum);
  const int64_t label64 = labels[gid];
  if (label64 < 0 || label64 >= int64_t(a.classes)) {
    row_loss[gid] = NAN;
    for (int32_t c = 0; c < a.classes; ++c) grad[base + uint64_t(c)] = NAN;
    return;
  }
  const int32_t label = int32_t(label64);
  row_loss[gid] = log_sum - (row[label] - m);
  for (int32_t c = 0; c < a.classes; ++c) {
    const float p = exp((row[c] - m) - log_sum);
    grad[base + uint64_t(c)] = (c == label ? p - 1.0f : p) * a.inv_rows;
  }
}

// The same, one simdgroup per row, for rows of 32 classes or more (the host launches rows x
// 32 threads in groups of whole simdgroups): lane l takes classes l, l + 32, ..; the row's
// max and sum of exponentials come from simd_max and simd_sum (a fixed tree: the same bits
// at every run). One thread per row took 70 us for a GPT batch (4,096 rows of 96 classes)
// on an H200, each thread walking its row three times alone. Lanes past the last row (the
// last group's tail) read row 0 and write nothing.
kernel void cross_entropy_rows_simd(device const float* logits [[buffer(0)]],
                                    device const int64_t* labels [[buffer(1)]],
                                    device float* row_loss [[buffer(2)]],
                                    device float* grad [[buffer(3)]],
                                    constant CrossEntropyArgs& a [[buffer(4)]],
                                    uint gid [[thread_position_in_grid]],
                                    uint32_t lane [[thread_index_in_simdgroup]],
                                    uint32_t width [[threads_per_simdgroup]]) {
  const bool live = gid / width < uint32_t(a.rows);
  const uint32_t r = live ? gid / width : 0u;
  const uint64_t base = uint64_t(r) * uint64_t(a.classes);
  device const float* row = logits + base;
  const int32_t W = int32_t(width), n = a.classes;
  float m = -INFINITY;
  // fmax skips NaN (MSL's max is undefined for it); a NaN logit still makes s NaN below.
  for (int32_t c = int32_t(lane); c < n; c += W) m = fmax(m, row[c]);
  m = simd_max(m);
  float s = 0.0f;
  for (int32_t c = int32_t(lane); c < n; c += W) s += exp(row[c] - m);
  const float log_sum = log(simd_sum(s));
  if (!live) return;
  const int64_t label64 = labels[r];
  if (label64 < 0 || label64 >= int64_t(n)) {
    if (lane == 0u) row_loss[r] = NAN;
    for (int32_t c = int32_t(lane); c < n; c += W) grad[base + uint64_t(c)] = NAN;
    return;
  }
  const int32_t label = int32_t(label64);
  if (lane == 0u) row_loss[r] = log_sum - (row[label] - m);
  for (int32_t c = int32_t(lane); c < n; c += W) {
    const float p = exp((row[c] - m) - log_sum);
    grad[base + uint64_t(c)] = (c == label ? p - 1.0f : p) * a.inv_rows;
  }
}

// The mean of the row losses: one threadgroup of kCrossEntropyMeanThreads, each thread
// summing rows tid, tid + 256, ..., then simd_sum and the simdgroups' sums in slot order (a
// fixed order: the same bits at every run). One thread summing alone took 54 us for a GPT
// batch's 4,096 rows on an H200.
kernel void cross_entropy_mean(device const float* row_loss [[buffer(0)]],
                               device float* loss [[buffer(1)]],
                               constant CrossEntropyArgs& a [[buffer(2)]],
                               uint32_t tid [[thread_index_in_threadgroup]],
                               uint3 tg_size [[threads_per_threadgroup]],
                               uint32_t lane [[thread_index_in_simdgroup]],
                               uint32_t sg [[simdgroup_index_in_threadgroup]],
                               uint32_t sg_width [[threads_per_simdgroup]]) {
  threadgroup float slots[64];  // simdgroups of a group: 256 threads, width >= 4
  const uint32_t T_ = tg_size.x;
  const uint32_t nsg = (T_ + sg_width - 1u) / sg_width;
  float s = 0.0f;
  for (uint32_t r = tid; r < uint32_t(a.rows); r += T_) s += row_loss[r];
  s = simd_sum(s);
  if (lane == 0u) slots[sg] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid == 0u) {
    float total = 0.0f;
    for (uint32_t k = 0; k < nsg; ++k) total += slots[k];
    loss[0] = total * a.inv_rows;
  }
}

// ---------------------------------------------------------------------------- optimizers
// Each update is one element of one tensor: param[i], grad[i] and the state s1[i], s2[i]
// (unused ones are bound but not read), with the tensor's hyper-parameters `a`.

// torch.optim.SGD: g += wd * p; buf = first ? g : momentum * buf + (1 - dampening) * g;
// g = nesterov ? g + momentum * buf : buf (when momentum != 0); p -= lr * g.
struct SgdUpdate {
  static FM_FUNC void apply(device float* param, device const float* grad, device float* buf,
                            device float* unused, constant OptimArgs& a, uint32_t i) {
    const float p = param[i];
    float g = grad[i];
    if (a.weight_decay != 0.0f) g = g + a.weight_decay * p;
    if (a.momentum != 0.0f) {
      const float b = a.first != 0 ? g : a.momentum * buf[i] + (1.0f - a.dampening) * g;
      buf[i] = b;
      g = a.nesterov != 0 ? g + a.momentum * b : b;
    }
    param[i] = p - a.lr * g;
  }
};

// torch.optim.Adam (amsgrad=False): m = lerp(m, g, 1 - beta1); v = beta2 v + (1 - beta2) g^2;
// p -= step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps), as torch's order of operations.
struct AdamUpdate {
  static FM_FUNC void apply(device float* param, device const float* grad, device float* exp_avg,
                            device float* exp_avg_sq, constant OptimArgs& a, uint32_t i) {
    const float p = param[i];
    float g = grad[i];
    if (a.weight_decay != 0.0f) g = g + a.weight_decay * p;
    const float m0 = exp_avg[i];
    const float m = m0 + (1.0f - a.beta1) * (g - m0);
    const float v = a.beta2 * exp_avg_sq[i] + (1.0f - a.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = sqrt(v) / a.sqrt_bias2 + a.eps;
    param[i] = p - a.step_size * (m / denom);
  }
};

// torch.optim.Adadelta: sq = rho sq + (1 - rho) g^2; delta = sqrt(acc + eps) / sqrt(sq + eps) g;
// acc = rho acc + (1 - rho) delta^2; p -= lr * delta.
struct AdadeltaUpdate {
  static FM_FUNC void apply(device float* param, device const float* grad,
                            device float* square_avg, device float* acc_delta,
                            constant OptimArgs& a, uint32_t i) {
    const float p = param[i];
    float g = grad[i];
    if (a.weight_decay != 0.0f) g = g + a.weight_decay * p;
    const float sq = a.rho * square_avg[i] + (1.0f - a.rho) * g * g;
    square_avg[i] = sq;
    const float ad = acc_delta[i];
    const float delta = sqrt(ad + a.eps) / sqrt(sq + a.eps) * g;
    acc_delta[i] = a.rho * ad + (1.0f - a.rho) * delta * delta;
    param[i] = p - a.lr * delta;
  }
};

// Up to FM_OPTIM_SLOTS tensors in one launch (training_args.h): thread gid updates element
// gid - start[k] of the slot k whose range holds it. A kernel binds a fixed set of buffers,
// so the slots are spelled out; selecting a pointer by slot is plain MSL.
template <typename U>
kernel void optimizer_multi(device float* p0 [[buffer(0)]], device const float* g0 [[buffer(1)]],
                            device float* a0 [[buffer(2)]], device float* b0 [[buffer(3)]],
                            device float* p1 [[buffer(4)]], device const float* g1 [[buffer(5)]],
                            device float* a1 [[buffer(6)]], device float* b1 [[buffer(7)]],
                            device float* p2 [[buffer(8)]], device const float* g2 [[buffer(9)]],
                            device float* a2 [[buffer(10)]], device float* b2 [[buffer(11)]],
                            constant OptimMultiArgs& m [[buffer(12)]],
                            uint gid [[thread_position_in_grid]]) {
  static_assert(FM_OPTIM_SLOTS == 3, "optimizer_multi spells out 3 slots");
  if (gid >= m.start[m.count]) return;
  const uint32_t k = gid < m.start[1] ? 0u : gid < m.start[2] ? 1u : 2u;
  const uint32_t i = gid - m.start[k];
  device float* p = k == 0u ? p0 : k == 1u ? p1 : p2;
  device const float* g = k == 0u ? g0 : k == 1u ? g1 : g2;
  device float* sa = k == 0u ? a0 : k == 1u ? a1 : a2;
  device float* sb = k == 0u ? b0 : k == 1u ? b1 : b2;
  U::apply(p, g, sa, sb, m.slot[k], i);
}

FM_INSTANTIATE("sgd_step", optimizer_multi, SgdUpdate);
FM_INSTANTIATE("adam_step", optimizer_multi, AdamUpdate);
FM_INSTANTIATE("adadelta_step", optimizer_multi, AdadeltaUpdate);
