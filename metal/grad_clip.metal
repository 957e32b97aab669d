// Gradient clipping as torch.nn.utils.clip_grad_norm_, several gradients per launch (a
// multi-tensor norm and scale, as PyTorch's foreach kernels): grad_norm_parts writes one
// partial per chunk of every gradient, grad_norm_finish combines them into the total norm and
// the clipping factor, grad_scale_multi multiplies the gradients by it in place. The
// factor stays on the device: no host read between the three.
//
// Deterministic by construction (grad_clip_args.h): chunks of FM_GRAD_CHUNK elements, each
// summed by FM_GRAD_LANES lanes in a fixed order and a fixed pairwise tree, whatever the
// threadgroup size (a thread serves lanes tid, tid + group size, ...) or the device. Sums
// are kept as (hi, lo) pairs with each addition's rounding error (two-sum), as
// metal/reduce.metal's sums, so the norm of a million elements loses almost nothing.
// Float16 gradients are summed in float, float64 ones in double (their chunk partials
// stored as float pairs). The compensated arithmetic needs IEEE float semantics: no fast
// math (the library builds with -fno-fast-math).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "grad_clip_args.h"
using namespace metal;

// Slot k's buffer (a kernel binds a fixed set of buffers, so the slots are spelled out).
template <typename P>
FM_FUNC P grad_slot(uint32_t k, P g0, P g1, P g2, P g3, P g4, P g5, P g6, P g7, P g8, P g9,
                    P g10, P g11, P g12, P g13) {
  switch (k) {
    case 0u: return g0;
    case 1u: return g1;
    case 2u: return g2;
    case 3u: return g3;
    case 4u: return g4;
    case 5u: return g5;
    case 6u: return g6;
    case 7u: return g7;
    case 8u: return g8;
    case 9u: return g9;
    case 10u: return g10;
    case 11u: return g11;
    case 12u: return g12;
    default: return g13;
  }
}

// What element x adds: x^2, |x| or |x|^p (the max mode takes |x| too).
template <typename A>
FM_FUNC A grad_term(A x, uint32_t mode, A p) {
  if (mode == FM_GRAD_NORM_SQUARE) return x * x;
  if (mode == FM_GRAD_NORM_POW) return pow(fabs(x), p);
  return fabs(x);
}

// (hi, lo) += (bh, bl): the sum with the addition's rounding error kept (none past an
// infinite sum), or the max with NaN winning.
template <typename A>
FM_FUNC void grad_combine(thread A& hi, thread A& lo, A bh, A bl, bool is_max) {
  if (is_max) {
    hi = (bh > hi || isnan(bh)) ? bh : hi;
    return;
  }
  const A s = hi + bh;
  const A bb = s - hi;
  const A e = (hi - (s - bb)) + (bh - bb);
  hi = s;
  lo = (isfinite(s) ? e : A(0)) + (lo + bl);
}

// A chunk's partial as a float pair (a double one rounded to hi plus the rest).
FM_FUNC void grad_store(device float* parts, uint32_t j, float hi, float lo) {
  parts[2u * j] = hi;
  parts[2u * j + 1u] = lo;
}
#if FM_HAS_DOUBLE
FM_FUNC void grad_store(device float* parts, uint32_t j, double hi, double lo) {
  const double t = hi + lo;
  const float h = float(t);
  parts[2u * j] = h;
  parts[2u * j + 1u] = isfinite(h) ? float(t - double(h)) : 0.0f;
}
#endif

// Grid: one threadgroup per chunk of the launch (threadgroup x is the chunk). T: the
// gradients' dtype, A: the accumulator's (float; double for double).
template <typename T, typename A>
kernel void grad_norm_parts(device const T* g0 [[buffer(0)]], device const T* g1 [[buffer(1)]],
                            device const T* g2 [[buffer(2)]], device const T* g3 [[buffer(3)]],
                            device const T* g4 [[buffer(4)]], device const T* g5 [[buffer(5)]],
                            device const T* g6 [[buffer(6)]], device const T* g7 [[buffer(7)]],
                            device const T* g8 [[buffer(8)]], device const T* g9 [[buffer(9)]],
                            device const T* g10 [[buffer(10)]], device const T* g11 [[buffer(11)]],
                            device const T* g12 [[buffer(12)]], device const T* g13 [[buffer(13)]],
                            device float* parts [[buffer(14)]],
                            constant GradNormPartsArgs& a [[buffer(15)]],
                            uint3 tg_pos [[threadgroup_position_in_grid]],
                            uint32_t tid [[thread_index_in_threadgroup]],
                            uint3 tg_size [[threads_per_threadgroup]]) {
  static_assert(FM_GRAD_SLOTS == 14, "grad_norm_parts spells out 14 slots");
  threadgroup A lane_hi[FM_GRAD_LANES];
  threadgroup A lane_lo[FM_GRAD_LANES];
  const uint32_t step = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t c = tg_pos.x;
  const bool live = c < a.chunk_start[a.count];
  uint32_t k = 0;
  for (uint32_t j = 1; j < a.count; ++j) k = c >= a.chunk_start[j] ? j : k;
  device const T* g = grad_slot(k, g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13);
  const uint32_t in_slot = live ? c - a.chunk_start[k] : 0u;
  const uint32_t begin = in_slot * uint32_t(FM_GRAD_CHUNK);
  const uint32_t len = live ? min(a.n[k] - begin, uint32_t(FM_GRAD_CHUNK)) : 0u;
  const bool is_max = a.mode == FM_GRAD_NORM_MAX;
  const A p = A(a.p);
  for (uint32_t l = tid; l < uint32_t(FM_GRAD_LANES); l += step) {
    A hi = A(0), lo = A(0);
    for (uint32_t i = l; i < len; i += uint32_t(FM_GRAD_LANES))
      grad_combine(hi, lo, grad_term(A(g[begin + i]), a.mode, p), A(0), is_max);
    lane_hi[l] = hi;
    lane_lo[l] = lo;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint32_t h = uint32_t(FM_GRAD_LANES) / 2u; h > 0u; h /= 2u) {
    for (uint32_t l = tid; l < h; l += step) {
      A hi = lane_hi[l], lo = lane_lo[l];
      grad_combine(hi, lo, lane_hi[l + h], lane_lo[l + h], is_max);
      lane_hi[l] = hi;
      lane_lo[l] = lo;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0u && live) grad_store(parts, a.part_at[k] + in_slot, lane_hi[0], lane_lo[0]);
}

FM_INSTANTIATE("grad_norm_parts_float32", grad_norm_parts, float, float);
FM_INSTANTIATE("grad_norm_parts_float16", grad_norm_parts, half, float);
#if FM_HAS_DOUBLE
FM_INSTANTIATE_DISCRETE("grad_norm_parts_float64", grad_norm_parts, double, double);
#endif

// One threadgroup: the parts' pairs by lanes and the same tree, then the root and the
// clipping factor min(max_norm / (total + 1e-6), 1), NaN kept (as NumPy's minimum).
kernel void grad_norm_finish(device const float* parts [[buffer(0)]],
                             device float* total [[buffer(1)]],
                             device float* scale [[buffer(2)]],
                             constant GradNormFinishArgs& a [[buffer(3)]],
                             uint32_t tid [[thread_index_in_threadgroup]],
                             uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup float lane_hi[FM_GRAD_LANES];
  threadgroup float lane_lo[FM_GRAD_LANES];
  const uint32_t step = tg_size.x * tg_size.y * tg_size.z;
  const bool is_max = a.mode == FM_GRAD_NORM_MAX;
  for (uint32_t l = tid; l < uint32_t(FM_GRAD_LANES); l += step) {
    float hi = 0.0f, lo = 0.0f;
    for (uint32_t j = l; j < a.parts; j += uint32_t(FM_GRAD_LANES))
      grad_combine(hi, lo, parts[2u * j], parts[2u * j + 1u], is_max);
    lane_hi[l] = hi;
    lane_lo[l] = lo;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint32_t h = uint32_t(FM_GRAD_LANES) / 2u; h > 0u; h /= 2u) {
    for (uint32_t l = tid; l < h; l += step) {
      float hi = lane_hi[l], lo = lane_lo[l];
      grad_combine(hi, lo, lane_hi[l + h], lane_lo[l + h], is_max);
      lane_hi[l] = hi;
      lane_lo[l] = lo;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0u) {
    const float s = is_max ? lane_hi[0] : lane_hi[0] + lane_lo[0];
    const float t = a.mode == FM_GRAD_NORM_SQUARE ? sqrt(s)
                    : a.mode == FM_GRAD_NORM_POW  ? pow(s, a.inv_p)
                                                  : s;
    total[0] = t;
    const float q = a.max_norm / (t + 1e-6f);
    scale[0] = (isnan(q) || q < 1.0f) ? q : 1.0f;
  }
}

// The gradient times the factor, in its dtype: float16 by the factor rounded to float16
// (as `g *= scale.astype(float16)`), float64 by the float32 factor widened.
FM_FUNC float grad_scaled(float g, float s) { return g * s; }
FM_FUNC half grad_scaled(half g, float s) { return half(float(g) * float(half(s))); }
#if FM_HAS_DOUBLE
FM_FUNC double grad_scaled(double g, float s) { return g * double(s); }
#endif

// One thread per element of the launch's slots, in place.
template <typename T>
kernel void grad_scale_multi(device T* g0 [[buffer(0)]], device T* g1 [[buffer(1)]],
                             device T* g2 [[buffer(2)]], device T* g3 [[buffer(3)]],
                             device T* g4 [[buffer(4)]], device T* g5 [[buffer(5)]],
                             device T* g6 [[buffer(6)]], device T* g7 [[buffer(7)]],
                             device T* g8 [[buffer(8)]], device T* g9 [[buffer(9)]],
                             device T* g10 [[buffer(10)]], device T* g11 [[buffer(11)]],
                             device T* g12 [[buffer(12)]], device T* g13 [[buffer(13)]],
                             device const float* scale [[buffer(14)]],
                             constant GradScaleArgs& a [[buffer(15)]],
                             uint gid [[thread_position_in_grid]]) {
  static_assert(FM_GRAD_SLOTS == 14, "grad_scale_multi spells out 14 slots");
  if (gid >= a.start[a.count]) return;
  uint32_t k = 0;
  for (uint32_t j = 1; j < a.count; ++j) k = gid >= a.start[j] ? j : k;
  device T* g = grad_slot(k, g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13);
  const uint32_t i = gid - a.start[k];
  g[i] = grad_scaled(g[i], scale[0]);
}

FM_INSTANTIATE("grad_scale_multi_float32", grad_scale_multi, float);
FM_INSTANTIATE("grad_scale_multi_float16", grad_scale_multi, half);
#if FM_HAS_DOUBLE
FM_INSTANTIATE_DISCRETE("grad_scale_multi_float64", grad_scale_multi, double);
#endif
