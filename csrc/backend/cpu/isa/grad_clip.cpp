// The chunk loops of the CPU's gradient clipping (grad_clip_cpu.cpp): metal/grad_clip.metal's
// partition and arithmetic (lanes, lane order, pairwise tree, two-sum pairs) as plain loops
// over the lanes, which the compiler vectorises. Compiled once per ISA (see isa_dispatch.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "grad_clip_args.h"

namespace fm::cpu::FM_CPU_ISA {

namespace {
using i64 = std::int64_t;
constexpr i64 kLanes = FM_GRAD_LANES;

template <typename A>
inline void combine_sum(A& hi, A& lo, A bh, A bl) {
  const A s = hi + bh;
  const A bb = s - hi;
  const A e = (hi - (s - bb)) + (bh - bb);
  hi = s;
  lo = (std::isfinite(s) ? e : A(0)) + (lo + bl);
}
template <typename A>
inline void combine_max(A& hi, A bh) {
  hi = (bh > hi || std::isnan(bh)) ? bh : hi;
}

template <std::uint32_t Mode, typename A>
inline A term(A x, A p) {
  if constexpr (Mode == FM_GRAD_NORM_SQUARE) return x * x;
  if constexpr (Mode == FM_GRAD_NORM_POW) return std::pow(std::fabs(x), p);
  return std::fabs(x);
}

// The pairwise tree over the lanes, as the kernels: (hi, lo) of lane 0 at the end.
template <std::uint32_t Mode, typename A>
void tree(A* hi, A* lo) {
  for (i64 h = kLanes / 2; h > 0; h /= 2)
    for (i64 l = 0; l < h; ++l) {
      if constexpr (Mode == FM_GRAD_NORM_MAX) combine_max(hi[l], hi[l + h]);
      else combine_sum(hi[l], lo[l], hi[l + h], lo[l + h]);
    }
}

inline void store(float* pair, float hi, float lo) {
  pair[0] = hi;
  pair[1] = lo;
}
inline void store(float* pair, double hi, double lo) {
  const double t = hi + lo;
  const float h = float(t);
  pair[0] = h;
  pair[1] = std::isfinite(h) ? float(t - double(h)) : 0.0f;
}

template <std::uint32_t Mode, typename T>
void chunk(const T* x, i64 len, float p, float* pair) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  A hi[kLanes] = {}, lo[kLanes] = {};
  const A pa = A(p);
  for (i64 r = 0; r < len; r += kLanes) {
    const i64 m = std::min(kLanes, len - r);
    for (i64 l = 0; l < m; ++l) {
      const A v = term<Mode>(A(x[r + l]), pa);
      if constexpr (Mode == FM_GRAD_NORM_MAX) combine_max(hi[l], v);
      else combine_sum(hi[l], lo[l], v, A(0));
    }
  }
  tree<Mode>(hi, lo);
  store(pair, hi[0], lo[0]);
}

template <typename T>
void chunk_mode(std::uint32_t mode, const void* x, i64 len, float p, float* pair) {
  const T* t = static_cast<const T*>(x);
  switch (mode) {
    case FM_GRAD_NORM_SQUARE: return chunk<FM_GRAD_NORM_SQUARE>(t, len, p, pair);
    case FM_GRAD_NORM_ABS: return chunk<FM_GRAD_NORM_ABS>(t, len, p, pair);
    case FM_GRAD_NORM_POW: return chunk<FM_GRAD_NORM_POW>(t, len, p, pair);
    default: return chunk<FM_GRAD_NORM_MAX>(t, len, p, pair);
  }
}

template <std::uint32_t Mode>
float finish_mode(const float* parts, i64 n) {
  float hi[kLanes] = {}, lo[kLanes] = {};
  for (i64 l = 0; l < kLanes; ++l)
    for (i64 j = l; j < n; j += kLanes) {
      if constexpr (Mode == FM_GRAD_NORM_MAX) combine_max(hi[l], parts[2 * j]);
      else combine_sum(hi[l], lo[l], parts[2 * j], parts[2 * j + 1]);
    }
  tree<Mode>(hi, lo);
  return Mode == FM_GRAD_NORM_MAX ? hi[0] : hi[0] + lo[0];
}
}  // namespace

// One chunk (len <= FM_GRAD_CHUNK elements at x; element bytes 2: float16, 4, 8) into its
// float pair, as grad_norm_parts.
void grad_norm_chunk(int bytes, std::uint32_t mode, const void* x, std::int64_t len, float p,
                     float* pair) {
  if (bytes == 2) return chunk_mode<_Float16>(mode, x, len, p, pair);
  if (bytes == 8) return chunk_mode<double>(mode, x, len, p, pair);
  chunk_mode<float>(mode, x, len, p, pair);
}

// The n pairs combined, the root taken, as grad_norm_finish (before the factor).
float grad_norm_finish(std::uint32_t mode, const float* parts, std::int64_t n, float inv_p) {
  switch (mode) {
    case FM_GRAD_NORM_SQUARE: return std::sqrt(finish_mode<FM_GRAD_NORM_SQUARE>(parts, n));
    case FM_GRAD_NORM_ABS: return finish_mode<FM_GRAD_NORM_ABS>(parts, n);
    case FM_GRAD_NORM_POW: return std::pow(finish_mode<FM_GRAD_NORM_POW>(parts, n), inv_p);
    default: return finish_mode<FM_GRAD_NORM_MAX>(parts, n);
  }
}

// len elements at x times s in their dtype, as grad_scale_multi.
void grad_scale_span(int bytes, void* x, std::int64_t len, float s) {
  if (bytes == 2) {
    _Float16* h = static_cast<_Float16*>(x);
    const float sh = float(_Float16(s));
    for (i64 i = 0; i < len; ++i) h[i] = _Float16(float(h[i]) * sh);
  } else if (bytes == 8) {
    double* d = static_cast<double*>(x);
    const double sd = double(s);
    for (i64 i = 0; i < len; ++i) d[i] *= sd;
  } else {
    float* f = static_cast<float*>(x);
    for (i64 i = 0; i < len; ++i) f[i] *= s;
  }
}

}  // namespace fm::cpu::FM_CPU_ISA
