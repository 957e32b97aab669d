// The tiled implicit GEMM of the convolutions (conv2d_gemm), and the interface a problem
// description gives it: Tap (the column parts of an address) and the k counter. The problems
// themselves (forward, input and weight gradients, the Winograd products) and the
// instantiations are in metal/conv2d.metal, which includes this; docs/gpu_kernels.md has
// the tile shapes and why.
#pragma once
#include <metal_stdlib>
#include "fm_kernel.h"
#include "conv2d_args.h"
#include "fm_math.h"
using namespace metal;

// A thread copy of the argument block (Metal copies out of the constant address space field
// by field: its implicit copy constructor takes a thread reference).
FM_FUNC Conv2dArgs thread_copy(constant Conv2dArgs& s) {
  Conv2dArgs a;
  a.N = s.N;
  a.C_in = s.C_in;
  a.H = s.H;
  a.W = s.W;
  a.C_out = s.C_out;
  a.kH = s.kH;
  a.kW = s.kW;
  a.groups = s.groups;
  a.H_out = s.H_out;
  a.W_out = s.W_out;
  a.stride_h = s.stride_h;
  a.stride_w = s.stride_w;
  a.pad_h = s.pad_h;
  a.pad_w = s.pad_w;
  a.dil_h = s.dil_h;
  a.dil_w = s.dil_w;
  return a;
}

// p[i] where `in`, else 0, as a predicated load: the zero is set before the load, so nothing
// waits for the value until it is used (a select after the load would make ptxas wait for
// it right there, to free the predicate, before the slice's FMAs: measured on an H100).
FM_FUNC float load_or_zero(device const float* p, bool in, int32_t i) {
  float v = 0.0f;
  if (in) v = p[i];
  return v;
}

// p[i..i+3] as one 16-byte load where `in`, else zeros (VEC4 problems: the host asks for
// them only where every quad is 16-byte aligned and wholly inside or outside the operand).
FM_FUNC float4 load4_or_zero(device const float* p, bool in, int32_t i) {
  float4 v = float4(0.0f);
  if (in) v = *((device const float4*)(p + i));
  return v;
}

// RELU: the `_relu` instances, which fastmetal.compile's fusion pass puts in place of a
// forward followed by relu (csrc/ops/capture_fusion.h): relu of the result as it is stored.
// A template parameter, not a flag: a run-time test here changed the code ptxas made for the
// main loop of every instance (the Winograd products 20.7 -> 39.9 us on an H100).
template <bool RELU>
FM_FUNC float conv_epilogue(float v) {
  return RELU ? fm_relu(v) : v;
}

struct Tap {
  int32_t base, h, w;
};

FM_FUNC Tap make_tap(int32_t base, int32_t h, int32_t w) {
  Tap t;
  t.base = base;
  t.h = h;
  t.w = w;
  return t;
}

// k = (q, u, v) as a mixed-radix counter; step() adds a fixed amount with one carry per
// digit (each digit of the step is below its radix).
struct KCounter {
  int32_t q, u, v;
};

FM_FUNC KCounter k_split(int32_t k, int32_t r1, int32_t r2) {
  KCounter c;
  const int32_t r12 = r1 * r2;
  c.q = k / r12;
  const int32_t rest = k - c.q * r12;
  c.u = rest / r2;
  c.v = rest - c.u * r2;
  return c;
}

FM_FUNC KCounter k_step(KCounter c, KCounter d, int32_t r1, int32_t r2) {
  c.v += d.v;
  c.u += d.u;
  if (c.v >= r2) {
    c.v -= r2;
    c.u += 1;
  }
  c.q += d.q;
  if (c.u >= r1) {
    c.u -= r1;
    c.q += 1;
  }
  return c;
}

// ---------------------------------------------------------------- tiled implicit GEMM
// conv2d_gemm<P, BM, BN, BK, TM, TN>: one threadgroup computes a BM x BN tile of C,
// stepping through K in BK-deep slices staged in threadgroup memory as float4 rows
// (As[k][m], Bs[k][c]: one 16-byte read gives 4 consecutive rows or columns; one float4 of
// padding per row keeps the transposing stores of A free of bank conflicts).
//
// Register blocking: V = (BM/TM) * (BN/TN) virtual threads, each accumulating TM x TN
// outputs: rows (i4 * BM/TM + tr) * 4 + {0..3} for i4 < TM/4, columns likewise, so each
// k step costs TM/4 + TN/4 float4 reads of threadgroup memory for TM * TN fmas.
//
// Two ways through K, the same arithmetic in the same order (results identical):
//  * T == V (the host's choice): one pass, double buffered. While the fmas of slice s run
//    on one pair of buffers, the loads of slice s+1 are in flight into registers; they go
//    to the other pair afterwards, so there is one barrier per slice.
//  * any other threadgroup size T: ceil(V / T) passes over K, each thread playing virtual
//    thread pass + tid, the tiles loaded by all T threads with a stride of T. Correct for
//    any T (tests run T = 1, 37, 300, ...); not the fast path.
// All barriers sit in loops whose trip counts are uniform across the group.
//
// VEC4 (the `_vec4` instances of the Winograd products; the host launches them only where
// every operand row is 16-byte aligned and whole quads long): the fast path loads float4
// quads — A along k (it must be k-contiguous), B along k or along its columns — from
// addresses linear in k (one k digit: k_parts(k) = k * k_parts(1)), so it needs no k table;
// the tiles in threadgroup memory, the FMAs and the epilogue are the scalar path's.
//
// Grid (in threadgroups): x = column tiles, y = row tiles, z = groups * splits; the splits
// of the K range ("split-K") write separate slices of the output, added by
// conv2d_sum_splits (deterministic: no atomics).
// buffer(0) = A source, buffer(1) = B source, buffer(2) = bias (read only where flags & 1),
// buffer(3) = output, buffer(4) = Conv2dArgs, buffer(5) = flags.

// Element e of a slice's tile of ROWS rows (A: its rows m; B: its columns c) and depth BK:
// row r and depth kk, k-major or row-major (k_fast: the problem's P::a_k_fast() or
// P::b_k_fast()), whichever reads memory contiguously along a SIMD group.
template <int ROWS, int BK>
FM_FUNC void tile_coords(bool k_fast, int32_t e, thread int32_t& r, thread int32_t& kk) {
  if (k_fast) {
    r = e / BK;
    kk = e - r * BK;
  } else {
    kk = e / ROWS;
    r = e - kk * ROWS;
  }
}

// The same coordinates for the fast path's load j of thread t (element t + j * V), written
// so that the one that is equal for every j visibly is (V a multiple of the run length):
// the compiler then keeps one copy of it and of what derives from it (its address parts,
// its k parts), which keeps the loop within 128 registers.
template <int ROWS, int BK, int V>
FM_FUNC void fast_coords(bool k_fast, int32_t t, int j, thread int32_t& r, thread int32_t& kk) {
  if (k_fast && V % BK == 0) {
    r = t / BK + j * (V / BK);
    kk = t % BK;
  } else if (!k_fast && V % ROWS == 0) {
    kk = t / ROWS + j * (V / ROWS);
    r = t % ROWS;
  } else {
    tile_coords<ROWS, BK>(k_fast, t + j * V, r, kk);
  }
}

template <typename P, int BM, int BN, int BK, int TM, int TN, bool VEC4, bool RELU = false>
kernel void conv2d_gemm(device const float* asrc [[buffer(0)]],
                        device const float* bsrc [[buffer(1)]],
                        device const float* bias [[buffer(2)]],
                        device float* out [[buffer(3)]],
                        constant Conv2dArgs& args [[buffer(4)]],
                        constant uint32_t& flags [[buffer(5)]],
                        uint3 tg_pos [[threadgroup_position_in_grid]],
                        uint3 tg_count [[threadgroups_per_grid]],
                        uint32_t tid [[thread_index_in_threadgroup]],
                        uint3 tg_size [[threads_per_threadgroup]]) {
  constexpr int MT = BM / TM, NT = BN / TN;  // virtual threads along rows / columns
  constexpr int V = MT * NT;
  constexpr int LA = BM * BK / V, LB = BN * BK / V;  // tile elements per virtual thread
  constexpr int AW = BM / 4 + 1, BW = BN / 4 + 1;    // float4 per staged row
  static_assert(TM % 4 == 0 && TN % 4 == 0 && BM % TM == 0 && BN % TN == 0, "tile shape");
  static_assert(LA * V == BM * BK && LB * V == BN * BK, "loads divide evenly");
  constexpr int QA = VEC4 ? LA / 4 : 1, QB = VEC4 ? LB / 4 : 1;  // quads per thread (VEC4)
  static_assert(!VEC4 || (LA % 4 == 0 && LB % 4 == 0 && BK % 4 == 0), "quads divide evenly");

  // Two buffers of each operand tile, the column parts of B's addresses, and the k parts
  // {A offset, B offset, B row, B column} of two slices.
  threadgroup float4 As[2 * BK * BM / 4 + 2 * BK];  // 2 buffers of BK rows of AW
  threadgroup float4 Bs[2 * BK * BN / 4 + 2 * BK];  // 2 buffers of BK rows of BW
  threadgroup int32_t col_base[BN];
  threadgroup int32_t col_h[BN];
  threadgroup int32_t col_w[BN];
  threadgroup int4 k_tab[2 * BK];

  // The argument block in registers: read in the inner loops, so not from memory there.
  const Conv2dArgs a = thread_copy(args);
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const int32_t M = P::rows(a), NC = P::cols(a), K = P::depth(a);
  const int32_t R1 = P::r1(a), R2 = P::r2(a);
  const int32_t splits = int32_t(tg_count.z) / P::batches(a);
  const int32_t g = int32_t(tg_pos.z) / splits;
  const int32_t split = int32_t(tg_pos.z) - g * splits;
  const int32_t row0 = int32_t(tg_pos.y) * BM, col0 = int32_t(tg_pos.x) * BN;
  // This split's K range, whole BK slices.
  const int32_t slices = (K + BK - 1) / BK;
  const int32_t per_split = (slices + splits - 1) / splits;
  const int32_t k_begin = split * per_split * BK;
  const int32_t k_end = min(K, k_begin + per_split * BK);
  const KCounter slice_step = k_split(BK, R1, R2);

  // Column parts of B's addresses (columns past the end are never loaded).
  for (uint32_t c = tid; c < uint32_t(BN); c += T) {
    const int32_t gc = col0 + int32_t(c);
    const Tap t = gc < NC ? P::col_tap(a, g, gc) : make_tap(0, 0, 0);
    col_base[c] = t.base;
    col_h[c] = t.h;
    col_w[c] = t.w;
  }
  // The first two slices' k parts.
  for (uint32_t e = tid; e < uint32_t(2 * BK); e += T) {
    const KCounter kc = k_split(k_begin + int32_t(e), R1, R2);
    k_tab[e] = P::k_parts(a, g, kc.q, kc.u, kc.v);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  float acc[TM * TN];
  if (T == uint32_t(V)) {
    // ---- fast path: one virtual thread per thread, double buffered
    const int32_t tr = int32_t(tid) / NT, tc = int32_t(tid) - tr * NT;
    for (int i = 0; i < TM * TN; ++i) acc[i] = 0.0f;
    // Scalar loads (!VEC4): this thread's fixed rows / columns, their address parts in
    // registers.
    int32_t a_m[LA], a_kk[LA], a_off[LA], b_c[LB], b_kk[LB];
    bool b_in[LB];
    Tap b_tap[LB];
    // Quad loads (VEC4): quad j of A is row qa_r[j], depths kq_a..kq_a+3; of B, column
    // qb_c[j] (k-fast B, depths kq_b..+3) or depth qb_k[j], columns qb_c[j]..+3.
    int32_t qa_r[QA], qa_off[QA], qb_c[QB], qb_k[QB], qb_base[QB];
    bool qb_in[QB];
    int32_t kq_a = 0, kq_b = 0;
    if (VEC4) {
      for (int j = 0; j < QA; ++j) {
        fast_coords<BM, BK / 4, V>(true, int32_t(tid), j, qa_r[j], kq_a);
        qa_off[j] = row0 + qa_r[j] < M ? P::a_row(a, g, row0 + qa_r[j]) : -1;
      }
      kq_a *= 4;
      for (int j = 0; j < QB; ++j) {
        if (P::b_k_fast()) {
          fast_coords<BN, BK / 4, V>(true, int32_t(tid), j, qb_c[j], kq_b);
          qb_k[j] = 0;
        } else {
          fast_coords<BN / 4, BK, V>(false, int32_t(tid), j, qb_c[j], qb_k[j]);
          qb_c[j] *= 4;
        }
        qb_in[j] = col0 + qb_c[j] < NC;
        qb_base[j] = qb_in[j] ? P::col_tap(a, g, col0 + qb_c[j]).base : 0;
      }
      kq_b *= 4;
    } else {
      for (int j = 0; j < LA; ++j) {
        fast_coords<BM, BK, V>(P::a_k_fast(), int32_t(tid), j, a_m[j], a_kk[j]);
        a_off[j] = row0 + a_m[j] < M ? P::a_row(a, g, row0 + a_m[j]) : -1;
      }
      for (int j = 0; j < LB; ++j) {
        fast_coords<BN, BK, V>(P::b_k_fast(), int32_t(tid), j, b_c[j], b_kk[j]);
        b_tap[j] = make_tap(col_base[b_c[j]], col_h[b_c[j]], col_w[b_c[j]]);
        b_in[j] = col0 + b_c[j] < NC;
      }
    }
    // The k parts of slice k0 + 2 * BK + tid, kept by the first BK threads.
    KCounter kc_next = k_split(k_begin + 2 * BK + int32_t(tid), R1, R2);
    float ra[LA], rb[LB];
    float4 qa[QA], qb[QB];
    int32_t k0 = k_begin;
    // Slice k0 into registers (the one-digit k parts of a VEC4 problem are linear in k).
#define FM_GEMM_LOAD_SLICE(k0, half)                                                         \
    if (VEC4) {                                                                              \
      const int32_t ka = P::k_parts(a, g, k0 + kq_a, 0, 0).x;                                \
      for (int j = 0; j < QA; ++j)                                                           \
        qa[j] = load4_or_zero(asrc, qa_off[j] >= 0 && k0 + kq_a < k_end, qa_off[j] + ka);    \
      for (int j = 0; j < QB; ++j) {                                                         \
        const int32_t kb = k0 + kq_b + qb_k[j];                                              \
        qb[j] = load4_or_zero(bsrc, qb_in[j] && kb < k_end,                                  \
                              qb_base[j] + P::k_parts(a, g, kb, 0, 0).y);                    \
      }                                                                                      \
    } else {                                                                                 \
      for (int j = 0; j < LA; ++j) {                                                         \
        ra[j] = load_or_zero(asrc, a_off[j] >= 0 && k0 + a_kk[j] < k_end,                    \
                             a_off[j] + k_tab[(half) * BK + a_kk[j]].x);                     \
      }                                                                                      \
      for (int j = 0; j < LB; ++j)                                                           \
        rb[j] = P::load_b(a, bsrc, b_in[j] && k0 + b_kk[j] < k_end,                          \
                          k_tab[(half) * BK + b_kk[j]], b_tap[j]);                           \
    }
    // The registers into buffer `half` (quads along k are transposed by four stores).
#define FM_GEMM_STORE_SLICE(half)                                                            \
    if (VEC4) {                                                                              \
      for (int j = 0; j < QA; ++j)                                                           \
        for (int i = 0; i < 4; ++i)                                                          \
          As[((half) * BK + kq_a + i) * AW + (qa_r[j] >> 2)][qa_r[j] & 3] = qa[j][i];        \
      for (int j = 0; j < QB; ++j) {                                                         \
        if (P::b_k_fast()) {                                                                 \
          for (int i = 0; i < 4; ++i)                                                        \
            Bs[((half) * BK + kq_b + i) * BW + (qb_c[j] >> 2)][qb_c[j] & 3] = qb[j][i];      \
        } else {                                                                             \
          Bs[((half) * BK + qb_k[j]) * BW + (qb_c[j] >> 2)] = qb[j];                         \
        }                                                                                    \
      }                                                                                      \
    } else {                                                                                 \
      for (int j = 0; j < LA; ++j)                                                           \
        As[((half) * BK + a_kk[j]) * AW + (a_m[j] >> 2)][a_m[j] & 3] = ra[j];                \
      for (int j = 0; j < LB; ++j)                                                           \
        Bs[((half) * BK + b_kk[j]) * BW + (b_c[j] >> 2)][b_c[j] & 3] = rb[j];                \
    }
    FM_GEMM_LOAD_SLICE(k0, 0)
    FM_GEMM_STORE_SLICE(0)
    threadgroup_barrier(mem_flags::mem_threadgroup);

    int32_t cur = 0;
    for (; k0 < k_end; k0 += BK) {
      const bool more = k0 + BK < k_end;
      const int32_t nk = k0 + BK, nt = 1 - cur;  // the next slice and its k parts
      if (more) {
        FM_GEMM_LOAD_SLICE(nk, nt)
      }
      for (int kk = 0; kk < BK; ++kk) {  // acc += A[k][rows] * B[k][columns], slice `cur`
        float4 av[TM / 4], bv[TN / 4];
        for (int i = 0; i < TM / 4; ++i) av[i] = As[(cur * BK + kk) * AW + i * MT + tr];
        for (int j = 0; j < TN / 4; ++j) bv[j] = Bs[(cur * BK + kk) * BW + j * NT + tc];
        for (int i = 0; i < TM; ++i)
          for (int j = 0; j < TN; ++j)
            acc[i * TN + j] = fma(av[i / 4][i % 4], bv[j / 4][j % 4], acc[i * TN + j]);
      }
      if (more) {
        FM_GEMM_STORE_SLICE(nt)
        // Slice k0 + 2*BK's k parts replace slice k0's (read before the last barrier).
        if (!VEC4 && tid < uint32_t(BK)) {
          k_tab[cur * BK + int32_t(tid)] = P::k_parts(a, g, kc_next.q, kc_next.u, kc_next.v);
          kc_next = k_step(kc_next, slice_step, R1, R2);
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      cur = nt;
    }
#undef FM_GEMM_LOAD_SLICE
#undef FM_GEMM_STORE_SLICE
    // ---- epilogue: out[out_row(m) + out_col(c)]
    int32_t ocol[TN];
    for (int j = 0; j < TN; ++j) {
      const int32_t gc = col0 + ((j / 4) * NT + tc) * 4 + j % 4;
      ocol[j] = gc < NC ? P::out_col(a, gc) : -1;
    }
    for (int i = 0; i < TM; ++i) {
      const int32_t gm = row0 + ((i / 4) * MT + tr) * 4 + i % 4;
      if (gm >= M) continue;
      const int32_t orow = P::out_row(a, g, split, gm);
      const float b = P::bias_of(a, bias, flags, g, gm);
      for (int j = 0; j < TN; ++j)
        if (ocol[j] >= 0) out[orow + ocol[j]] = conv_epilogue<RELU>(acc[i * TN + j] + b);
    }
  } else {
  // ---- any threadgroup size: passes of virtual threads, the tiles loaded with stride T
  for (uint32_t pass = 0; pass < uint32_t(V); pass += T) {
    const uint32_t v = pass + tid;
    const bool active = v < uint32_t(V);
    const int32_t tr = int32_t(v) / NT, tc = int32_t(v) - tr * NT;
    for (int i = 0; i < TM * TN; ++i) acc[i] = 0.0f;
    if (pass > 0) {
      // The previous pass left other slices' k parts: rebuild the first slice's.
      for (uint32_t kk = tid; kk < uint32_t(BK); kk += T) {
        const KCounter kc = k_split(k_begin + int32_t(kk), R1, R2);
        k_tab[kk] = P::k_parts(a, g, kc.q, kc.u, kc.v);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    int32_t cur = 0;
    for (int32_t k0 = k_begin; k0 < k_end; k0 += BK) {
      // Slice k0 into buffer `cur` (last read two slices ago, before the previous barrier).
      for (uint32_t e = tid; e < uint32_t(BM * BK); e += T) {
        int32_t m, kk;
        tile_coords<BM, BK>(P::a_k_fast(), int32_t(e), m, kk);
        const int32_t gm = row0 + m, gk = k0 + kk;
        As[(cur * BK + kk) * AW + (m >> 2)][m & 3] =
            (gm < M && gk < k_end) ? asrc[P::a_row(a, g, gm) + k_tab[cur * BK + kk].x] : 0.0f;
      }
      for (uint32_t e = tid; e < uint32_t(BN * BK); e += T) {
        int32_t c, kk;
        tile_coords<BN, BK>(P::b_k_fast(), int32_t(e), c, kk);
        Bs[(cur * BK + kk) * BW + (c >> 2)][c & 3] =
            P::load_b(a, bsrc, col0 + c < NC && k0 + kk < k_end, k_tab[cur * BK + kk],
                      make_tap(col_base[c], col_h[c], col_w[c]));
      }
      // The next slice's k parts, into the other half.
      for (uint32_t kk = tid; kk < uint32_t(BK); kk += T) {
        const KCounter kc = k_split(k0 + BK + int32_t(kk), R1, R2);
        k_tab[(1 - cur) * BK + int32_t(kk)] = P::k_parts(a, g, kc.q, kc.u, kc.v);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (active) {
        for (int kk = 0; kk < BK; ++kk) {  // as in the fast path
          float4 av[TM / 4], bv[TN / 4];
          for (int i = 0; i < TM / 4; ++i) av[i] = As[(cur * BK + kk) * AW + i * MT + tr];
          for (int j = 0; j < TN / 4; ++j) bv[j] = Bs[(cur * BK + kk) * BW + j * NT + tc];
          for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j)
              acc[i * TN + j] = fma(av[i / 4][i % 4], bv[j / 4][j % 4], acc[i * TN + j]);
        }
      }
      cur = 1 - cur;
    }
    // Nobody rebuilds the tables or buffers of the next pass before everyone is done.
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (active) {
      for (int i = 0; i < TM; ++i) {
        const int32_t gm = row0 + ((i / 4) * MT + tr) * 4 + i % 4;
        if (gm >= M) continue;
        const int32_t orow = P::out_row(a, g, split, gm);
        const float b = P::bias_of(a, bias, flags, g, gm);
        for (int j = 0; j < TN; ++j) {
          const int32_t gc = col0 + ((j / 4) * NT + tc) * 4 + j % 4;
          if (gc < NC) out[orow + P::out_col(a, gc)] = conv_epilogue<RELU>(acc[i * TN + j] + b);
        }
      }
    }
  }
  }
}
