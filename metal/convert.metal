// Elementwise kernels across dtypes: astype between float32, float16 and int64, the copy
// of int64 arrays, and comparisons of int64 arrays (giving float32 masks, 1.0 / 0.0, the
// mask convention of the float comparisons in elementwise_ops.tbl).
//
// Any strides for every operand (convert_args.h): the host merges dimensions first, so a
// contiguous array is one dimension here. Conversions as NumPy's astype: float -> float16
// rounds to nearest even (overflow to inf), int64 -> float rounds to nearest, float -> int64
// truncates toward zero; NaN, inf and values outside int64 give INT64_MIN (what NumPy gives
// on x86-64, where it warns).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "convert_args.h"
using namespace metal;

FM_FUNC int64_t view_offset(constant ViewArgs& a, int k, int64_t i) {
  int64_t off = 0;
  for (int32_t d = a.ndim - 1; d >= 0; --d) {
    const int64_t n = a.shape[d];
    off += (i % n) * a.strides[k][d];
    i /= n;
  }
  return off;
}

// float -> int64 as NumPy on x86-64: truncation, INT64_MIN for NaN and out-of-range values.
FM_FUNC int64_t float_to_int64(float v) {
  const int64_t lowest = int64_t(-9223372036854775807) - int64_t(1);
  return (v >= -9223372036854775808.0f && v < 9223372036854775808.0f) ? int64_t(v) : lowest;
}

// From (float, half or int64_t) -> To (float or half), through float: exact for half and
// float sources; an int64 rounds once (to float; a float16 result of a value above 65504 is
// inf either way).
template <typename From, typename To>
kernel void convert_float(device const From* x [[buffer(0)]], device To* out [[buffer(1)]],
                          constant ViewArgs& a [[buffer(2)]],
                          uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  out[view_offset(a, 2, e)] = static_cast<To>(static_cast<float>(x[view_offset(a, 0, e)]));
}

FM_INSTANTIATE("convert_float32_float32", convert_float, float, float);
FM_INSTANTIATE("convert_float32_float16", convert_float, float, half);
FM_INSTANTIATE("convert_float16_float32", convert_float, half, float);
FM_INSTANTIATE("convert_float16_float16", convert_float, half, half);
FM_INSTANTIATE("convert_int64_float32", convert_float, int64_t, float);
FM_INSTANTIATE("convert_int64_float16", convert_float, int64_t, half);

template <typename From>
kernel void convert_int(device const From* x [[buffer(0)]], device int64_t* out [[buffer(1)]],
                        constant ViewArgs& a [[buffer(2)]],
                        uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  out[view_offset(a, 2, e)] = float_to_int64(static_cast<float>(x[view_offset(a, 0, e)]));
}

FM_INSTANTIATE("convert_float32_int64", convert_int, float);
FM_INSTANTIATE("convert_float16_int64", convert_int, half);

kernel void convert_int64_int64(device const int64_t* x [[buffer(0)]],
                                device int64_t* out [[buffer(1)]],
                                constant ViewArgs& a [[buffer(2)]],
                                uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  out[view_offset(a, 2, e)] = x[view_offset(a, 0, e)];
}


// Op: 0 less, 1 less_equal, 2 greater, 3 greater_equal, 4 equal, 5 not_equal.
template <int Op>
FM_FUNC bool compare(int64_t x, int64_t y) {
  switch (Op) {
    case 0: return x < y;
    case 1: return x <= y;
    case 2: return x > y;
    case 3: return x >= y;
    case 4: return x == y;
    default: return x != y;
  }
}

template <int Op>
kernel void compare_int64(device const int64_t* x [[buffer(0)]],
                          device const int64_t* y [[buffer(1)]],
                          device float* out [[buffer(2)]],
                          constant ViewArgs& a [[buffer(3)]],
                          uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  const bool r = compare<Op>(x[view_offset(a, 0, e)], y[view_offset(a, 1, e)]);
  out[view_offset(a, 2, e)] = r ? 1.0f : 0.0f;
}

FM_INSTANTIATE("compare_less_int64", compare_int64, 0);
FM_INSTANTIATE("compare_less_equal_int64", compare_int64, 1);
FM_INSTANTIATE("compare_greater_int64", compare_int64, 2);
FM_INSTANTIATE("compare_greater_equal_int64", compare_int64, 3);
FM_INSTANTIATE("compare_equal_int64", compare_int64, 4);
FM_INSTANTIATE("compare_not_equal_int64", compare_int64, 5);
