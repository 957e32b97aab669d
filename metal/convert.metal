// Elementwise kernels across dtypes: astype between every pair of fastmetal's dtypes (the
// copy of a non-float array is the conversion to its own dtype), and comparisons of two
// arrays of one dtype, giving bool.
//
// bool is stored as one byte, 0 or 1 (uchar here: Metal's bool has no guaranteed size in
// device memory). float64 instances are FM_INSTANTIATE_DISCRETE: CPU and CUDA only, since
// Apple GPUs have no double (the metallib leaves them out).
//
// Any strides for every operand (convert_args.h): the host merges dimensions first, so a
// contiguous array is one dimension here. Conversions as NumPy's astype on x86-64:
//   to a float: rounds to nearest even (overflow to inf); an integer goes through float
//     (float16, float32) or double (float64): one rounding for every value that matters;
//   float to int64 / int32: truncation toward zero; NaN, inf and values outside the type
//     give its lowest value (INT64_MIN, INT32_MIN), where NumPy warns;
//   float to uint8: through int64, then the low 8 bits (-1.0 -> 255, as NumPy);
//   integer to integer: the low bits (two's complement wrap-around);
//   to bool: nonzero is true (NaN too, as NumPy's bool(nan)); bool to a number: 0 or 1.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "convert_args.h"
using namespace metal;

typedef uchar fm_bool;  // the storage of a bool element

FM_FUNC int64_t view_offset(constant ViewArgs& a, int k, int64_t i) {
  if (a.ndim == 1) return i * a.strides[k][0];  // merged contiguous or 1-D: no division
  int64_t off = 0;
  for (int32_t d = a.ndim - 1; d >= 0; --d) {
    const int64_t n = a.shape[d];
    off += (i % n) * a.strides[k][d];
    i /= n;
  }
  return off;
}

// Tags: the destination type of fm_cast, so that bool (stored as uchar) and uint8 differ.
struct to_f32 {};
struct to_f16 {};
struct to_f64 {};
struct to_i64 {};
struct to_i32 {};
struct to_u8 {};
struct to_bool {};

// float -> integer as NumPy on x86-64: truncation, the type's lowest value for NaN and
// out-of-range values (the bounds are exact powers of two in float).
FM_FUNC int64_t float_to_int64(float v) {
  const int64_t lowest = int64_t(-9223372036854775807) - int64_t(1);
  return (v >= -9223372036854775808.0f && v < 9223372036854775808.0f) ? int64_t(v) : lowest;
}
FM_FUNC int32_t float_to_int32(float v) {
  return (v >= -2147483648.0f && v < 2147483648.0f) ? int32_t(v) : int32_t(-2147483647 - 1);
}

// Sources: float, half and the integers convert through float (to_f32 / to_f16 / ints).
template <typename From>
FM_FUNC float fm_cast(From x, to_f32) { return static_cast<float>(x); }
template <typename From>
FM_FUNC half fm_cast(From x, to_f16) { return static_cast<half>(static_cast<float>(x)); }
template <typename From>
FM_FUNC int64_t fm_cast(From x, to_i64) { return float_to_int64(static_cast<float>(x)); }
template <typename From>
FM_FUNC int32_t fm_cast(From x, to_i32) { return float_to_int32(static_cast<float>(x)); }
template <typename From>
FM_FUNC uchar fm_cast(From x, to_u8) { return uchar(uint64_t(float_to_int64(static_cast<float>(x))) & 0xff); }
template <typename From>
FM_FUNC fm_bool fm_cast(From x, to_bool) { return static_cast<float>(x) != 0.0f ? 1 : 0; }

// Integer sources convert to integers exactly (the low bits) and to bool by nonzero.
#define FM_INT_CASTS(T)                                                                   \
  FM_FUNC int64_t fm_cast(T x, to_i64) { return int64_t(x); }                             \
  FM_FUNC int32_t fm_cast(T x, to_i32) { return int32_t(uint32_t(uint64_t(int64_t(x)))); } \
  FM_FUNC uchar fm_cast(T x, to_u8) { return uchar(uint64_t(int64_t(x)) & 0xff); }        \
  FM_FUNC fm_bool fm_cast(T x, to_bool) { return x != 0 ? 1 : 0; }
FM_INT_CASTS(int64_t)
FM_INT_CASTS(int32_t)
FM_INT_CASTS(uchar)  // uint8 and bool (0 or 1) alike

#if FM_HAS_DOUBLE
// double: one rounding to every float type; integers from double as from float (the bounds
// are exact in double too).
template <typename From>
FM_FUNC double fm_cast(From x, to_f64) { return static_cast<double>(x); }
FM_FUNC half fm_cast(double x, to_f16) { return static_cast<half>(x); }
FM_FUNC int64_t fm_cast(double v, to_i64) {
  const int64_t lowest = int64_t(-9223372036854775807) - int64_t(1);
  return (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? int64_t(v) : lowest;
}
FM_FUNC int32_t fm_cast(double v, to_i32) {
  return (v >= -2147483648.0 && v < 2147483648.0) ? int32_t(v) : int32_t(-2147483647 - 1);
}
FM_FUNC uchar fm_cast(double v, to_u8) { return uchar(uint64_t(fm_cast(v, to_i64())) & 0xff); }
FM_FUNC fm_bool fm_cast(double x, to_bool) { return x != 0.0 ? 1 : 0; }
// int64 -> double: one rounding (through float would round twice).
FM_FUNC double fm_cast(int64_t x, to_f64) { return static_cast<double>(x); }
#endif

// Src tells the instances of bool (1) and uint8 (0) apart: both are stored as uchar, and one
// template instance cannot carry two host names.
template <typename From, typename To, typename Tag, int Src>
kernel void convert_view(device const From* x [[buffer(0)]], device To* out [[buffer(1)]],
                         constant ViewArgs& a [[buffer(2)]],
                         uint i [[thread_position_in_grid]]) {
  const int64_t e = a.base + int64_t(i);
  out[view_offset(a, 2, e)] = fm_cast(x[view_offset(a, 0, e)], Tag());
}

// Every (from, to) pair; those with float64 on the discrete backends only.
FM_INSTANTIATE("convert_float32_float32", convert_view, float, float, to_f32, 0);
FM_INSTANTIATE("convert_float32_float16", convert_view, float, half, to_f16, 0);
FM_INSTANTIATE("convert_float32_int64", convert_view, float, int64_t, to_i64, 0);
FM_INSTANTIATE("convert_float32_int32", convert_view, float, int32_t, to_i32, 0);
FM_INSTANTIATE("convert_float32_uint8", convert_view, float, uchar, to_u8, 0);
FM_INSTANTIATE("convert_float32_bool", convert_view, float, fm_bool, to_bool, 0);
FM_INSTANTIATE_DISCRETE("convert_float32_float64", convert_view, float, double, to_f64, 0);
FM_INSTANTIATE("convert_float16_float32", convert_view, half, float, to_f32, 0);
FM_INSTANTIATE("convert_float16_float16", convert_view, half, half, to_f16, 0);
FM_INSTANTIATE("convert_float16_int64", convert_view, half, int64_t, to_i64, 0);
FM_INSTANTIATE("convert_float16_int32", convert_view, half, int32_t, to_i32, 0);
FM_INSTANTIATE("convert_float16_uint8", convert_view, half, uchar, to_u8, 0);
FM_INSTANTIATE("convert_float16_bool", convert_view, half, fm_bool, to_bool, 0);
FM_INSTANTIATE_DISCRETE("convert_float16_float64", convert_view, half, double, to_f64, 0);
FM_INSTANTIATE("convert_int64_float32", convert_view, int64_t, float, to_f32, 0);
FM_INSTANTIATE("convert_int64_float16", convert_view, int64_t, half, to_f16, 0);
FM_INSTANTIATE("convert_int64_int64", convert_view, int64_t, int64_t, to_i64, 0);
FM_INSTANTIATE("convert_int64_int32", convert_view, int64_t, int32_t, to_i32, 0);
FM_INSTANTIATE("convert_int64_uint8", convert_view, int64_t, uchar, to_u8, 0);
FM_INSTANTIATE("convert_int64_bool", convert_view, int64_t, fm_bool, to_bool, 0);
FM_INSTANTIATE_DISCRETE("convert_int64_float64", convert_view, int64_t, double, to_f64, 0);
FM_INSTANTIATE("convert_int32_float32", convert_view, int32_t, float, to_f32, 0);
FM_INSTANTIATE("convert_int32_float16", convert_view, int32_t, half, to_f16, 0);
FM_INSTANTIATE("convert_int32_int64", convert_view, int32_t, int64_t, to_i64, 0);
FM_INSTANTIATE("convert_int32_int32", convert_view, int32_t, int32_t, to_i32, 0);
FM_INSTANTIATE("convert_int32_uint8", convert_view, int32_t, uchar, to_u8, 0);
FM_INSTANTIATE("convert_int32_bool", convert_view, int32_t, fm_bool, to_bool, 0);
FM_INSTANTIATE_DISCRETE("convert_int32_float64", convert_view, int32_t, double, to_f64, 0);
FM_INSTANTIATE("convert_uint8_float32", convert_view, uchar, float, to_f32, 0);
FM_INSTANTIATE("convert_uint8_float16", convert_view, uchar, half, to_f16, 0);
FM_INSTANTIATE("convert_uint8_int64", convert_view, uchar, int64_t, to_i64, 0);
FM_INSTANTIATE("convert_uint8_int32", convert_view, uchar, int32_t, to_i32, 0);
FM_INSTANTIATE("convert_uint8_uint8", convert_view, uchar, uchar, to_u8, 0);
FM_INSTANTIATE("convert_uint8_bool", convert_view, uchar, fm_bool, to_bool, 0);
FM_INSTANTIATE_DISCRETE("convert_uint8_float64", convert_view, uchar, double, to_f64, 0);
FM_INSTANTIATE("convert_bool_float32", convert_view, fm_bool, float, to_f32, 1);
FM_INSTANTIATE("convert_bool_float16", convert_view, fm_bool, half, to_f16, 1);
FM_INSTANTIATE("convert_bool_int64", convert_view, fm_bool, int64_t, to_i64, 1);
FM_INSTANTIATE("convert_bool_int32", convert_view, fm_bool, int32_t, to_i32, 1);
FM_INSTANTIATE("convert_bool_uint8", convert_view, fm_bool, uchar, to_u8, 1);
FM_INSTANTIATE("convert_bool_bool", convert_view, fm_bool, fm_bool, to_bool, 1);
FM_INSTANTIATE_DISCRETE("convert_bool_float64", convert_view, fm_bool, double, to_f64, 1);
FM_INSTANTIATE_DISCRETE("convert_float64_float32", convert_view, double, float, to_f32, 0);
FM_INSTANTIATE_DISCRETE("convert_float64_float16", convert_view, double, half, to_f16, 0);
FM_INSTANTIATE_DISCRETE("convert_float64_int64", convert_view, double, int64_t, to_i64, 0);
FM_INSTANTIATE_DISCRETE("convert_float64_int32", convert_view, double, int32_t, to_i32, 0);
FM_INSTANTIATE_DISCRETE("convert_float64_uint8", convert_view, double, uchar, to_u8, 0);
FM_INSTANTIATE_DISCRETE("convert_float64_bool", convert_view, double, fm_bool, to_bool, 0);
FM_INSTANTIATE_DISCRETE("convert_float64_float64", convert_view, double, double, to_f64, 0);

// Op: 0 less, 1 less_equal, 2 greater, 3 greater_equal, 4 equal, 5 not_equal. NaN compares
// false but for not_equal (half compares through float: exact).
template <int Op, typename T>
FM_FUNC bool compare(T x, T y) {
  switch (Op) {
    case 0: return x < y;
    case 1: return x <= y;
    case 2: return x > y;
    case 3: return x >= y;
    case 4: return x == y;
    default: return x != y;
  }
}
template <typename T> struct compared { typedef T type; };
template <> struct compared<half> { typedef float type; };

template <typename T, int Op, int Src>  // Src: as convert_view's
kernel void compare_view(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                         device fm_bool* out [[buffer(2)]], constant ViewArgs& a [[buffer(3)]],
                         uint i [[thread_position_in_grid]]) {
  typedef typename compared<T>::type C;
  const int64_t e = a.base + int64_t(i);
  const bool r = compare<Op>(static_cast<C>(x[view_offset(a, 0, e)]),
                             static_cast<C>(y[view_offset(a, 1, e)]));
  out[view_offset(a, 2, e)] = r ? 1 : 0;
}

FM_INSTANTIATE("compare_less_float32", compare_view, float, 0, 0);
FM_INSTANTIATE("compare_less_equal_float32", compare_view, float, 1, 0);
FM_INSTANTIATE("compare_greater_float32", compare_view, float, 2, 0);
FM_INSTANTIATE("compare_greater_equal_float32", compare_view, float, 3, 0);
FM_INSTANTIATE("compare_equal_float32", compare_view, float, 4, 0);
FM_INSTANTIATE("compare_not_equal_float32", compare_view, float, 5, 0);
FM_INSTANTIATE("compare_less_float16", compare_view, half, 0, 0);
FM_INSTANTIATE("compare_less_equal_float16", compare_view, half, 1, 0);
FM_INSTANTIATE("compare_greater_float16", compare_view, half, 2, 0);
FM_INSTANTIATE("compare_greater_equal_float16", compare_view, half, 3, 0);
FM_INSTANTIATE("compare_equal_float16", compare_view, half, 4, 0);
FM_INSTANTIATE("compare_not_equal_float16", compare_view, half, 5, 0);
FM_INSTANTIATE("compare_less_int64", compare_view, int64_t, 0, 0);
FM_INSTANTIATE("compare_less_equal_int64", compare_view, int64_t, 1, 0);
FM_INSTANTIATE("compare_greater_int64", compare_view, int64_t, 2, 0);
FM_INSTANTIATE("compare_greater_equal_int64", compare_view, int64_t, 3, 0);
FM_INSTANTIATE("compare_equal_int64", compare_view, int64_t, 4, 0);
FM_INSTANTIATE("compare_not_equal_int64", compare_view, int64_t, 5, 0);
FM_INSTANTIATE("compare_less_int32", compare_view, int32_t, 0, 0);
FM_INSTANTIATE("compare_less_equal_int32", compare_view, int32_t, 1, 0);
FM_INSTANTIATE("compare_greater_int32", compare_view, int32_t, 2, 0);
FM_INSTANTIATE("compare_greater_equal_int32", compare_view, int32_t, 3, 0);
FM_INSTANTIATE("compare_equal_int32", compare_view, int32_t, 4, 0);
FM_INSTANTIATE("compare_not_equal_int32", compare_view, int32_t, 5, 0);
FM_INSTANTIATE("compare_less_uint8", compare_view, uchar, 0, 0);
FM_INSTANTIATE("compare_less_equal_uint8", compare_view, uchar, 1, 0);
FM_INSTANTIATE("compare_greater_uint8", compare_view, uchar, 2, 0);
FM_INSTANTIATE("compare_greater_equal_uint8", compare_view, uchar, 3, 0);
FM_INSTANTIATE("compare_equal_uint8", compare_view, uchar, 4, 0);
FM_INSTANTIATE("compare_not_equal_uint8", compare_view, uchar, 5, 0);
FM_INSTANTIATE("compare_less_bool", compare_view, fm_bool, 0, 1);
FM_INSTANTIATE("compare_less_equal_bool", compare_view, fm_bool, 1, 1);
FM_INSTANTIATE("compare_greater_bool", compare_view, fm_bool, 2, 1);
FM_INSTANTIATE("compare_greater_equal_bool", compare_view, fm_bool, 3, 1);
FM_INSTANTIATE("compare_equal_bool", compare_view, fm_bool, 4, 1);
FM_INSTANTIATE("compare_not_equal_bool", compare_view, fm_bool, 5, 1);
FM_INSTANTIATE_DISCRETE("compare_less_float64", compare_view, double, 0, 0);
FM_INSTANTIATE_DISCRETE("compare_less_equal_float64", compare_view, double, 1, 0);
FM_INSTANTIATE_DISCRETE("compare_greater_float64", compare_view, double, 2, 0);
FM_INSTANTIATE_DISCRETE("compare_greater_equal_float64", compare_view, double, 3, 0);
FM_INSTANTIATE_DISCRETE("compare_equal_float64", compare_view, double, 4, 0);
FM_INSTANTIATE_DISCRETE("compare_not_equal_float64", compare_view, double, 5, 0);
