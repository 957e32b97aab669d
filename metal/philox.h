// Philox-4x32-10, the counter-based generator behind dropout (training.metal) and
// fastmetal.random (random.metal): one definition, so both draw the same bits on every
// device. Random123's known-answer vectors check it (tests/test_training_ops.py).
#pragma once
#include "fm_kernel.h"

// Philox-4x32-10 (Salmon et al., Random123) with 32-bit integer operations only: the high
// half of the 32 x 32 product is formed from 16-bit halves, so every device computes the
// same bits.
FM_FUNC uint32_t philox_mulhilo(uint32_t a, uint32_t b, thread uint32_t& lo) {
  lo = a * b;
  const uint32_t a0 = a & 0xffffu, a1 = a >> 16, b0 = b & 0xffffu, b1 = b >> 16;
  const uint32_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const uint32_t mid = (p00 >> 16) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16);
}

FM_FUNC void philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                           uint32_t k1, thread uint32_t* r) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint32_t lo0, lo1;
    const uint32_t hi0 = philox_mulhilo(0xD2511F53u, c0, lo0);
    const uint32_t hi1 = philox_mulhilo(0xCD9E8D57u, c2, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  r[0] = c0;
  r[1] = c1;
  r[2] = c2;
  r[3] = c3;
}
