// dropout_apply (metal/training.metal) for the CPU: the same Philox-4x32-10 stream and the
// same mask, bit for bit, with the 32 x 32 -> 64-bit products that the CPU has (the MSL form
// builds them from 16-bit halves so that every GPU gives the same bits), over blocks of
// counters that the compiler vectorises. Compiled once per ISA (see isa_dispatch.h).
#include <algorithm>
#include <cstdint>

#include "thread_pool.h"
#include "training_args.h"

namespace fm::cpu::FM_CPU_ISA {

namespace {
constexpr int kLanes = 16;  // counters per inner block: independent chains for the vector unit

// Philox-4x32-10 of the counters (c0 + i, 0, 0, 0), i < kLanes, under key (k0, k1).
void philox_block(uint32_t c0, uint32_t k0, uint32_t k1, uint32_t (&r)[4][kLanes]) {
  uint32_t x0[kLanes], x1[kLanes], x2[kLanes], x3[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    x0[i] = c0 + uint32_t(i);
    x1[i] = x2[i] = x3[i] = 0u;
  }
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < kLanes; ++i) {
      const uint64_t p0 = uint64_t(0xD2511F53u) * x0[i];
      const uint64_t p1 = uint64_t(0xCD9E8D57u) * x2[i];
      const uint32_t n0 = uint32_t(p1 >> 32) ^ x1[i] ^ k0;
      const uint32_t n2 = uint32_t(p0 >> 32) ^ x3[i] ^ k1;
      x1[i] = uint32_t(p1);
      x3[i] = uint32_t(p0);
      x0[i] = n0;
      x2[i] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int i = 0; i < kLanes; ++i) {
    r[0][i] = x0[i];
    r[1][i] = x1[i];
    r[2][i] = x2[i];
    r[3][i] = x3[i];
  }
}
}  // namespace

// out[i] = x[i] * scale where the 24 high bits of Philox word i % 4 of counter i / 4 reach
// the threshold, else 0 (as the kernel). Elements are disjoint per task: any thread count
// gives the same bits.
void dropout_native(const DropoutArgs& a, const float* x, float* out) {
  const int64_t counters = (int64_t(a.n) + 3) / 4;
  const int64_t blocks = (counters + kLanes - 1) / kLanes;
  constexpr int64_t kBlocksPerTask = 64;  // 4096 elements
  ThreadPool::instance().parallel_for((blocks + kBlocksPerTask - 1) / kBlocksPerTask,
                                      [&](int64_t task) {
    uint32_t r[4][kLanes];
    const int64_t b1 = std::min(blocks, (task + 1) * kBlocksPerTask);
    for (int64_t b = task * kBlocksPerTask; b < b1; ++b) {
      const uint32_t c0 = uint32_t(b * kLanes);
      philox_block(c0, a.key0, a.key1, r);
      const int64_t e0 = int64_t(c0) * 4;
      const int64_t e1 = std::min<int64_t>(a.n, e0 + 4 * kLanes);
      for (int64_t e = e0; e < e1; ++e) {
        const int64_t k = e - e0;
        const uint32_t bits = r[k % 4][k / 4];
        out[e] = (bits >> 8) >= a.threshold ? x[e] * a.scale : 0.0f;
      }
    }
  });
}

}  // namespace fm::cpu::FM_CPU_ISA
