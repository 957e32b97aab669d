// Cumulative sums and products along an axis (fastmetal.cumsum, cumprod), as NumPy's
// add.accumulate and multiply.accumulate: one thread per (outer, inner) position walks the R
// elements of its line in order, so every partial sum or product is rounded as NumPy rounds
// it (float32: float operations; float64: double, on the CPU and CUDA only; float16: each
// result rounded to half, as NumPy's float16 add and multiply; int64: wrapping, in
// uint64_t). The input is contiguous (outer, R, inner) (reduce_args.h), the output too.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "reduce_args.h"
using namespace metal;

// The running operation of each scan: Add (cumsum) and Mul (cumprod), from 0 and 1.
struct ScanAdd {
  template <typename T>
  FM_FUNC T operator()(T acc, T v) const { return acc + v; }  // float, double
  FM_FUNC half operator()(half acc, half v) const { return half(float(acc) + float(v)); }
  FM_FUNC int64_t operator()(int64_t acc, int64_t v) const {
    return as_type<int64_t>(uint64_t(acc) + uint64_t(v));
  }
  FM_FUNC float identity() const { return 0.0f; }
};
// float16: the float product of two halves is exact, so one rounding to half (NumPy's).
struct ScanMul {
  template <typename T>
  FM_FUNC T operator()(T acc, T v) const { return acc * v; }  // float, double
  FM_FUNC half operator()(half acc, half v) const { return half(float(acc) * float(v)); }
  FM_FUNC int64_t operator()(int64_t acc, int64_t v) const {
    return as_type<int64_t>(uint64_t(acc) * uint64_t(v));
  }
  FM_FUNC float identity() const { return 1.0f; }
};

template <typename T, typename Op>
kernel void scan_rows(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                      constant ReduceArgs& a [[buffer(2)]],
                      uint g [[thread_position_in_grid]]) {
  const Op op;
  const uint64_t ob = g / a.inner, oi = g % a.inner;
  T acc = static_cast<T>(op.identity());
  for (uint32_t r = 0; r < a.R; ++r) {
    const uint64_t k = (ob * a.R + r) * a.inner + oi;
    acc = op(acc, x[k]);
    out[k] = acc;
  }
}

FM_INSTANTIATE("cumsum_float32", scan_rows, float, ScanAdd);
FM_INSTANTIATE("cumsum_float16", scan_rows, half, ScanAdd);
FM_INSTANTIATE("cumsum_int64", scan_rows, int64_t, ScanAdd);
FM_INSTANTIATE_DISCRETE("cumsum_float64", scan_rows, double, ScanAdd);
FM_INSTANTIATE("cumprod_float32", scan_rows, float, ScanMul);
FM_INSTANTIATE("cumprod_float16", scan_rows, half, ScanMul);
FM_INSTANTIATE("cumprod_int64", scan_rows, int64_t, ScanMul);
FM_INSTANTIATE_DISCRETE("cumprod_float64", scan_rows, double, ScanMul);
