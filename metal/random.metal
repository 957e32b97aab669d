// fastmetal.random: uniform, normal and Bernoulli draws from the counter-based Philox of
// dropout (philox.h). Each thread makes four elements from one Philox block, so the numbers
// depend only on (seed, counter, index): the same on every device and at every thread
// count. No barriers: the CPU runs these as plain loops.
//
// Two variants of each kernel: the whole blocks (n / 4 threads, four unconditional stores,
// which the CPU's vectoriser takes) and the tail (`_tail`: one thread for the last n % 4
// elements, each store checked).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "fm_math.h"
#include "philox.h"
#include "random_args.h"
using namespace metal;

// The Philox block of thread g: block (first + g) of the draw, counter + first + g in all.
FM_FUNC void random_block(constant RandomArgs& a, uint32_t g, thread uint32_t* r) {
  const uint64_t b = a.counter + uint64_t(a.first) + uint64_t(g);
  philox4x32_10(uint32_t(b), uint32_t(b >> 32), 0u, 0u, a.key0, a.key1, r);
}

// out[i .. i + 3] = v0 .. v3, for i = 4 (first + g); the tail checks each index against n.
template <bool kTail>
FM_FUNC void store4(device float* out, constant RandomArgs& a, uint32_t g, float v0, float v1,
                    float v2, float v3) {
  const uint64_t i = (uint64_t(a.first) + uint64_t(g)) * 4u;
  if (!kTail) {
    out[i] = v0;
    out[i + 1] = v1;
    out[i + 2] = v2;
    out[i + 3] = v3;
    return;
  }
  if (i < a.n) out[i] = v0;
  if (i + 1 < a.n) out[i + 1] = v1;
  if (i + 2 < a.n) out[i + 2] = v2;
  if (i + 3 < a.n) out[i + 3] = v3;
}

// The `bits` high bits of a word as a float k / 2^bits in [0, 1) (exact: bits <= 24).
FM_FUNC float unit_float(uint32_t word, uint32_t bits) {
  return float(word >> (32u - bits)) * as_type<float>((127u - bits) << 23);
}

// low + (high - low) * u, as one fma: one rounding, so no compiler's contraction choice
// changes the result.
FM_FUNC float uniform_value(uint32_t word, constant RandomArgs& a) {
  return fma(unit_float(word, a.bits), a.b, a.a);
}

template <bool kTail>
kernel void random_uniform(device float* out [[buffer(0)]],
                           constant RandomArgs& a [[buffer(1)]],
                           uint gid [[thread_position_in_grid]]) {
  uint32_t r[4];
  random_block(a, gid, r);
  store4<kTail>(out, a, gid, uniform_value(r[0], a), uniform_value(r[1], a),
                uniform_value(r[2], a), uniform_value(r[3], a));
}
FM_INSTANTIATE("random_uniform", random_uniform, false);
FM_INSTANTIATE("random_uniform_tail", random_uniform, true);

// ---------------------------------------------------------------------------- normal
// Box–Muller, written so that every device rounds it the same way: integers and exact float
// operations where possible, and every product that feeds a sum as an explicit fma (a plain
// a * b + c is fused or not at each compiler's choice, as fm_math.h's polynomials are, which
// would leave devices an ulp apart). Division and sqrt are correctly rounded everywhere (the
// library builds without fast math). The x86-64 fallback without FMA (cpu ISA `base`)
// emulates fma through double, which can round differently in rare elements.

// ln(k / 2^24) for an integer k in [1, 2^24]: k = 2^e m with m in [sqrt(1/2), sqrt 2) (exact,
// on the bits of float(k)), ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716.
FM_FUNC float log_unit(uint32_t k) {
  const int32_t bits = as_type<int32_t>(float(k));  // exact: k <= 2^24
  int32_t e = ((bits >> 23) & 0xff) - 127;
  float m = as_type<float>((bits & 0x007fffff) | 0x3f800000);  // [1, 2)
  const bool big = m > 1.41421356f;
  m = select(m, m * 0.5f, big);
  e = e + select(0, 1, big) - 24;
  const float s = (m - 1.0f) / (m + 1.0f);  // m - 1 exact (Sterbenz)
  const float z = s * s;
  float p = 0.1818181818f;                  // 2/11
  p = fma(p, z, 0.2222222222f);             // 2/9
  p = fma(p, z, 0.2857142857f);             // 2/7
  p = fma(p, z, 0.4f);                      // 2/5
  p = fma(p, z, 0.6666666667f);             // 2/3
  const float ln_m = fma(s * z, p, 2.0f * s);
  const float ef = float(e);                // e ln 2 = e (ln2_hi + ln2_lo), e * ln2_hi exact
  return fma(ef, 0.693145751953125f, fma(ef, 1.428606820e-06f, ln_m));
}

// (sin, cos) of 2 pi k / 2^24 for an integer k in [0, 2^24): the nearest quarter turn q
// taken off exactly in integers leaves x in [-1/8, 1/8) turns, where Taylor polynomials in x
// (coefficients (2 pi)^n / n!) are below float32's rounding by degree 11 and 12.
FM_FUNC void sincos_turns(uint32_t k, thread float& sin_v, thread float& cos_v) {
  const uint32_t q = (k + 0x200000u) >> 22;                          // 0 .. 4
  const float x = float(int32_t(k) - int32_t(q << 22)) * 5.9604644775390625e-8f;  // * 2^-24
  const float x2 = x * x;
  float ps = -15.09464258f;
  ps = fma(ps, x2, 42.05869394f);
  ps = fma(ps, x2, -76.70585975f);
  ps = fma(ps, x2, 81.60524928f);
  ps = fma(ps, x2, -41.34170224f);
  const float s = fma(x * x2, ps, x * 6.283185307f);
  float pc = 7.903536371f;
  pc = fma(pc, x2, -26.42625678f);
  pc = fma(pc, x2, 60.24464137f);
  pc = fma(pc, x2, -85.45681721f);
  pc = fma(pc, x2, 64.93939402f);
  pc = fma(pc, x2, -19.7392088f);
  const float c = fma(x2, pc, 1.0f);
  sin_v = fm_quadrant(s, c, q);       // sin(q pi/2 + t) = [s, c, -s, -c][q & 3]
  cos_v = fm_quadrant(s, c, q + 1u);
}

// A word pair: k1 = (w1 >> 8) + 1 in [1, 2^24] (u1 = k1 / 2^24 in (0, 1], so log u1 is
// finite), k2 = w2 >> 8 (u2 = k2 / 2^24 in [0, 1)); radius sqrt(-2 ln u1) <= 5.77, angle
// 2 pi u2; (z0, z1) = mean + std * radius (cos, sin), each one fma.
FM_FUNC void box_muller(uint32_t w1, uint32_t w2, constant RandomArgs& a, thread float& z0,
                        thread float& z1) {
  const float radius = sqrt(-2.0f * log_unit((w1 >> 8) + 1u));
  float sin_v, cos_v;
  sincos_turns(w2 >> 8, sin_v, cos_v);
  z0 = fma(radius * cos_v, a.b, a.a);
  z1 = fma(radius * sin_v, a.b, a.a);
}

template <bool kTail>
kernel void random_normal(device float* out [[buffer(0)]],
                          constant RandomArgs& a [[buffer(1)]],
                          uint gid [[thread_position_in_grid]]) {
  uint32_t r[4];
  random_block(a, gid, r);
  float z0, z1, z2, z3;
  box_muller(r[0], r[1], a, z0, z1);
  box_muller(r[2], r[3], a, z2, z3);
  store4<kTail>(out, a, gid, z0, z1, z2, z3);
}
FM_INSTANTIATE("random_normal", random_normal, false);
FM_INSTANTIATE("random_normal_tail", random_normal, true);

// 1 with probability threshold / 2^24 (an integer comparison: exact everywhere), else 0.
FM_FUNC float bernoulli_value(uint32_t word, constant RandomArgs& a) {
  return select(0.0f, 1.0f, (word >> 8) < a.threshold);
}

template <bool kTail>
kernel void random_bernoulli(device float* out [[buffer(0)]],
                             constant RandomArgs& a [[buffer(1)]],
                             uint gid [[thread_position_in_grid]]) {
  uint32_t r[4];
  random_block(a, gid, r);
  store4<kTail>(out, a, gid, bernoulli_value(r[0], a), bernoulli_value(r[1], a),
                bernoulli_value(r[2], a), bernoulli_value(r[3], a));
}
FM_INSTANTIATE("random_bernoulli", random_bernoulli, false);
FM_INSTANTIATE("random_bernoulli_tail", random_bernoulli, true);
