// Cumulative sums along an axis (fastmetal.cumsum), as NumPy's add.accumulate: one thread
// per (outer, inner) position walks the R elements of its line in order, so every partial
// sum is rounded as NumPy rounds it (float32: float adds; float64: double adds, on the CPU
// and CUDA only; float16: each sum rounded to
// half, as NumPy's float16 add; int64: wrapping, in uint64_t). The input is contiguous
// (outer, R, inner) (reduce_args.h), the output too.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "reduce_args.h"
using namespace metal;

template <typename T>
FM_FUNC T scan_add(T acc, T v) { return acc + v; }  // float, double
FM_FUNC half scan_add(half acc, half v) { return half(float(acc) + float(v)); }
FM_FUNC int64_t scan_add(int64_t acc, int64_t v) { return as_type<int64_t>(uint64_t(acc) + uint64_t(v)); }

template <typename T>
kernel void cumsum_rows(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                        constant ReduceArgs& a [[buffer(2)]],
                        uint g [[thread_position_in_grid]]) {
  const uint64_t ob = g / a.inner, oi = g % a.inner;
  T acc = static_cast<T>(0.0f);
  for (uint32_t r = 0; r < a.R; ++r) {
    const uint64_t k = (ob * a.R + r) * a.inner + oi;
    acc = scan_add(acc, x[k]);
    out[k] = acc;
  }
}

FM_INSTANTIATE("cumsum_float32", cumsum_rows, float);
FM_INSTANTIATE("cumsum_float16", cumsum_rows, half);
FM_INSTANTIATE("cumsum_int64", cumsum_rows, int64_t);
FM_INSTANTIATE_DISCRETE("cumsum_float64", cumsum_rows, double);
