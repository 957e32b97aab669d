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

// One round: the counter words mixed by two multiplications under the round's key.
FM_FUNC void philox_round(thread uint32_t& c0, thread uint32_t& c1, thread uint32_t& c2,
                          thread uint32_t& c3, uint32_t k0, uint32_t k1) {
  uint32_t lo0, lo1;
  const uint32_t hi0 = philox_mulhilo(0xD2511F53u, c0, lo0);
  const uint32_t hi1 = philox_mulhilo(0xCD9E8D57u, c2, lo1);
  c0 = hi1 ^ c1 ^ k0;
  c1 = lo1;
  c2 = hi0 ^ c3 ^ k1;
  c3 = lo0;
}

// Ten rounds, the key bumped by the Weyl constants (0x9E3779B9, 0xBB67AE85) before each
// after the first. Written out rather than looped: the CPU's vectoriser takes a thread's
// body only as straight-line code (a loop inside the grid loop keeps it scalar).
FM_FUNC void philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                           uint32_t k1, thread uint32_t* r) {
  philox_round(c0, c1, c2, c3, k0, k1);
  philox_round(c0, c1, c2, c3, k0 + 0x9E3779B9u, k1 + 0xBB67AE85u);
  philox_round(c0, c1, c2, c3, k0 + 0x3C6EF372u, k1 + 0x76CF5D0Au);
  philox_round(c0, c1, c2, c3, k0 + 0xDAA66D2Bu, k1 + 0x32370B8Fu);
  philox_round(c0, c1, c2, c3, k0 + 0x78DDE6E4u, k1 + 0xED9EBA14u);
  philox_round(c0, c1, c2, c3, k0 + 0x1715609Du, k1 + 0xA9066899u);
  philox_round(c0, c1, c2, c3, k0 + 0xB54CDA56u, k1 + 0x646E171Eu);
  philox_round(c0, c1, c2, c3, k0 + 0x5384540Fu, k1 + 0x1FD5C5A3u);
  philox_round(c0, c1, c2, c3, k0 + 0xF1BBCDC8u, k1 + 0xDB3D7428u);
  philox_round(c0, c1, c2, c3, k0 + 0x8FF34781u, k1 + 0x96A522ADu);
  r[0] = c0;
  r[1] = c1;
  r[2] = c2;
  r[3] = c3;
}
