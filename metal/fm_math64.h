// Double forms of the fm_math.h helpers the op table calls, for the float64 instances of the
// elementwise kernels (FM_INSTANTIATE_DISCRETE: the CPU and CUDA builds; Apple GPUs have no
// double: under __METAL_VERSION__ FM_HAS_DOUBLE is 0 and this file is empty). The generated
// elementwise_ops.h includes it and gives every op an operator()(double) whose fm_ calls
// resolve here (tools/gen/gen_kernels.py refuses an op whose helper has no double overload,
// which would otherwise be called through a conversion to float); metal/recurrent.metal's
// templates include it for their double instances.
//
// Computed with the shims' double math (the C++ library's on the CPU, CUDA's double
// functions: each within a few ulp), with NumPy's special values (NaN, +-inf, -0.0).
// Unlike fm_math.h these are not written for the CPU vectoriser: libm calls per element
// are what a double op costs anyway, and the float64 entries are compiled for the base ISA
// only (gen_kernels.py: is_base_isa_only).
#pragma once
#include "fm_kernel.h"

#if FM_HAS_DOUBLE

FM_FUNC double fm_copysign(double x, double s) { return metal::copysign(x, s); }
FM_FUNC double fm_exp(double x) { return metal::exp(x); }
FM_FUNC double fm_log(double x) { return metal::log(x); }
// log2 and log10 scale a subnormal x into the normal range first (by 2^54, exactly), so the
// result does not depend on how the C library treats subnormals: the manylinux stand-in
// toolchain (zig's clang, whose compiler-rt brings its own log2/log10) lost 22 bits there.
FM_FUNC bool fm_subnormal(double x) { return x > 0.0 && x < 2.2250738585072014e-308; }
FM_FUNC double fm_log2(double x) {
  return fm_subnormal(x) ? metal::log2(x * 0x1p54) - 54.0 : metal::log2(x);
}
FM_FUNC double fm_log10(double x) {
  return fm_subnormal(x) ? metal::log10(x * 0x1p54) - 16.255619765854984 : metal::log10(x);  // 54 log10(2)
}
FM_FUNC double fm_log1p(double x) { return metal::log1p(x); }
FM_FUNC double fm_expm1(double x) { return metal::expm1(x); }
FM_FUNC double fm_sin(double x) { return metal::sin(x); }
FM_FUNC double fm_cos(double x) { return metal::cos(x); }
FM_FUNC double fm_tan(double x) { return metal::tan(x); }
FM_FUNC double fm_asin(double x) { return metal::asin(x); }
FM_FUNC double fm_acos(double x) { return metal::acos(x); }
FM_FUNC double fm_atan(double x) { return metal::atan(x); }
FM_FUNC double fm_sinh(double x) { return metal::sinh(x); }
FM_FUNC double fm_cosh(double x) { return metal::cosh(x); }
FM_FUNC double fm_tanh(double x) { return metal::tanh(x); }
FM_FUNC double fm_asinh(double x) { return metal::asinh(x); }
FM_FUNC double fm_acosh(double x) { return metal::acosh(x); }
FM_FUNC double fm_atanh(double x) { return metal::atanh(x); }
FM_FUNC double fm_atan2(double y, double x) { return metal::atan2(y, x); }
// C99's hypot: inf if either is infinite, NaN or not (as NumPy's).
FM_FUNC double fm_hypot(double x, double y) { return metal::hypot(x, y); }
// C99's pow, whose special cases (pow(x, 0) = 1, pow(1, y) = 1, pow(-inf, y), ...) are NumPy's.
FM_FUNC double fm_pow(double x, double y) { return metal::pow(x, y); }
FM_FUNC double fm_floor(double x) { return metal::floor(x); }
FM_FUNC double fm_ceil(double x) { return metal::ceil(x); }
FM_FUNC double fm_trunc(double x) { return metal::trunc(x); }

// NaN-propagating max/min (NumPy's maximum/minimum), as fm_math.h's float ones.
FM_FUNC double fm_maximum(double x, double y) { return (x != x || x > y) ? x : y; }
FM_FUNC double fm_minimum(double x, double y) { return (x != x || x < y) ? x : y; }
FM_FUNC double fm_relu(double x) { return x <= 0.0 ? 0.0 : x; }
// NumPy's sign: -1, 0 (+0 for -0 too), 1; NaN stays NaN.
FM_FUNC double fm_sign(double x) { return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : (x == 0.0 ? 0.0 : x)); }

// 1 / (1 + e^-x) from e = e^-|x| <= 1: no overflow, and e / (1 + e) for x < 0 keeps the
// tiny results that 1 / (1 + e^-x) computes as well (NumPy's reference form).
FM_FUNC double fm_sigmoid(double x) {
  const double e = metal::exp(-metal::fabs(x));
  const double s = 1.0 / (1.0 + e);
  return x < 0.0 ? e * s : s;
}
// x sigmoid(x); -inf gives NaN, as x / (1 + e^-x) does.
FM_FUNC double fm_silu(double x) { return x * fm_sigmoid(x); }
// log(1 + e^x) = max(x, 0) + log1p(e^-|x|): neither term overflows (NumPy's logaddexp(0, x)).
FM_FUNC double fm_softplus(double x) {
  return (x < 0.0 ? 0.0 : x) + metal::log1p(metal::exp(-metal::fabs(x)));
}
// log(e^x + e^y), as NumPy's npy_logaddexp: x + ln2 where x == y (equal infinities
// included), NaN where either is NaN.
FM_FUNC double fm_logaddexp(double x, double y) {
  const double d = x - y;
  const double r = d > 0.0 ? x + metal::log1p(metal::exp(-d))
                           : (d <= 0.0 ? y + metal::log1p(metal::exp(d)) : d);
  return x == y ? x + 0.6931471805599453 : r;
}

// erfc(-x / sqrt2). -x / sqrt2 rounds with a relative error of up to 2^-53, which erfc
// magnifies by 2 z^2 (z = -x / sqrt2; up to ~1500 before erfc underflows): the rounding
// error dz (1/sqrt2 as hi + lo, the product split by an FMA) is taken out to first order,
// erfc(z + dz) = erfc(z) - 2/sqrt(pi) e^{-z^2} dz.
FM_FUNC double fm_erfc_of_neg_scaled(double x) {
  const double c_hi = 0.7071067811865476;  // 1/sqrt2 = c_hi + c_lo
  const double c_lo = -4.833646656726457e-17;
  const double z = -x * c_hi;
  const double dz = metal::fma(-x, c_hi, -z) - x * c_lo;
  const double e = metal::erfc(z);
  const double corrected = e - 1.1283791670955126 * metal::exp(-z * z) * dz;
  return metal::isfinite(x) ? corrected : e;  // +-inf: dz is NaN there
}
// GELU, exact erf form: x/2 erfc(-x/sqrt2) (full relative accuracy in the negative tail).
// -inf gives NaN (-inf * 0), as the float64 reference.
FM_FUNC double fm_gelu(double x) { return 0.5 * x * fm_erfc_of_neg_scaled(x); }
// GELU's derivative Phi(x) + x phi(x); x^2 split exactly (x x = xx + xx_lo) so that the
// rounding of x * x does not become relative error of e^{-x^2/2}.
FM_FUNC double fm_gelu_grad(double x) {
  const double xx = x * x;
  const double xx_lo = metal::fma(x, x, -xx);
  const double pdf = metal::exp(-0.5 * xx) * (1.0 - 0.5 * xx_lo) * 0.3989422804014327;
  return 0.5 * fm_erfc_of_neg_scaled(x) + x * pdf;
}

// NumPy's float64 remainder and floor_divide (npy_remainder, npy_floor_divide / npy_divmod)
// step by step, from C's exact fmod: the remainder takes the divisor's sign (a zero one
// too); the quotient (a - mod) / b, one less where the remainder moved, snapped to the
// nearest integer; for b == 0, fmod's NaN and a / b.
FM_FUNC double fm_remainder(double a, double b) {
  double mod = metal::fmod(a, b);
  if (b == 0.0) return mod;
  if (mod != 0.0) {
    if ((b < 0.0) != (mod < 0.0)) mod += b;
  } else {
    mod = metal::copysign(0.0, b);
  }
  return mod;
}
FM_FUNC double fm_floor_divide(double a, double b) {
  if (b == 0.0) return a / b;
  const double mod = metal::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0.0 && (b < 0.0) != (mod < 0.0)) div -= 1.0;
  if (div == 0.0) return metal::copysign(0.0, a / b);
  double floordiv = metal::floor(div);
  if (div - floordiv > 0.5) floordiv += 1.0;
  return floordiv;
}

// fm_math.h's fm_nextafter on the 64 bits (the same steps, C's and NumPy's special values).
FM_FUNC double fm_nextafter(double x, double y) {
  const uint64_t sign = 0x8000000000000000ull, inf = 0x7ff0000000000000ull;
  const uint64_t bx = metal::as_type<uint64_t>(x), by = metal::as_type<uint64_t>(y);
  const uint64_t ax = bx & (sign - 1u), ay = by & (sign - 1u);
  if (ax > inf) return x;
  if (ay > inf) return y;
  const int64_t ox = bx >= sign ? -int64_t(ax) : int64_t(ax);
  const int64_t oy = by >= sign ? -int64_t(ay) : int64_t(ay);
  if (ox == oy) return y;
  if (ax == 0u) return metal::as_type<double>((by & sign) | 1u);
  const bool away = bx < sign ? ox < oy : ox > oy;
  return metal::as_type<double>(away ? bx + 1u : bx - 1u);
}

#endif  // FM_HAS_DOUBLE
