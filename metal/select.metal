// fastmetal.where(condition, x, y): out = condition ? x : y, elementwise, for every pair of
// a condition dtype (a float mask, the comparisons' result, or int64: nonzero is true, NaN
// too, as NumPy's bool(NaN)) and a value dtype. The host first copies y (broadcast) into
// out with the conversion kernels, then this kernel writes x where the condition holds, so
// three stride sets (ViewArgs: condition, x, out) address any broadcast or strided view.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "convert_args.h"
using namespace metal;

FM_FUNC int64_t select_view_offset(constant ViewArgs& a, int k, int64_t i) {
  int64_t off = 0;
  for (int32_t d = a.ndim - 1; d >= 0; --d) {
    const int64_t n = a.shape[d];
    off += (i % n) * a.strides[k][d];
    i /= n;
  }
  return off;
}

template <typename C, typename T>
kernel void where_into(device const C* cond [[buffer(0)]], device const T* x [[buffer(1)]],
                       device T* out [[buffer(2)]], constant ViewArgs& a [[buffer(3)]],
                       uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  // through float: nonzero int64 stays nonzero, NaN != 0 is true, and half compares on
  // every backend
  if (static_cast<float>(cond[select_view_offset(a, 0, e)]) != 0.0f)
    out[select_view_offset(a, 2, e)] = x[select_view_offset(a, 1, e)];
}

FM_INSTANTIATE("where_float32_float32", where_into, float, float);
FM_INSTANTIATE("where_float32_float16", where_into, float, half);
FM_INSTANTIATE("where_float32_int64", where_into, float, int64_t);
FM_INSTANTIATE("where_float16_float32", where_into, half, float);
FM_INSTANTIATE("where_float16_float16", where_into, half, half);
FM_INSTANTIATE("where_float16_int64", where_into, half, int64_t);
FM_INSTANTIATE("where_int64_float32", where_into, int64_t, float);
FM_INSTANTIATE("where_int64_float16", where_into, int64_t, half);
FM_INSTANTIATE("where_int64_int64", where_into, int64_t, int64_t);
