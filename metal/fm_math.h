// Math helpers shared by the kernels of every backend, written in the portable MSL subset.
//
// Why not the standard functions: Metal has no erf/erfc/log1p, and on the CPU a libm call
// per element stops the loop vectoriser. These are branch-free (select, not if), so the
// same source vectorises on the CPU and stays divergence-free on GPUs.
#pragma once

// e^x with <= 2 ulp error over the whole float range; exact NaN/inf/underflow behaviour.
// Cody–Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor for e^r (truncation
// < 6e-9 relative), and 2^n applied in two halves so subnormal results come out right.
inline float fm_exp(float x) {
  const float xc = clamp(x, -104.0f, 89.0f);            // clamp keeps NaN as NaN
  const float xs = select(xc, 0.0f, isnan(xc));          // no NaN into integer conversion
  const float shifter = 12582912.0f;                     // 1.5 * 2^23: rounds to integer
  const float t = fma(xs, 1.44269504088896341f, shifter);
  const float n = t - shifter;
  float r = fma(n, -0.693145751953125f, xs);             // ln2 split into hi + lo
  r = fma(n, -1.428606765330187045e-06f, r);
  float p = 1.0f / 5040.0f;
  p = fma(p, r, 1.0f / 720.0f);
  p = fma(p, r, 1.0f / 120.0f);
  p = fma(p, r, 1.0f / 24.0f);
  p = fma(p, r, 1.0f / 6.0f);
  p = fma(p, r, 0.5f);
  p = fma(p, r, 1.0f);
  p = fma(p, r, 1.0f);
  const int32_t ni = as_type<int32_t>(t) - as_type<int32_t>(shifter);
  const int32_t n1 = ni / 2;
  const int32_t n2 = ni - n1;
  const float s1 = as_type<float>((n1 + 127) << 23);
  const float s2 = as_type<float>((n2 + 127) << 23);
  const float y = (p * s1) * s2;
  return select(y, x, isnan(x));
}

inline float fm_sigmoid(float x) { return 1.0f / (1.0f + fm_exp(-x)); }

// log(1 + x) without losing x when |x| is tiny (Goldberg's trick: the rounding error of
// 1 + x cancels in log(u) * x / (u - 1)).
inline float fm_log1p(float x) {
  const float u = 1.0f + x;
  const float d = u - 1.0f;
  const float r = log(u) * (x / select(d, 1.0f, d == 0.0f));
  return select(select(r, x, d == 0.0f), u, isinf(u));
}

// softplus(x) = log(1 + e^x), written so that neither branch overflows.
inline float fm_softplus(float x) {
  return max(x, 0.0f) + fm_log1p(fm_exp(-fabs(x)));
}

// erfc with small *relative* error in both tails (Numerical Recipes' Chebyshev fit,
// fractional error < 1.2e-7), with e^{-z^2} split as e^{-hi} e^{-lo} so that rounding
// of z*z does not turn into relative error for large z.
inline float fm_erfc(float x) {
  const float z = fabs(x);
  const float t = 1.0f / fma(0.5f, z, 1.0f);
  float p = 0.17087277f;
  p = fma(p, t, -0.82215223f);
  p = fma(p, t, 1.48851587f);
  p = fma(p, t, -1.13520398f);
  p = fma(p, t, 0.27886807f);
  p = fma(p, t, -0.18628806f);
  p = fma(p, t, 0.09678418f);
  p = fma(p, t, 0.37409196f);
  p = fma(p, t, 1.00002368f);
  p = fma(p, t, -1.26551223f);
  const float zz = z * z;
  const float zz_lo = fma(z, z, -zz);
  const float r = t * fm_exp(-zz) * fm_exp(p - zz_lo);
  return select(r, 2.0f - r, x < 0.0f);
}

// GELU, exact erf form as torch.nn.functional.gelu: x/2 (1 + erf(x/sqrt2)) = x/2 erfc(-x/sqrt2);
// the erfc form keeps full relative accuracy for large negative x.
inline float fm_gelu(float x) { return 0.5f * x * fm_erfc(-x * 0.70710678118654752f); }

// NaN-propagating max/min (NumPy's maximum/minimum, not C's fmax/fmin).
inline float fm_maximum(float x, float y) { return select(y, x, isnan(x) || x > y); }
inline float fm_minimum(float x, float y) { return select(y, x, isnan(x) || x < y); }

// relu(NaN) = NaN, as np.maximum(x, 0) and torch.relu.
inline float fm_relu(float x) { return select(x, 0.0f, x <= 0.0f); }
