// Math helpers shared by the kernels of every backend, written in the portable MSL subset.
//
// Why not the standard functions: Metal has no erf/erfc/log1p, and on the CPU a libm call
// per element stops the loop vectoriser. These are branch-free (select, not if; no table
// indexed by data), so the same source vectorises on the CPU (SSE2, AVX2, AVX-512, NEON)
// and stays divergence-free on GPUs. None relies on what MSL leaves undefined: no min, max
// or clamp that could see a NaN (fm_clamp_nan below defines that case), no float-to-int
// conversion of a NaN or out-of-range value.
//
// Conditions are single comparisons, combined by nesting selects rather than by && or ||
// on bools: GCC's vectoriser rejects some boolean algebra between masks of different
// origin (a `mask ? bool : false` it cannot convert), and which form it meets depends on
// the GCC version's folding and jump threading. Each select of a float on one comparison
// vectorises under every GCC and clang tried (tools/ci/check_vectorised.py --cxx). (The other
// half of keeping selects branch-free under any GCC is the grid loop's `omp simd`, in
// csrc/backend/cpu/fm_cpu_entry.h.)
#pragma once
#include "fm_kernel.h"

// lo <= x <= hi, NaN stays NaN (comparisons with NaN are false, so neither select fires).
FM_FUNC float fm_clamp_nan(float x, float lo, float hi) {
  return metal::select(metal::select(x, lo, x < lo), hi, x > hi);
}

// x with the sign bit of s (bit operations: exact, NaN-safe).
FM_FUNC float fm_copysign(float x, float s) {
  return metal::as_type<float>((metal::as_type<uint32_t>(x) & 0x7fffffffu) |
                               (metal::as_type<uint32_t>(s) & 0x80000000u));
}

// a * b + c, fused where the target has FMA (every compiler here contracts it), else a
// multiply and an add: for polynomial steps, whose accuracy does not need the fusing.
// metal::fma is kept for the steps that need its exactness (two-products, Cody–Waite),
// and x86-64 without FMA has to emulate those.
FM_FUNC float fm_mad(float a, float b, float c) { return a * b + c; }

// 1/b and a/b for the divisions inside the helpers below, where b is a normal number of
// moderate size (1 <= b <= 32). CUDA's IEEE division is a reciprocal estimate, Newton steps
// and a range check that branches to a slow path (about 10 instructions, the largest part
// of gelu's cost there); its estimate (MUFU.RCP, <= 1 ulp) with one Newton step on the
// quotient is within 1 ulp in 4 instructions. The other targets divide exactly, so their
// results stay bit for bit what they were.
#if defined(__CUDACC__)
FM_FUNC float fm_recip_estimate(float b) {  // one MUFU.RCP (__fdividef adds a range check)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return r;
}
FM_FUNC float fm_div(float a, float b) {
  const float r = fm_recip_estimate(b);
  const float q = a * r;
  return metal::fma(r, metal::fma(-b, q, a), q);
}
#else
FM_FUNC float fm_recip_estimate(float b) { return 1.0f / b; }
FM_FUNC float fm_div(float a, float b) { return a / b; }
#endif

// a + b = s + err exactly (Knuth's two-sum, no multiplications).
FM_FUNC float fm_two_sum(float a, float b, thread float& err) {
  const float s = a + b;
  const float bb = s - a;
  err = (a - (s - bb)) + (b - bb);
  return s;
}

// e^r for |r| <= ln2/2: degree-7 Taylor in Horner form (truncation < 6e-9 relative);
// shared by fm_exp_dd and fm_exp_nonpos, whose results must stay bit-identical.
FM_FUNC float fm_exp_taylor7(float r) {
  float p = 1.0f / 5040.0f;
  p = fm_mad(p, r, 1.0f / 720.0f);
  p = fm_mad(p, r, 1.0f / 120.0f);
  p = fm_mad(p, r, 1.0f / 24.0f);
  p = fm_mad(p, r, 1.0f / 6.0f);
  p = fm_mad(p, r, 0.5f);
  p = fm_mad(p, r, 1.0f);
  return fm_mad(p, r, 1.0f);
}

// Cody–Waite reduction of e^xs (xs clamped to [-104, 89]; a NaN passes): returns n and
// sets r with xs = n ln2 + r, |r| <= ln2/2. The shifter 1.5 * 2^23 rounds xs/ln2 to an
// integer in t's low bits; ln2_hi has 16 bits, so n * ln2_hi is exact. For a NaN xs, n is
// garbage but in range and r is NaN. Shared by the three exps below, whose results must
// stay bit-identical.
FM_FUNC int32_t fm_exp_reduce(float xs, thread float& r) {
  const float shifter = 12582912.0f;
  const float t = xs * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  r = xs - n * 0.693145751953125f;  // exact (Sterbenz)
  r = r - n * 1.428606765330187045e-06f;
  return metal::as_type<int32_t>(t) - metal::as_type<int32_t>(shifter);
}

// e^(x_hi + x_lo) with <= 2 ulp error over the whole float range (x_lo a small finite
// correction, |x_lo| << ulp(x_hi); the caller replaces a non-finite one); exact
// NaN/inf/underflow behaviour. Cody–Waite reduction (fm_exp_reduce), degree-7 Taylor for
// e^r (truncation < 6e-9 relative), 2^n applied in two halves so that subnormal results
// come out right.
FM_FUNC float fm_exp_dd(float x_hi, float x_lo) {
  const float xc = fm_clamp_nan(x_hi, -104.0f, 89.0f);
  const bool clamped = xc != x_hi;
  const float xs = metal::select(xc, 0.0f, metal::isnan(xc));  // no NaN into integer conversion
  float r;
  const int32_t ni = fm_exp_reduce(xs, r);
  r = r + metal::select(x_lo, 0.0f, clamped);
  const float p = fm_exp_taylor7(r);
#if defined(FM_SHIM_VECTOR_LDEXP)
  const float y = metal::ldexp(p, ni);
#else
  const int32_t n1 = ni / 2;
  const int32_t n2 = ni - n1;
  const float s1 = metal::as_type<float>((n1 + 127) << 23);
  const float s2 = metal::as_type<float>((n2 + 127) << 23);
  const float y = (p * s1) * s2;
#endif
  return metal::select(y, x_hi, metal::isnan(x_hi));
}

// e^x: fm_exp_dd(x, 0) bit for bit, in fewer operations (the AVX-512 loop: 31 instructions
// per 16 floats instead of 45). A NaN passes the clamp, gives a NaN p, and NaN times
// any scale is NaN, so it needs no select; an arithmetic shift halves n (floor instead of
// truncation changes which half is odd, not the product: p * 2^n1 is exact, normal, and
// the one rounding is the second multiplication, subnormal results included). Where the
// CPU shim has ldexp as one vector instruction, it is that one rounding of p * 2^n.
FM_FUNC float fm_exp(float x) {
  float r;
  const int32_t ni = fm_exp_reduce(fm_clamp_nan(x, -104.0f, 89.0f), r);  // n in [-150, 128]
  const float p = fm_exp_taylor7(r);
#if defined(FM_SHIM_VECTOR_LDEXP)
  return metal::ldexp(p, ni);
#else
  const int32_t n1 = ni >> 1;
  const int32_t n2 = ni - n1;
  // Shifted as unsigned: the garbage of a NaN must not meet a signed left shift (UB).
  const float s1 = metal::as_type<float>(uint32_t(n1 + 127) << 23);
  const float s2 = metal::as_type<float>(uint32_t(n2 + 127) << 23);
  return (p * s1) * s2;
#endif
}

// e^v for v <= 0 (NaN stays NaN): fm_exp bit for bit, in fewer operations for the ops
// whose argument is never positive (sigmoid, softplus, erfc). With n in [-150, 0] one fixed
// split of the scale, 2^(n+64) (normal, so p * 2^(n+64) is exact) times 2^-64 (the one
// rounding, subnormal results included), replaces fm_exp's halving of n; no overflow
// clamp, and no NaN select: a NaN v gives a NaN p, and NaN times any scale is NaN (the
// scale's bits are only reinterpreted, never converted).
FM_FUNC float fm_exp_nonpos(float v) {
  float r;
  const int32_t ni = fm_exp_reduce(metal::select(v, -104.0f, v < -104.0f), r);  // [-150, 0]
  const float p = fm_exp_taylor7(r);
#if defined(FM_SHIM_VECTOR_LDEXP)
  return metal::ldexp(p, ni);  // the same one rounding (see fm_exp)
#else
  // Shifted as unsigned: a NaN v makes ni garbage, and a signed shift of it would be UB.
  const float scale = metal::as_type<float>(uint32_t(ni + (127 + 64)) << 23);
  return (p * scale) * 5.42101086242752217e-20f;  // 2^-64
#endif
}

// Natural log as a float-float hi + lo (relative error ~2^-35) for x > 0 finite; for
// subnormal x, scaled by 2^23 first. x = 2^e m, m in [sqrt(1/2), sqrt 2), then
// log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716, with s itself as a float-float.
// Other x (0, negative, inf, NaN) give garbage here; callers select their special values.
FM_FUNC float fm_log_dd(float x, thread float& lo) {
  const bool sub = x < 1.17549435e-38f;
  const float xs = metal::select(x, x * 8388608.0f, sub);
  const int32_t bits = metal::as_type<int32_t>(xs);
  int32_t e = ((bits >> 23) & 0xff) - 127;
  float m = metal::as_type<float>((bits & 0x007fffff) | 0x3f800000);  // [1, 2)
  const bool big = m > 1.41421356f;
  m = metal::select(m, m * 0.5f, big);
  e = e + metal::select(0, 1, big) - metal::select(0, 23, sub);
  const float f = m - 1.0f;                       // exact
  const float d = 2.0f + f;                       // m + 1
  const float d_lo = f - (d - 2.0f);              // exact error of d
  const float s = f / d;
  const float s_lo = (metal::fma(-s, d, f) - s * d_lo) / d;
  const float z = s * s;
  float p = 0.1818181818f;                        // 2/11
  p = fm_mad(p, z, 0.2222222222f);            // 2/9
  p = fm_mad(p, z, 0.2857142857f);            // 2/7
  p = fm_mad(p, z, 0.4f);                     // 2/5
  p = fm_mad(p, z, 0.6666666667f);            // 2/3
  const float ef = float(e);
  float err;
  const float hi = fm_two_sum(ef * 0.693145751953125f, 2.0f * s, err);  // e * ln2_hi exact
  lo = err + (2.0f * s_lo + (s * z) * p) + ef * 1.428606765330187045e-06f;
  const float h = hi + lo;
  lo = lo - (h - hi);
  return h;
}

// log x, <= 1 ulp or so; log(0) = -inf, log(x < 0) = NaN, log(inf) = inf, NaN stays NaN.
FM_FUNC float fm_log(float x) {
  float lo;
  const float y = fm_log_dd(x, lo);
  const float inf = metal::as_type<float>(0x7f800000u);
  const float nan = metal::as_type<float>(0x7fc00000u);
  float r = metal::select(y, -inf, x == 0.0f);
  r = metal::select(r, nan, !(x >= 0.0f));  // x < 0 or NaN
  return metal::select(r, inf, x == inf);
}

// tanh: odd polynomial (Cephes tanhf) below 0.625, else 1 - 2 / (e^{2|x|} + 1); +-1 past 9.1.
FM_FUNC float fm_tanh(float x) {
  const float a = metal::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = fm_mad(p, z, 2.06390887954e-2f);
  p = fm_mad(p, z, -5.37397155531e-2f);
  p = fm_mad(p, z, 1.33314422036e-1f);
  p = fm_mad(p, z, -3.33332819422e-1f);
  const float small = fm_mad(p * z, x, x);
  const float e = fm_exp(2.0f * fm_clamp_nan(a, 0.0f, 9.1f));
  const float big = fm_copysign(1.0f - 2.0f / (e + 1.0f), x);
  // The copysign keeps tanh(-0) = -0 (the polynomial's p z x + x rounds it to +0).
  return metal::select(big, fm_copysign(small, x), a < 0.625f);
}

// sin and cos of x in radians. Range reduction x = n pi/2 + r, |r| <= pi/4 (a little more
// for huge x), in two ways, chosen per element by select:
//  * |x| <= 2^15 (Cody–Waite): pi/2 as three floats, r = ((x - n p1) - n p2) - n p3 with
//    exact FMAs; error ~2^-60 absolute.
//  * larger |x| (Payne–Hanek style, without tables): x * 2/pi mod 4 from 2/pi in nine 24-bit
//    float pieces (scaled by 2^100, x by 2^-100, so every piece is a normal float); each
//    product split exactly by an FMA, its multiples of 4 dropped exactly, the parts added
//    as a triple float, so that r keeps ~2^-70 absolute accuracy even when x is very
//    close to a multiple of pi/2.
// Then Cephes' minimax polynomials on |r| <= pi/4 and the quadrant n mod 4.
FM_FUNC float fm_mod4(float v) { return v - 4.0f * metal::rint(v * 0.25f); }  // exact

// Adds xs * c (exactly split, multiples of 4 dropped) to the triple float s0 + s1 + s2.
FM_FUNC void fm_rem_step(float xs, float c, thread float& s0, thread float& s1, thread float& s2) {
  const float ph = xs * c;
  const float pl = metal::fma(xs, c, -ph);
  float e1, e2;
  s0 = fm_two_sum(s0, fm_mod4(ph), e1);
  s1 = fm_two_sum(s1, e1, e2);
  s2 = s2 + e2;
  s0 = fm_two_sum(s0, fm_mod4(pl), e1);
  s1 = fm_two_sum(s1, e1, e2);
  s2 = s2 + e2;
  s0 = fm_mod4(s0);
}

FM_FUNC void fm_rem_pio2(float x, thread float& r_hi, thread float& r_lo, thread int32_t& q) {
  // Cody–Waite.
  const float n = metal::rint(x * 0.636619772f);
  float cw = metal::fma(-n, 1.57079637f, x);
  cw = metal::fma(-n, -4.37113883e-08f, cw);
  const float cw_lo = -n * -1.71512451e-15f;
  const float cw_hi = cw + cw_lo;
  // Payne–Hanek style, on x' = x * 2^-100 (finite x only; others give NaN, selected later).
  const float xs = x * 7.88860905e-31f;  // 2^-100
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f;
  fm_rem_step(xs, 8.070114040e+29f, s0, s1, s2);
  fm_rem_step(xs, 3.255650369e+22f, s0, s1, s2);
  fm_rem_step(xs, 3.723210512e+14f, s0, s1, s2);
  fm_rem_step(xs, 4.125416000e+07f, s0, s1, s2);
  fm_rem_step(xs, 1.532540607e+01f, s0, s1, s2);
  fm_rem_step(xs, 7.184481774e-07f, s0, s1, s2);
  fm_rem_step(xs, 3.321755577e-14f, s0, s1, s2);
  fm_rem_step(xs, 8.941953688e-22f, s0, s1, s2);
  fm_rem_step(xs, 2.006214621e-28f, s0, s1, s2);
  const float nb = metal::rint(s0);
  float e3;
  const float f0 = fm_two_sum(s0 - nb, s1, e3);  // s0 - nb is exact
  const float f1 = e3 + s2;
  const float fh = f0 + f1;
  const float fl = f1 - (fh - f0);
  // quarter turns -> radians: (fh + fl) * (pio2_hi + pio2_lo)
  const float ph_hi = fh * 1.57079637f;
  const float ph_lo = metal::fma(fh, 1.57079637f, -ph_hi) + (fh * -4.37113883e-08f + fl * 1.57079637f);
  const bool huge = !(metal::fabs(x) <= 32768.0f);
  r_hi = metal::select(cw_hi, ph_hi, huge);
  r_lo = metal::select(cw_lo - (cw_hi - cw), ph_lo, huge);
  const float nq = metal::select(n, nb, huge);
  q = int32_t(metal::select(nq, 0.0f, metal::isnan(nq)));  // |nq| <= 2^14: converts exactly
}

// sin(r) and cos(r) for |r| <= ~0.8, r = r_hi + r_lo.
FM_FUNC float fm_sin_poly(float r, float r_lo) {
  const float z = r * r;
  float p = -1.9515295891e-4f;
  p = fm_mad(p, z, 8.3321608736e-3f);
  p = fm_mad(p, z, -1.6666654611e-1f);
  return r + fm_mad(r * z, p, r_lo);
}
FM_FUNC float fm_cos_poly(float r, float r_lo) {
  const float z = r * r;
  float p = 2.443315711809948e-5f;
  p = fm_mad(p, z, -1.388731625493765e-3f);
  p = fm_mad(p, z, 4.166664568298827e-2f);
  const float hz = 0.5f * z;
  const float w = 1.0f - hz;
  // (1 - w) - hz recovers the rounding of w; - r r_lo is the first-order term of r_lo.
  return w + (((1.0f - w) - hz) + fm_mad(z * z, p, -r * r_lo));
}

// Quadrant q of (s, c) = (sin r, cos r): sin x = [s, c, -s, -c][q & 3]; on the bits, so that
// no select becomes a branch.
FM_FUNC float fm_quadrant(float s, float c, uint32_t q) {
  const uint32_t swap = 0u - (q & 1u);
  const uint32_t v = (metal::as_type<uint32_t>(s) & ~swap) | (metal::as_type<uint32_t>(c) & swap);
  return metal::as_type<float>(v ^ ((q & 2u) << 30));
}

FM_FUNC float fm_sin(float x) {
  float r, r_lo;
  int32_t q;
  fm_rem_pio2(x, r, r_lo, q);
  const float y = fm_quadrant(fm_sin_poly(r, r_lo), fm_cos_poly(r, r_lo), uint32_t(q));
  // sin(-0) = -0: the reduction's fma(-n, pio2, x) turns a zero x into +0.
  return metal::select(metal::select(y, x, x == 0.0f), x - x, !metal::isfinite(x));  // inf -> NaN
}

FM_FUNC float fm_cos(float x) {
  float r, r_lo;
  int32_t q;
  fm_rem_pio2(x, r, r_lo, q);
  const float y = fm_quadrant(fm_sin_poly(r, r_lo), fm_cos_poly(r, r_lo), uint32_t(q) + 1u);
  return metal::select(y, x - x, !metal::isfinite(x));
}

// x^y with C99 / NumPy special cases. |x|^y = e^{y log|x|} with log|x| and the product as
// float-floats, so the result keeps a few-ulp error even where y log|x| is near +-88.
FM_FUNC float fm_pow(float x, float y) {
  const float a = metal::fabs(x);
  float l_lo;
  const float l_hi = fm_log_dd(a, l_lo);
  const float z_hi = y * l_hi;
  const float z_lo = metal::fma(y, l_hi, -z_hi) + y * l_lo;
  const float mag_finite = fm_exp_dd(z_hi, metal::select(z_lo, 0.0f, !metal::isfinite(z_lo)));
  const float inf = metal::as_type<float>(0x7f800000u);
  const float nan = metal::as_type<float>(0x7fc00000u);
  // |x| = 0 or inf, or |y| = inf: the limits directly. Every condition below is one
  // comparison, and conditions are combined by nesting selects, never by && or || (GCC's
  // vectoriser gives up on some boolean algebra between masks: see the note at the top).
  const bool y_pos = y > 0.0f;
  float mag = mag_finite;
  mag = metal::select(mag, metal::select(inf, 0.0f, y_pos), a == 0.0f);
  mag = metal::select(mag, metal::select(0.0f, inf, y_pos), a == inf);
  const bool y_inf = metal::fabs(y) == inf;
  const float big_base = metal::select(0.0f, inf, y_pos);    // |x| > 1, y = +-inf
  const float small_base = metal::select(inf, 0.0f, y_pos);  // |x| < 1 (|x| = 1 is x = 1, below)
  mag = metal::select(mag, metal::select(small_base, big_base, a > 1.0f), y_inf);
  // Sign and domain for x < 0 (and -0): odd integer y keeps the sign, non-integer y is NaN.
  // y is an odd integer iff y - 2 rint(y / 2) = +-1 (exact; |y| >= 2^24 is even, NaN or inf
  // is not odd).
  const float y_small = metal::select(0.0f, y, metal::fabs(y) < 16777216.0f);
  const bool y_odd = metal::fabs(y_small - 2.0f * metal::rint(0.5f * y_small)) == 1.0f;
  float r = metal::select(mag, metal::select(mag, -mag, y_odd), metal::signbit(x));
  // Finite x < 0 with non-integer y (y = +-inf counts as integer: rint(inf) = inf).
  const float r_neg = metal::select(r, nan, metal::rint(y) != y);
  r = metal::select(r, metal::select(r, r_neg, x > -inf), x < 0.0f);
  r = metal::select(r, nan, metal::isnan(x));
  r = metal::select(r, nan, metal::isnan(y));
  r = metal::select(r, metal::select(r, 1.0f, y_inf), x == -1.0f);
  r = metal::select(r, 1.0f, y == 0.0f);
  return metal::select(r, 1.0f, x == 1.0f);
}

// 1 / (1 + e^-x), from e = e^-|x| <= 1 so that nothing overflows and, for x < 0,
// e / (1 + e) keeps the subnormal results that 1 / (1 + e^-x) would flush to 0.
FM_FUNC float fm_sigmoid(float x) {
  const float e = fm_exp_nonpos(-metal::fabs(x));
  const float s = fm_div(1.0f, 1.0f + e);
  return metal::select(s, e * s, x < 0.0f);
}

// SiLU, x * sigmoid(x). For x < 0 it is x e / (1 + e) with e = e^x = 2^n p: the product
// x p / (1 + e) is scaled by 2^n last, in one rounding, so results down in the subnormal
// range keep their precision (x times an e already rounded to a subnormal loses up to 7
// bits). Past |x| = 112 the result is x (x > 0) or -0 (x < 0; -inf gives NaN, as
// -inf * sigmoid(-inf) does in PyTorch and NumPy), so no infinity reaches a division.
FM_FUNC float fm_silu(float x) {
  float r;
  const float a = -metal::fabs(x);
  const bool outside = a < -112.0f;  // |x| e^-|x| is below half the smallest subnormal
  const int32_t ni = fm_exp_reduce(metal::select(a, -112.0f, outside), r);  // [-162, 0]
  const float p = fm_exp_taylor7(r);
  // Shifted as unsigned: a NaN x makes ni garbage, and a signed shift of it would be UB.
  const float scale = metal::as_type<float>(uint32_t(ni + (127 + 64)) << 23);
  const float e = (p * scale) * 5.42101086242752217e-20f;  // e^-|x| (2^-64 undoes the bias)
  const float xs = metal::select(x, 0.0f, outside);  // finite into the divisions
  const float neg = (fm_div(xs * p, 1.0f + e) * scale) * 5.42101086242752217e-20f;
  const float inside = metal::select(fm_div(xs, 1.0f + e), neg, x < 0.0f);
  return metal::select(inside, metal::select(x * 0.0f, x, x > 0.0f), outside);
}

// log(1 + x) without losing x when |x| is tiny (Goldberg's trick: the rounding error of
// 1 + x cancels in log(u) * x / (u - 1)).
FM_FUNC float fm_log1p(float x) {
  const float u = 1.0f + x;
  const float d = u - 1.0f;
  const float r = fm_log(u) * (x / metal::select(d, 1.0f, d == 0.0f));
  // u = +inf: log1p(+inf) = +inf; -inf (x = -inf) gives NaN through the log.
  return metal::select(metal::select(r, x, d == 0.0f), u, u == metal::as_type<float>(0x7f800000u));
}

// softplus(x) = log(1 + e^x), written so that neither branch overflows.
FM_FUNC float fm_softplus(float x) {
  return metal::select(x, 0.0f, x < 0.0f) + fm_log1p(fm_exp_nonpos(-metal::fabs(x)));
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
  const float r = fm_recip_estimate(den);
  float q = (a - 2.0f) * r;
  q = fm_mad(r, metal::fma(-q, den, a - 2.0f), q);  // one Newton step: q to full float precision
  float p = 8.733854776e-05f;
  p = fm_mad(p, q, 1.820253112e-04f);
  p = fm_mad(p, q, -4.064179540e-04f);
  p = fm_mad(p, q, -1.436045223e-03f);
  p = fm_mad(p, q, 1.252846852e-03f);
  p = fm_mad(p, q, 8.715686841e-03f);
  p = fm_mad(p, q, -8.030299685e-03f);
  p = fm_mad(p, q, -5.421902239e-02f);
  p = fm_mad(p, q, 1.640509376e-01f);
  p = fm_mad(p, q, -1.660304438e-01f);
  p = fm_mad(p, q, -9.276381708e-02f);
  p = fm_mad(p, q, 2.769783819e-01f);
  return fm_div(1.0f + p, fm_mad(2.0f, a, 1.0f)) * (fm_exp_nonpos(-aa) * (1.0f - aa_lo));
}

FM_FUNC float fm_erfc(float x) {
  const float a = fm_clamp_nan(metal::fabs(x), 0.0f, 10.1f);
  const float aa = a * a;
  const float y = fm_erfc_core(a, aa, metal::fma(a, a, -aa));
  return metal::select(metal::select(y, 2.0f - y, x < 0.0f), x, metal::isnan(x));
}

// GELU, exact erf form as torch.nn.functional.gelu: x/2 (1 + erf(x/sqrt2)) = x/2 erfc(-x/sqrt2);
// the erfc form keeps full relative accuracy for large negative x.
// The tail's condition number is 2 z^2, so z^2 = x^2 / 2 is formed exactly from x.
FM_FUNC float fm_gelu(float x) {
  const float a = fm_clamp_nan(metal::fabs(x) * 0.70710678118654752f, 0.0f, 10.1f);
  const float xc = fm_clamp_nan(metal::fabs(x), 0.0f, 14.28f);  // 10.1 * sqrt2: erfc is 0 beyond
  const float xx = xc * xc;
  const float e = fm_erfc_core(a, 0.5f * xx, 0.5f * metal::fma(xc, xc, -xx));
  const float erfc_minus_z = metal::select(e, 2.0f - e, x > 0.0f);  // erfc(-x/sqrt2)
  return metal::select(0.5f * x * erfc_minus_z, x, metal::isnan(x));
}

// Variants for float16 results (the kernels call fm_NAME_f16 in place of fm_NAME when the
// result is stored as half; tools/gen/gen_kernels.py finds them by that suffix). A float16
// result keeps 11 bits, so these need a relative error of about 1e-5, not float32's few ulp,
// and GPUs take the hardware exp2 (float16 gelu moves half the bytes of float32 for the same
// arithmetic, so the float32 body would make it compute-bound there). The CPU keeps
// fm_exp_nonpos, which vectorises where a libm exp2 would not.
#if defined(__CUDACC__) || defined(__METAL_VERSION__)
FM_FUNC float fm_exp_nonpos_f16(float v) { return metal::exp2(v * 1.44269504088896341f); }
#else
FM_FUNC float fm_exp_nonpos_f16(float v) { return fm_exp_nonpos(v); }
#endif

// GELU for float16 results: fm_gelu's erfc form with a degree-7 fit of
// (1 + 2a) e^{a^2} erfc(a) - 1 in q = (a - 2) / (a + 2) (relative error 2e-6 on [0, 10.1])
// and reciprocal estimates; special values as fm_gelu.
FM_FUNC float fm_gelu_f16(float x) {
  const float z = metal::fabs(x) * 0.70710678118654752f;
  const float a = metal::select(z, 10.1f, z > 10.1f);  // NaN stays NaN
  const float q = (a - 2.0f) * fm_recip_estimate(a + 2.0f);
  float p = 1.810235553e-03f;
  p = fm_mad(p, q, 7.553198840e-03f);
  p = fm_mad(p, q, -8.682060987e-03f);
  p = fm_mad(p, q, -5.388904735e-02f);
  p = fm_mad(p, q, 1.642221361e-01f);
  p = fm_mad(p, q, -1.660654098e-01f);
  p = fm_mad(p, q, -9.277440608e-02f);
  p = fm_mad(p, q, 2.769790888e-01f);
  const float e = (1.0f + p) * fm_recip_estimate(fm_mad(2.0f, a, 1.0f)) * fm_exp_nonpos_f16(-a * a);
  const float erfc_minus_z = metal::select(e, 2.0f - e, x > 0.0f);  // erfc(-x/sqrt2)
  return metal::select(0.5f * x * erfc_minus_z, x, metal::isnan(x));
}

// GELU's derivative, as torch's gelu backward (erf form): Phi(x) + x phi(x), with the
// normal CDF Phi(x) = erfc(-x/sqrt2) / 2 taken from fm_gelu's erfc (accurate in both tails).
FM_FUNC float fm_gelu_grad(float x) {
  const float a = fm_clamp_nan(metal::fabs(x) * 0.70710678118654752f, 0.0f, 10.1f);
  const float xc = fm_clamp_nan(metal::fabs(x), 0.0f, 14.28f);
  const float xx = xc * xc;
  const float e = fm_erfc_core(a, 0.5f * xx, 0.5f * metal::fma(xc, xc, -xx));
  const float cdf = 0.5f * metal::select(e, 2.0f - e, x > 0.0f);
  const float pdf = fm_exp(-0.5f * xx) * 0.39894228040143268f;  // 1/sqrt(2 pi)
  return metal::select(cdf + x * pdf, x, metal::isnan(x));
}

// NaN-propagating max/min (NumPy's maximum/minimum, not C's fmax/fmin).
FM_FUNC float fm_maximum(float x, float y) { return metal::select(y, x, metal::isnan(x) || x > y); }
FM_FUNC float fm_minimum(float x, float y) { return metal::select(y, x, metal::isnan(x) || x < y); }

// relu(NaN) = NaN, as np.maximum(x, 0) and torch.relu.
FM_FUNC float fm_relu(float x) { return metal::select(x, 0.0f, x <= 0.0f); }

// ---------------------------------------------------------------- floor division and modulo
// NumPy's float floor_divide and remainder (npy_divmodf), computed in float as NumPy does
// for float32 (and for float16, which NumPy also computes in float32): bit for bit its
// results. C's fmodf is a libm call (which stops the CPU vectoriser), so the exact fmod is
// built from one-rounding steps below.

// 2**e as a float for an integer e in [-126, 127] (built from bits: exact).
FM_FUNC float fm_pow2i(int32_t e) { return metal::as_type<float>(uint32_t(e + 127) << 23); }

// floor(v) through rint (no libm call): rint is one instruction (or fm_soft_rint).
FM_FUNC float fm_floor(float v) {
  const float r = metal::rint(v);
  return metal::select(r, r - 1.0f, r > v);
}

// One step of fm_fmod_abs: r reduced by B * 2**e1 * 2**e2 (see there).
FM_FUNC float fm_fmod_step(float r, float B, int32_t e1, int32_t e2) {
  const float Bs = (B * fm_pow2i(e1)) * fm_pow2i(e2);
  const float t = fm_floor(r / Bs);
  const float v = metal::fma(-t, Bs, r);
  const float w = metal::select(v, v + Bs, v < 0.0f);
  return metal::select(r, w, Bs <= r);
}

// |a| mod |b| for finite a and nonzero b, exactly (fmodf of the magnitudes). Twelve steps
// take the quotient off 23 bits at a time, largest first: step s uses
// B_s = |b| * 2**(23 * (11 - s)) (a power-of-two scaling: exact, or inf and then skipped),
// so that r / B_s < 2**24 wherever B_s <= r (the step before left r < B_{s-1} = 2**23 B_s).
// t = floor(r / B_s) is then an exact integer, one above the true floor at most (the
// quotient is correctly rounded), and r - t * B_s is a multiple of ulp(B_s) smaller than
// B_s in magnitude: a float, which one fma computes exactly; a negative one gets B_s back.
// Written out step by step (no loop): the CPU vectoriser then sees straight-line code.
FM_FUNC float fm_fmod_abs(float a, float b) {
  const float B = metal::fabs(b);
  float r = metal::fabs(a);
  r = fm_fmod_step(r, B, 127, 126);  // 2**253
  r = fm_fmod_step(r, B, 127, 103);  // 2**230
  r = fm_fmod_step(r, B, 127, 80);
  r = fm_fmod_step(r, B, 127, 57);
  r = fm_fmod_step(r, B, 127, 34);
  r = fm_fmod_step(r, B, 127, 11);   // 2**138
  r = fm_fmod_step(r, B, 115, 0);
  r = fm_fmod_step(r, B, 92, 0);
  r = fm_fmod_step(r, B, 69, 0);
  r = fm_fmod_step(r, B, 46, 0);
  r = fm_fmod_step(r, B, 23, 0);
  return fm_fmod_step(r, B, 0, 0);
}

// C's fmodf(a, b): the sign of a; NaN for an infinite a, a zero b or a NaN operand.
FM_FUNC float fm_fmod(float a, float b) {
  const float nan = metal::as_type<float>(0x7fc00000u);
  float r = fm_copysign(fm_fmod_abs(a, b), a);
  r = metal::select(r, nan, b == 0.0f);
  r = metal::select(r, nan, metal::isinf(a));
  return metal::select(r, nan, metal::isnan(b));
}

// NumPy's remainder (Python's %): fmod moved into the divisor's sign; a zero takes the
// divisor's sign.
FM_FUNC float fm_remainder(float a, float b) {
  const float mod = fm_fmod(a, b);
  const float if_pos = metal::select(mod, mod + b, mod < 0.0f);  // b > 0: a negative mod moves
  const float if_neg = metal::select(mod, mod + b, mod > 0.0f);  // b < 0: a positive mod moves
  const float moved = metal::select(if_pos, if_neg, b < 0.0f);
  return metal::select(moved, fm_copysign(0.0f, b), mod == 0.0f);
}

// NumPy's floor_divide (Python's //): (a - fmod(a, b)) / b, one less where the remainder
// moved, rounded to the nearest integer (it is one up to rounding); a / b for b == 0.
FM_FUNC float fm_floor_divide(float a, float b) {
  const float mod = fm_fmod(a, b);
  const float div = (a - mod) / b;
  const float if_pos = metal::select(div, div - 1.0f, mod < 0.0f);
  const float if_neg = metal::select(div, div - 1.0f, mod > 0.0f);
  const float d = metal::select(if_pos, if_neg, b < 0.0f);
  const float f = fm_floor(d);
  const float near = metal::select(f, f + 1.0f, d - f > 0.5f);
  const float q = metal::select(near, fm_copysign(0.0f, a / b), d == 0.0f);
  return metal::select(q, a / b, b == 0.0f);
}

// ---------------------------------------------------------------- the Array API's elementwise
// functions (asin ... logaddexp): branch-free as the helpers above, from fm_exp / fm_log_dd /
// fm_log1p and Cephes' float minimax polynomials; special values as C99 / NumPy.

// The sign bit of x as one comparison (true for -0 and negative NaNs).
FM_FUNC bool fm_signbit(float x) { return metal::as_type<int32_t>(x) < 0; }

// C's nextafter on the bits of a float32 or float16 (bx, by widened to 32 bits; sign: the
// format's sign bit; inf: its +inf bits). Integer arithmetic only, so subnormals are exact
// where a GPU flushes them in float arithmetic. As C and NumPy: NaN if either is NaN, y if
// x == y (nextafter(0.0, -0.0) is -0.0), the smallest subnormal of y's sign from a zero,
// -0.0 from -denorm_min toward 0, +-inf from +-max outward.
FM_FUNC uint32_t fm_nextafter_bits(uint32_t bx, uint32_t by, uint32_t sign, uint32_t inf) {
  const uint32_t ax = bx & (sign - 1u), ay = by & (sign - 1u);
  // The values' order as integers (sign-magnitude to two's complement; -0 and +0 both 0).
  const int32_t ox = metal::select(int32_t(ax), -int32_t(ax), bx >= sign);
  const int32_t oy = metal::select(int32_t(ay), -int32_t(ay), by >= sign);
  // Away from zero (magnitude + 1) when moving up from a positive x or down from a negative.
  const uint32_t away = metal::select(uint32_t(ox > oy), uint32_t(ox < oy), bx < sign);
  uint32_t r = metal::select(bx - 1u, bx + 1u, away != 0u);
  r = metal::select(r, (by & sign) | 1u, ax == 0u);
  r = metal::select(r, by, ox == oy);
  r = metal::select(r, by, ay > inf);
  return metal::select(r, bx, ax > inf);
}

FM_FUNC float fm_nextafter(float x, float y) {
  return metal::as_type<float>(fm_nextafter_bits(metal::as_type<uint32_t>(x),
                                                 metal::as_type<uint32_t>(y), 0x80000000u,
                                                 0x7f800000u));
}

// float16 results: the step is one float16 ulp. x is a float16 value (the kernel loaded it);
// y is rounded to float16 first, as NumPy casts a Python scalar to the array's dtype.
FM_FUNC float fm_nextafter_f16(float x, float y) {
  const uint32_t bx = metal::as_type<uint16_t>(half(x));
  const uint32_t by = metal::as_type<uint16_t>(half(y));
  return float(metal::as_type<half>(uint16_t(fm_nextafter_bits(bx, by, 0x8000u, 0x7c00u))));
}

// log x from its float-float log times a float-float constant c_hi + c_lo (log2, log10),
// with log's special values.
FM_FUNC float fm_log_scaled(float x, float c_hi, float c_lo) {
  float lo;
  const float hi = fm_log_dd(x, lo);
  const float p = hi * c_hi;
  const float y = p + (metal::fma(hi, c_hi, -p) + (hi * c_lo + lo * c_hi));
  const float inf = metal::as_type<float>(0x7f800000u);
  const float nan = metal::as_type<float>(0x7fc00000u);
  float r = metal::select(y, -inf, x == 0.0f);
  r = metal::select(r, nan, !(x >= 0.0f));  // x < 0 or NaN
  return metal::select(r, inf, x == inf);
}
FM_FUNC float fm_log2(float x) { return fm_log_scaled(x, 1.44269502163f, 1.925963033500011e-08f); }
FM_FUNC float fm_log10(float x) { return fm_log_scaled(x, 0.434294492006f, -1.0103049952192578e-08f); }

// e^x - 1 by Kahan's trick: (u - 1) x / log u with u = e^x rounded, whose rounding error
// cancels in the quotient; x itself where u rounds to 1, -1 where u - 1 does.
FM_FUNC float fm_expm1(float x) {
  const float u = fm_exp(x);
  const float d = u - 1.0f;
  const float l = fm_log(metal::select(u, 2.0f, d == 0.0f));  // no 0 / 0 where u == 1
  const float r = d * (x / l);
  float y = metal::select(r, x, d == 0.0f);
  y = metal::select(y, -1.0f, d == -1.0f);
  return metal::select(y, u, u == metal::as_type<float>(0x7f800000u));  // overflow: inf
}

// sinh and cosh: from expm1 / exp below |x| = 10, e^(|x| - ln2) (a float-float exponent) above,
// where e^-|x| is below half an ulp.
FM_FUNC float fm_exp_minus_ln2(float a) {
  float err;
  const float hi = fm_two_sum(a, -0.693147182465f, err);
  return fm_exp_dd(hi, err + 1.9046542121259336e-09f);
}
FM_FUNC float fm_sinh(float x) {
  const float a = metal::fabs(x);
  const float e = fm_expm1(metal::select(a, 0.0f, a > 10.0f));
  const float small = 0.5f * (e + e / (e + 1.0f));
  return fm_copysign(metal::select(small, fm_exp_minus_ln2(a), a > 10.0f), x);
}
FM_FUNC float fm_cosh(float x) {
  const float a = metal::fabs(x);
  const float e = fm_exp(metal::select(a, 0.0f, a > 10.0f));
  return metal::select(0.5f * (e + 1.0f / e), fm_exp_minus_ln2(a), a > 10.0f);
}

// tan x = sin / cos after fm_sin's reduction: s / c, or -c / s in odd quadrants.
FM_FUNC float fm_tan(float x) {
  float r, r_lo;
  int32_t q;
  fm_rem_pio2(x, r, r_lo, q);
  const float s = fm_sin_poly(r, r_lo);
  const float c = fm_cos_poly(r, r_lo);
  // [s/c, -c/s, s/c, -c/s][q & 3] on the bits (fm_quadrant), as fm_sin: no select on q.
  const float y = fm_quadrant(s, c, uint32_t(q)) / fm_quadrant(c, -s, uint32_t(q));
  return metal::select(metal::select(y, x, x == 0.0f), x - x, !metal::isfinite(x));
}

// asin of 0 <= s <= 0.5 with z = s * s (Cephes asinf's polynomial).
FM_FUNC float fm_asin_core(float s, float z) {
  float p = 4.2163199048e-2f;
  p = fm_mad(p, z, 2.4181311049e-2f);
  p = fm_mad(p, z, 4.5470025998e-2f);
  p = fm_mad(p, z, 7.4953002686e-2f);
  p = fm_mad(p, z, 1.6666752422e-1f);
  return fm_mad(s * z, p, s);
}
// asin: above 1/2, pi/2 - 2 asin(sqrt((1 - |x|) / 2)); |x| > 1 gives NaN through the sqrt.
FM_FUNC float fm_asin(float x) {
  const float a = metal::fabs(x);
  const bool big = a > 0.5f;
  const float z = metal::select(a * a, 0.5f * (1.0f - a), big);
  const float s = metal::select(a, metal::sqrt(z), big);
  const float t = fm_asin_core(s, z);
  const float r = metal::select(t, (1.57079637f - 2.0f * t) - 4.37113883e-08f, big);
  return fm_copysign(r, x);
}
// acos as Cephes acosf: 2 asin(sqrt((1 - x) / 2)) above 1/2, pi - that below -1/2,
// pi/2 - asin x between (pi and pi/2 as float-floats).
FM_FUNC float fm_acos(float x) {
  const float a = metal::fabs(x);
  const bool big = a > 0.5f;
  const float z = metal::select(x * x, 0.5f * (1.0f - a), big);
  const float s = metal::select(x, metal::sqrt(z), big);
  const float t = fm_asin_core(metal::fabs(s), z);
  const float mid = (1.57079637f - fm_copysign(t, s)) - 4.37113883e-08f;
  const float far = metal::select(2.0f * t, (3.14159274f - 2.0f * t) - 8.74227766e-08f, x < 0.0f);
  return metal::select(mid, far, big);
}

// atan of 0 <= a (Cephes atanf: reduced to |t| <= tan(pi/8) by pi/4 or pi/2 offsets).
FM_FUNC float fm_atan_abs(float a) {
  const bool big = a > 2.414213562373095f;
  const bool mid = a > 0.4142135623730950f;
  const float t = metal::select(metal::select(a, (a - 1.0f) / (a + 1.0f), mid), -1.0f / a, big);
  const float y0 = metal::select(metal::select(0.0f, 0.785398185f, mid), 1.57079637f, big);
  const float y0_lo = metal::select(metal::select(0.0f, -2.18556941e-08f, mid), -4.37113883e-08f, big);
  const float z = t * t;
  float p = 8.05374449538e-2f;
  p = fm_mad(p, z, -1.38776856032e-1f);
  p = fm_mad(p, z, 1.99777106478e-1f);
  p = fm_mad(p, z, -3.33329491539e-1f);
  return y0 + (fm_mad(t * z, p, t) + y0_lo);
}
FM_FUNC float fm_atan(float x) { return fm_copysign(fm_atan_abs(metal::fabs(x)), x); }

// atan2(y, x) as C99: atan(min / max of |x|, |y|), then reflected by pi/2 - r where |y| > |x|,
// pi - r where x has its sign bit set (-0 included), and given y's sign.
FM_FUNC float fm_atan2(float y, float x) {
  const float ax = metal::fabs(x);
  const float ay = metal::fabs(y);
  const bool steep = ay > ax;
  const float mx = metal::select(ax, ay, steep);
  const float mn = metal::select(ay, ax, steep);
  float q = mn / mx;
  q = metal::select(q, 0.0f, mx == 0.0f);                              // both zero
  q = metal::select(q, 1.0f, mn == metal::as_type<float>(0x7f800000u));  // both infinite
  float r = fm_atan_abs(q);
  r = metal::select(r, (1.57079637f - r) - 4.37113883e-08f, steep);
  r = metal::select(r, (3.14159274f - r) - 8.74227766e-08f, fm_signbit(x));
  r = fm_copysign(r, y);
  return metal::select(metal::select(r, x, metal::isnan(x)), y, metal::isnan(y));
}

// asinh |x| = log1p(a + a^2 / (1 + sqrt(1 + a^2))), log a + ln2 past 2^30 (where a^2 would
// overflow and the +1 is below an ulp).
FM_FUNC float fm_asinh(float x) {
  const float a = metal::fabs(x);
  const bool huge = a > 1073741824.0f;
  const float as = metal::select(a, 1.0f, huge);
  const float aa = as * as;
  const float small = fm_log1p(as + aa / (1.0f + metal::sqrt(1.0f + aa)));
  const float r = metal::select(small, fm_log(a) + 0.693147182f, huge);
  return fm_copysign(r, x);
}
// acosh x = log1p(t + sqrt(2t + t^2)), t = x - 1 (exact near 1); log x + ln2 past 2^30;
// NaN below 1.
FM_FUNC float fm_acosh(float x) {
  const bool huge = x > 1073741824.0f;
  const float t = metal::select(x, 2.0f, huge) - 1.0f;
  const float small = fm_log1p(t + metal::sqrt(fm_mad(t, t, 2.0f * t)));
  const float r = metal::select(small, fm_log(x) + 0.693147182f, huge);
  return metal::select(r, metal::as_type<float>(0x7fc00000u), x < 1.0f);
}
// atanh x = log1p(2a / (1 - a)) / 2 with x's sign; +-inf at +-1, NaN beyond.
FM_FUNC float fm_atanh(float x) {
  const float a = metal::fabs(x);
  const float r = 0.5f * fm_log1p((2.0f * a) / (1.0f - a));
  return fm_copysign(metal::select(r, metal::as_type<float>(0x7fc00000u), a > 1.0f), x);
}

// hypot without overflow or underflow in between: max * sqrt(1 + (min / max)^2); inf if
// either is infinite (NaN or not), NaN otherwise where either is NaN.
FM_FUNC float fm_hypot(float x, float y) {
  const float a = metal::fabs(x);
  const float b = metal::fabs(y);
  const float inf = metal::as_type<float>(0x7f800000u);
  const bool a_big = a > b;
  const float m = metal::select(b, a, a_big);
  const float n = metal::select(a, b, a_big);
  const float q = n / metal::select(m, 1.0f, m == 0.0f);
  float h = m * metal::sqrt(fm_mad(q, q, 1.0f));
  h = metal::select(h, inf, a == inf);
  return metal::select(h, inf, b == inf);
}

// log(e^x + e^y) = max + log1p(e^-|x - y|); x + ln2 where x == y (infinities included).
FM_FUNC float fm_logaddexp(float x, float y) {
  const float m = fm_maximum(x, y);
  const float r = m + fm_log1p(fm_exp_nonpos(-metal::fabs(x - y)));
  return metal::select(r, x + 0.693147182f, x == y);
}

// floor / ceil / trunc through rint (fm_floor: one instruction, no libm call); zeros keep
// their sign as C's.
FM_FUNC float fm_ceil(float x) { return -fm_floor(-x); }
FM_FUNC float fm_trunc(float x) { return metal::select(fm_floor(x), -fm_floor(-x), x < 0.0f); }
// NumPy's sign: -1, 0 (+0 for -0 too), 1; NaN stays NaN.
FM_FUNC float fm_sign(float x) {
  const float z = metal::select(x, 0.0f, x == 0.0f);
  return metal::select(metal::select(z, 1.0f, x > 0.0f), -1.0f, x < 0.0f);
}
