// fastmetal.where(condition, x, y): out = condition ? x : y, elementwise. The condition is
// bool (one byte, 0 or 1: the host converts any other dtype first, nonzero being true, NaN
// too, as NumPy's bool(NaN)); x and out share a dtype, moved as raw bits of its width (b1,
// b2, b4, b8), so four kernels serve every dtype. The host first copies y (broadcast) into
// out with the conversion kernels, then this kernel writes x where the condition holds, so
// three stride sets (ViewArgs: condition, x, out) address any broadcast or strided view.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "convert_args.h"
using namespace metal;

FM_FUNC int64_t select_view_offset(constant ViewArgs& a, int k, int64_t i) {
  if (a.ndim == 1) return i * a.strides[k][0];  // merged contiguous or 1-D: no division
  int64_t off = 0;
  for (int32_t d = a.ndim - 1; d >= 0; --d) {
    const int64_t n = a.shape[d];
    off += (i % n) * a.strides[k][d];
    i /= n;
  }
  return off;
}

template <typename T>
kernel void where_into(device const uchar* cond [[buffer(0)]], device const T* x [[buffer(1)]],
                       device T* out [[buffer(2)]], constant ViewArgs& a [[buffer(3)]],
                       uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  if (cond[select_view_offset(a, 0, e)] != 0)
    out[select_view_offset(a, 2, e)] = x[select_view_offset(a, 1, e)];
}

FM_INSTANTIATE("where_b1", where_into, uchar);
FM_INSTANTIATE("where_b2", where_into, ushort);
FM_INSTANTIATE("where_b4", where_into, uint32_t);
FM_INSTANTIATE("where_b8", where_into, uint64_t);
