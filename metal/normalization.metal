// Normalization and softmax kernels: layer_norm / rms_norm / group_norm (rows normalised by
// their own statistics), batch_norm (per-channel statistics), softmax / log_softmax /
// logsumexp along any axis, and their backward passes. T is the storage type of the data
// (float or half); everything is computed in float, statistics are saved as float.
//
// A row (or a channel) is one threadgroup: each thread reduces a strided share, the
// simdgroups combine theirs with simd_sum / simd_max, and every thread then adds the
// simdgroups' results from threadgroup memory in slot order, so all threads hold the same
// bits and the result does not depend on which thread finished first. Correct for any
// threadgroup size up to 1024 (partial simdgroups included): every barrier and simdgroup
// function is reached by the whole group. Statistics are two-pass (mean, then the mean
// of squared deviations), exact enough for large offsets where sum / sum-of-squares is not.
// The data is re-read from device memory on each pass: a row or channel is small enough
// to stay in cache.
//
// Axes that are not the last (softmax with inner > 1) take one thread per (outer, inner)
// column instead: neighbouring threads read neighbouring elements.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "normalization_args.h"
using namespace metal;

enum : uint32_t { kNormSlots = 64 };  // simdgroups per group: 1024 threads, width >= 16

// ------------------------------------------------------------------- layer / rms / group
// Grid: rows threadgroups. Writes y, and the row's mean (0 for rms) and rstd.
template <typename T>
kernel void row_norm_forward(device const T* x [[buffer(0)]],
                             device const float* weight [[buffer(1)]],
                             device const float* bias [[buffer(2)]],
                             device T* y [[buffer(3)]],
                             device float* mean_out [[buffer(4)]],
                             device float* rstd_out [[buffer(5)]],
                             constant RowNormArgs& a [[buffer(6)]],
                             uint3 tg_pos [[threadgroup_position_in_grid]],
                             uint32_t tid [[thread_index_in_threadgroup]],
                             uint3 tg_size [[threads_per_threadgroup]],
                             uint32_t lane [[thread_index_in_simdgroup]],
                             uint32_t sg [[simdgroup_index_in_threadgroup]],
                             uint32_t sg_width [[threads_per_simdgroup]]) {
  threadgroup float slots[kNormSlots];
  const uint32_t T_ = tg_size.x;
  const uint32_t nsg = (T_ + sg_width - 1) / sg_width;
  const uint32_t r = tg_pos.x;
  const uint64_t base = uint64_t(r) * uint64_t(a.n);
  const bool rms = (a.flags & kNormRms) != 0u;
  const float n = float(a.n);
  // Pass 1: sum of x (layer/group norm) or of x^2 (rms).
  float s = 0.0f;
  for (uint32_t i = tid; i < a.n; i += T_) {
    const float v = float(x[base + i]);
    s += rms ? v * v : v;
  }
  s = simd_sum(s);
  if (lane == 0u) slots[sg] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  s = 0.0f;
  for (uint32_t k = 0; k < nsg; ++k) s += slots[k];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const float mean = rms ? 0.0f : s / n;
  // Pass 2: squared deviations from the mean (rms: the sum of squares is already there).
  float d = 0.0f;
  if (!rms) {
    for (uint32_t i = tid; i < a.n; i += T_) {
      const float v = float(x[base + i]) - mean;
      d += v * v;
    }
  }
  d = simd_sum(d);
  if (lane == 0u) slots[sg] = d;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  d = 0.0f;
  for (uint32_t k = 0; k < nsg; ++k) d += slots[k];
  const float var = (rms ? s : d) / n;
  const float rstd = 1.0f / sqrt(var + a.eps);
  if (tid == 0u) {
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
  const uint32_t c0 = (r % a.groups) * a.group_ch;
  const bool has_w = (a.flags & kNormWeight) != 0u, has_b = (a.flags & kNormBias) != 0u;
  for (uint32_t i = tid; i < a.n; i += T_) {
    const uint32_t c = c0 + (a.spatial == 1u ? i : i / a.spatial);
    float v = (float(x[base + i]) - mean) * rstd;
    if (has_w) v = v * weight[c];
    if (has_b) v = v + bias[c];
    y[base + i] = static_cast<T>(v);
  }
}

FM_INSTANTIATE("row_norm_forward_float32", row_norm_forward, float);
FM_INSTANTIATE("row_norm_forward_float16", row_norm_forward, half);

// dx = rstd * (wg - mean(wg) - xhat * mean(wg * xhat)), wg = g * weight, xhat = (x - mean) *
// rstd (rms: without the mean(wg) term). Grid: rows threadgroups.
template <typename T>
kernel void row_norm_backward(device const T* g [[buffer(0)]],
                              device const T* x [[buffer(1)]],
                              device const float* weight [[buffer(2)]],
                              device const float* mean_in [[buffer(3)]],
                              device const float* rstd_in [[buffer(4)]],
                              device T* dx [[buffer(5)]],
                              constant RowNormArgs& a [[buffer(6)]],
                              uint3 tg_pos [[threadgroup_position_in_grid]],
                              uint32_t tid [[thread_index_in_threadgroup]],
                              uint3 tg_size [[threads_per_threadgroup]],
                              uint32_t lane [[thread_index_in_simdgroup]],
                              uint32_t sg [[simdgroup_index_in_threadgroup]],
                              uint32_t sg_width [[threads_per_simdgroup]]) {
  threadgroup float slots_g[kNormSlots];
  threadgroup float slots_gx[kNormSlots];
  const uint32_t T_ = tg_size.x;
  const uint32_t nsg = (T_ + sg_width - 1) / sg_width;
  const uint32_t r = tg_pos.x;
  const uint64_t base = uint64_t(r) * uint64_t(a.n);
  const float mean = mean_in[r], rstd = rstd_in[r];
  const uint32_t c0 = (r % a.groups) * a.group_ch;
  const bool has_w = (a.flags & kNormWeight) != 0u;
  float sg_ = 0.0f, sgx = 0.0f;
  for (uint32_t i = tid; i < a.n; i += T_) {
    const uint32_t c = c0 + (a.spatial == 1u ? i : i / a.spatial);
    const float wg = has_w ? float(g[base + i]) * weight[c] : float(g[base + i]);
    sg_ += wg;
    sgx += wg * ((float(x[base + i]) - mean) * rstd);
  }
  sg_ = simd_sum(sg_);
  sgx = simd_sum(sgx);
  if (lane == 0u) {
    slots_g[sg] = sg_;
    slots_gx[sg] = sgx;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  sg_ = 0.0f;
  sgx = 0.0f;
  for (uint32_t k = 0; k < nsg; ++k) {
    sg_ += slots_g[k];
    sgx += slots_gx[k];
  }
  const float n = float(a.n);
  const float mg = (a.flags & kNormRms) != 0u ? 0.0f : sg_ / n;
  const float mgx = sgx / n;
  for (uint32_t i = tid; i < a.n; i += T_) {
    const uint32_t c = c0 + (a.spatial == 1u ? i : i / a.spatial);
    const float wg = has_w ? float(g[base + i]) * weight[c] : float(g[base + i]);
    const float xhat = (float(x[base + i]) - mean) * rstd;
    dx[base + i] = static_cast<T>(rstd * ((wg - mg) - xhat * mgx));
  }
}

FM_INSTANTIATE("row_norm_backward_float32", row_norm_backward, float);
FM_INSTANTIATE("row_norm_backward_float16", row_norm_backward, half);

// The weight and bias gradients, first launch: thread (c, chunk) sums its chunk of outer
// rows (normalization_args.h, AffineGradArgs). Grid: (C, chunks).
template <typename T>
kernel void norm_affine_partial(device const T* g [[buffer(0)]],
                                device const T* x [[buffer(1)]],
                                device const float* mean_in [[buffer(2)]],
                                device const float* rstd_in [[buffer(3)]],
                                device float* part_w [[buffer(4)]],
                                device float* part_b [[buffer(5)]],
                                constant AffineGradArgs& a [[buffer(6)]],
                                uint2 gid [[thread_position_in_grid]]) {
  const uint32_t c = gid.x, k = gid.y;
  if (c >= a.C || k >= a.chunks) return;
  const uint32_t a0 = k * a.chunk_rows, a1 = min(a.outer, a0 + a.chunk_rows);
  const bool rms = (a.flags & kNormRms) != 0u;
  float sw = 0.0f, sb = 0.0f;
  if (a.S == 1u) {
    // LayerNorm / RMSNorm (one element per row and feature): eight rows' loads go out before
    // their adds, the adds in row order as below (one load at a time, a thread waited out 64
    // loads' latency in turn: GPT's (4096, 128) gradient took 24 us on an H100).
    for (uint32_t o = a0; o < a1; o += 8u) {
      float gv[8], xv[8], mv[8], rv[8];
      FM_UNROLL for (uint32_t u = 0; u < 8u; ++u) {
        const bool in = o + u < a1;
        const uint32_t st = (o + u) * a.groups + c / a.group_ch;
        const uint64_t at = uint64_t(o + u) * uint64_t(a.C) + uint64_t(c);
        gv[u] = 0.0f;
        xv[u] = 0.0f;
        mv[u] = 0.0f;
        rv[u] = 0.0f;
        if (in) {
          gv[u] = float(g[at]);
          xv[u] = float(x[at]);
          mv[u] = rms ? 0.0f : mean_in[st];
          rv[u] = rstd_in[st];
        }
      }
      FM_UNROLL for (uint32_t u = 0; u < 8u; ++u) {
        if (o + u < a1) {
          float rw = 0.0f;
          rw += gv[u] * (xv[u] - mv[u]);
          sb += gv[u];
          sw += rw * rv[u];
        }
      }
    }
    part_w[uint64_t(k) * a.C + c] = sw;
    part_b[uint64_t(k) * a.C + c] = sb;
    return;
  }
  for (uint32_t o = a0; o < a1; ++o) {
    const uint32_t st = o * a.groups + c / a.group_ch;
    const float m = rms ? 0.0f : mean_in[st];
    const uint64_t base = (uint64_t(o) * uint64_t(a.C) + uint64_t(c)) * uint64_t(a.S);
    float rw = 0.0f;
    for (uint32_t s = 0; s < a.S; ++s) {
      const float gv = float(g[base + s]);
      rw += gv * (float(x[base + s]) - m);
      sb += gv;
    }
    sw += rw * rstd_in[st];
  }
  part_w[uint64_t(k) * a.C + c] = sw;
  part_b[uint64_t(k) * a.C + c] = sb;
}

FM_INSTANTIATE("norm_affine_partial_float32", norm_affine_partial, float);
FM_INSTANTIATE("norm_affine_partial_float16", norm_affine_partial, half);

// Second launch: the chunks' partials added in chunk order. Grid: C.
kernel void norm_affine_finish(device const float* part_w [[buffer(0)]],
                               device const float* part_b [[buffer(1)]],
                               device float* dweight [[buffer(2)]],
                               device float* dbias [[buffer(3)]],
                               constant AffineGradArgs& a [[buffer(4)]],
                               uint gid [[thread_position_in_grid]]) {
  if (gid >= a.C) return;
  // Two chains in chunk order (sum_slices, 8 loads then 8 adds, measured slower here on an
  // H100: 5.2 against 3.7 us for GPT's 64 chunks of 128).
  float sw = 0.0f, sb = 0.0f;
  for (uint32_t k = 0; k < a.chunks; ++k) {
    sw += part_w[uint64_t(k) * a.C + gid];
    sb += part_b[uint64_t(k) * a.C + gid];
  }
  dweight[gid] = sw;
  dbias[gid] = sb;
}

// ------------------------------------------------------------------- batch norm
// A channel is one threadgroup: few channels (16 in a CIFAR ResNet's first stage) leave most
// of a GPU idle, so a channel's speed is the loads its threads keep in flight. Each thread
// walks its share of the channel's N * S elements (j = tid, tid + T, ...; element j at
// x[(n * C + c) * S + s], (n, s) = divmod(j, S) stepped without a division) four elements an
// iteration, four independent loads at a time.
struct BnWalk {
  uint32_t n, s;    // the next element
  uint32_t dn, ds;  // one step of T elements: divmod(T, S)
};

FM_FUNC BnWalk bn_walk(constant BatchNormArgs& a, uint32_t tid, uint32_t T) {
  BnWalk w;
  const uint32_t S = max(a.S, 1u);
  w.n = tid / S;
  w.s = tid - w.n * S;
  w.dn = T / S;
  w.ds = T - w.dn * S;
  return w;
}

// The element's index, and the walk moved one step on.
FM_FUNC uint64_t bn_next(constant BatchNormArgs& a, uint32_t c, thread BnWalk& w) {
  const uint64_t i = (uint64_t(w.n) * uint64_t(a.C) + uint64_t(c)) * uint64_t(a.S) + uint64_t(w.s);
  w.s += w.ds;
  w.n += w.dn;
  if (w.s >= a.S) {
    w.s -= a.S;
    w.n += 1u;
  }
  return i;
}

// One threadgroup per channel: the statistics (batch or running), the running update, and
// y = x * scale + shift with scale = weight * rstd, shift = bias - mean * scale (PyTorch's
// form). The batch statistics take one read of x, with nothing large cancelling: each
// thread keeps the count, mean and M2 (sum of squared deviations) of its elements, merging
// in four at a time (their own two-pass mean and M2; Chan et al.'s update), and the group
// combines the threads': mean = sum(n_t mean_t) / n, M2 = sum(M2_t + n_t (mean_t - mean)^2).
// new_mean / new_var may be running_mean /
// running_var themselves (thread 0 of a channel reads its element before writing it).
// Grid: C threadgroups.
template <typename T>
kernel void batch_norm_forward(device const T* x [[buffer(0)]],
                               device const float* weight [[buffer(1)]],
                               device const float* bias [[buffer(2)]],
                               device const float* running_mean [[buffer(3)]],
                               device const float* running_var [[buffer(4)]],
                               device T* y [[buffer(5)]],
                               device float* save_mean [[buffer(6)]],
                               device float* save_rstd [[buffer(7)]],
                               device float* new_mean [[buffer(8)]],
                               device float* new_var [[buffer(9)]],
                               constant BatchNormArgs& a [[buffer(10)]],
                               uint3 tg_pos [[threadgroup_position_in_grid]],
                               uint32_t tid [[thread_index_in_threadgroup]],
                               uint3 tg_size [[threads_per_threadgroup]],
                               uint32_t lane [[thread_index_in_simdgroup]],
                               uint32_t sg [[simdgroup_index_in_threadgroup]],
                               uint32_t sg_width [[threads_per_simdgroup]]) {
  threadgroup float slots[kNormSlots];
  const uint32_t T_ = tg_size.x;
  const uint32_t nsg = (T_ + sg_width - 1) / sg_width;
  const uint32_t c = tg_pos.x;
  const uint32_t count = a.N * a.S;
  const bool training = (a.flags & kNormTraining) != 0u;
  // This thread's elements: j = tid + k T < count.
  const uint32_t mine = tid < count ? (count - 1u - tid) / T_ + 1u : 0u;
  float n_t = 0.0f, mean_t = 0.0f, m2_t = 0.0f;  // the thread's count, mean and M2
  if (training) {
    BnWalk w = bn_walk(a, tid, T_);
    uint32_t k = 0;
    for (; k + 4u <= mine; k += 4u) {
      const uint64_t i0 = bn_next(a, c, w), i1 = bn_next(a, c, w);
      const uint64_t i2 = bn_next(a, c, w), i3 = bn_next(a, c, w);
      const float v0 = float(x[i0]), v1 = float(x[i1]), v2 = float(x[i2]), v3 = float(x[i3]);
      const float mb = ((v0 + v1) + (v2 + v3)) * 0.25f;
      const float d0 = v0 - mb, d1 = v1 - mb, d2 = v2 - mb, d3 = v3 - mb;
      const float nn = n_t + 4.0f, delta = mb - mean_t;
      mean_t += delta * (4.0f / nn);
      m2_t += ((d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3)) + delta * delta * (n_t * 4.0f / nn);
      n_t = nn;
    }
    for (; k < mine; ++k) {
      const float v = float(x[bn_next(a, c, w)]);
      n_t += 1.0f;
      const float delta = v - mean_t;
      mean_t += delta / n_t;
      m2_t += delta * (v - mean_t);
    }
  }
  // The group's sums in slot order (the same bits in every thread): the values, then M2.
  float mean = simd_sum(n_t * mean_t);
  if (lane == 0u) slots[sg] = mean;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  mean = 0.0f;
  for (uint32_t q = 0; q < nsg; ++q) mean += slots[q];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  mean = mean / float(count);
  const float dev = mean_t - mean;
  float m2 = simd_sum(m2_t + n_t * dev * dev);
  if (lane == 0u) slots[sg] = m2;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  m2 = 0.0f;
  for (uint32_t q = 0; q < nsg; ++q) m2 += slots[q];
  float rstd;
  if (training) {
    rstd = 1.0f / sqrt(m2 / float(count) + a.eps);
  } else {
    mean = running_mean[c];
    rstd = 1.0f / sqrt(running_var[c] + a.eps);
  }
  if (tid == 0u) {
    save_mean[c] = mean;
    save_rstd[c] = rstd;
    if ((a.flags & kNormRunning) != 0u) {
      const float unbiased = m2 / (float(count) - 1.0f);
      const float rm = running_mean[c], rv = running_var[c];
      new_mean[c] = a.momentum * mean + (1.0f - a.momentum) * rm;
      new_var[c] = a.momentum * unbiased + (1.0f - a.momentum) * rv;
    }
  }
  const float scale = (a.flags & kNormWeight) != 0u ? weight[c] * rstd : rstd;
  const float shift = ((a.flags & kNormBias) != 0u ? bias[c] : 0.0f) - mean * scale;
  BnWalk w = bn_walk(a, tid, T_);
  uint32_t k = 0;
  for (; k + 4u <= mine; k += 4u) {
    const uint64_t i0 = bn_next(a, c, w), i1 = bn_next(a, c, w);
    const uint64_t i2 = bn_next(a, c, w), i3 = bn_next(a, c, w);
    const float v0 = float(x[i0]), v1 = float(x[i1]), v2 = float(x[i2]), v3 = float(x[i3]);
    y[i0] = static_cast<T>(v0 * scale + shift);
    y[i1] = static_cast<T>(v1 * scale + shift);
    y[i2] = static_cast<T>(v2 * scale + shift);
    y[i3] = static_cast<T>(v3 * scale + shift);
  }
  for (; k < mine; ++k) {
    const uint64_t i = bn_next(a, c, w);
    y[i] = static_cast<T>(float(x[i]) * scale + shift);
  }
}

FM_INSTANTIATE("batch_norm_forward_float32", batch_norm_forward, float);
FM_INSTANTIATE("batch_norm_forward_float16", batch_norm_forward, half);

// One threadgroup per channel, from the forward's saved mean and rstd: dbias = sum(g),
// dweight = sum(g * xhat); training: dx = weight * rstd * (g - mean(g) - xhat *
// mean(g * xhat)); eval (running statistics, y affine in x): dx = g * weight * rstd.
// Four elements (eight loads) in flight per thread, as the forward.
template <typename T>
kernel void batch_norm_backward(device const T* g [[buffer(0)]],
                                device const T* x [[buffer(1)]],
                                device const float* weight [[buffer(2)]],
                                device const float* mean_in [[buffer(3)]],
                                device const float* rstd_in [[buffer(4)]],
                                device T* dx [[buffer(5)]],
                                device float* dweight [[buffer(6)]],
                                device float* dbias [[buffer(7)]],
                                constant BatchNormArgs& a [[buffer(8)]],
                                uint3 tg_pos [[threadgroup_position_in_grid]],
                                uint32_t tid [[thread_index_in_threadgroup]],
                                uint3 tg_size [[threads_per_threadgroup]],
                                uint32_t lane [[thread_index_in_simdgroup]],
                                uint32_t sg [[simdgroup_index_in_threadgroup]],
                                uint32_t sg_width [[threads_per_simdgroup]]) {
  threadgroup float slots_g[kNormSlots];
  threadgroup float slots_gx[kNormSlots];
  const uint32_t T_ = tg_size.x;
  const uint32_t nsg = (T_ + sg_width - 1) / sg_width;
  const uint32_t c = tg_pos.x;
  const uint32_t count = a.N * a.S;
  const uint32_t mine = tid < count ? (count - 1u - tid) / T_ + 1u : 0u;
  const float mean = mean_in[c], rstd = rstd_in[c];
  float sg_ = 0.0f, sgx = 0.0f;
  BnWalk w = bn_walk(a, tid, T_);
  uint32_t k = 0;
  for (; k + 4u <= mine; k += 4u) {
    const uint64_t i0 = bn_next(a, c, w), i1 = bn_next(a, c, w);
    const uint64_t i2 = bn_next(a, c, w), i3 = bn_next(a, c, w);
    const float g0 = float(g[i0]), g1 = float(g[i1]), g2 = float(g[i2]), g3 = float(g[i3]);
    const float x0 = float(x[i0]), x1 = float(x[i1]), x2 = float(x[i2]), x3 = float(x[i3]);
    sg_ += (g0 + g1) + (g2 + g3);
    sgx += (g0 * (x0 - mean) + g1 * (x1 - mean)) + (g2 * (x2 - mean) + g3 * (x3 - mean));
  }
  for (; k < mine; ++k) {
    const uint64_t i = bn_next(a, c, w);
    const float gv = float(g[i]);
    sg_ += gv;
    sgx += gv * (float(x[i]) - mean);
  }
  sg_ = simd_sum(sg_);
  sgx = simd_sum(sgx);
  if (lane == 0u) {
    slots_g[sg] = sg_;
    slots_gx[sg] = sgx;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  sg_ = 0.0f;
  sgx = 0.0f;
  for (uint32_t q = 0; q < nsg; ++q) {
    sg_ += slots_g[q];
    sgx += slots_gx[q];
  }
  sgx = sgx * rstd;  // sum(g * xhat)
  if (tid == 0u) {
    dweight[c] = sgx;
    dbias[c] = sg_;
  }
  const float wgt = (a.flags & kNormWeight) != 0u ? weight[c] : 1.0f;
  const float wr = wgt * rstd;
  const bool training = (a.flags & kNormTraining) != 0u;
  const float mg = training ? sg_ / float(count) : 0.0f;
  const float mgx = training ? sgx / float(count) : 0.0f;
  w = bn_walk(a, tid, T_);
  k = 0;
  for (; k + 4u <= mine; k += 4u) {
    const uint64_t i0 = bn_next(a, c, w), i1 = bn_next(a, c, w);
    const uint64_t i2 = bn_next(a, c, w), i3 = bn_next(a, c, w);
    const float g0 = float(g[i0]), g1 = float(g[i1]), g2 = float(g[i2]), g3 = float(g[i3]);
    const float x0 = float(x[i0]), x1 = float(x[i1]), x2 = float(x[i2]), x3 = float(x[i3]);
    dx[i0] = static_cast<T>(wr * ((g0 - mg) - (x0 - mean) * rstd * mgx));
    dx[i1] = static_cast<T>(wr * ((g1 - mg) - (x1 - mean) * rstd * mgx));
    dx[i2] = static_cast<T>(wr * ((g2 - mg) - (x2 - mean) * rstd * mgx));
    dx[i3] = static_cast<T>(wr * ((g3 - mg) - (x3 - mean) * rstd * mgx));
  }
  for (; k < mine; ++k) {
    const uint64_t i = bn_next(a, c, w);
    const float xhat = (float(x[i]) - mean) * rstd;
    dx[i] = static_cast<T>(wr * ((float(g[i]) - mg) - xhat * mgx));
  }
}

FM_INSTANTIATE("batch_norm_backward_float32", batch_norm_backward, float);
FM_INSTANTIATE("batch_norm_backward_float16", batch_norm_backward, half);

// ------------------------------------------------------------------- softmax family
// With m the row's max: softmax = exp(x - m) / sum, log_softmax = (x - m) - log(sum),
// logsumexp = m + log(sum) where an infinite m is replaced by 0 first (PyTorch's rule: a row
// with +inf gives inf, a row of -inf gives -inf). A NaN makes the row NaN; softmax and
// log_softmax of a row holding +inf, or of a row of -inf, are NaN, as PyTorch. The max skips
// NaN (fmax; MSL's max is undefined for it); the sum still sees it.

// Rows (inner == 1): one threadgroup per row. Grid: outer threadgroups.
template <typename T>
kernel void softmax_rows(device const T* x [[buffer(0)]],
                         device T* out [[buffer(1)]],
                         constant SoftmaxArgs& a [[buffer(2)]],
                         uint3 tg_pos [[threadgroup_position_in_grid]],
                         uint32_t tid [[thread_index_in_threadgroup]],
                         uint3 tg_size [[threads_per_threadgroup]],
                         uint32_t lane [[thread_index_in_simdgroup]],
                         uint32_t sg [[simdgroup_index_in_threadgroup]],
                         uint32_t sg_width [[threads_per_simdgroup]]) {
  threadgroup float slots[kNormSlots];
  const uint32_t T_ = tg_size.x;
  const uint32_t nsg = (T_ + sg_width - 1) / sg_width;
  const uint32_t r = tg_pos.x;
  const uint64_t base = uint64_t(r) * uint64_t(a.n);
  float m = -INFINITY;
  for (uint32_t i = tid; i < a.n; i += T_) m = fmax(m, float(x[base + i]));
  m = simd_max(m);
  if (lane == 0u) slots[sg] = m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  m = -INFINITY;
  for (uint32_t k = 0; k < nsg; ++k) m = fmax(m, slots[k]);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (a.mode == kLogSumExp && isinf(m)) m = 0.0f;
  float s = 0.0f;
  for (uint32_t i = tid; i < a.n; i += T_) s += exp(float(x[base + i]) - m);
  s = simd_sum(s);
  if (lane == 0u) slots[sg] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  s = 0.0f;
  for (uint32_t k = 0; k < nsg; ++k) s += slots[k];
  if (a.mode == kSoftmax) {
    const float inv = 1.0f / s;
    for (uint32_t i = tid; i < a.n; i += T_)
      out[base + i] = static_cast<T>(exp(float(x[base + i]) - m) * inv);
  } else if (a.mode == kLogSumExp) {
    if (tid == 0u) out[r] = static_cast<T>(m + log(s));
  } else {
    const float ls = log(s);
    for (uint32_t i = tid; i < a.n; i += T_)
      out[base + i] = static_cast<T>((float(x[base + i]) - m) - ls);
  }
}

FM_INSTANTIATE("softmax_rows_float32", softmax_rows, float);
FM_INSTANTIATE("softmax_rows_float16", softmax_rows, half);

// Columns (inner > 1): thread (i, o) owns the n elements o * n * inner + k * inner + i.
// Grid: (inner, outer).
template <typename T>
kernel void softmax_cols(device const T* x [[buffer(0)]],
                         device T* out [[buffer(1)]],
                         constant SoftmaxArgs& a [[buffer(2)]],
                         uint2 gid [[thread_position_in_grid]]) {
  if (gid.x >= a.inner || gid.y >= a.outer) return;
  const uint64_t base = uint64_t(gid.y) * uint64_t(a.n) * uint64_t(a.inner) + gid.x;
  const uint64_t st = a.inner;
  float m = -INFINITY;
  for (uint32_t k = 0; k < a.n; ++k) m = fmax(m, float(x[base + k * st]));
  if (a.mode == kLogSumExp && isinf(m)) m = 0.0f;
  float s = 0.0f;
  for (uint32_t k = 0; k < a.n; ++k) s += exp(float(x[base + k * st]) - m);
  if (a.mode == kSoftmax) {
    const float inv = 1.0f / s;
    for (uint32_t k = 0; k < a.n; ++k)
      out[base + k * st] = static_cast<T>(exp(float(x[base + k * st]) - m) * inv);
  } else if (a.mode == kLogSumExp) {
    out[uint64_t(gid.y) * uint64_t(a.inner) + gid.x] = static_cast<T>(m + log(s));
  } else {
    const float ls = log(s);
    for (uint32_t k = 0; k < a.n; ++k)
      out[base + k * st] = static_cast<T>((float(x[base + k * st]) - m) - ls);
  }
}

FM_INSTANTIATE("softmax_cols_float32", softmax_cols, float);
FM_INSTANTIATE("softmax_cols_float16", softmax_cols, half);

// Backward from the forward's output y: softmax dx = y * (g - sum(g * y)); log_softmax
// dx = g - exp(y) * sum(g) (mode as the forward's). Rows: one threadgroup per row.
template <typename T>
kernel void softmax_backward_rows(device const T* g [[buffer(0)]],
                                  device const T* y [[buffer(1)]],
                                  device T* dx [[buffer(2)]],
                                  constant SoftmaxArgs& a [[buffer(3)]],
                                  uint3 tg_pos [[threadgroup_position_in_grid]],
                                  uint32_t tid [[thread_index_in_threadgroup]],
                                  uint3 tg_size [[threads_per_threadgroup]],
                                  uint32_t lane [[thread_index_in_simdgroup]],
                                  uint32_t sg [[simdgroup_index_in_threadgroup]],
                                  uint32_t sg_width [[threads_per_simdgroup]]) {
  threadgroup float slots[kNormSlots];
  const uint32_t T_ = tg_size.x;
  const uint32_t nsg = (T_ + sg_width - 1) / sg_width;
  const uint64_t base = uint64_t(tg_pos.x) * uint64_t(a.n);
  const bool log_mode = a.mode == kLogSoftmax;
  float s = 0.0f;
  for (uint32_t i = tid; i < a.n; i += T_) {
    const float gv = float(g[base + i]);
    s += log_mode ? gv : gv * float(y[base + i]);
  }
  s = simd_sum(s);
  if (lane == 0u) slots[sg] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  s = 0.0f;
  for (uint32_t k = 0; k < nsg; ++k) s += slots[k];
  for (uint32_t i = tid; i < a.n; i += T_) {
    const float gv = float(g[base + i]), yv = float(y[base + i]);
    dx[base + i] = static_cast<T>(log_mode ? gv - exp(yv) * s : yv * (gv - s));
  }
}

FM_INSTANTIATE("softmax_backward_rows_float32", softmax_backward_rows, float);
FM_INSTANTIATE("softmax_backward_rows_float16", softmax_backward_rows, half);

// Columns (inner > 1). Grid: (inner, outer).
template <typename T>
kernel void softmax_backward_cols(device const T* g [[buffer(0)]],
                                  device const T* y [[buffer(1)]],
                                  device T* dx [[buffer(2)]],
                                  constant SoftmaxArgs& a [[buffer(3)]],
                                  uint2 gid [[thread_position_in_grid]]) {
  if (gid.x >= a.inner || gid.y >= a.outer) return;
  const uint64_t base = uint64_t(gid.y) * uint64_t(a.n) * uint64_t(a.inner) + gid.x;
  const uint64_t st = a.inner;
  const bool log_mode = a.mode == kLogSoftmax;
  float s = 0.0f;
  for (uint32_t k = 0; k < a.n; ++k) {
    const float gv = float(g[base + k * st]);
    s += log_mode ? gv : gv * float(y[base + k * st]);
  }
  for (uint32_t k = 0; k < a.n; ++k) {
    const float gv = float(g[base + k * st]), yv = float(y[base + k * st]);
    dx[base + k * st] = static_cast<T>(log_mode ? gv - exp(yv) * s : yv * (gv - s));
  }
}

FM_INSTANTIATE("softmax_backward_cols_float32", softmax_backward_cols, float);
FM_INSTANTIATE("softmax_backward_cols_float16", softmax_backward_cols, half);
