// Arithmetic of int64 arrays, as NumPy's int64 ufuncs: +, -, *, //, %, **, maximum,
// minimum, negative, abs, square. Additions and products wrap around on overflow (done in
// uint64_t, whose overflow is defined); x // 0 and x % 0 give 0 and INT64_MIN // -1 gives
// INT64_MIN (what NumPy gives, where it warns); x ** y takes y >= 0 (the host refuses the
// negative exponents it can see, as NumPy's ValueError; a negative one in an array gives 0).
//
// Any strides for every operand (convert_args.h, as the conversion kernels): the host merges
// dimensions first, so a contiguous array is one dimension here.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "convert_args.h"
using namespace metal;

// The element offset of linear index i (C order over a.shape) in operand k.
FM_FUNC int64_t int64_view_offset(constant ViewArgs& a, int k, int64_t i) {
  int64_t off = 0;
  for (int32_t d = a.ndim - 1; d >= 0; --d) {
    const int64_t n = a.shape[d];
    off += (i % n) * a.strides[k][d];
    i /= n;
  }
  return off;
}


FM_FUNC int64_t wrap(uint64_t v) { return as_type<int64_t>(v); }

// Python's floor division; 0 for y == 0, INT64_MIN for INT64_MIN // -1 (no C++ overflow).
FM_FUNC int64_t floor_div(int64_t x, int64_t y) {
  if (y == 0) return 0;
  if (y == -1) return wrap(uint64_t(0) - uint64_t(x));
  const int64_t q = x / y;
  return (x % y != 0 && ((x < 0) != (y < 0))) ? q - 1 : q;
}

// Python's modulo (the sign of y); 0 for y == 0 and for y == -1.
FM_FUNC int64_t floor_mod(int64_t x, int64_t y) {
  if (y == 0 || y == -1) return 0;
  const int64_t r = x % y;
  return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
}

FM_FUNC int64_t int_power(int64_t x, int64_t y) {
  if (y < 0) return 0;
  uint64_t result = 1, base = uint64_t(x);
  for (uint64_t e = uint64_t(y); e != 0; e >>= 1) {
    if (e & 1) result *= base;
    base *= base;
  }
  return wrap(result);
}

// Op: 0 add, 1 subtract, 2 multiply, 3 floor_divide, 4 remainder, 5 maximum, 6 minimum,
// 7 power.
template <int Op>
FM_FUNC int64_t binary_op(int64_t x, int64_t y) {
  switch (Op) {
    case 0: return wrap(uint64_t(x) + uint64_t(y));
    case 1: return wrap(uint64_t(x) - uint64_t(y));
    case 2: return wrap(uint64_t(x) * uint64_t(y));
    case 3: return floor_div(x, y);
    case 4: return floor_mod(x, y);
    case 5: return x > y ? x : y;
    case 6: return x < y ? x : y;
    default: return int_power(x, y);
  }
}

template <int Op>
kernel void binary_int64(device const int64_t* x [[buffer(0)]],
                         device const int64_t* y [[buffer(1)]],
                         device int64_t* out [[buffer(2)]],
                         constant ViewArgs& a [[buffer(3)]],
                         uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  out[int64_view_offset(a, 2, e)] =
      binary_op<Op>(x[int64_view_offset(a, 0, e)], y[int64_view_offset(a, 1, e)]);
}

FM_INSTANTIATE("int64_add", binary_int64, 0);
FM_INSTANTIATE("int64_subtract", binary_int64, 1);
FM_INSTANTIATE("int64_multiply", binary_int64, 2);
FM_INSTANTIATE("int64_floor_divide", binary_int64, 3);
FM_INSTANTIATE("int64_remainder", binary_int64, 4);
FM_INSTANTIATE("int64_maximum", binary_int64, 5);
FM_INSTANTIATE("int64_minimum", binary_int64, 6);
FM_INSTANTIATE("int64_power", binary_int64, 7);

// Op: 0 negative, 1 abs, 2 square (abs(INT64_MIN) is INT64_MIN, as NumPy).
template <int Op>
FM_FUNC int64_t unary_op(int64_t x) {
  switch (Op) {
    case 0: return wrap(uint64_t(0) - uint64_t(x));
    case 1: return x < 0 ? wrap(uint64_t(0) - uint64_t(x)) : x;
    default: return wrap(uint64_t(x) * uint64_t(x));
  }
}

template <int Op>
kernel void unary_int64(device const int64_t* x [[buffer(0)]],
                        device int64_t* out [[buffer(1)]],
                        constant ViewArgs& a [[buffer(2)]],
                        uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  out[int64_view_offset(a, 2, e)] = unary_op<Op>(x[int64_view_offset(a, 0, e)]);
}

FM_INSTANTIATE("int64_negative", unary_int64, 0);
FM_INSTANTIATE("int64_abs", unary_int64, 1);
FM_INSTANTIATE("int64_square", unary_int64, 2);
