// Batched matrix product C[b] = A[b] @ B[b] (matmul_args.h): a tiled GEMM.
//
// Each threadgroup computes a BM x BN tile of C, stepping through K in BK-deep slices
// staged in threadgroup memory (each element of A and B is read from device memory once
// per tile, never per output element). The tile is covered by (BM/TM) * (BN/TN) "virtual
// threads" of TM x TN register-blocked outputs; a threadgroup of T threads runs them in
// ceil(V/T) passes and loads the slices with a stride of T, so the result is the same for
// ANY threadgroup size (T == V = 256 is the fast case). Barriers sit in loops whose trip
// counts are uniform across the group. Threadgroup memory: 2 * BK * (BM + 1) floats (8 KiB).
//
// Grid: threadgroups (ceil(N / BN), ceil(M / BM), batch).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "matmul_args.h"
using namespace metal;

template <int BM, int BN, int BK, int TM, int TN>
kernel void matmul_tiled(device const float* A [[buffer(0)]],
                         device const float* B [[buffer(1)]],
                         device float* C [[buffer(2)]],
                         constant MatmulArgs& p [[buffer(3)]],
                         uint3 tg_pos [[threadgroup_position_in_grid]],
                         uint32_t tid [[thread_index_in_threadgroup]],
                         uint3 tg_size [[threads_per_threadgroup]]) {
  // +1: columns written by the loaders do not all hit one memory bank.
  threadgroup float As[BK][BM + 1];
  threadgroup float Bs[BK][BN + 1];

  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const int32_t row0 = int32_t(tg_pos.y) * BM, col0 = int32_t(tg_pos.x) * BN;
  // This batch's operand offsets.
  int32_t b = int32_t(tg_pos.z), a_off = 0, b_off = 0;
  for (int32_t d = p.batch_dims - 1; d >= 0; --d) {
    const int32_t i = b % p.batch_shape[d];
    b /= p.batch_shape[d];
    a_off += i * p.a_bs[d];
    b_off += i * p.b_bs[d];
  }
  device const float* a = A + a_off;
  device const float* bm = B + b_off;
  device float* c = C + int32_t(tg_pos.z) * p.M * p.N;
  // Coalesced loads walk the operand's contiguous index fastest.
  const bool a_k_fast = p.a_cs == 1 || p.M == 1;
  const bool b_k_fast = p.b_rs == 1 && p.b_cs != 1;

  const uint32_t MT = BM / TM, NT = BN / TN;  // virtual threads along rows / columns
  const uint32_t V = MT * NT;
  for (uint32_t pass = 0; pass < V; pass += T) {
    const uint32_t v = pass + tid;
    const bool active = v < V;
    const int32_t tr = int32_t(v / NT), tc = int32_t(v % NT);
    float acc[TM][TN];
    for (int i = 0; i < TM; ++i)
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    for (int32_t k0 = 0; k0 < p.K; k0 += BK) {
      for (uint32_t e = tid; e < uint32_t(BM * BK); e += T) {
        int32_t m, kk;
        if (a_k_fast) {
          m = int32_t(e) / BK;
          kk = int32_t(e) - m * BK;
        } else {
          kk = int32_t(e) / BM;
          m = int32_t(e) - kk * BM;
        }
        const int32_t gm = row0 + m, gk = k0 + kk;
        As[kk][m] = (gm < p.M && gk < p.K) ? a[gm * p.a_rs + gk * p.a_cs] : 0.0f;
      }
      for (uint32_t e = tid; e < uint32_t(BN * BK); e += T) {
        int32_t n, kk;
        if (b_k_fast) {
          n = int32_t(e) / BK;
          kk = int32_t(e) - n * BK;
        } else {
          kk = int32_t(e) / BN;
          n = int32_t(e) - kk * BN;
        }
        const int32_t gn = col0 + n, gk = k0 + kk;
        Bs[kk][n] = (gn < p.N && gk < p.K) ? bm[gk * p.b_rs + gn * p.b_cs] : 0.0f;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (active) {
        for (int kk = 0; kk < BK; ++kk) {
          float av[TM], bv[TN];
          for (int i = 0; i < TM; ++i) av[i] = As[kk][tr + i * int32_t(MT)];
          for (int j = 0; j < TN; ++j) bv[j] = Bs[kk][tc + j * int32_t(NT)];
          for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
        }
      }
      // Nobody overwrites the slices until everyone has used them.
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    if (active) {
      for (int i = 0; i < TM; ++i) {
        const int32_t gm = row0 + tr + i * int32_t(MT);
        if (gm >= p.M) continue;
        for (int j = 0; j < TN; ++j) {
          const int32_t gn = col0 + tc + j * int32_t(NT);
          if (gn < p.N) c[gm * p.N + gn] = acc[i][j];
        }
      }
    }
  }
}

FM_INSTANTIATE("matmul_64x64", matmul_tiled, 64, 64, 16, 4, 4);
FM_INSTANTIATE("matmul_32x64", matmul_tiled, 32, 64, 16, 2, 4);
