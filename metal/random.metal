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

// Box–Muller on a word pair: u1 in (0, 1] (so log u1 is finite), u2 in [0, 1); radius
// sqrt(-2 log u1) <= 5.77, angle 2 pi u2; z = (radius cos, radius sin), then mean + std z
// as one fma. fm_math.h's log, sin and cos are the same code on every device (within an
// ulp or so of each other, as each compiler contracts their polynomials).
FM_FUNC void box_muller(uint32_t w1, uint32_t w2, constant RandomArgs& a, thread float& z0,
                        thread float& z1) {
  const float u1 = float((w1 >> 8) + 1u) * 5.9604644775390625e-8f;  // 2^-24
  const float u2 = float(w2 >> 8) * 5.9604644775390625e-8f;
  const float radius = sqrt(-2.0f * fm_log(u1));
  const float angle = 6.28318530717958648f * u2;
  z0 = fma(radius * fm_cos(angle), a.b, a.a);
  z1 = fma(radius * fm_sin(angle), a.b, a.a);
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
