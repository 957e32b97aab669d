// Arithmetic of integer arrays (int64, int32, uint8) and the bitwise ops of integers and
// bool, as NumPy's integer ufuncs: +, -, *, //, %, **, maximum, minimum, negative, abs,
// square, &, |, ^, <<, >>, ~. Additions and products wrap around on overflow (done in the
// unsigned type of the same width, whose overflow is defined); x // 0 and x % 0 give 0 and
// MIN // -1 gives MIN (what NumPy gives, where it warns); x ** y takes y >= 0 (the host
// refuses the negative exponents it can see, as NumPy's ValueError; a negative one in an
// array gives 0). Shifts by a negative count or by the width or more give 0 (<<) or the
// sign (>>), as NumPy. bool (one byte, 0 or 1) has only the bitwise ops.
//
// Any strides for every operand (convert_args.h, as the conversion kernels): the host merges
// dimensions first, so a contiguous array is one dimension here.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "convert_args.h"
using namespace metal;

// The element offset of linear index i (C order over a.shape) in operand k.
FM_FUNC int64_t int_view_offset(constant ViewArgs& a, int k, int64_t i) {
  if (a.ndim == 1) return i * a.strides[k][0];  // merged contiguous or 1-D: no division
  int64_t off = 0;
  for (int32_t d = a.ndim - 1; d >= 0; --d) {
    const int64_t n = a.shape[d];
    off += (i % n) * a.strides[k][d];
    i /= n;
  }
  return off;
}

// The unsigned type of each width: wrapping arithmetic.
template <typename T> struct IntTraits;
template <> struct IntTraits<int64_t> { typedef uint64_t U; };
template <> struct IntTraits<int32_t> { typedef uint32_t U; };
template <> struct IntTraits<uchar> { typedef uchar U; };

template <typename T>
FM_FUNC T wrap_add(T x, T y) {
  typedef typename IntTraits<T>::U U;
  return T(U(U(x) + U(y)));
}
template <typename T>
FM_FUNC T wrap_sub(T x, T y) {
  typedef typename IntTraits<T>::U U;
  return T(U(U(x) - U(y)));
}
template <typename T>
FM_FUNC T wrap_mul(T x, T y) {
  typedef typename IntTraits<T>::U U;
  return T(U(U(x) * U(y)));
}

// Python's floor division; 0 for y == 0, MIN for MIN // -1 (no C++ overflow).
template <typename T>
FM_FUNC T floor_div(T x, T y) {
  if (y == T(0)) return T(0);
  if ((T(-1) < T(0)) && y == T(-1)) return wrap_sub(T(0), x);
  const T q = x / y;
  return (x % y != T(0) && ((x < T(0)) != (y < T(0)))) ? T(q - T(1)) : q;
}

// Python's modulo (the sign of y); 0 for y == 0 and for y == -1.
template <typename T>
FM_FUNC T floor_mod(T x, T y) {
  if (y == T(0) || ((T(-1) < T(0)) && y == T(-1))) return T(0);
  const T r = x % y;
  return (r != T(0) && ((r < T(0)) != (y < T(0)))) ? T(r + y) : r;
}

template <typename T>
FM_FUNC T int_power(T x, T y) {
  typedef typename IntTraits<T>::U U;
  if (y < T(0)) return T(0);
  U result = 1, base = U(x);
  for (U e = U(y); e != U(0); e >>= 1) {
    if (e & U(1)) result = U(result * base);
    base = U(base * base);
  }
  return T(result);
}

template <typename T>
FM_FUNC T shift_left(T x, T y) {
  typedef typename IntTraits<T>::U U;
  if (y < T(0) || int64_t(y) >= int64_t(8 * sizeof(T))) return T(0);
  return T(U(U(x) << U(y)));
}
template <typename T>
FM_FUNC T shift_right(T x, T y) {  // arithmetic for signed types, as NumPy
  if (y < T(0) || int64_t(y) >= int64_t(8 * sizeof(T))) return x < T(0) ? T(-1) : T(0);
  return T(x >> y);
}

// Op: 0 add, 1 subtract, 2 multiply, 3 floor_divide, 4 remainder, 5 maximum, 6 minimum,
// 7 power, 8 bitwise_and, 9 bitwise_or, 10 bitwise_xor, 11 left_shift, 12 right_shift.
template <typename T, int Op>
FM_FUNC T binary_op(T x, T y) {
  switch (Op) {
    case 0: return wrap_add(x, y);
    case 1: return wrap_sub(x, y);
    case 2: return wrap_mul(x, y);
    case 3: return floor_div(x, y);
    case 4: return floor_mod(x, y);
    case 5: return x > y ? x : y;
    case 6: return x < y ? x : y;
    case 7: return int_power(x, y);
    case 8: return T(x & y);
    case 9: return T(x | y);
    case 10: return T(x ^ y);
    case 11: return shift_left(x, y);
    default: return shift_right(x, y);
  }
}

template <typename T, int Op>
kernel void binary_int(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                       device T* out [[buffer(2)]], constant ViewArgs& a [[buffer(3)]],
                       uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  out[int_view_offset(a, 2, e)] =
      binary_op<T, Op>(x[int_view_offset(a, 0, e)], y[int_view_offset(a, 1, e)]);
}

// Op: 0 negative, 1 abs, 2 square, 3 bitwise_invert, 4 sign (abs(MIN) is MIN, as NumPy;
// the negative of an unsigned value wraps around; sign is -1, 0 or 1 in x's dtype).
template <typename T, int Op>
FM_FUNC T unary_op(T x) {
  switch (Op) {
    case 0: return wrap_sub(T(0), x);
    case 1: return x < T(0) ? wrap_sub(T(0), x) : x;
    case 2: return wrap_mul(x, x);
    case 3: return T(~x);
    default: return x > T(0) ? T(1) : (x == T(0) ? T(0) : wrap_sub(T(0), T(1)));
  }
}

template <typename T, int Op>
kernel void unary_int(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                      constant ViewArgs& a [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  out[int_view_offset(a, 2, e)] = unary_op<T, Op>(x[int_view_offset(a, 0, e)]);
}

// bool (0 or 1 in a byte): and, or, xor, and invert as logical not.
template <int Op>
kernel void binary_bool(device const uchar* x [[buffer(0)]], device const uchar* y [[buffer(1)]],
                        device uchar* out [[buffer(2)]], constant ViewArgs& a [[buffer(3)]],
                        uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  const uchar u = x[int_view_offset(a, 0, e)], v = y[int_view_offset(a, 1, e)];
  out[int_view_offset(a, 2, e)] = Op == 0 ? uchar(u & v) : Op == 1 ? uchar(u | v) : uchar(u ^ v);
}

kernel void bool_bitwise_invert(device const uchar* x [[buffer(0)]], device uchar* out [[buffer(1)]],
                                constant ViewArgs& a [[buffer(2)]],
                                uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  out[int_view_offset(a, 2, e)] = uchar(x[int_view_offset(a, 0, e)] ^ uchar(1));
}

FM_INSTANTIATE("bool_bitwise_and", binary_bool, 0);
FM_INSTANTIATE("bool_bitwise_or", binary_bool, 1);
FM_INSTANTIATE("bool_bitwise_xor", binary_bool, 2);
FM_INSTANTIATE("int64_add", binary_int, int64_t, 0);
FM_INSTANTIATE("int64_subtract", binary_int, int64_t, 1);
FM_INSTANTIATE("int64_multiply", binary_int, int64_t, 2);
FM_INSTANTIATE("int64_floor_divide", binary_int, int64_t, 3);
FM_INSTANTIATE("int64_remainder", binary_int, int64_t, 4);
FM_INSTANTIATE("int64_maximum", binary_int, int64_t, 5);
FM_INSTANTIATE("int64_minimum", binary_int, int64_t, 6);
FM_INSTANTIATE("int64_power", binary_int, int64_t, 7);
FM_INSTANTIATE("int64_bitwise_and", binary_int, int64_t, 8);
FM_INSTANTIATE("int64_bitwise_or", binary_int, int64_t, 9);
FM_INSTANTIATE("int64_bitwise_xor", binary_int, int64_t, 10);
FM_INSTANTIATE("int64_left_shift", binary_int, int64_t, 11);
FM_INSTANTIATE("int64_right_shift", binary_int, int64_t, 12);
FM_INSTANTIATE("int64_negative", unary_int, int64_t, 0);
FM_INSTANTIATE("int64_abs", unary_int, int64_t, 1);
FM_INSTANTIATE("int64_square", unary_int, int64_t, 2);
FM_INSTANTIATE("int64_bitwise_invert", unary_int, int64_t, 3);
FM_INSTANTIATE("int64_sign", unary_int, int64_t, 4);
FM_INSTANTIATE("int32_add", binary_int, int32_t, 0);
FM_INSTANTIATE("int32_subtract", binary_int, int32_t, 1);
FM_INSTANTIATE("int32_multiply", binary_int, int32_t, 2);
FM_INSTANTIATE("int32_floor_divide", binary_int, int32_t, 3);
FM_INSTANTIATE("int32_remainder", binary_int, int32_t, 4);
FM_INSTANTIATE("int32_maximum", binary_int, int32_t, 5);
FM_INSTANTIATE("int32_minimum", binary_int, int32_t, 6);
FM_INSTANTIATE("int32_power", binary_int, int32_t, 7);
FM_INSTANTIATE("int32_bitwise_and", binary_int, int32_t, 8);
FM_INSTANTIATE("int32_bitwise_or", binary_int, int32_t, 9);
FM_INSTANTIATE("int32_bitwise_xor", binary_int, int32_t, 10);
FM_INSTANTIATE("int32_left_shift", binary_int, int32_t, 11);
FM_INSTANTIATE("int32_right_shift", binary_int, int32_t, 12);
FM_INSTANTIATE("int32_negative", unary_int, int32_t, 0);
FM_INSTANTIATE("int32_abs", unary_int, int32_t, 1);
FM_INSTANTIATE("int32_square", unary_int, int32_t, 2);
FM_INSTANTIATE("int32_bitwise_invert", unary_int, int32_t, 3);
FM_INSTANTIATE("int32_sign", unary_int, int32_t, 4);
FM_INSTANTIATE("uint8_add", binary_int, uchar, 0);
FM_INSTANTIATE("uint8_subtract", binary_int, uchar, 1);
FM_INSTANTIATE("uint8_multiply", binary_int, uchar, 2);
FM_INSTANTIATE("uint8_floor_divide", binary_int, uchar, 3);
FM_INSTANTIATE("uint8_remainder", binary_int, uchar, 4);
FM_INSTANTIATE("uint8_maximum", binary_int, uchar, 5);
FM_INSTANTIATE("uint8_minimum", binary_int, uchar, 6);
FM_INSTANTIATE("uint8_power", binary_int, uchar, 7);
FM_INSTANTIATE("uint8_bitwise_and", binary_int, uchar, 8);
FM_INSTANTIATE("uint8_bitwise_or", binary_int, uchar, 9);
FM_INSTANTIATE("uint8_bitwise_xor", binary_int, uchar, 10);
FM_INSTANTIATE("uint8_left_shift", binary_int, uchar, 11);
FM_INSTANTIATE("uint8_right_shift", binary_int, uchar, 12);
FM_INSTANTIATE("uint8_negative", unary_int, uchar, 0);
FM_INSTANTIATE("uint8_abs", unary_int, uchar, 1);
FM_INSTANTIATE("uint8_square", unary_int, uchar, 2);
FM_INSTANTIATE("uint8_bitwise_invert", unary_int, uchar, 3);
FM_INSTANTIATE("uint8_sign", unary_int, uchar, 4);
