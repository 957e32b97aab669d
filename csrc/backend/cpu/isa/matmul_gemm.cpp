// The fast CPU matrix product for fastmetal.matmul / linear: the register-blocked
// micro-kernels of the conv2d engine (conv2d_engine.h: gemm_block, pack_a) on strided,
// batched operands. Compiled once per ISA (see isa_dispatch.h).
//
// Per batch: A is packed into MR-row strips (any strides), B is copied into a row-padded
// contiguous panel (the micro-kernel reads whole NR-wide vectors), then tiles of
// kRowBlock rows x kColPanel columns run in parallel. Every element of C is the same
// chain of FMAs over k whatever the tiling or the thread count, so results are bitwise
// reproducible for any FASTMETAL_NUM_THREADS.
#include "conv2d_engine.h"
#include "matmul_args.h"

namespace fm::cpu::FM_CPU_ISA {
using namespace conv;

namespace {
constexpr int kRowBlock = MR * 16;
constexpr i64 kColPanel = NR * 32;

i64 batch_offset(const MatmulArgs& p, i64 b, const int32_t* bs) {
  i64 off = 0;
  for (int d = p.batch_dims - 1; d >= 0; --d) {
    const i64 i = b % p.batch_shape[d];
    b /= p.batch_shape[d];
    off += i * bs[d];
  }
  return off;
}

struct Scratch {
  std::vector<float> ap, bp;
  std::vector<i64> off;
};
Scratch& thread_scratch() {
  static thread_local Scratch s;
  return s;
}

// Packs batch b's operands into s; returns the padded row pitch of B.
i64 pack(const MatmulArgs& p, const float* A, const float* B, i64 b, Scratch& s, bool parallel) {
  const int M = p.M, N = p.N, K = p.K;
  const float* a = A + batch_offset(p, b, p.a_bs);
  const float* bb = B + batch_offset(p, b, p.b_bs);
  // Row pitch of the copy: a multiple of NR, but not of 128 floats (rows a power of two
  // apart map onto the same L1 sets, and the micro-kernel walks B down its rows).
  i64 ldb = round_up(N, NR);
  if (ldb % 128 == 0) ldb += NR;
  const int strips = int(ceil_div(M, MR));
  if (i64(s.ap.size()) < packed_size(M, K)) s.ap.resize(std::size_t(packed_size(M, K)));
  if (i64(s.bp.size()) < ldb * K + NR) s.bp.resize(std::size_t(ldb * K + NR));
  if (i64(s.off.size()) < K) s.off.resize(std::size_t(K));
  for (int k = 0; k < K; ++k) s.off[k] = k * ldb;
  float* ap = s.ap.data();
  float* bp = s.bp.data();
  auto pack_strip = [&](i64 st) {
    const int m0 = int(st) * MR, rows = std::min(MR, M - m0);
    pack_a(rows, K, [&](int m, int k) { return a[i64(m0 + m) * p.a_rs + i64(k) * p.a_cs]; },
           ap + st * i64(K) * MR);
  };
  auto copy_row = [&](i64 k) {
    float* dst = bp + k * ldb;
    const float* src = bb + k * p.b_rs;
    if (p.b_cs == 1) {
      std::memcpy(dst, src, sizeof(float) * N);
    } else {
      for (int n = 0; n < N; ++n) dst[n] = src[i64(n) * p.b_cs];
    }
    std::fill(dst + N, dst + ldb, 0.f);
  };
  // A transposed B (B^T contiguous: linear's weight.T) is copied in blocks of kTransK rows,
  // reading each column's run contiguously while the block's destination rows stay cached.
  constexpr i64 kTransK = 64;
  const bool transposed = p.b_rs == 1 && p.b_cs != 1;
  auto copy_block = [&](i64 blk) {
    const i64 k0 = blk * kTransK, k1 = std::min<i64>(K, k0 + kTransK);
    for (int n = 0; n < N; ++n) {
      const float* src = bb + i64(n) * p.b_cs;
      for (i64 k = k0; k < k1; ++k) bp[k * ldb + n] = src[k];
    }
    for (i64 k = k0; k < k1; ++k) std::fill(bp + k * ldb + N, bp + (k + 1) * ldb, 0.f);
  };
  const i64 copies = transposed ? ceil_div(K, kTransK) : K;
  auto copy = [&](i64 i) { transposed ? copy_block(i) : copy_row(i); };
  if (parallel) {
    auto& pool = ThreadPool::instance();
    pool.parallel_for(strips, pack_strip);
    pool.parallel_for(copies, copy);
  } else {
    for (i64 st = 0; st < strips; ++st) pack_strip(st);
    for (i64 i = 0; i < copies; ++i) copy(i);
  }
  return ldb;
}

void tile(const MatmulArgs& p, const Scratch& s, i64 ldb, float* c, int m0, i64 n0) {
  const int rows = std::min(kRowBlock, p.M - m0);
  const i64 cols = std::min<i64>(kColPanel, p.N - n0);
  gemm_block(rows, p.K, s.ap.data() + i64(m0) * p.K, s.off.data(), s.bp.data() + n0, cols,
             c + i64(m0) * p.N + n0, p.N, nullptr, /*spill=*/false);
}
}  // namespace

void matmul_gemm(const MatmulArgs& p, const float* A, const float* B, float* C) {
  const i64 MN = i64(p.M) * p.N;
  if (MN == 0 || p.batch == 0) return;
  if (p.K == 0) {
    std::fill(C, C + MN * p.batch, 0.f);
    return;
  }
  const i64 row_blocks = ceil_div(p.M, kRowBlock), col_panels = ceil_div(p.N, kColPanel);
  const i64 tiles = row_blocks * col_panels;
  auto& pool = ThreadPool::instance();
  if (p.batch >= 2 * pool.num_threads() || tiles == 1) {
    // Many small products: one batch per task, all on that thread.
    pool.parallel_for(p.batch, [&](i64 b) {
      Scratch& s = thread_scratch();
      const i64 ldb = pack(p, A, B, b, s, false);
      for (i64 t = 0; t < tiles; ++t)
        tile(p, s, ldb, C + b * MN, int(t / col_panels) * kRowBlock, (t % col_panels) * kColPanel);
    });
    return;
  }
  Scratch shared;
  for (i64 b = 0; b < p.batch; ++b) {
    const i64 ldb = pack(p, A, B, b, shared, true);
    pool.parallel_for(tiles, [&](i64 t) {
      tile(p, shared, ldb, C + b * MN, int(t / col_panels) * kRowBlock,
           (t % col_panels) * kColPanel);
    });
  }
}

}  // namespace fm::cpu::FM_CPU_ISA
