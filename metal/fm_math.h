// Math helpers shared by the kernels of every backend, written in the portable MSL subset.
//
// Why not the standard functions: Metal has no erf/erfc/log1p, and on the CPU a libm call
// per element stops the loop vectoriser. These are branch-free (select, not if), so the
// same source vectorises on the CPU and stays divergence-free on GPUs.
#pragma once
#include "fm_kernel.h"

// e^x with <= 2 ulp error over the whole float range; exact NaN/inf/underflow behaviour.
// Cody–Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor for e^r (truncation
// < 6e-9 relative), and 2^n applied in two halves so subnormal results come out right.
FM_FUNC float fm_exp(float x) {
  const float xc = metal::clamp(x, -104.0f, 89.0f);            // clamp keeps NaN as NaN
  const float xs = metal::select(xc, 0.0f, metal::isnan(xc));          // no NaN into integer conversion
  const float shifter = 12582912.0f;                     // 1.5 * 2^23: rounds to integer
  const float t = metal::fma(xs, 1.44269504088896341f, shifter);
  const float n = t - shifter;
  float r = metal::fma(n, -0.693145751953125f, xs);             // ln2 split into hi + lo
  r = metal::fma(n, -1.428606765330187045e-06f, r);
  float p = 1.0f / 5040.0f;
  p = metal::fma(p, r, 1.0f / 720.0f);
  p = metal::fma(p, r, 1.0f / 120.0f);
  p = metal::fma(p, r, 1.0f / 24.0f);
  p = metal::fma(p, r, 1.0f / 6.0f);
  p = metal::fma(p, r, 0.5f);
  p = metal::fma(p, r, 1.0f);
  p = metal::fma(p, r, 1.0f);
  const int32_t ni = metal::as_type<int32_t>(t) - metal::as_type<int32_t>(shifter);
  const int32_t n1 = ni / 2;
  const int32_t n2 = ni - n1;
  const float s1 = metal::as_type<float>((n1 + 127) << 23);
  const float s2 = metal::as_type<float>((n2 + 127) << 23);
  const float y = (p * s1) * s2;
  return metal::select(y, x, metal::isnan(x));
}

FM_FUNC float fm_sigmoid(float x) { return 1.0f / (1.0f + fm_exp(-x)); }

// log(1 + x) without losing x when |x| is tiny (Goldberg's trick: the rounding error of
// 1 + x cancels in log(u) * x / (u - 1)).
FM_FUNC float fm_log1p(float x) {
  const float u = 1.0f + x;
  const float d = u - 1.0f;
  const float r = metal::log(u) * (x / metal::select(d, 1.0f, d == 0.0f));
  return metal::select(metal::select(r, x, d == 0.0f), u, metal::isinf(u));
}

// softplus(x) = log(1 + e^x), written so that neither branch overflows.
FM_FUNC float fm_softplus(float x) {
  return metal::max(x, 0.0f) + fm_log1p(fm_exp(-metal::fabs(x)));
}

// erfc with small *relative* error in both tails. With q = (a-2)/(a+2), a = |x|, the
// function (1+2a) e^{a^2} erfc(a) - 1 is smooth on a in [0, 10.1]; a degree-11 polynomial
// in q (least-squares fit in float64, max relative error 6e-9) gives it. e^{-a^2} is taken
// as e^{-hi} (1 - lo) with a^2 = hi + lo split by an FMA, so rounding of a*a does not turn
// into relative error for large a. Past a = 10.1, erfc underflows to 0 in float32.
// erfc(a) for 0 <= a <= 10.1 given a*a = aa + aa_lo exactly (the caller splits it, so
// that a scaled argument like x/sqrt2 can pass 0.5*x*x without rounding).
FM_FUNC float fm_erfc_core(float a, float aa, float aa_lo) {
  const float den = a + 2.0f;
  const float r = 1.0f / den;
  float q = (a - 2.0f) * r;
  q = metal::fma(r, metal::fma(-q, den, a - 2.0f), q);  // one Newton step: q to full float precision
  float p = 8.733854776e-05f;
  p = metal::fma(p, q, 1.820253112e-04f);
  p = metal::fma(p, q, -4.064179540e-04f);
  p = metal::fma(p, q, -1.436045223e-03f);
  p = metal::fma(p, q, 1.252846852e-03f);
  p = metal::fma(p, q, 8.715686841e-03f);
  p = metal::fma(p, q, -8.030299685e-03f);
  p = metal::fma(p, q, -5.421902239e-02f);
  p = metal::fma(p, q, 1.640509376e-01f);
  p = metal::fma(p, q, -1.660304438e-01f);
  p = metal::fma(p, q, -9.276381708e-02f);
  p = metal::fma(p, q, 2.769783819e-01f);
  return (1.0f + p) / metal::fma(2.0f, a, 1.0f) * (fm_exp(-aa) * (1.0f - aa_lo));
}

FM_FUNC float fm_erfc(float x) {
  const float a = metal::min(metal::fabs(x), 10.1f);
  const float aa = a * a;
  const float y = fm_erfc_core(a, aa, metal::fma(a, a, -aa));
  return metal::select(metal::select(y, 2.0f - y, x < 0.0f), x, metal::isnan(x));
}

// GELU, exact erf form as torch.nn.functional.gelu: x/2 (1 + erf(x/sqrt2)) = x/2 erfc(-x/sqrt2);
// the erfc form keeps full relative accuracy for large negative x.
// The tail's condition number is 2 z^2, so z^2 = x^2 / 2 is formed exactly from x.
FM_FUNC float fm_gelu(float x) {
  const float a = metal::min(metal::fabs(x) * 0.70710678118654752f, 10.1f);
  const float xc = metal::min(metal::fabs(x), 14.28f);  // 10.1 * sqrt2: erfc is 0 beyond
  const float xx = xc * xc;
  const float e = fm_erfc_core(a, 0.5f * xx, 0.5f * metal::fma(xc, xc, -xx));
  const float erfc_minus_z = metal::select(e, 2.0f - e, x > 0.0f);  // erfc(-x/sqrt2)
  return metal::select(0.5f * x * erfc_minus_z, x, metal::isnan(x));
}

// NaN-propagating max/min (NumPy's maximum/minimum, not C's fmax/fmin).
FM_FUNC float fm_maximum(float x, float y) { return metal::select(y, x, metal::isnan(x) || x > y); }
FM_FUNC float fm_minimum(float x, float y) { return metal::select(y, x, metal::isnan(x) || x < y); }

// relu(NaN) = NaN, as np.maximum(x, 0) and torch.relu.
FM_FUNC float fm_relu(float x) { return metal::select(x, 0.0f, x <= 0.0f); }
