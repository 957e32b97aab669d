// fastmetal.random: uniform, normal and Bernoulli draws from the counter-based Philox of
// dropout (philox.h). Thread g makes elements 4g .. 4g + 3 from one Philox block, so the
// numbers depend only on (seed, counter, index): the same on every device and at every
// thread count. No barriers: the CPU runs these as plain loops.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "fm_math.h"
#include "philox.h"
#include "random_args.h"
using namespace metal;

// The Philox block of thread g: counter (counter + g) as a 64-bit number.
FM_FUNC void random_block(constant RandomArgs& a, uint32_t g, thread uint32_t* r) {
  const uint32_t lo = a.counter_lo + g;
  const uint32_t hi = a.counter_hi + select(0u, 1u, lo < g);  // the carry
  philox4x32_10(lo, hi, 0u, 0u, a.key0, a.key1, r);
}

// The `bits` high bits of a word as a float k / 2^bits in [0, 1) (exact: bits <= 24).
FM_FUNC float unit_float(uint32_t word, uint32_t bits) {
  return float(word >> (32u - bits)) * as_type<float>((127u - bits) << 23);
}

// low + (high - low) * u, as one fma: one rounding, so no compiler's contraction choice
// changes the result.
kernel void random_uniform(device float* out [[buffer(0)]],
                           constant RandomArgs& a [[buffer(1)]],
                           uint gid [[thread_position_in_grid]]) {
  uint32_t r[4];
  random_block(a, gid, r);
  const uint64_t base = uint64_t(gid) * 4u;
  for (uint32_t j = 0; j < 4u; ++j)
    if (base + j < a.n) out[base + j] = fma(unit_float(r[j], a.bits), a.b, a.a);
}

// Box–Muller on the word pairs (0, 1) and (2, 3): u1 in (0, 1] (log u1 finite), u2 in
// [0, 1); radius sqrt(-2 log u1) <= 5.77, angle 2 pi u2. The fm_math.h log and sincos are
// the same code on every device (within an ulp or so of each other).
kernel void random_normal(device float* out [[buffer(0)]],
                          constant RandomArgs& a [[buffer(1)]],
                          uint gid [[thread_position_in_grid]]) {
  uint32_t r[4];
  random_block(a, gid, r);
  const uint64_t base = uint64_t(gid) * 4u;
  const float two_pi = 6.28318530717958648f;
  for (uint32_t j = 0; j < 4u; j += 2u) {
    const float u1 = float((r[j] >> 8) + 1u) * 5.9604644775390625e-8f;  // 2^-24
    const float u2 = float(r[j + 1] >> 8) * 5.9604644775390625e-8f;
    const float radius = sqrt(-2.0f * fm_log(u1));
    const float angle = two_pi * u2;
    if (base + j < a.n) out[base + j] = fma(radius * fm_cos(angle), a.b, a.a);
    if (base + j + 1 < a.n) out[base + j + 1] = fma(radius * fm_sin(angle), a.b, a.a);
  }
}

// 1 with probability threshold / 2^24 (an integer comparison: exact everywhere), else 0.
kernel void random_bernoulli(device float* out [[buffer(0)]],
                             constant RandomArgs& a [[buffer(1)]],
                             uint gid [[thread_position_in_grid]]) {
  uint32_t r[4];
  random_block(a, gid, r);
  const uint64_t base = uint64_t(gid) * 4u;
  for (uint32_t j = 0; j < 4u; ++j)
    if (base + j < a.n) out[base + j] = select(0.0f, 1.0f, (r[j] >> 8) < a.threshold);
}
