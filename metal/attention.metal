// Fused scaled-dot-product attention, forward and backward (attention_args.h):
//   O = softmax(Q K^T * scale + mask) V   per batch index, with an optional boolean or additive
// mask, PyTorch's top-left causal mask and dropout on the attention weights. The L x S score
// matrix never reaches device memory: tiles of it live in registers and threadgroup memory, the
// softmax is the online one (running max m and sum l per row, the partial output rescaled by
// exp(m_old - m_new) when the max grows), and the forward saves lse = m + log(l) per row, so the
// backward recomputes P = exp(s - lse) tile by tile (FlashAttention-2). Memory is O(L + S) per
// batch index beyond the inputs and outputs.
//
// Every operand is read or written through its own batch and row strides (attention_args.h),
// rows contiguous: head-split views and outputs laid out like the inputs cost no copy.
//
// Written for Apple GPUs first: 32-wide simdgroups (NVIDIA's warps are as wide, and the CUDA
// shim maps simd_max / simd_sum to warp shuffles, threadgroup arrays to __shared__ and the
// barriers to __syncthreads / __syncwarp; the CPU emulator runs 32 lanes), at most 32 KiB of
// threadgroup memory per group (what the DMAX = 64 tiles nearly fill), float32
// accumulation (float16 inputs are widened when staged). Head dims up to 128; the instances
// are sized for DMAX = 64 (every head dim <= 64, the fast case) and DMAX = 128. Loops run to
// the actual head dims, tiles are zero-padded to a multiple of 4 columns so rows are read as
// float4.
//
// Forward for head dims <= 64: sdpa_forward_tiled (register-blocked; its own comment below).
// Causal, the tiled kernels give each group two tiles, t and the mirror one (equal work:
// sdpa_tile_passes).
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
//
// Backward (deterministic: every output element is summed by one thread, no atomics). Head
// dims <= 64: sdpa_backward_dkdv_tiled and sdpa_backward_dq_tiled (register-blocked; their own
// comment below; FASTMETAL_SDPA_BACKWARD=classic picks the kernels described here, which
// serve head dims 65..128):
//   sdpa_backward_prep: delta[i] = rowsum(dO[i] * O[i]), one thread per row.
//   sdpa_backward_dkdv: one threadgroup of 128 threads per (tile of BK keys, batch index) keeps
//     dK, dV of its keys in registers (thread: key tid % BK, column quads tid / BK + k * 128/BK)
//     and walks the query tiles of BQ rows: stage Q (pre-scaled), dO, lse, delta; each thread
//     recomputes BQ * BK / 128 entries of P = exp(s - lse) and dP = dO . V (DMAX = 64: 2 keys x
//     2 rows, from 2 K and 2 Q float4s per 4 columns; the kernels' constants SK, SW), writes
//     P_dropped and dS = P * (dP_dropped - delta) to threadgroup memory; then dV += P^T dO,
//     dK += dS^T (scale Q). A causal group starts at the query tile of its first key.
//   sdpa_backward_dq: one threadgroup per (tile of BQ queries, batch index) keeps dQ in
//     registers (a thread: 1 column quad x BQ / QR rows; a warp: 8 quads x 4 rows) and walks
//     the key tiles: stage K and V, recompute dS as above, dQ += dS K; times scale at the end.
//   K, V, Q and dO are staged as rows padded by 4 floats, read as float4s: the keys or rows a
//   warp reads at once are 4 or 8 consecutive ones, in distinct bank groups.
//   Tiles: DMAX = 64: BQ = 16, BK = 32 (dK/dV: K + V 2 x 8.5 KiB + Q + dO 2 x 4.25 KiB + P +
//   dS 2 x 2.06 KiB = 30,464 bytes; dQ: 28,352 bytes). DMAX = 128: BQ = 8, BK = 16 (26,496 and
//   25,952 bytes): halving both tiles is what keeps two 128-wide K and V tiles under 32 KiB.
//
// Masking: a masked-out score is -inf. A row whose every score is -inf (a boolean mask with no
// True in the row, -inf additive entries only, or S = 0) has l = 0: its output is 0 and its
// lse -inf, so its P is 0 in the backward (no gradient), as PyTorch 2.13 answers (its SDPA
// gives 0 for such rows, not the NaN of a plain softmax; checked on 2.13.0). Dropout:
// the kept probabilities are scaled by 1 / (1 - p) before they meet V; l sums the undropped
// ones; the mask is a pure function of the score's flat index (attention_args.h).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "philox.h"
#include "attention_args.h"
using namespace metal;

// Element offset of batch index b in operand `which` (FM_SDPA_Q ...; attention_args.h).
FM_FUNC uint64_t sdpa_offset(constant SdpaArgs& a, int32_t b, int32_t which) {
  int64_t off = 0;
  int32_t rest = b;
  for (int32_t d = a.batch_dims - 1; d >= 0; --d) {
    const int32_t i = rest % a.batch_shape[d];
    rest /= a.batch_shape[d];
    off += int64_t(i) * a.bs[which][d];
  }
  return uint64_t(off);
}

// Element offset of batch index b in the mask.
FM_FUNC uint64_t sdpa_mask_offset(constant SdpaArgs& a, int32_t b) {
  int64_t off = 0;
  int32_t rest = b;
  for (int32_t d = a.batch_dims - 1; d >= 0; --d) {
    const int32_t i = rest % a.batch_shape[d];
    rest /= a.batch_shape[d];
    off += int64_t(i) * a.m_bs[d];
  }
  return uint64_t(off);
}

// Element offset of row i of operand `which` in batch index b (its columns follow).
FM_FUNC uint64_t sdpa_row(constant SdpaArgs& a, uint64_t batch_off, int32_t which, int32_t i) {
  return batch_off + uint64_t(i) * uint64_t(a.rs[which]);
}

// The scaled score s of (row i, key j) with the masks applied: -inf where the key is out of
// range, above the diagonal (causal) or masked out; the additive mask added. Rows past L are
// padding and never read the mask.
FM_FUNC float sdpa_masked(constant SdpaArgs& a, device const float* mask, uint64_t mo, int32_t i,
                          int32_t j, float s) {
  if (j >= a.S || i >= a.L || (a.causal != 0 && j > i)) return -INFINITY;
  if (a.mask_kind != FM_SDPA_MASK_NONE) {
    const float mv = mask[mo + uint64_t(int64_t(i) * a.m_rs + int64_t(j) * a.m_cs)];
    if (a.mask_kind == FM_SDPA_MASK_BOOL) return mv != 0.0f ? s : -INFINITY;
    return s + mv;
  }
  return s;
}

// The dropout factor of score (b, i, j): 0 (dropped) or drop_scale; 1 without dropout.
FM_FUNC float sdpa_keep(constant SdpaArgs& a, int32_t b, int32_t i, int32_t j) {
  if (a.threshold == 0u) return 1.0f;
  const uint64_t n = (uint64_t(b) * uint64_t(a.L) + uint64_t(i)) * uint64_t(a.S) + uint64_t(j);
  uint32_t r[4];
  philox4x32_10(uint32_t(n >> 2), uint32_t(n >> 34), 0u, 0u, a.key0, a.key1, r);
  return (r[uint32_t(n & 3u)] >> 8) >= a.threshold ? a.drop_scale : 0.0f;
}

// s + q . k over 4 columns, in one fixed order (the forward and both backward kernels form
// the same score bit for bit, so P = exp(s - lse) <= 1 in the backward).
FM_FUNC float sdpa_dot4(float4 q, float k0, float k1, float k2, float k3, float s) {
  s = fma(q.x, k0, s);
  s = fma(q.y, k1, s);
  s = fma(q.z, k2, s);
  return fma(q.w, k3, s);
}

// Component u of v (portable: no subscripts on vectors).
FM_FUNC float sdpa_comp(float4 v, int32_t u) {
  return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w;
}

// Four consecutive elements p[base + c .. + 3] widened to float, scaled, zero from column n on.
template <typename T>
FM_FUNC float4 sdpa_load4(device const T* p, uint64_t base, int32_t c, int32_t n, float scale) {
  return float4(c < n ? float(p[base + uint64_t(c)]) * scale : 0.0f,
                c + 1 < n ? float(p[base + uint64_t(c + 1)]) * scale : 0.0f,
                c + 2 < n ? float(p[base + uint64_t(c + 2)]) * scale : 0.0f,
                c + 3 < n ? float(p[base + uint64_t(c + 3)]) * scale : 0.0f);
}

// p[i .. i + 3] as one 16-byte load (float32: i and p 16-byte aligned, SdpaArgs::quads);
// float16 never takes this road (the host leaves quads 0), it reads the 4 elements.
FM_FUNC float4 sdpa_quad(device const float* p, uint64_t i) {
  return *((device const float4*)(p + i));
}
FM_FUNC float4 sdpa_quad(device const half* p, uint64_t i) {
  return float4(float(p[i]), float(p[i + 1]), float(p[i + 2]), float(p[i + 3]));
}

// sdpa_load4, with one 16-byte load where the host found every row aligned (quads: n % 4 == 0,
// so a quad that starts before n ends there; one from n on is zeros, as sdpa_load4 gives).
// The same values either way.
template <typename T>
FM_FUNC float4 sdpa_load4q(device const T* p, uint64_t base, int32_t c, int32_t n, float scale,
                           bool quads) {
  if (quads && c < n) return sdpa_quad(p, base + uint64_t(c)) * scale;
  return sdpa_load4(p, base, c, n, scale);
}

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
// Causal load balance of the tiled kernels: tile t of nt sees about t + 1 tiles of the other
// side (or nt - t), so with causal the grid has ceil(nt / 2) groups and group t takes tile t
// and tile nt - 1 - t in turn (one pass where they coincide); otherwise one tile each.
FM_FUNC int32_t sdpa_tile_passes(constant SdpaArgs& a, int32_t nt, int32_t t) {
  return a.causal != 0 && nt - 1 - t != t ? 2 : 1;
}
FM_FUNC int32_t sdpa_tile_pass(int32_t nt, int32_t t, int32_t pass) {
  return pass == 0 ? t : nt - 1 - t;
}

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

// ------------------------------------------------------------------------------- backward
// delta[b, i] = sum_c dO[b, i, c] * O[b, i, c]. Grid: (L, nbatch).
template <typename T>
kernel void sdpa_backward_prep(device const T* dout [[buffer(0)]],
                               device const T* out [[buffer(1)]],
                               device float* delta [[buffer(2)]],
                               constant SdpaArgs& a [[buffer(3)]],
                               uint2 gid [[thread_position_in_grid]]) {
  const int32_t b = int32_t(gid.y), i = int32_t(gid.x);
  const uint64_t g = sdpa_row(a, sdpa_offset(a, b, FM_SDPA_G), FM_SDPA_G, i);
  const uint64_t o = sdpa_row(a, sdpa_offset(a, b, FM_SDPA_O), FM_SDPA_O, i);
  float s = 0.0f;
  for (int32_t c = 0; c < a.Ev; ++c) s = fma(float(dout[g + uint64_t(c)]), float(out[o + uint64_t(c)]), s);
  delta[uint64_t(b) * uint64_t(a.L) + uint64_t(i)] = s;
}

FM_INSTANTIATE("sdpa_backward_prep_float32", sdpa_backward_prep, float);
FM_INSTANTIATE("sdpa_backward_prep_float16", sdpa_backward_prep, half);

// dK and dV of BK keys. Grid (threadgroups): x = ceil(S / BK) key tiles, y = nbatch; 128
// threads each.
template <typename T, int DMAX, int BQ, int BK>
kernel void sdpa_backward_dkdv(device const T* q [[buffer(0)]],
                               device const T* k [[buffer(1)]],
                               device const T* v [[buffer(2)]],
                               device const float* mask [[buffer(3)]],
                               device const T* dout [[buffer(4)]],
                               device const float* lse [[buffer(5)]],
                               device const float* delta [[buffer(6)]],
                               device T* dk [[buffer(7)]],
                               device T* dv [[buffer(8)]],
                               constant SdpaArgs& a [[buffer(9)]],
                               uint3 tg_pos [[threadgroup_position_in_grid]],
                               uint32_t tid [[thread_index_in_threadgroup]]) {
  constexpr int NT = 128;
  constexpr int KT = BK + 1;         // padded row of P and dS
  constexpr int KS = DMAX / 4 + 1;    // float4s per staged K / V row: 8 lanes, 8 bank groups
  constexpr int DQ = DMAX / 4;
  constexpr int QS = DQ + 1;           // float4s per staged Q / dO row (padded: bank spread)
  // Scores and dP: thread (key group tid % 4 + 4 * (tid / 32), row group (tid % 32) / 4) takes
  // SK keys x SW rows (keys SK * group + u, rows group + 8 w), so one warp's load of K or Q
  // touches 4 keys or 8 rows: at most 128 distinct bytes, no bank conflict.
  constexpr int SE = BQ * BK / NT;
  constexpr int SK = SE >= 4 ? 2 : 1;
  constexpr int SW = SE / SK;
  static_assert(BK / SK == 16 && BQ / SW == 8 && SK * SW == SE, "score micro-tile");
  constexpr int RG = NT / BK;          // dK, dV: thread tid has key tid % BK, group tid / BK
  constexpr int CG = DQ / RG;          // column quads of dK (and of dV) per thread
  static_assert(NT % BK == 0 && BQ % RG == 0 && DQ % RG == 0, "tile shape");
  threadgroup float4 Ks[BK * DMAX / 4 + BK];  // K rows, padded by 4 floats (bank spread)
  threadgroup float4 Vs[BK * DMAX / 4 + BK];
  threadgroup float4 Qs[BQ * DMAX / 4 + BQ];
  threadgroup float4 Gs[BQ * DMAX / 4 + BQ];
  threadgroup float Ps[BQ * BK + BQ];
  threadgroup float Ss[BQ * BK + BQ];
  threadgroup float Ls[BQ];
  threadgroup float Ds[BQ];

  const int32_t b = int32_t(tg_pos.y);
  const int32_t k0 = int32_t(tg_pos.x) * BK;
  const int32_t L = a.L, S = a.S, D = a.E, Dv = a.Ev;
  const int32_t D4 = (D + 3) / 4, V4 = (Dv + 3) / 4;
  const uint64_t qo = sdpa_offset(a, b, FM_SDPA_Q), ko = sdpa_offset(a, b, FM_SDPA_K);
  const uint64_t vo = sdpa_offset(a, b, FM_SDPA_V), go = sdpa_offset(a, b, FM_SDPA_G);
  const uint64_t mo = sdpa_mask_offset(a, b);
  const int32_t j = int32_t(tid) % BK, rg = int32_t(tid) / BK;
  const int32_t sk0 = SK * (int32_t(tid) % 4 + 4 * (int32_t(tid) / 32)), sr0 = int32_t(tid) % 32 / 4;

  for (int32_t e = int32_t(tid); e < BK * KS; e += NT) {
    const int32_t jj = e / KS, c = (e - jj * KS) * 4;
    const bool in = k0 + jj < S;
    Ks[e] = in ? sdpa_load4(k, sdpa_row(a, ko, FM_SDPA_K, k0 + jj), c, D, 1.0f) : float4(0.0f);
    Vs[e] = in ? sdpa_load4(v, sdpa_row(a, vo, FM_SDPA_V, k0 + jj), c, Dv, 1.0f) : float4(0.0f);
  }
  float4 dka[CG], dva[CG];
  for (int g = 0; g < CG; ++g) {
    dka[g] = float4(0.0f);
    dva[g] = float4(0.0f);
  }
  // Causal: rows before the first key of the tile see none of its keys.
  const int32_t q_begin = a.causal != 0 ? (k0 / BQ) * BQ : 0;
  const uint64_t row0 = uint64_t(b) * uint64_t(L);
  for (int32_t q0 = q_begin; q0 < L; q0 += BQ) {
    threadgroup_barrier(mem_flags::mem_threadgroup);  // the last tile's readers are done
    for (int32_t e = int32_t(tid); e < BQ * DQ; e += NT) {
      const int32_t r = e / DQ, c = (e - r * DQ) * 4, i = q0 + r;
      Qs[r * QS + c / 4] = i < L ? sdpa_load4(q, sdpa_row(a, qo, FM_SDPA_Q, i), c, D, a.scale) : float4(0.0f);
      Gs[r * QS + c / 4] = i < L ? sdpa_load4(dout, sdpa_row(a, go, FM_SDPA_G, i), c, Dv, 1.0f) : float4(0.0f);
    }
    if (int32_t(tid) < BQ) {
      const int32_t i = q0 + int32_t(tid);
      Ls[tid] = i < L ? lse[row0 + uint64_t(i)] : 0.0f;
      Ds[tid] = i < L ? delta[row0 + uint64_t(i)] : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // SK x SW scores and dP entries from SK + SW float4s per 4 columns (the same fma chain
    // per score as the forward's, so s is the forward's bit for bit).
    float sv[SE], dpv[SE];
    FM_UNROLL
    for (int e = 0; e < SE; ++e) {
      sv[e] = 0.0f;
      dpv[e] = 0.0f;
    }
    for (int32_t d4 = 0; d4 < D4; ++d4) {
      float4 kk[SK], qq[SW];
      FM_UNROLL
      for (int u = 0; u < SK; ++u) kk[u] = Ks[(sk0 + u) * KS + d4];
      FM_UNROLL
      for (int w = 0; w < SW; ++w) qq[w] = Qs[(sr0 + 8 * w) * QS + d4];
      FM_UNROLL
      for (int w = 0; w < SW; ++w) {
        FM_UNROLL
        for (int u = 0; u < SK; ++u)
          sv[w * SK + u] = sdpa_dot4(qq[w], kk[u].x, kk[u].y, kk[u].z, kk[u].w, sv[w * SK + u]);
      }
    }
    for (int32_t c4 = 0; c4 < V4; ++c4) {
      float4 vk[SK], gg[SW];
      FM_UNROLL
      for (int u = 0; u < SK; ++u) vk[u] = Vs[(sk0 + u) * KS + c4];
      FM_UNROLL
      for (int w = 0; w < SW; ++w) gg[w] = Gs[(sr0 + 8 * w) * QS + c4];
      FM_UNROLL
      for (int w = 0; w < SW; ++w) {
        FM_UNROLL
        for (int u = 0; u < SK; ++u)
          dpv[w * SK + u] = sdpa_dot4(gg[w], vk[u].x, vk[u].y, vk[u].z, vk[u].w, dpv[w * SK + u]);
      }
    }
    FM_UNROLL
    for (int e = 0; e < SE; ++e) {
      const int32_t r = sr0 + 8 * (e / SK), i = q0 + r, jk = sk0 + e % SK;
      const float s = sv[e], dp = dpv[e];
      const float x = sdpa_masked(a, mask, mo, i, k0 + jk, s);
      const float p = x == -INFINITY ? 0.0f : exp(x - Ls[r]);
      const float keep = i < L && k0 + jk < S ? sdpa_keep(a, b, i, k0 + jk) : 0.0f;
      Ps[r * KT + jk] = p * keep;
      Ss[r * KT + jk] = p == 0.0f ? 0.0f : p * (dp * keep - Ds[r]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int r = 0; r < BQ; ++r) {
      const float pj = Ps[r * KT + j], sj = Ss[r * KT + j];
      for (int g = 0; g < CG; ++g) {
        const float4 gq = Gs[r * QS + rg + g * RG], qq = Qs[r * QS + rg + g * RG];
        dva[g] = float4(fma(pj, gq.x, dva[g].x), fma(pj, gq.y, dva[g].y), fma(pj, gq.z, dva[g].z),
                        fma(pj, gq.w, dva[g].w));
        dka[g] = float4(fma(sj, qq.x, dka[g].x), fma(sj, qq.y, dka[g].y), fma(sj, qq.z, dka[g].z),
                        fma(sj, qq.w, dka[g].w));
      }
    }
  }
  if (k0 + j < S) {
    const uint64_t krow = sdpa_row(a, sdpa_offset(a, b, FM_SDPA_DK), FM_SDPA_DK, k0 + j);
    const uint64_t vrow = sdpa_row(a, sdpa_offset(a, b, FM_SDPA_DV), FM_SDPA_DV, k0 + j);
    for (int g = 0; g < CG; ++g) {
      for (int32_t u = 0; u < 4; ++u) {
        const int32_t col = 4 * (rg + g * RG) + u;
        if (col < D) dk[krow + uint64_t(col)] = T(sdpa_comp(dka[g], u));
        if (col < Dv) dv[vrow + uint64_t(col)] = T(sdpa_comp(dva[g], u));
      }
    }
  }
}

FM_INSTANTIATE("sdpa_backward_dkdv_d64_float32", sdpa_backward_dkdv, float, 64, 16, 32);
FM_INSTANTIATE("sdpa_backward_dkdv_d128_float32", sdpa_backward_dkdv, float, 128, 8, 16);
FM_INSTANTIATE("sdpa_backward_dkdv_d64_float16", sdpa_backward_dkdv, half, 64, 16, 32);
FM_INSTANTIATE("sdpa_backward_dkdv_d128_float16", sdpa_backward_dkdv, half, 128, 8, 16);

// dQ of BQ queries. Grid (threadgroups): x = ceil(L / BQ) query tiles, y = nbatch; 128
// threads each.
template <typename T, int DMAX, int BQ, int BK>
kernel void sdpa_backward_dq(device const T* q [[buffer(0)]],
                             device const T* k [[buffer(1)]],
                             device const T* v [[buffer(2)]],
                             device const float* mask [[buffer(3)]],
                             device const T* dout [[buffer(4)]],
                             device const float* lse [[buffer(5)]],
                             device const float* delta [[buffer(6)]],
                             device T* dq [[buffer(7)]],
                             constant SdpaArgs& a [[buffer(8)]],
                             uint3 tg_pos [[threadgroup_position_in_grid]],
                             uint32_t tid [[thread_index_in_threadgroup]]) {
  constexpr int NT = 128;
  constexpr int KT = BK + 1;         // padded row of P and dS
  constexpr int KS = DMAX / 4 + 1;    // float4s per staged K / V row: 8 lanes, 8 bank groups
  constexpr int DQ = DMAX / 4;
  constexpr int QS = DQ + 1;           // float4s per staged Q / dO row (padded: bank spread)
  // Scores and dP: thread (key group tid % 4 + 4 * (tid / 32), row group (tid % 32) / 4) takes
  // SK keys x SW rows (keys SK * group + u, rows group + 8 w), so one warp's load of K or Q
  // touches 4 keys or 8 rows: at most 128 distinct bytes, no bank conflict.
  constexpr int SE = BQ * BK / NT;
  constexpr int SK = SE >= 4 ? 2 : 1;
  constexpr int SW = SE / SK;
  static_assert(BK / SK == 16 && BQ / SW == 8 && SK * SW == SE, "score micro-tile");
  constexpr int QR = NT / DQ;          // dQ: column quad cq, rows qr + k * QR (below)
  constexpr int AR = BQ / QR;
  static_assert(NT % DQ == 0 && BQ % QR == 0 && DQ % 8 == 0 && NT / 32 % (DQ / 8) == 0 &&
                QR == 4 * (NT / 32 / (DQ / 8)), "tile shape");
  threadgroup float4 Qs[BQ * DMAX / 4 + BQ];
  threadgroup float4 Gs[BQ * DMAX / 4 + BQ];
  threadgroup float4 Ks[BK * DMAX / 4 + BK];  // K rows, padded by 4 floats (bank spread)
  threadgroup float4 Vs[BK * DMAX / 4 + BK];
  threadgroup float Ss[BQ * BK + BQ];
  threadgroup float Ls[BQ];
  threadgroup float Ds[BQ];

  const int32_t b = int32_t(tg_pos.y);
  const int32_t q0 = int32_t(tg_pos.x) * BQ;
  const int32_t L = a.L, S = a.S, D = a.E, Dv = a.Ev;
  const int32_t D4 = (D + 3) / 4, V4 = (Dv + 3) / 4;
  const uint64_t qo = sdpa_offset(a, b, FM_SDPA_Q), ko = sdpa_offset(a, b, FM_SDPA_K);
  const uint64_t vo = sdpa_offset(a, b, FM_SDPA_V), go = sdpa_offset(a, b, FM_SDPA_G);
  const uint64_t mo = sdpa_mask_offset(a, b);
  const uint64_t row0 = uint64_t(b) * uint64_t(L);
  const int32_t sk0 = SK * (int32_t(tid) % 4 + 4 * (int32_t(tid) / 32)), sr0 = int32_t(tid) % 32 / 4;
  // dQ: a warp takes 8 column quads x 4 rows, so its K float4 load is 128 distinct bytes.
  const int32_t w = int32_t(tid) / 32;
  const int32_t cq = int32_t(tid) % 8 + 8 * (w % (DQ / 8)), qr = int32_t(tid) % 32 / 8 + 4 * (w / (DQ / 8));

  for (int32_t e = int32_t(tid); e < BQ * DQ; e += NT) {
    const int32_t r = e / DQ, c = (e - r * DQ) * 4, i = q0 + r;
    Qs[r * QS + c / 4] = i < L ? sdpa_load4(q, sdpa_row(a, qo, FM_SDPA_Q, i), c, D, a.scale) : float4(0.0f);
    Gs[r * QS + c / 4] = i < L ? sdpa_load4(dout, sdpa_row(a, go, FM_SDPA_G, i), c, Dv, 1.0f) : float4(0.0f);
  }
  if (int32_t(tid) < BQ) {
    const int32_t i = q0 + int32_t(tid);
    Ls[tid] = i < L ? lse[row0 + uint64_t(i)] : 0.0f;
    Ds[tid] = i < L ? delta[row0 + uint64_t(i)] : 0.0f;
  }
  float4 acc[AR];
  for (int r = 0; r < AR; ++r) acc[r] = float4(0.0f);
  const int32_t k_end = a.causal != 0 ? min(S, q0 + BQ) : S;
  for (int32_t k0 = 0; k0 < k_end; k0 += BK) {
    threadgroup_barrier(mem_flags::mem_threadgroup);  // the last tile's readers are done
    for (int32_t e = int32_t(tid); e < BK * KS; e += NT) {
      const int32_t jj = e / KS, c = (e - jj * KS) * 4;
      const bool in = k0 + jj < S;
      Ks[e] = in ? sdpa_load4(k, sdpa_row(a, ko, FM_SDPA_K, k0 + jj), c, D, 1.0f) : float4(0.0f);
      Vs[e] = in ? sdpa_load4(v, sdpa_row(a, vo, FM_SDPA_V, k0 + jj), c, Dv, 1.0f) : float4(0.0f);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // SK x SW scores and dP entries from SK + SW float4s per 4 columns (the same fma chain
    // per score as the forward's, so s is the forward's bit for bit).
    float sv[SE], dpv[SE];
    FM_UNROLL
    for (int e = 0; e < SE; ++e) {
      sv[e] = 0.0f;
      dpv[e] = 0.0f;
    }
    for (int32_t d4 = 0; d4 < D4; ++d4) {
      float4 kk[SK], qq[SW];
      FM_UNROLL
      for (int u = 0; u < SK; ++u) kk[u] = Ks[(sk0 + u) * KS + d4];
      FM_UNROLL
      for (int w = 0; w < SW; ++w) qq[w] = Qs[(sr0 + 8 * w) * QS + d4];
      FM_UNROLL
      for (int w = 0; w < SW; ++w) {
        FM_UNROLL
        for (int u = 0; u < SK; ++u)
          sv[w * SK + u] = sdpa_dot4(qq[w], kk[u].x, kk[u].y, kk[u].z, kk[u].w, sv[w * SK + u]);
      }
    }
    for (int32_t c4 = 0; c4 < V4; ++c4) {
      float4 vk[SK], gg[SW];
      FM_UNROLL
      for (int u = 0; u < SK; ++u) vk[u] = Vs[(sk0 + u) * KS + c4];
      FM_UNROLL
      for (int w = 0; w < SW; ++w) gg[w] = Gs[(sr0 + 8 * w) * QS + c4];
      FM_UNROLL
      for (int w = 0; w < SW; ++w) {
        FM_UNROLL
        for (int u = 0; u < SK; ++u)
          dpv[w * SK + u] = sdpa_dot4(gg[w], vk[u].x, vk[u].y, vk[u].z, vk[u].w, dpv[w * SK + u]);
      }
    }
    FM_UNROLL
    for (int e = 0; e < SE; ++e) {
      const int32_t r = sr0 + 8 * (e / SK), i = q0 + r, jk = sk0 + e % SK;
      const float s = sv[e], dp = dpv[e];
      const float x = sdpa_masked(a, mask, mo, i, k0 + jk, s);
      const float p = x == -INFINITY ? 0.0f : exp(x - Ls[r]);
      const float keep = i < L && k0 + jk < S ? sdpa_keep(a, b, i, k0 + jk) : 0.0f;
      Ss[r * KT + jk] = p == 0.0f ? 0.0f : p * (dp * keep - Ds[r]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int jj = 0; jj < BK; ++jj) {
      const float4 kk = Ks[jj * KS + cq];
      const float k0v = kk.x, k1v = kk.y, k2v = kk.z, k3v = kk.w;
      for (int r = 0; r < AR; ++r) {
        const float sj = Ss[(qr + r * QR) * KT + jj];
        acc[r] = float4(fma(sj, k0v, acc[r].x), fma(sj, k1v, acc[r].y), fma(sj, k2v, acc[r].z),
                        fma(sj, k3v, acc[r].w));
      }
    }
  }
  const uint64_t dqo = sdpa_offset(a, b, FM_SDPA_DQ);
  for (int r = 0; r < AR; ++r) {
    const int32_t i = q0 + qr + r * QR;
    if (i < L) {
      for (int32_t u = 0; u < 4; ++u) {
        const int32_t col = 4 * cq + u;
        if (col < D) dq[sdpa_row(a, dqo, FM_SDPA_DQ, i) + uint64_t(col)] = T(sdpa_comp(acc[r], u) * a.scale);
      }
    }
  }
}

FM_INSTANTIATE("sdpa_backward_dq_d64_float32", sdpa_backward_dq, float, 64, 16, 32);
FM_INSTANTIATE("sdpa_backward_dq_d128_float32", sdpa_backward_dq, float, 128, 8, 16);
FM_INSTANTIATE("sdpa_backward_dq_d64_float16", sdpa_backward_dq, half, 64, 16, 32);
FM_INSTANTIATE("sdpa_backward_dq_d128_float16", sdpa_backward_dq, half, 128, 8, 16);

// ------------------------------------------------------------------------ tiled backward
// sdpa_backward_dkdv_tiled and sdpa_backward_dq_tiled: the backward for head dims <= 64 with
// register blocking (ops/attention.cpp picks them; FASTMETAL_SDPA_BACKWARD=classic picks the
// kernels above). Those give each thread 2 x 2 entries of P and dS and read ~1 threadgroup
// value per FMA; here, as in sdpa_forward_tiled, every thread computes 4 x 4 micro-tiles of
// S and dP and 4 x 8 (or 4 x 4) micro-tiles of the gradients from float4s it loads once.
// Both kernels: 128 threads (4 simdgroups of 32), BQ = 32 query rows x BK = 64 keys per step.
//   scores and dP: thread t (w = t / 32, lane = t % 32) owns rows 4 rq .. + 3 and keys
//     4 kq .. + 3, rq = 4 (w % 2) + lane / 8, kq = 8 (w / 2) + lane % 8: per column d one
//     float4 of Qt[d] (4 rows; 4 distinct per warp, broadcast to 8 lanes) and one of Kt[d]
//     (4 keys; 8 consecutive per warp) feed 16 FMAs; dP = dO V^T likewise from Gt and Vt.
//     s is formed exactly as the forwards form it (Q pre-scaled when staged, fma over
//     d = 0, 1, .. in order), so P = exp(s - lse) <= 1 holds.
//   dK/dV (a group owns 64 keys, walks the query tiles of 32 rows): thread t owns keys
//     4 jq .. + 3, jq = 4 w + lane / 8, and columns 4 cg .. + 3, 32 + 4 cg .. + 3, cg = lane % 8,
//     of both dK and dV (64 accumulators). P (dropped) and dS are staged row-major, P[r][key
//     quad]; per row quad the thread loads 4 float4s of P and 8 of Gt (dO transposed: 4 rows
//     per float4) for 128 FMAs into dV, and 4 of dS and 8 of Qt for 128 into dK.
//     Per thread and query tile: 4,096 FMAs, 448 threadgroup loads (~0.11 per FMA).
//   dQ (a group owns 32 rows, walks the key tiles of 64): thread t owns rows 4 rq .. + 3 and
//     columns 4 kq .. + 3 (the score mapping; 16 accumulators); per key quad 4 float4s of dS
//     (4 keys of a row) and 4 of Kt (4 keys of a column) feed 64 FMAs. Per thread and key
//     tile: 3,072 FMAs, 384 loads (0.125 per FMA).
//   Every gradient element is summed by one thread, rows (dK, dV) or keys (dQ) in ascending
//   order: deterministic, whatever the grid.
//   Causal: a key tile starts at the query tile of its first key, a query tile stops at the
//   key tile of its last row (the diagonal tiles masked per element), and each group takes
//   tile t and tile nt - 1 - t (sdpa_tile_passes: the same work in every group).
// Threadgroup memory: the transposed tiles Qt, Gt (64 x 32 floats, 8 KiB each) and X (64 x 64,
// 16 KiB) that holds Kt, then Vt, then (dK/dV) P and dS, or (dQ) Vt then Kt while dS takes
// Gt's place: 32,768 bytes, the Apple limit, in both kernels. So the dK/dV kernel stages K and
// V again for each query tile (from L2: 32 KiB of K and V with 16 KiB of Q and dO per 2^19
// FMAs of the group) and the dQ kernel dO for each key tile; 6 and 5 barriers per tile.
// Loads and stores are bank-conflict free: Qt[d][row quad ^ (d / 4 % 8)] and Kt[d][key quad
// ^ (d / 4 % 8)] (XOR-swizzled so the 8 column quads a warp reads in the gradient steps hit 8
// distinct 16-byte columns), dS of the dQ kernel [r][key quad ^ (r / 4 % 8)]; aligned float32
// rows are staged with 16-byte device loads (SdpaArgs::quads). lse and delta of a
// thread's 4 rows are read into registers (no threadgroup copy). Registers per thread: dK/dV
// 64 accumulators + 16 P + 16 dP + 4 delta + loads in flight: ptxas (sm_90) wants ~175; the
// CUDA build caps attention at 128 (4 groups per SM; ~1 spill load per 64 FMAs in the
// loops); dQ 16 accumulators, ~140 uncapped (the scheduler's loads in flight).
enum : int32_t {
  kSdpaBwdRows = 32,     // query rows per step
  kSdpaBwdKeys = 64,     // keys per step
  kSdpaBwdDim = 64,      // the largest head dim it serves
  kSdpaBwdThreads = 128,
};

// dK and dV of 64 keys. Grid (threadgroups): x = ceil(S / 64) key tiles (PAIRED, the causal
// instances: ceil(ceil(S / 64) / 2) pairs), y = nbatch; 128 threads each. The two passes
// are unrolled (code twice): as a loop, ptxas (sm_90, 128 registers) spilled 16 accumulators
// around the dK/dV loop; the non-causal instances have one pass.
template <typename T, bool PAIRED>
kernel void sdpa_backward_dkdv_tiled(device const T* q [[buffer(0)]],
                                     device const T* k [[buffer(1)]],
                                     device const T* v [[buffer(2)]],
                                     device const float* mask [[buffer(3)]],
                                     device const T* dout [[buffer(4)]],
                                     device const float* lse [[buffer(5)]],
                                     device const float* delta [[buffer(6)]],
                                     device T* dk [[buffer(7)]],
                                     device T* dv [[buffer(8)]],
                                     constant SdpaArgs& a [[buffer(9)]],
                                     uint3 tg_pos [[threadgroup_position_in_grid]],
                                     uint32_t tid [[thread_index_in_threadgroup]]) {
  constexpr int BQ = kSdpaBwdRows;
  constexpr int BK = kSdpaBwdKeys;
  constexpr int NT = kSdpaBwdThreads;
  constexpr int RQ = BQ / 4;   // float4 per Qt / Gt row (row quads)
  constexpr int KQ = BK / 4;   // float4 per Kt / Vt row and per P / dS row (key quads)
  constexpr int PS = BQ * KQ;  // dS's offset in X
  static_assert(NT == 128 && RQ == 8 && KQ == 16 && kSdpaBwdDim == 64 && BK % BQ == 0,
                "tile shape");
  threadgroup float4 Qt[kSdpaBwdDim * kSdpaBwdRows / 4];  // Qt[d][rq ^ (d / 4 % 8)], scaled
  threadgroup float4 Gt[kSdpaBwdDim * kSdpaBwdRows / 4];  // dO transposed, likewise
  threadgroup float4 X[kSdpaBwdDim * kSdpaBwdKeys / 4];   // Kt, Vt [d][kq ^ (d / 4 % 8)]; P, dS

  const int32_t b = int32_t(tg_pos.y);
  const bool quads = a.quads != 0;
  const int32_t L = a.L, S = a.S, D = a.E, Dv = a.Ev;
  const int32_t D4 = (D + 3) / 4, V4 = (Dv + 3) / 4;
  const int32_t w = int32_t(tid) / 32, lane = int32_t(tid) % 32;
  const int32_t rq = 4 * (w % 2) + lane / 8, kq = 8 * (w / 2) + lane % 8;  // scores
  const int32_t jq = 4 * w + lane / 8, cg = lane % 8;                      // dK, dV

  // Causal: key tile t meets the query tiles from its own on, so group t takes key tiles t
  // and nt - 1 - t (about the same work in every group where L = S).
  const int32_t nt = (S + BK - 1) / BK, t = int32_t(tg_pos.x);
  const int32_t k_last = (PAIRED && sdpa_tile_passes(a, nt, t) == 2 ? nt - 1 - t : t) * BK;
  FM_UNROLL
  for (int pass = 0; pass < (PAIRED ? 2 : 1); ++pass) {
    const int32_t k0 = pass == 0 ? t * BK : k_last;
    if (pass == 1 && k_last == t * BK) break;
    float dka[32], dva[32];  // [u * 8 + c]: key 4 jq + u, column 4 cg + c (c < 4), 28 + 4 cg + c
    FM_UNROLL
    for (int e = 0; e < 32; ++e) {
      dka[e] = 0.0f;
      dva[e] = 0.0f;
    }
    // Causal: rows before the tile's first key see none of its keys (k0 is a multiple of BQ).
    const int32_t q_begin = a.causal != 0 ? k0 : 0;
    for (int32_t q0 = q_begin; q0 < L; q0 += BQ) {
      // Recomputed per tile: cheaper than the registers they would hold across phase 2.
      const uint64_t qo = sdpa_offset(a, b, FM_SDPA_Q), ko = sdpa_offset(a, b, FM_SDPA_K);
      const uint64_t vo = sdpa_offset(a, b, FM_SDPA_V), go = sdpa_offset(a, b, FM_SDPA_G);
      const uint64_t mo = sdpa_mask_offset(a, b);
      const uint64_t row0 = uint64_t(b) * uint64_t(L);
      threadgroup_barrier(mem_flags::mem_threadgroup);  // the last tile's readers are done
      // Qt (scaled) and Gt: thread (row quad, column quad) transposes a 4 x 4 block.
      // every load of the step first, then the transposing stores (one wait, not one per block)
      float4 xq[4], xg[4];
      FM_UNROLL
      for (int it = 0; it < 1; ++it) {
        const int32_t e = int32_t(tid) + it * NT;
        const int32_t r4 = e % RQ, c4 = e / RQ;
        FM_UNROLL
        for (int vv = 0; vv < 4; ++vv) {
          const int32_t i = q0 + 4 * r4 + vv;
          xq[it * 4 + vv] = e < RQ * D4 && i < L ? sdpa_load4q(q, sdpa_row(a, qo, FM_SDPA_Q, i), 4 * c4, D, a.scale, quads) : float4(0.0f);
        }
      }
      FM_UNROLL
      for (int it = 0; it < 1; ++it) {
        const int32_t e = int32_t(tid) + it * NT;
        const int32_t r4 = e % RQ, c4 = e / RQ;
        FM_UNROLL
        for (int vv = 0; vv < 4; ++vv) {
          const int32_t i = q0 + 4 * r4 + vv;
          xg[it * 4 + vv] = e < RQ * V4 && i < L ? sdpa_load4q(dout, sdpa_row(a, go, FM_SDPA_G, i), 4 * c4, Dv, 1.0f, quads) : float4(0.0f);
        }
      }
      FM_UNROLL
      for (int it = 0; it < 1; ++it) {
        const int32_t e = int32_t(tid) + it * NT;
        if (e < RQ * D4) {
          const int32_t r4 = e % RQ, c4 = e / RQ;
          const int32_t at = 4 * c4 * RQ + (r4 ^ (c4 % 8));
          Qt[at] = float4(xq[it * 4 + 0].x, xq[it * 4 + 1].x, xq[it * 4 + 2].x, xq[it * 4 + 3].x);
          Qt[at + RQ] = float4(xq[it * 4 + 0].y, xq[it * 4 + 1].y, xq[it * 4 + 2].y, xq[it * 4 + 3].y);
          Qt[at + 2 * RQ] = float4(xq[it * 4 + 0].z, xq[it * 4 + 1].z, xq[it * 4 + 2].z, xq[it * 4 + 3].z);
          Qt[at + 3 * RQ] = float4(xq[it * 4 + 0].w, xq[it * 4 + 1].w, xq[it * 4 + 2].w, xq[it * 4 + 3].w);
        }
      }
      FM_UNROLL
      for (int it = 0; it < 1; ++it) {
        const int32_t e = int32_t(tid) + it * NT;
        if (e < RQ * V4) {
          const int32_t r4 = e % RQ, c4 = e / RQ;
          const int32_t at = 4 * c4 * RQ + (r4 ^ (c4 % 8));
          Gt[at] = float4(xg[it * 4 + 0].x, xg[it * 4 + 1].x, xg[it * 4 + 2].x, xg[it * 4 + 3].x);
          Gt[at + RQ] = float4(xg[it * 4 + 0].y, xg[it * 4 + 1].y, xg[it * 4 + 2].y, xg[it * 4 + 3].y);
          Gt[at + 2 * RQ] = float4(xg[it * 4 + 0].z, xg[it * 4 + 1].z, xg[it * 4 + 2].z, xg[it * 4 + 3].z);
          Gt[at + 3 * RQ] = float4(xg[it * 4 + 0].w, xg[it * 4 + 1].w, xg[it * 4 + 2].w, xg[it * 4 + 3].w);
        }
      }
      for (int32_t e = int32_t(tid); e < KQ * D4; e += NT) {
        const int32_t j4 = e % KQ, c4 = e / KQ;
        float4 x[4];
        FM_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int32_t j = k0 + 4 * j4 + u;
          x[u] = j < S ? sdpa_load4q(k, sdpa_row(a, ko, FM_SDPA_K, j), 4 * c4, D, 1.0f, quads) : float4(0.0f);
        }
        const int32_t at = 4 * c4 * KQ + (j4 ^ (c4 % 8));
        X[at] = float4(x[0].x, x[1].x, x[2].x, x[3].x);
        X[at + KQ] = float4(x[0].y, x[1].y, x[2].y, x[3].y);
        X[at + 2 * KQ] = float4(x[0].z, x[1].z, x[2].z, x[3].z);
        X[at + 3 * KQ] = float4(x[0].w, x[1].w, x[2].w, x[3].w);
      }
      float lr[4];
      FM_UNROLL
      for (int vv = 0; vv < 4; ++vv) {
        const int32_t i = q0 + 4 * rq + vv;
        lr[vv] = i < L ? lse[row0 + uint64_t(i)] : 0.0f;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);

      // s[vv * 4 + u] = score of row 4 rq + vv and key 4 kq + u, fma over d in order; then P.
      float pv[16];
      FM_UNROLL
      for (int e = 0; e < 16; ++e) pv[e] = 0.0f;
      for (int32_t c4 = 0; c4 < D4; ++c4) {
        FM_UNROLL
        for (int t = 0; t < 4; ++t) {
          const float4 qq = Qt[(4 * c4 + t) * RQ + (rq ^ (c4 % 8))];
          const float4 kk = X[(4 * c4 + t) * KQ + (kq ^ (c4 % 8))];
          FM_UNROLL
          for (int vv = 0; vv < 4; ++vv) {
            const float qv = sdpa_comp(qq, vv);
            pv[vv * 4 + 0] = fma(qv, kk.x, pv[vv * 4 + 0]);
            pv[vv * 4 + 1] = fma(qv, kk.y, pv[vv * 4 + 1]);
            pv[vv * 4 + 2] = fma(qv, kk.z, pv[vv * 4 + 2]);
            pv[vv * 4 + 3] = fma(qv, kk.w, pv[vv * 4 + 3]);
          }
        }
      }
      FM_UNROLL
      for (int e = 0; e < 16; ++e) {
        const int32_t i = q0 + 4 * rq + e / 4, j = k0 + 4 * kq + e % 4;
        const float x = sdpa_masked(a, mask, mo, i, j, pv[e]);
        pv[e] = x == -INFINITY ? 0.0f : exp(x - lr[e / 4]);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // every thread is done with Kt
      for (int32_t e = int32_t(tid); e < KQ * V4; e += NT) {
        const int32_t j4 = e % KQ, c4 = e / KQ;
        float4 x[4];
        FM_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int32_t j = k0 + 4 * j4 + u;
          x[u] = j < S ? sdpa_load4q(v, sdpa_row(a, vo, FM_SDPA_V, j), 4 * c4, Dv, 1.0f, quads) : float4(0.0f);
        }
        const int32_t at = 4 * c4 * KQ + (j4 ^ (c4 % 8));
        X[at] = float4(x[0].x, x[1].x, x[2].x, x[3].x);
        X[at + KQ] = float4(x[0].y, x[1].y, x[2].y, x[3].y);
        X[at + 2 * KQ] = float4(x[0].z, x[1].z, x[2].z, x[3].z);
        X[at + 3 * KQ] = float4(x[0].w, x[1].w, x[2].w, x[3].w);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      // dP = dO V^T, the same micro-tile.
      float dp[16];
      FM_UNROLL
      for (int e = 0; e < 16; ++e) dp[e] = 0.0f;
      for (int32_t c4 = 0; c4 < V4; ++c4) {
        FM_UNROLL
        for (int t = 0; t < 4; ++t) {
          const float4 gg = Gt[(4 * c4 + t) * RQ + (rq ^ (c4 % 8))];
          const float4 vk = X[(4 * c4 + t) * KQ + (kq ^ (c4 % 8))];
          FM_UNROLL
          for (int vv = 0; vv < 4; ++vv) {
            const float gv = sdpa_comp(gg, vv);
            dp[vv * 4 + 0] = fma(gv, vk.x, dp[vv * 4 + 0]);
            dp[vv * 4 + 1] = fma(gv, vk.y, dp[vv * 4 + 1]);
            dp[vv * 4 + 2] = fma(gv, vk.z, dp[vv * 4 + 2]);
            dp[vv * 4 + 3] = fma(gv, vk.w, dp[vv * 4 + 3]);
          }
        }
      }
      // dS = P (dP_dropped - delta) into dp, P_dropped into pv.
      FM_UNROLL
      for (int vv = 0; vv < 4; ++vv) {
        const int32_t i = q0 + 4 * rq + vv;
        const float dl = i < L ? delta[row0 + uint64_t(i)] : 0.0f;
        FM_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int32_t j = k0 + 4 * kq + u;
          const float p = pv[vv * 4 + u];
          const float keep = i < L && j < S ? sdpa_keep(a, b, i, j) : 0.0f;
          pv[vv * 4 + u] = p * keep;
          dp[vv * 4 + u] = p == 0.0f ? 0.0f : p * (dp[vv * 4 + u] * keep - dl);
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // every thread is done with Vt
      FM_UNROLL
      for (int vv = 0; vv < 4; ++vv) {
        X[(4 * rq + vv) * KQ + kq] = float4(pv[vv * 4], pv[vv * 4 + 1], pv[vv * 4 + 2], pv[vv * 4 + 3]);
        X[PS + (4 * rq + vv) * KQ + kq] = float4(dp[vv * 4], dp[vv * 4 + 1], dp[vv * 4 + 2], dp[vv * 4 + 3]);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      // dV += P^T dO, dK += dS^T (scale Q): rows in order, 4 at a time.
      for (int r4 = 0; r4 < RQ; ++r4) {
        float4 pp[4];
        FM_UNROLL
        for (int vv = 0; vv < 4; ++vv) pp[vv] = X[(4 * r4 + vv) * KQ + jq];
        FM_UNROLL
        for (int c = 0; c < 8; ++c) {
          const int32_t col = c < 4 ? 4 * cg + c : kSdpaBwdDim / 2 + 4 * cg + c - 4;  // sw = cg
          const float4 g = Gt[col * RQ + (r4 ^ cg)];
          FM_UNROLL
          for (int u = 0; u < 4; ++u) {
            float acc = dva[u * 8 + c];
            acc = fma(sdpa_comp(pp[0], u), g.x, acc);
            acc = fma(sdpa_comp(pp[1], u), g.y, acc);
            acc = fma(sdpa_comp(pp[2], u), g.z, acc);
            dva[u * 8 + c] = fma(sdpa_comp(pp[3], u), g.w, acc);
          }
        }
        FM_UNROLL
        for (int vv = 0; vv < 4; ++vv) pp[vv] = X[PS + (4 * r4 + vv) * KQ + jq];
        FM_UNROLL
        for (int c = 0; c < 8; ++c) {
          const int32_t col = c < 4 ? 4 * cg + c : kSdpaBwdDim / 2 + 4 * cg + c - 4;
          const float4 qq = Qt[col * RQ + (r4 ^ cg)];
          FM_UNROLL
          for (int u = 0; u < 4; ++u) {
            float acc = dka[u * 8 + c];
            acc = fma(sdpa_comp(pp[0], u), qq.x, acc);
            acc = fma(sdpa_comp(pp[1], u), qq.y, acc);
            acc = fma(sdpa_comp(pp[2], u), qq.z, acc);
            dka[u * 8 + c] = fma(sdpa_comp(pp[3], u), qq.w, acc);
          }
        }
      }
    }
    const uint64_t dko = sdpa_offset(a, b, FM_SDPA_DK), dvo = sdpa_offset(a, b, FM_SDPA_DV);
    FM_UNROLL
    for (int u = 0; u < 4; ++u) {
      const int32_t j = k0 + 4 * jq + u;
      if (j < S) {
        const uint64_t krow = sdpa_row(a, dko, FM_SDPA_DK, j), vrow = sdpa_row(a, dvo, FM_SDPA_DV, j);
        FM_UNROLL
        for (int c = 0; c < 8; ++c) {
          const int32_t col = c < 4 ? 4 * cg + c : kSdpaBwdDim / 2 + 4 * cg + c - 4;
          if (col < D) dk[krow + uint64_t(col)] = T(dka[u * 8 + c]);
          if (col < Dv) dv[vrow + uint64_t(col)] = T(dva[u * 8 + c]);
        }
      }
    }
  }
}

FM_INSTANTIATE("sdpa_backward_dkdv_tiled_d64_float32", sdpa_backward_dkdv_tiled, float, false);
FM_INSTANTIATE("sdpa_backward_dkdv_tiled_d64_float16", sdpa_backward_dkdv_tiled, half, false);
FM_INSTANTIATE("sdpa_backward_dkdv_tiled_causal_d64_float32", sdpa_backward_dkdv_tiled, float, true);
FM_INSTANTIATE("sdpa_backward_dkdv_tiled_causal_d64_float16", sdpa_backward_dkdv_tiled, half, true);

// dQ of 32 query rows. Grid (threadgroups): x = ceil(L / 32) query tiles, y = nbatch; 128
// threads each.
template <typename T>
kernel void sdpa_backward_dq_tiled(device const T* q [[buffer(0)]],
                                   device const T* k [[buffer(1)]],
                                   device const T* v [[buffer(2)]],
                                   device const float* mask [[buffer(3)]],
                                   device const T* dout [[buffer(4)]],
                                   device const float* lse [[buffer(5)]],
                                   device const float* delta [[buffer(6)]],
                                   device T* dq [[buffer(7)]],
                                   constant SdpaArgs& a [[buffer(8)]],
                                   uint3 tg_pos [[threadgroup_position_in_grid]],
                                   uint32_t tid [[thread_index_in_threadgroup]]) {
  constexpr int BQ = kSdpaBwdRows;
  constexpr int BK = kSdpaBwdKeys;
  constexpr int NT = kSdpaBwdThreads;
  constexpr int RQ = BQ / 4;
  constexpr int KQ = BK / 4;
  static_assert(NT == 128 && RQ == 8 && KQ == 16 && kSdpaBwdDim == 64, "tile shape");
  threadgroup float4 Qt[kSdpaBwdDim * kSdpaBwdRows / 4];  // Qt[d][rq ^ (d / 4 % 8)], scaled
  threadgroup float4 Gt[kSdpaBwdDim * kSdpaBwdRows / 4];  // dO transposed; then dS[r][kq ^ (r / 4 % 8)]
  threadgroup float4 X[kSdpaBwdDim * kSdpaBwdKeys / 4];   // Vt, then Kt [d][kq ^ (d / 4 % 8)]

  const int32_t b = int32_t(tg_pos.y);
  const bool quads = a.quads != 0;
  const int32_t L = a.L, S = a.S, D = a.E, Dv = a.Ev;
  const int32_t D4 = (D + 3) / 4, V4 = (Dv + 3) / 4;
  const uint64_t qo = sdpa_offset(a, b, FM_SDPA_Q), ko = sdpa_offset(a, b, FM_SDPA_K);
  const uint64_t vo = sdpa_offset(a, b, FM_SDPA_V), go = sdpa_offset(a, b, FM_SDPA_G);
  const uint64_t mo = sdpa_mask_offset(a, b);
  const uint64_t row0 = uint64_t(b) * uint64_t(L);
  const int32_t w = int32_t(tid) / 32, lane = int32_t(tid) % 32;
  // Scores: rows 4 rq .. + 3, keys 4 kq .. + 3; dQ: the same rows, columns 4 kq .. + 3.
  const int32_t rq = 4 * (w % 2) + lane / 8, kq = 8 * (w / 2) + lane % 8;

  // Causal: group t takes query tiles t and nt - 1 - t (as sdpa_forward_tiled).
  const int32_t nt = (L + BQ - 1) / BQ, t = int32_t(tg_pos.x);
  const int32_t npass = sdpa_tile_passes(a, nt, t);
  for (int32_t pass = 0; pass < npass; ++pass) {
    const int32_t q0 = sdpa_tile_pass(nt, t, pass) * BQ;
    threadgroup_barrier(mem_flags::mem_threadgroup);  // the last pass's readers of Qt are done
    for (int32_t e = int32_t(tid); e < RQ * D4; e += NT) {
      const int32_t r4 = e % RQ, c4 = e / RQ;
      float4 x[4];
      FM_UNROLL
      for (int vv = 0; vv < 4; ++vv) {
        const int32_t i = q0 + 4 * r4 + vv;
        x[vv] = i < L ? sdpa_load4q(q, sdpa_row(a, qo, FM_SDPA_Q, i), 4 * c4, D, a.scale, quads) : float4(0.0f);
      }
      const int32_t at = 4 * c4 * RQ + (r4 ^ (c4 % 8));
      Qt[at] = float4(x[0].x, x[1].x, x[2].x, x[3].x);
      Qt[at + RQ] = float4(x[0].y, x[1].y, x[2].y, x[3].y);
      Qt[at + 2 * RQ] = float4(x[0].z, x[1].z, x[2].z, x[3].z);
      Qt[at + 3 * RQ] = float4(x[0].w, x[1].w, x[2].w, x[3].w);
    }
    float lr[4], dl[4];
    FM_UNROLL
    for (int vv = 0; vv < 4; ++vv) {
      const int32_t i = q0 + 4 * rq + vv;
      lr[vv] = i < L ? lse[row0 + uint64_t(i)] : 0.0f;
      dl[vv] = i < L ? delta[row0 + uint64_t(i)] : 0.0f;
    }
    float acc[16];  // [vv * 4 + c]: row 4 rq + vv, column 4 kq + c
    FM_UNROLL
    for (int e = 0; e < 16; ++e) acc[e] = 0.0f;
    const int32_t k_end = a.causal != 0 ? min(S, q0 + BQ) : S;
    for (int32_t k0 = 0; k0 < k_end; k0 += BK) {
      threadgroup_barrier(mem_flags::mem_threadgroup);  // the last tile's readers are done
      // every load of the step first, then the transposing stores (one wait, not one per block)
      float4 xg[4], xv[8];
      FM_UNROLL
      for (int it = 0; it < 1; ++it) {
        const int32_t e = int32_t(tid) + it * NT;
        const int32_t r4 = e % RQ, c4 = e / RQ;
        FM_UNROLL
        for (int vv = 0; vv < 4; ++vv) {
          const int32_t i = q0 + 4 * r4 + vv;
          xg[it * 4 + vv] = e < RQ * V4 && i < L ? sdpa_load4q(dout, sdpa_row(a, go, FM_SDPA_G, i), 4 * c4, Dv, 1.0f, quads) : float4(0.0f);
        }
      }
      FM_UNROLL
      for (int it = 0; it < 2; ++it) {
        const int32_t e = int32_t(tid) + it * NT;
        const int32_t j4 = e % KQ, c4 = e / KQ;
        FM_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int32_t j = k0 + 4 * j4 + u;
          xv[it * 4 + u] = e < KQ * V4 && j < S ? sdpa_load4q(v, sdpa_row(a, vo, FM_SDPA_V, j), 4 * c4, Dv, 1.0f, quads) : float4(0.0f);
        }
      }
      FM_UNROLL
      for (int it = 0; it < 1; ++it) {
        const int32_t e = int32_t(tid) + it * NT;
        if (e < RQ * V4) {
          const int32_t r4 = e % RQ, c4 = e / RQ;
          const int32_t at = 4 * c4 * RQ + (r4 ^ (c4 % 8));
          Gt[at] = float4(xg[it * 4 + 0].x, xg[it * 4 + 1].x, xg[it * 4 + 2].x, xg[it * 4 + 3].x);
          Gt[at + RQ] = float4(xg[it * 4 + 0].y, xg[it * 4 + 1].y, xg[it * 4 + 2].y, xg[it * 4 + 3].y);
          Gt[at + 2 * RQ] = float4(xg[it * 4 + 0].z, xg[it * 4 + 1].z, xg[it * 4 + 2].z, xg[it * 4 + 3].z);
          Gt[at + 3 * RQ] = float4(xg[it * 4 + 0].w, xg[it * 4 + 1].w, xg[it * 4 + 2].w, xg[it * 4 + 3].w);
        }
      }
      FM_UNROLL
      for (int it = 0; it < 2; ++it) {
        const int32_t e = int32_t(tid) + it * NT;
        if (e < KQ * V4) {
          const int32_t j4 = e % KQ, c4 = e / KQ;
          const int32_t at = 4 * c4 * KQ + (j4 ^ (c4 % 8));
          X[at] = float4(xv[it * 4 + 0].x, xv[it * 4 + 1].x, xv[it * 4 + 2].x, xv[it * 4 + 3].x);
          X[at + KQ] = float4(xv[it * 4 + 0].y, xv[it * 4 + 1].y, xv[it * 4 + 2].y, xv[it * 4 + 3].y);
          X[at + 2 * KQ] = float4(xv[it * 4 + 0].z, xv[it * 4 + 1].z, xv[it * 4 + 2].z, xv[it * 4 + 3].z);
          X[at + 3 * KQ] = float4(xv[it * 4 + 0].w, xv[it * 4 + 1].w, xv[it * 4 + 2].w, xv[it * 4 + 3].w);
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      float dp[16];
      FM_UNROLL
      for (int e = 0; e < 16; ++e) dp[e] = 0.0f;
      for (int32_t c4 = 0; c4 < V4; ++c4) {
        FM_UNROLL
        for (int t = 0; t < 4; ++t) {
          const float4 gg = Gt[(4 * c4 + t) * RQ + (rq ^ (c4 % 8))];
          const float4 vk = X[(4 * c4 + t) * KQ + (kq ^ (c4 % 8))];
          FM_UNROLL
          for (int vv = 0; vv < 4; ++vv) {
            const float gv = sdpa_comp(gg, vv);
            dp[vv * 4 + 0] = fma(gv, vk.x, dp[vv * 4 + 0]);
            dp[vv * 4 + 1] = fma(gv, vk.y, dp[vv * 4 + 1]);
            dp[vv * 4 + 2] = fma(gv, vk.z, dp[vv * 4 + 2]);
            dp[vv * 4 + 3] = fma(gv, vk.w, dp[vv * 4 + 3]);
          }
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // every thread is done with Vt and Gt
      // every load of the step first, then the transposing stores (one wait, not one per block)
      float4 xk[8];
      FM_UNROLL
      for (int it = 0; it < 2; ++it) {
        const int32_t e = int32_t(tid) + it * NT;
        const int32_t j4 = e % KQ, c4 = e / KQ;
        FM_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int32_t j = k0 + 4 * j4 + u;
          xk[it * 4 + u] = e < KQ * D4 && j < S ? sdpa_load4q(k, sdpa_row(a, ko, FM_SDPA_K, j), 4 * c4, D, 1.0f, quads) : float4(0.0f);
        }
      }
      FM_UNROLL
      for (int it = 0; it < 2; ++it) {
        const int32_t e = int32_t(tid) + it * NT;
        if (e < KQ * D4) {
          const int32_t j4 = e % KQ, c4 = e / KQ;
          const int32_t at = 4 * c4 * KQ + (j4 ^ (c4 % 8));
          X[at] = float4(xk[it * 4 + 0].x, xk[it * 4 + 1].x, xk[it * 4 + 2].x, xk[it * 4 + 3].x);
          X[at + KQ] = float4(xk[it * 4 + 0].y, xk[it * 4 + 1].y, xk[it * 4 + 2].y, xk[it * 4 + 3].y);
          X[at + 2 * KQ] = float4(xk[it * 4 + 0].z, xk[it * 4 + 1].z, xk[it * 4 + 2].z, xk[it * 4 + 3].z);
          X[at + 3 * KQ] = float4(xk[it * 4 + 0].w, xk[it * 4 + 1].w, xk[it * 4 + 2].w, xk[it * 4 + 3].w);
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      float s[16];
      FM_UNROLL
      for (int e = 0; e < 16; ++e) s[e] = 0.0f;
      for (int32_t c4 = 0; c4 < D4; ++c4) {
        FM_UNROLL
        for (int t = 0; t < 4; ++t) {
          const float4 qq = Qt[(4 * c4 + t) * RQ + (rq ^ (c4 % 8))];
          const float4 kk = X[(4 * c4 + t) * KQ + (kq ^ (c4 % 8))];
          FM_UNROLL
          for (int vv = 0; vv < 4; ++vv) {
            const float qv = sdpa_comp(qq, vv);
            s[vv * 4 + 0] = fma(qv, kk.x, s[vv * 4 + 0]);
            s[vv * 4 + 1] = fma(qv, kk.y, s[vv * 4 + 1]);
            s[vv * 4 + 2] = fma(qv, kk.z, s[vv * 4 + 2]);
            s[vv * 4 + 3] = fma(qv, kk.w, s[vv * 4 + 3]);
          }
        }
      }
      // dS = P (dP_dropped - delta), to Gt's place (its readers passed the barrier above).
      FM_UNROLL
      for (int vv = 0; vv < 4; ++vv) {
        const int32_t i = q0 + 4 * rq + vv;
        float ds[4];
        FM_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int32_t j = k0 + 4 * kq + u;
          const float x = sdpa_masked(a, mask, mo, i, j, s[vv * 4 + u]);
          const float p = x == -INFINITY ? 0.0f : exp(x - lr[vv]);
          const float keep = i < L && j < S ? sdpa_keep(a, b, i, j) : 0.0f;
          ds[u] = p == 0.0f ? 0.0f : p * (dp[vv * 4 + u] * keep - dl[vv]);
        }
        Gt[(4 * rq + vv) * KQ + (kq ^ (rq % 8))] = float4(ds[0], ds[1], ds[2], ds[3]);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      // dQ += dS K, keys in order.
      for (int j4 = 0; j4 < KQ; ++j4) {
        float4 ss[4];
        FM_UNROLL
        for (int vv = 0; vv < 4; ++vv) ss[vv] = Gt[(4 * rq + vv) * KQ + (j4 ^ (rq % 8))];
        FM_UNROLL
        for (int c = 0; c < 4; ++c) {
          const float4 kk = X[(4 * kq + c) * KQ + (j4 ^ (kq % 8))];  // column 4 kq + c: sw = kq % 8
          FM_UNROLL
          for (int vv = 0; vv < 4; ++vv) {
            float x = acc[vv * 4 + c];
            x = fma(ss[vv].x, kk.x, x);
            x = fma(ss[vv].y, kk.y, x);
            x = fma(ss[vv].z, kk.z, x);
            acc[vv * 4 + c] = fma(ss[vv].w, kk.w, x);
          }
        }
      }
    }
    const uint64_t dqo = sdpa_offset(a, b, FM_SDPA_DQ);
    FM_UNROLL
    for (int vv = 0; vv < 4; ++vv) {
      const int32_t i = q0 + 4 * rq + vv;
      if (i < L) {
        const uint64_t row = sdpa_row(a, dqo, FM_SDPA_DQ, i);
        FM_UNROLL
        for (int c = 0; c < 4; ++c) {
          const int32_t col = 4 * kq + c;
          if (col < D) dq[row + uint64_t(col)] = T(acc[vv * 4 + c] * a.scale);
        }
      }
    }
  }
}

FM_INSTANTIATE("sdpa_backward_dq_tiled_d64_float32", sdpa_backward_dq_tiled, float);
FM_INSTANTIATE("sdpa_backward_dq_tiled_d64_float16", sdpa_backward_dq_tiled, half);
