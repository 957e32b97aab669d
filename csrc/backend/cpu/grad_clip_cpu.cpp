// The CPU's gradient clipping (ops/training.cpp asks for "grad_norm" and "grad_scale"):
// metal/grad_clip.metal's partition and arithmetic as plain loops (the kernels' barriers
// would run under the fiber emulator), behind the _set_native_cpu switch. The same chunks,
// lanes, lane order and tree as the kernels, so the result does not depend on the thread
// count and matches the kernels' to rounding (the compilers may contract a*b+c differently).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/array.h"
#include "grad_clip_args.h"
#include "native_ops.h"
#include "thread_pool.h"

namespace fm::cpu {
namespace {
using i64 = std::int64_t;
constexpr i64 kChunk = FM_GRAD_CHUNK, kLanes = FM_GRAD_LANES;

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

// Lanes then the pairwise tree, as the kernels: (hi, lo) of lane 0 at the end.
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

// One chunk (len <= kChunk elements at x) into its float pair.
template <std::uint32_t Mode, typename T, typename A>
void chunk_partial(const T* x, i64 len, A p, float* pair) {
  A hi[kLanes] = {}, lo[kLanes] = {};
  for (i64 r = 0; r < len; r += kLanes) {
    const i64 m = std::min(kLanes, len - r);
    for (i64 l = 0; l < m; ++l) {
      const A v = term<Mode>(A(x[r + l]), p);
      if constexpr (Mode == FM_GRAD_NORM_MAX) combine_max(hi[l], v);
      else combine_sum(hi[l], lo[l], v, A(0));
    }
  }
  tree<Mode>(hi, lo);
  store(pair, hi[0], lo[0]);
}

template <std::uint32_t Mode, typename T>
void chunk_of(const void* base, i64 begin, i64 len, float p, float* pair) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  chunk_partial<Mode, T, A>(static_cast<const T*>(base) + begin, len, A(p), pair);
}

template <std::uint32_t Mode>
void chunk_any(DType t, const void* base, i64 begin, i64 len, float p, float* pair) {
  if (t == DType::float16) return chunk_of<Mode, _Float16>(base, begin, len, p, pair);
  if (t == DType::float64) return chunk_of<Mode, double>(base, begin, len, p, pair);
  chunk_of<Mode, float>(base, begin, len, p, pair);
}

// The parts' pairs by lanes and the tree, the root and the factor (grad_norm_finish).
template <std::uint32_t Mode>
float finish(const std::vector<float>& parts, i64 n) {
  float hi[kLanes] = {}, lo[kLanes] = {};
  for (i64 l = 0; l < kLanes; ++l)
    for (i64 j = l; j < n; j += kLanes) {
      if constexpr (Mode == FM_GRAD_NORM_MAX) combine_max(hi[l], parts[2 * j]);
      else combine_sum(hi[l], lo[l], parts[2 * j], parts[2 * j + 1]);
    }
  tree<Mode>(hi, lo);
  return Mode == FM_GRAD_NORM_MAX ? hi[0] : hi[0] + lo[0];
}

void grad_norm_native(const std::vector<Array>& grads, float p, const GradNormFinishArgs& a,
                      const Array& total, const Array& scale) {
  struct Chunk {
    DType dtype;
    const void* base;
    i64 begin, len;
  };
  std::vector<Chunk> chunks;
  for (const Array& g : grads)
    for (i64 at = 0; at < g.size(); at += kChunk)
      chunks.push_back({g.dtype, g.host_data(), at, std::min(kChunk, g.size() - at)});
  const i64 n = i64(chunks.size());
  std::vector<float> parts(std::size_t(2 * n));
  constexpr i64 kPerTask = 8;  // chunks per task: 32768 elements
  ThreadPool::instance().parallel_for((n + kPerTask - 1) / kPerTask, [&](i64 t) {
    for (i64 c = t * kPerTask; c < std::min(n, (t + 1) * kPerTask); ++c) {
      const Chunk& k = chunks[std::size_t(c)];
      float* pair = &parts[std::size_t(2 * c)];
      switch (a.mode) {
        case FM_GRAD_NORM_SQUARE: chunk_any<FM_GRAD_NORM_SQUARE>(k.dtype, k.base, k.begin, k.len, p, pair); break;
        case FM_GRAD_NORM_ABS: chunk_any<FM_GRAD_NORM_ABS>(k.dtype, k.base, k.begin, k.len, p, pair); break;
        case FM_GRAD_NORM_POW: chunk_any<FM_GRAD_NORM_POW>(k.dtype, k.base, k.begin, k.len, p, pair); break;
        default: chunk_any<FM_GRAD_NORM_MAX>(k.dtype, k.base, k.begin, k.len, p, pair); break;
      }
    }
  });
  float s;
  switch (a.mode) {
    case FM_GRAD_NORM_SQUARE: s = std::sqrt(finish<FM_GRAD_NORM_SQUARE>(parts, n)); break;
    case FM_GRAD_NORM_ABS: s = finish<FM_GRAD_NORM_ABS>(parts, n); break;
    case FM_GRAD_NORM_POW: s = std::pow(finish<FM_GRAD_NORM_POW>(parts, n), a.inv_p); break;
    default: s = finish<FM_GRAD_NORM_MAX>(parts, n); break;
  }
  *reinterpret_cast<float*>(total.host_data()) = s;
  const float q = a.max_norm / (s + 1e-6f);
  *reinterpret_cast<float*>(scale.host_data()) = (std::isnan(q) || q < 1.0f) ? q : 1.0f;
}

// Every gradient times scale[0] in its dtype (grad_scale_multi's grad_scaled).
void grad_scale_native(const std::vector<Array>& grads, const Array& scale) {
  const float s = *reinterpret_cast<const float*>(scale.host_data());
  constexpr i64 kTask = 1 << 16;
  struct Span {
    const Array* g;
    i64 begin, len;
  };
  std::vector<Span> spans;
  for (const Array& g : grads)
    for (i64 at = 0; at < g.size(); at += kTask) spans.push_back({&g, at, std::min(kTask, g.size() - at)});
  ThreadPool::instance().parallel_for(i64(spans.size()), [&](i64 t) {
    const Span& sp = spans[std::size_t(t)];
    char* base = sp.g->host_data();
    if (sp.g->dtype == DType::float16) {
      _Float16* x = reinterpret_cast<_Float16*>(base) + sp.begin;
      const float sh = float(_Float16(s));
      for (i64 i = 0; i < sp.len; ++i) x[i] = _Float16(float(x[i]) * sh);
    } else if (sp.g->dtype == DType::float64) {
      double* x = reinterpret_cast<double*>(base) + sp.begin;
      const double sd = double(s);
      for (i64 i = 0; i < sp.len; ++i) x[i] *= sd;
    } else {
      float* x = reinterpret_cast<float*>(base) + sp.begin;
      for (i64 i = 0; i < sp.len; ++i) x[i] *= s;
    }
  });
}

}  // namespace

FM_CPU_NATIVE("grad_norm", &grad_norm_native, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("grad_scale", &grad_scale_native, &native_reduce_matmul_enabled());

}  // namespace fm::cpu
