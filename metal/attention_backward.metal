// Fused scaled-dot-product attention, the backward kernels: sdpa_backward_prep, the classic
// sdpa_backward_dkdv / sdpa_backward_dq (head dims up to 128) and the tiled
// sdpa_backward_dkdv_tiled / sdpa_backward_dq_tiled (head dims <= 64). They recompute
// P = exp(s - lse) from the lse of the forward kernels (attention_forward.metal); the layout,
// masking, dropout, the helpers both use and the design in attention_common.h.
//
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
#include <metal_stdlib>
#include "fm_kernel.h"
#include "attention_args.h"
#include "attention_common.h"
using namespace metal;

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
