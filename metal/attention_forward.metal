// Fused scaled-dot-product attention, the forward kernels: sdpa_forward (head dims up to 128)
// and sdpa_forward_tiled (head dims <= 64; its SPLIT / PREFETCH instances for discrete GPUs).
// They save lse per row for the backward kernels, which are in attention_backward.metal; the
// layout, masking, dropout, the helpers both use and the design in attention_common.h.
//
// Forward for head dims <= 64: sdpa_forward_tiled (register-blocked; its own comment below).
// Forward (sdpa_forward): one threadgroup per (tile of BQ query rows, batch index), NSG
// simdgroups of 32 lanes, each simdgroup owning R = 8 query rows. Per key tile of BK = 32 keys
// (one key per lane):
//   1. the tile is staged: K transposed, Kt[d][j] with rows padded to 33 floats (the
//      transposing stores and the lane-wise reads both hit 32 distinct banks), V row-major;
//   2. lane j computes the scores of key j against its simdgroup's 8 rows (Q rows staged once,
//      pre-scaled, read as float4 at one address per simdgroup: a broadcast);
//   3. per row, simd_max and simd_sum give the tile's max and the new running sum: the only
//      cross-lane traffic, 2 reductions per row and tile;
//   4. the 8 x 32 probabilities go to threadgroup memory (the simdgroup's own rows) and each
//      lane accumulates output columns lane, lane + 32, .. of its 8 rows: V[j][c] read
//      lane-contiguous, P[r][j] broadcast.
//   Threadgroup memory: DMAX = 64: NSG = 4 (BQ = 32, 128 threads): Q 32 x 64 (8 KiB) + Kt
//   64 x 33 (8.25 KiB) + V 32 x 64 (8 KiB) + P 32 x 32 (4 KiB) = 28,928 bytes. DMAX = 128:
//   NSG = 2 (BQ = 16, 64 threads) with K and V sharing one buffer (V staged after the scores,
//   two more barriers per tile): Q 16 x 128 (8 KiB) + Kt 128 x 33 (16.5 KiB) + P 16 x 32 (2 KiB)
//   = 27,136 bytes. Registers per lane: 8 scores, 8 x DMAX / 32 accumulators, 16 row stats.
//   A causal group stops at its last row's key (the tiles above the diagonal are skipped).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "attention_args.h"
#include "attention_common.h"
using namespace metal;

// ------------------------------------------------------------------------------- forward
enum : int32_t {
  kSdpaKeys = 32,  // keys per forward tile: one per lane of a 32-wide simdgroup
  kSdpaRows = 8,   // query rows per simdgroup in the forward
};

// Grid (threadgroups): x = ceil(L / BQ) query tiles, y = nbatch; 32 * NSG threads each
// (the kernel relies on exactly that many, in 32-wide simdgroups).
template <typename T, int DMAX, int NSG, bool SHARED_KV>
kernel void sdpa_forward(device const T* q [[buffer(0)]],
                         device const T* k [[buffer(1)]],
                         device const T* v [[buffer(2)]],
                         device const float* mask [[buffer(3)]],
                         device T* out [[buffer(4)]],
                         device float* lse [[buffer(5)]],
                         constant SdpaArgs& a [[buffer(6)]],
                         uint3 tg_pos [[threadgroup_position_in_grid]],
                         uint32_t tid [[thread_index_in_threadgroup]],
                         uint32_t lane [[thread_index_in_simdgroup]],
                         uint32_t sg [[simdgroup_index_in_threadgroup]]) {
  constexpr int BK = kSdpaKeys;
  constexpr int R = kSdpaRows;
  constexpr int BQ = R * NSG;
  constexpr int NT = 32 * NSG;
  constexpr int KT = BK + 1;           // padded row of the transposed K tile
  constexpr int DQ = DMAX / 4;         // float4 per staged Q row
  constexpr int CV = DMAX / 32;        // output columns per lane
  constexpr int VOFF = SHARED_KV ? 0 : DMAX * KT;
  static_assert(DMAX % 32 == 0 && BK * DMAX <= DMAX * KT, "tile shape");
  // Sizes spelled in template parameters and file constants (the MSL gate checks them per
  // instance): Q tile, Kt (+ V unless shared), P.
  threadgroup float4 Qs[kSdpaRows * NSG * DMAX / 4];
  threadgroup float KV[DMAX * kSdpaKeys + DMAX + kSdpaKeys * DMAX - SHARED_KV * kSdpaKeys * DMAX];
  threadgroup float Ps[kSdpaRows * NSG * kSdpaKeys];

  const int32_t b = int32_t(tg_pos.y);
  const int32_t q0 = int32_t(tg_pos.x) * BQ;
  const int32_t L = a.L, S = a.S, D = a.E, Dv = a.Ev;
  const int32_t D4 = (D + 3) / 4;
  const uint64_t qo = sdpa_offset(a, b, FM_SDPA_Q), ko = sdpa_offset(a, b, FM_SDPA_K);
  const uint64_t vo = sdpa_offset(a, b, FM_SDPA_V), oo = sdpa_offset(a, b, FM_SDPA_O);
  const uint64_t mo = sdpa_mask_offset(a, b);

  // Q tile, scaled, zero past D and L.
  for (int32_t e = int32_t(tid); e < BQ * D4; e += NT) {
    const int32_t r = e / D4, c = (e - r * D4) * 4, i = q0 + r;
    Qs[r * DQ + c / 4] = i < L ? sdpa_load4(q, sdpa_row(a, qo, FM_SDPA_Q, i), c, D, a.scale)
                               : float4(0.0f);
  }

  const int32_t rbase = int32_t(sg) * R;
  float o[R * CV];
  float m[R], l[R];
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    for (int c = 0; c < CV; ++c) o[r * CV + c] = 0.0f;
  }
  // Uniform across the group: a causal tile needs keys up to its last row only.
  const int32_t k_end = a.causal != 0 ? min(S, q0 + BQ) : S;
  for (int32_t k0 = 0; k0 < k_end; k0 += BK) {
    threadgroup_barrier(mem_flags::mem_threadgroup);  // the last tile's readers are done
    for (int32_t e = int32_t(tid); e < BK * D4 * 4; e += NT) {
      const int32_t j = e / (D4 * 4), d = e - j * (D4 * 4);
      KV[d * KT + j] = k0 + j < S && d < D
                           ? float(k[sdpa_row(a, ko, FM_SDPA_K, k0 + j) + uint64_t(d)]) : 0.0f;
    }
    if (!SHARED_KV) {
      for (int32_t e = int32_t(tid); e < BK * DMAX; e += NT) {
        const int32_t j = e / DMAX, c = e - j * DMAX;
        KV[VOFF + e] = k0 + j < S && c < Dv
                           ? float(v[sdpa_row(a, vo, FM_SDPA_V, k0 + j) + uint64_t(c)]) : 0.0f;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // Scores of key k0 + lane against the simdgroup's rows.
    float s[R];
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
    for (int32_t d4 = 0; d4 < D4; ++d4) {
      const float k0v = KV[(4 * d4) * KT + int32_t(lane)];
      const float k1v = KV[(4 * d4 + 1) * KT + int32_t(lane)];
      const float k2v = KV[(4 * d4 + 2) * KT + int32_t(lane)];
      const float k3v = KV[(4 * d4 + 3) * KT + int32_t(lane)];
      for (int r = 0; r < R; ++r) s[r] = sdpa_dot4(Qs[(rbase + r) * DQ + d4], k0v, k1v, k2v, k3v, s[r]);
    }
    // Online softmax, one row at a time across the simdgroup.
    const int32_t j = k0 + int32_t(lane);
    for (int r = 0; r < R; ++r) {
      const int32_t i = q0 + rbase + r;
      const float x = sdpa_masked(a, mask, mo, i, j, s[r]);
      const float m_new = fmax(m[r], simd_max(x));
      // A row with no key yet keeps p = 0 and its (zero) sums instead of exp(-inf + inf).
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float p = exp(x - m_use);
      const float alpha = exp(m[r] - m_use);
      l[r] = l[r] * alpha + simd_sum(p);
      m[r] = m_new;
      for (int c = 0; c < CV; ++c) o[r * CV + c] *= alpha;
      Ps[(rbase + r) * BK + int32_t(lane)] = p * sdpa_keep(a, b, i, j);
    }
    if (SHARED_KV) {
      threadgroup_barrier(mem_flags::mem_threadgroup);  // every simdgroup is done with Kt
      for (int32_t e = int32_t(tid); e < BK * DMAX; e += NT) {
        const int32_t jj = e / DMAX, c = e - jj * DMAX;
        KV[e] = k0 + jj < S && c < Dv
                    ? float(v[sdpa_row(a, vo, FM_SDPA_V, k0 + jj) + uint64_t(c)]) : 0.0f;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    } else {
      simdgroup_barrier(mem_flags::mem_threadgroup);  // P rows are the simdgroup's own
    }
    // O[r][c] += sum_j P[r][j] V[j][c] for c = lane + 32 * cc.
    for (int jj = 0; jj < BK; ++jj) {
      float vv[CV];
      for (int c = 0; c < CV; ++c) vv[c] = KV[VOFF + jj * DMAX + int32_t(lane) + 32 * c];
      for (int r = 0; r < R; ++r) {
        const float p = Ps[(rbase + r) * BK + jj];
        for (int c = 0; c < CV; ++c) o[r * CV + c] = fma(p, vv[c], o[r * CV + c]);
      }
    }
  }

  for (int r = 0; r < R; ++r) {
    const int32_t i = q0 + rbase + r;
    if (i < L) {
      const uint64_t row = uint64_t(b) * uint64_t(L) + uint64_t(i);
      const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];  // no key takes part: 0, as PyTorch
      for (int c = 0; c < CV; ++c) {
        const int32_t col = int32_t(lane) + 32 * c;
        if (col < Dv) out[sdpa_row(a, oo, FM_SDPA_O, i) + uint64_t(col)] = T(o[r * CV + c] * inv);
      }
      if (lane == 0u) lse[row] = m[r] + log(l[r]);
    }
  }
}

FM_INSTANTIATE("sdpa_forward_d64_float32", sdpa_forward, float, 64, 4, false);
FM_INSTANTIATE("sdpa_forward_d128_float32", sdpa_forward, float, 128, 2, true);
FM_INSTANTIATE("sdpa_forward_d64_float16", sdpa_forward, half, 64, 4, false);
FM_INSTANTIATE("sdpa_forward_d128_float16", sdpa_forward, half, 128, 2, true);

// ------------------------------------------------------------------------- tiled forward
// sdpa_forward_tiled: the forward for head dims <= 64 with register blocking (ops/attention.cpp
// picks it; FASTMETAL_SDPA_FORWARD=classic picks sdpa_forward instead). The kernel above reads
// ~0.5 threadgroup values per FMA and so runs at the threadgroup memory's speed; here every
// thread computes a 4 x 4 micro-tile of the scores and a 4 x 8 micro-tile of the output from
// float4s it loads once:
//   threadgroup: BQ = 64 query rows, BK = 32 keys per tile, 128 threads (4 simdgroups of 32);
//     thread t: lane = t % 32, row quad rq = 4 * (t / 32) + lane / 8 (rows 4 rq .. 4 rq + 3),
//     key quad kg = lane % 8 (keys 4 kg .. 4 kg + 3 of the tile; output columns 4 kg .. + 3
//     and 32 + 4 kg .. + 3). The 8 lanes sharing a row quad are adjacent (8 g .. 8 g + 7).
//   scores: per column d, one float4 of Qt[d] (4 rows, the same address for the 8 lanes of a
//     row quad: a broadcast) and one of Kt[d] (4 keys, 8 distinct float4s in a row) feed 16
//     FMAs: 64 columns = 128 float4 loads for 1,024 FMAs.
//   row max: the thread's 4 keys, then 3 simd_shuffle_down steps within the 8 lanes (lane
//     8 g ends with the max of its group) and 4 simd_broadcasts from lanes 0, 8, 16, 24 (the
//     portable subset has no xor shuffle; a broadcast lane must be uniform on Metal): 28
//     shuffles per tile instead of 2 full reductions per row. The running sum l is kept per
//     thread over its own keys (every lane of a row uses the same max) and summed across the
//     8 lanes once, at the end.
//   P V: per key, one float4 of P (4 rows, a broadcast) and two of V (8 columns) feed 32
//     FMAs: 96 float4 loads for 1,024 FMAs. In all ~0.11 loads per FMA, and per warp each load
//     touches at most 128 distinct bytes without bank conflicts (one 128-byte wavefront where
//     the hardware merges repeated addresses across the warp): ~0.11 wavefronts per warp FMA
//     instruction, against ~0.5 in sdpa_forward (per 4 columns: 4 scalar Kt loads and 8 Q
//     broadcasts for 32 FMAs; per key 2 V loads and 8 P broadcasts for 16), which is what
//     bounds that kernel where an SM serves 4 FMA instructions but one wavefront per cycle.
// The score s[i][j] is formed exactly as the other kernels form it (Q pre-scaled when staged,
// fma over d = 0, 1, .. in order, as sdpa_dot4 chains them), the tile maxima are exact, p and
// alpha the same exp of the same operands, and O is rescaled and accumulated over the keys in
// the same order, so out differs from sdpa_forward's only through l (its partial sums are
// added in another order: a few ulps) and lse likewise. The backward's P = exp(s - lse) <= 1
// still holds: l >= 1 in any order (the max's own term is exp(0) = 1 and the others are >= 0).
// Threadgroup memory: Qt 64 x 64 (16 KiB, staged once), Kt 64 x 32 then V 32 x 64 in one
// buffer (8 KiB: V is staged after the scores, 4 barriers per tile), Pt 32 x 64 (8 KiB):
// 32,768 bytes, the Apple limit exactly. Pt's row quads are XOR-swizzled by the key's quad so
// the 8 lanes writing one key quad's 4 rows hit 8 distinct 16-byte columns. Registers per
// thread: 16 scores, 32 accumulators, 4 + 4 row stats, ~70 in all.
// Discrete GPUs (FM_INSTANTIATE_DISCRETE; ops/attention.cpp): with V in its own 8 KiB after
// Kt (SPLIT, 40,960 bytes) a tile needs 2 barriers, not 4: K and V are stored together, and
// between the P writes and the P V reads a simdgroup barrier is enough (a row quad's 8 lanes
// are one simdgroup's: Pt's rows are its own). "split" loads K and V after the first barrier
// (one wait on device memory per tile, not two); "prefetch" (PREFETCH)
// loads tile k0 + 32 into registers (8 float4s) after the P writes, so the loads fly during
// the P V FMAs, and stores them after the next tile's first barrier: no wait on device memory
// between barriers. Same scores, p, sums and order as the 32 KiB instance: bit for bit.
// ptxas (CUDA 13.0, sm_90, float32): at the attention files' -maxrregcount=128 the 32 KiB
// instance uses 128 registers (8 bytes spilled), split 128 (120 B), prefetch 128 (332 B
// stored, 468 B loaded); uncapped 157, 167, 167 and no spills. The spills sit in the per-tile
// softmax and staging code, none in the score or P V FMA loops, and the prefetched float4s
// stay in registers across P V (SASS, nvdisasm). Measured on an H100 neither beat the 32 KiB
// instance (4 x 8 x 1024 causal: 346 us, split 404, prefetch 443), so both are opt-in
// (FASTMETAL_SDPA_FORWARD=split|prefetch).

enum : int32_t {
  kSdpaTiledRows = 64,     // query rows per threadgroup
  kSdpaTiledKeys = 32,     // keys per tile
  kSdpaTiledDim = 64,      // the largest head dim it serves
  kSdpaTiledThreads = 128,
};

// The maximum of v over the 8 adjacent lanes 8 g .. 8 g + 7 of the caller (every lane calls
// it, in uniform control flow): a shuffle_down tree leaves it in lane 8 g, then each lane takes
// its group's from 4 uniform broadcasts. Exact (max), so the order does not matter.
FM_FUNC float sdpa_group8_max(float v, uint32_t lane) {
  v = fmax(v, simd_shuffle_down(v, ushort(4)));
  v = fmax(v, simd_shuffle_down(v, ushort(2)));
  v = fmax(v, simd_shuffle_down(v, ushort(1)));
  const float g0 = simd_broadcast(v, ushort(0)), g1 = simd_broadcast(v, ushort(8));
  const float g2 = simd_broadcast(v, ushort(16)), g3 = simd_broadcast(v, ushort(24));
  const uint32_t g = lane / 8u;
  return g == 0u ? g0 : g == 1u ? g1 : g == 2u ? g2 : g3;
}

// The sum of v over the same 8 lanes (lane order 8 g + {0, 4, 2, 6, 1, 5, 3, 7} pairwise).
FM_FUNC float sdpa_group8_sum(float v, uint32_t lane) {
  v += simd_shuffle_down(v, ushort(4));
  v += simd_shuffle_down(v, ushort(2));
  v += simd_shuffle_down(v, ushort(1));
  const float g0 = simd_broadcast(v, ushort(0)), g1 = simd_broadcast(v, ushort(8));
  const float g2 = simd_broadcast(v, ushort(16)), g3 = simd_broadcast(v, ushort(24));
  const uint32_t g = lane / 8u;
  return g == 0u ? g0 : g == 1u ? g1 : g == 2u ? g2 : g3;
}

// SPLIT: key tile k0's K block (at most one 4 x 4 block a thread: KQ * 16 = 128 threads) into
// xk and its V quads (4 a thread) into xv, zero past S, D and Dv: the loads of the 32 KiB
// instance's staging, into registers that the kernel then stores.
template <typename T>
FM_FUNC void sdpa_tiled_fetch_k(device const T* k, constant SdpaArgs& a, uint64_t ko, int32_t k0,
                                int32_t tid, int32_t D4, bool quads, thread float4* xk) {
  constexpr int KQ = kSdpaTiledKeys / 4;
  if (tid < KQ * D4) {
    const int32_t j4 = tid % KQ, c = (tid / KQ) * 4;
    FM_UNROLL
    for (int u = 0; u < 4; ++u) {
      const int32_t j = k0 + 4 * j4 + u;
      xk[u] = j < a.S ? sdpa_load4q(k, sdpa_row(a, ko, FM_SDPA_K, j), c, a.E, 1.0f, quads) : float4(0.0f);
    }
  }
}
template <typename T>
FM_FUNC void sdpa_tiled_fetch_v(device const T* v, constant SdpaArgs& a, uint64_t vo, int32_t k0,
                                int32_t tid, bool quads, thread float4* xv) {
  constexpr int VQ = kSdpaTiledDim / 4;
  FM_UNROLL
  for (int it = 0; it < kSdpaTiledKeys * VQ / kSdpaTiledThreads; ++it) {
    const int32_t e = tid + it * kSdpaTiledThreads;
    const int32_t jj = e / VQ, c = (e % VQ) * 4, j = k0 + jj;
    xv[it] = j < a.S ? sdpa_load4q(v, sdpa_row(a, vo, FM_SDPA_V, j), c, a.Ev, 1.0f, quads) : float4(0.0f);
  }
}
// Grid (threadgroups): x = ceil(L / 64) query tiles, y = nbatch; 128 threads each.
template <typename T, bool SPLIT, bool PREFETCH>
kernel void sdpa_forward_tiled(device const T* q [[buffer(0)]],
                               device const T* k [[buffer(1)]],
                               device const T* v [[buffer(2)]],
                               device const float* mask [[buffer(3)]],
                               device T* out [[buffer(4)]],
                               device float* lse [[buffer(5)]],
                               constant SdpaArgs& a [[buffer(6)]],
                               uint3 tg_pos [[threadgroup_position_in_grid]],
                               uint32_t tid [[thread_index_in_threadgroup]],
                               uint32_t lane [[thread_index_in_simdgroup]],
                               uint32_t sg [[simdgroup_index_in_threadgroup]]) {
  constexpr int BQ = kSdpaTiledRows;
  constexpr int BK = kSdpaTiledKeys;
  constexpr int NT = kSdpaTiledThreads;
  constexpr int RQ = BQ / 4;   // float4 per Qt / Pt row (row quads)
  constexpr int KQ = BK / 4;   // float4 per Kt row (key quads)
  constexpr int VQ = kSdpaTiledDim / 4;  // float4 per V row
  constexpr int VOFF = SPLIT ? BK * VQ : 0;  // V's first float4 in KV
  static_assert(NT == 32 * 4 && RQ == 16 && KQ == 8 && VQ == 2 * KQ && BK * VQ % NT == 0 &&
                KQ * VQ == NT, "tile shape");
  threadgroup float4 Qt[kSdpaTiledDim * kSdpaTiledRows / 4];  // Qt[d][row quad]
  // Kt[d][key quad], then V[j][c quad] in the same place, or after it (SPLIT).
  threadgroup float4 KV[kSdpaTiledDim * kSdpaTiledKeys / 4 + SPLIT * kSdpaTiledKeys * kSdpaTiledDim / 4];
  threadgroup float4 Pt[kSdpaTiledKeys * kSdpaTiledRows / 4]; // Pt[j][row quad ^ (j / 4)]

  const int32_t b = int32_t(tg_pos.y);
  const bool quads = a.quads != 0;
  const int32_t L = a.L, S = a.S, D = a.E, Dv = a.Ev;
  const int32_t D4 = (D + 3) / 4;
  const uint64_t qo = sdpa_offset(a, b, FM_SDPA_Q), ko = sdpa_offset(a, b, FM_SDPA_K);
  const uint64_t vo = sdpa_offset(a, b, FM_SDPA_V), oo = sdpa_offset(a, b, FM_SDPA_O);
  const uint64_t mo = sdpa_mask_offset(a, b);
  const int32_t rq = int32_t(sg) * 4 + int32_t(lane) / 8, kg = int32_t(lane) % 8;
  // Causal: tile t's work grows with t, so group t takes tiles t and nt - 1 - t (the same
  // work in every group; sdpa_tile_passes).
  const int32_t nt = (L + BQ - 1) / BQ, t = int32_t(tg_pos.x);
  const int32_t npass = sdpa_tile_passes(a, nt, t);
  for (int32_t pass = 0; pass < npass; ++pass) {
    const int32_t q0 = sdpa_tile_pass(nt, t, pass) * BQ;
    threadgroup_barrier(mem_flags::mem_threadgroup);  // the last pass's readers of Qt are done

    // Qt, scaled, zero past D and L: thread (row quad, column quad) transposes a 4 x 4 block.
    for (int32_t e = int32_t(tid); e < RQ * D4; e += NT) {
      const int32_t r4 = e % RQ, c = (e / RQ) * 4;
      float4 x[4];
      FM_UNROLL
      for (int vv = 0; vv < 4; ++vv) {
        const int32_t i = q0 + 4 * r4 + vv;
        x[vv] = i < L ? sdpa_load4q(q, sdpa_row(a, qo, FM_SDPA_Q, i), c, D, a.scale, quads) : float4(0.0f);
      }
      Qt[(c + 0) * RQ + r4] = float4(x[0].x, x[1].x, x[2].x, x[3].x);
      Qt[(c + 1) * RQ + r4] = float4(x[0].y, x[1].y, x[2].y, x[3].y);
      Qt[(c + 2) * RQ + r4] = float4(x[0].z, x[1].z, x[2].z, x[3].z);
      Qt[(c + 3) * RQ + r4] = float4(x[0].w, x[1].w, x[2].w, x[3].w);
    }

    float o[32];            // o[vv * 8 + c]: row 4 rq + vv, columns 4 kg + c (c < 4), 28 + 4 kg + c
    float m[4], l[4];
    FM_UNROLL
    for (int vv = 0; vv < 4; ++vv) {
      m[vv] = -INFINITY;
      l[vv] = 0.0f;
      FM_UNROLL
      for (int c = 0; c < 8; ++c) o[vv * 8 + c] = 0.0f;
    }
    const int32_t k_end = a.causal != 0 ? min(S, q0 + BQ) : S;
    float4 xk[4], xv[BK * VQ / NT];  // SPLIT: the next tile, fetched during this one's P V
    if (PREFETCH) {
      sdpa_tiled_fetch_k(k, a, ko, 0, int32_t(tid), D4, quads, xk);
      sdpa_tiled_fetch_v(v, a, vo, 0, int32_t(tid), quads, xv);
    }
    for (int32_t k0 = 0; k0 < k_end; k0 += BK) {
      threadgroup_barrier(mem_flags::mem_threadgroup);  // the last tile's P V is done
      if (SPLIT) {
        // K and V in place before one barrier (prefetched, or loaded here: K's loads, then
        // V's, then the stores).
        if (!PREFETCH) {
          sdpa_tiled_fetch_k(k, a, ko, k0, int32_t(tid), D4, quads, xk);
          sdpa_tiled_fetch_v(v, a, vo, k0, int32_t(tid), quads, xv);
        }
        if (int32_t(tid) < KQ * D4) {  // Kt from xk, transposed as below
          const int32_t j4 = int32_t(tid) % KQ, c = (int32_t(tid) / KQ) * 4;
          KV[(c + 0) * KQ + j4] = float4(xk[0].x, xk[1].x, xk[2].x, xk[3].x);
          KV[(c + 1) * KQ + j4] = float4(xk[0].y, xk[1].y, xk[2].y, xk[3].y);
          KV[(c + 2) * KQ + j4] = float4(xk[0].z, xk[1].z, xk[2].z, xk[3].z);
          KV[(c + 3) * KQ + j4] = float4(xk[0].w, xk[1].w, xk[2].w, xk[3].w);
        }
        FM_UNROLL
        for (int it = 0; it < BK * VQ / NT; ++it) KV[VOFF + int32_t(tid) + it * NT] = xv[it];
      }
      // Kt: thread (key quad, column quad) transposes a 4 x 4 block (8 adjacent lanes write one
      // row of Kt: 128 contiguous bytes).
      for (int32_t e = int32_t(tid); !SPLIT && e < KQ * D4; e += NT) {
        const int32_t j4 = e % KQ, c = (e / KQ) * 4;
        float4 x[4];
        FM_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int32_t j = k0 + 4 * j4 + u;
          x[u] = j < S ? sdpa_load4q(k, sdpa_row(a, ko, FM_SDPA_K, j), c, D, 1.0f, quads) : float4(0.0f);
        }
        KV[(c + 0) * KQ + j4] = float4(x[0].x, x[1].x, x[2].x, x[3].x);
        KV[(c + 1) * KQ + j4] = float4(x[0].y, x[1].y, x[2].y, x[3].y);
        KV[(c + 2) * KQ + j4] = float4(x[0].z, x[1].z, x[2].z, x[3].z);
        KV[(c + 3) * KQ + j4] = float4(x[0].w, x[1].w, x[2].w, x[3].w);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);

      // s[vv * 4 + u] = score of row 4 rq + vv and key 4 kg + u, fma over d in order.
      float s[16];
      FM_UNROLL
      for (int e = 0; e < 16; ++e) s[e] = 0.0f;
      for (int32_t d = 0; d < 4 * D4; ++d) {
        const float4 qq = Qt[d * RQ + rq], kk = KV[d * KQ + kg];
        FM_UNROLL
        for (int vv = 0; vv < 4; ++vv) {
          const float qv = sdpa_comp(qq, vv);
          s[vv * 4 + 0] = fma(qv, kk.x, s[vv * 4 + 0]);
          s[vv * 4 + 1] = fma(qv, kk.y, s[vv * 4 + 1]);
          s[vv * 4 + 2] = fma(qv, kk.z, s[vv * 4 + 2]);
          s[vv * 4 + 3] = fma(qv, kk.w, s[vv * 4 + 3]);
        }
      }
      // Online softmax; p (dropout applied) goes to Pt for the P V step.
      float pk[16];
      FM_UNROLL
      for (int vv = 0; vv < 4; ++vv) {
        const int32_t i = q0 + 4 * rq + vv;
        float x[4];
        float mx = -INFINITY;
        FM_UNROLL
        for (int u = 0; u < 4; ++u) {
          x[u] = sdpa_masked(a, mask, mo, i, k0 + 4 * kg + u, s[vv * 4 + u]);
          mx = fmax(mx, x[u]);
        }
        const float m_new = fmax(m[vv], sdpa_group8_max(mx, lane));
        // A row with no key yet keeps p = 0 and its (zero) sums instead of exp(-inf + inf).
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = exp(m[vv] - m_use);
        float ps = 0.0f;
        FM_UNROLL
        for (int u = 0; u < 4; ++u) {
          const float p = exp(x[u] - m_use);
          ps += p;
          pk[u * 4 + vv] = p * sdpa_keep(a, b, i, k0 + 4 * kg + u);
        }
        l[vv] = l[vv] * alpha + ps;
        m[vv] = m_new;
        FM_UNROLL
        for (int c = 0; c < 8; ++c) o[vv * 8 + c] *= alpha;
      }
      FM_UNROLL
      for (int u = 0; u < 4; ++u)
        Pt[(4 * kg + u) * RQ + (rq ^ kg)] = float4(pk[u * 4], pk[u * 4 + 1], pk[u * 4 + 2], pk[u * 4 + 3]);
      if (SPLIT) {
        // The next tile's loads fly during this tile's P V (the last tile has none).
        if (PREFETCH && k0 + BK < k_end) {
          sdpa_tiled_fetch_k(k, a, ko, k0 + BK, int32_t(tid), D4, quads, xk);
          sdpa_tiled_fetch_v(v, a, vo, k0 + BK, int32_t(tid), quads, xv);
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);  // a row quad's Pt is its simdgroup's own
      } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);  // every thread is done with Kt
        // V: the thread's 4 loads first, then the stores (one wait, not four).
        FM_UNROLL
        for (int it = 0; it < BK * VQ / NT; ++it) {
          const int32_t e = int32_t(tid) + it * NT;
          const int32_t jj = e / VQ, c = (e % VQ) * 4, j = k0 + jj;
          xv[it] = j < S ? sdpa_load4q(v, sdpa_row(a, vo, FM_SDPA_V, j), c, Dv, 1.0f, quads) : float4(0.0f);
        }
        FM_UNROLL
        for (int it = 0; it < BK * VQ / NT; ++it) KV[int32_t(tid) + it * NT] = xv[it];
        threadgroup_barrier(mem_flags::mem_threadgroup);
      }
      // O[r][c] += sum_j P[r][j] V[j][c], keys in order.
      for (int jj = 0; jj < BK; ++jj) {
        const float4 pp = Pt[jj * RQ + (rq ^ (jj / 4))];
        const float4 va = KV[VOFF + jj * VQ + kg], vb = KV[VOFF + jj * VQ + KQ + kg];
        FM_UNROLL
        for (int vv = 0; vv < 4; ++vv) {
          const float p = sdpa_comp(pp, vv);
          o[vv * 8 + 0] = fma(p, va.x, o[vv * 8 + 0]);
          o[vv * 8 + 1] = fma(p, va.y, o[vv * 8 + 1]);
          o[vv * 8 + 2] = fma(p, va.z, o[vv * 8 + 2]);
          o[vv * 8 + 3] = fma(p, va.w, o[vv * 8 + 3]);
          o[vv * 8 + 4] = fma(p, vb.x, o[vv * 8 + 4]);
          o[vv * 8 + 5] = fma(p, vb.y, o[vv * 8 + 5]);
          o[vv * 8 + 6] = fma(p, vb.z, o[vv * 8 + 6]);
          o[vv * 8 + 7] = fma(p, vb.w, o[vv * 8 + 7]);
        }
      }
    }

    FM_UNROLL
    for (int vv = 0; vv < 4; ++vv) {
      const float lt = sdpa_group8_sum(l[vv], lane);  // every lane, before any leaves
      const int32_t i = q0 + 4 * rq + vv;
      if (i < L) {
        const float inv = lt == 0.0f ? 0.0f : 1.0f / lt;  // no key takes part: 0, as PyTorch
        const uint64_t row = sdpa_row(a, oo, FM_SDPA_O, i);
        FM_UNROLL
        for (int c = 0; c < 8; ++c) {
          const int32_t col = c < 4 ? 4 * kg + c : 4 * KQ + 4 * kg + c - 4;
          if (col < Dv) out[row + uint64_t(col)] = T(o[vv * 8 + c] * inv);
        }
        if (kg == 0) lse[uint64_t(b) * uint64_t(L) + uint64_t(i)] = m[vv] + log(lt);
      }
    }
  }
}

FM_INSTANTIATE("sdpa_forward_tiled_d64_float32", sdpa_forward_tiled, float, false, false);
FM_INSTANTIATE("sdpa_forward_tiled_d64_float16", sdpa_forward_tiled, half, false, false);
FM_INSTANTIATE_DISCRETE("sdpa_forward_split_d64_float32", sdpa_forward_tiled, float, true, false);
FM_INSTANTIATE_DISCRETE("sdpa_forward_split_d64_float16", sdpa_forward_tiled, half, true, false);
FM_INSTANTIATE_DISCRETE("sdpa_forward_prefetch_d64_float32", sdpa_forward_tiled, float, true, true);
FM_INSTANTIATE_DISCRETE("sdpa_forward_prefetch_d64_float16", sdpa_forward_tiled, half, true, true);
