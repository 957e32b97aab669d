// conv2d kernels: forward, input gradient, weight gradient, bias gradient.
//
// Tensors are contiguous float32: x (N, C_in, H, W), w (C_out, C_in/groups, kH, kW),
// y / gy (N, C_out, H_out, W_out). The argument block is Conv2dArgs (conv2d_args.h).
//
// The three big products are implicit GEMMs, one per group g (no im2col buffer: the tile
// loaders gather straight from the tensors):
//
//   forward       C[co][n,oh,ow]  = sum_{ci,kh,kw}  w[co][ci,kh,kw]  * x(n, ci, oh*s-p+kh*d, ...)
//   input grad    C[ci][n,ih,iw]  = sum_{co,kh,kw}  w[co][ci,kh,kw]  * gy(n, co, (ih+p-kh*d)/s, ...)
//                 (the tap exists only where the division is exact and in range)
//   weight grad   C[co][ci,kh,kw] = sum_{n,oh,ow}   gy[n,co][oh,ow]  * x(n, ci, oh*s-p+kh*d, ...)
//
// conv2d_gemm<Problem, BM, BN, BK, TM, TN> computes a BM x BN tile of C per threadgroup,
// stepping through K in BK-deep slices staged in threadgroup memory. The tile is covered
// by (BM/TM) * (BN/TN) "virtual threads" of TM x TN outputs each; a threadgroup of T
// threads runs them in ceil(V/T) passes, and loads the staged slices with a stride of T,
// so the result is the same for ANY threadgroup size (T == V is the fast case). All
// barriers sit in loops whose trip counts are uniform across the group.
//
// The weight gradient has a long K (N*H_out*W_out) and a small output: it is split over
// K ("split-K"): threadgroups_per_grid.z = groups * splits, each split writes its partial
// product to its own slice of a workspace and conv2d_sum_splits adds the slices
// (deterministic: no atomics).
//
// Where the GEMM has only a few rows (depthwise convolutions: one channel per group) most
// of a tile would idle, so the host (csrc/conv2d.cpp) uses direct kernels instead:
// conv2d_forward_direct when C_out/groups <= 4 and conv2d_backward_input_direct when
// C_in/groups <= 4 (one thread per output element, no barriers), and
// conv2d_reduce<WeightDot> (one threadgroup per weight element) when
// (C_out/groups) * (C_in/groups) <= 4. conv2d_reduce<BiasSum> is the bias gradient.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "conv2d_args.h"
using namespace metal;


// ---------------------------------------------------------------- problem descriptions
// Each problem says, for group g: the GEMM sizes, how to read A[m][k] and B[k][c] (zero
// outside the tensors: padding, or taps that a stride skips), where C[m][c] goes, and
// which index of each operand is contiguous in memory (so tile loads can be coalesced).
//
// Every address splits into a part that depends on the row / column alone and a part that
// depends on k alone: A[m][k] = asrc[a_row(m) + a_k(k)] (inside the GEMM's bounds), and B
// is a gather whose k part k_tap(k) and column part col_tap(c) ({offset, row, column})
// load_b combines, checking the image bounds. The kernel tabulates the k parts once per K
// slice in threadgroup memory and keeps the column parts in registers, so the integer
// divisions that decompose k and c are paid per table entry, not per loaded element.
// C[m][c] goes to out[out_row(m) + out_col(c)].

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

// x(ih, iw) of one channel plane at `base`, zero outside the image.
FM_FUNC float load_padded(constant Conv2dArgs& a, device const float* x, int32_t base,
                          int32_t ih, int32_t iw) {
  // One unsigned compare per axis: negative coordinates wrap to huge values.
  if (uint32_t(ih) >= uint32_t(a.H) || uint32_t(iw) >= uint32_t(a.W)) return 0.0f;
  return x[base + ih * a.W + iw];
}

struct ConvForward {
  static FM_FUNC int32_t rows(constant Conv2dArgs& a) { return a.C_out / a.groups; }
  static FM_FUNC int32_t cols(constant Conv2dArgs& a) { return a.N * a.H_out * a.W_out; }
  static FM_FUNC int32_t depth(constant Conv2dArgs& a) { return (a.C_in / a.groups) * a.kH * a.kW; }
  static FM_FUNC bool a_k_fast() { return true; }
  static FM_FUNC bool b_k_fast() { return false; }
  // A = weight rows of group g: row co holds its C_in/groups * kH * kW taps contiguously.
  static FM_FUNC int32_t a_row(constant Conv2dArgs& a, int32_t g, int32_t m) {
    return (g * rows(a) + m) * depth(a);
  }
  static FM_FUNC int32_t a_k(constant Conv2dArgs& a, int32_t g, int32_t k) { return k; }
  // B[ci, kh, kw][n, oh, ow] = x[n][g*C_in/groups + ci][oh*s - p + kh*d][ow*s - p + kw*d].
  static FM_FUNC Tap k_tap(constant Conv2dArgs& a, int32_t g, int32_t k) {
    const int32_t khw = a.kH * a.kW;
    const int32_t ci = k / khw, r = k - ci * khw;
    const int32_t kh = r / a.kW, kw = r - kh * a.kW;
    return make_tap(ci * a.H * a.W, kh * a.dil_h, kw * a.dil_w);
  }
  static FM_FUNC Tap col_tap(constant Conv2dArgs& a, int32_t g, int32_t c) {
    const int32_t hw = a.H_out * a.W_out;
    const int32_t n = c / hw, p = c - n * hw;
    const int32_t oh = p / a.W_out, ow = p - oh * a.W_out;
    return make_tap((n * a.C_in + g * (a.C_in / a.groups)) * a.H * a.W,
                    oh * a.stride_h - a.pad_h, ow * a.stride_w - a.pad_w);
  }
  static FM_FUNC float load_b(constant Conv2dArgs& a, device const float* x, Tap kt, Tap ct) {
    return load_padded(a, x, ct.base + kt.base, ct.h + kt.h, ct.w + kt.w);
  }
  static FM_FUNC int32_t out_row(constant Conv2dArgs& a, int32_t g, int32_t split, int32_t m) {
    return (g * rows(a) + m) * a.H_out * a.W_out;
  }
  static FM_FUNC int32_t out_col(constant Conv2dArgs& a, int32_t c) {
    const int32_t hw = a.H_out * a.W_out;
    const int32_t n = c / hw;
    return n * a.C_out * hw + (c - n * hw);
  }
  static FM_FUNC float bias_of(constant Conv2dArgs& a, device const float* bias, uint32_t flags,
                               int32_t g, int32_t m) {
    return (flags & 1u) != 0 ? bias[g * rows(a) + m] : 0.0f;
  }
};

struct ConvBackwardInput {
  static FM_FUNC int32_t rows(constant Conv2dArgs& a) { return a.C_in / a.groups; }
  static FM_FUNC int32_t cols(constant Conv2dArgs& a) { return a.N * a.H * a.W; }
  static FM_FUNC int32_t depth(constant Conv2dArgs& a) { return (a.C_out / a.groups) * a.kH * a.kW; }
  static FM_FUNC bool a_k_fast() { return true; }
  static FM_FUNC bool b_k_fast() { return false; }
  // A[ci][co, kh, kw] = w[g*C_out/groups + co][ci][kh][kw] (the transposed weight).
  static FM_FUNC int32_t a_row(constant Conv2dArgs& a, int32_t g, int32_t m) {
    return m * a.kH * a.kW;
  }
  static FM_FUNC int32_t a_k(constant Conv2dArgs& a, int32_t g, int32_t k) {
    const int32_t khw = a.kH * a.kW;
    const int32_t co = k / khw, r = k - co * khw;
    return (g * (a.C_out / a.groups) + co) * rows(a) * khw + r;
  }
  // B[co, kh, kw][n, ih, iw] = gy at the output pixel whose tap (kh, kw) read (ih, iw):
  // oh = (ih + p - kh*d) / s where that division is exact and oh is in range.
  static FM_FUNC Tap k_tap(constant Conv2dArgs& a, int32_t g, int32_t k) {
    const int32_t khw = a.kH * a.kW;
    const int32_t co = k / khw, r = k - co * khw;
    const int32_t kh = r / a.kW, kw = r - kh * a.kW;
    return make_tap(co * a.H_out * a.W_out, kh * a.dil_h, kw * a.dil_w);
  }
  static FM_FUNC Tap col_tap(constant Conv2dArgs& a, int32_t g, int32_t c) {
    const int32_t hw = a.H * a.W;
    const int32_t n = c / hw, p = c - n * hw;
    const int32_t ih = p / a.W, iw = p - ih * a.W;
    return make_tap((n * a.C_out + g * (a.C_out / a.groups)) * a.H_out * a.W_out,
                    ih + a.pad_h, iw + a.pad_w);
  }
  static FM_FUNC float load_b(constant Conv2dArgs& a, device const float* gy, Tap kt, Tap ct) {
    const int32_t th = ct.h - kt.h, tw = ct.w - kt.w;
    if (a.stride_h == 1 && a.stride_w == 1) {  // uniform: no division for the common case
      if (uint32_t(th) >= uint32_t(a.H_out) || uint32_t(tw) >= uint32_t(a.W_out)) return 0.0f;
      return gy[ct.base + kt.base + th * a.W_out + tw];
    }
    if (th < 0 || tw < 0) return 0.0f;
    const int32_t oh = th / a.stride_h, ow = tw / a.stride_w;
    if (oh * a.stride_h != th || ow * a.stride_w != tw || oh >= a.H_out || ow >= a.W_out)
      return 0.0f;
    return gy[ct.base + kt.base + oh * a.W_out + ow];
  }
  static FM_FUNC int32_t out_row(constant Conv2dArgs& a, int32_t g, int32_t split, int32_t m) {
    return (g * rows(a) + m) * a.H * a.W;
  }
  static FM_FUNC int32_t out_col(constant Conv2dArgs& a, int32_t c) {
    const int32_t hw = a.H * a.W;
    const int32_t n = c / hw;
    return n * a.C_in * hw + (c - n * hw);
  }
  static FM_FUNC float bias_of(constant Conv2dArgs& a, device const float* bias, uint32_t flags,
                               int32_t g, int32_t m) {
    return 0.0f;
  }
};

struct ConvBackwardWeight {
  static FM_FUNC int32_t rows(constant Conv2dArgs& a) { return a.C_out / a.groups; }
  static FM_FUNC int32_t cols(constant Conv2dArgs& a) { return (a.C_in / a.groups) * a.kH * a.kW; }
  static FM_FUNC int32_t depth(constant Conv2dArgs& a) { return a.N * a.H_out * a.W_out; }
  static FM_FUNC bool a_k_fast() { return true; }
  static FM_FUNC bool b_k_fast() { return true; }
  // A[co][n, oh, ow] = gy.
  static FM_FUNC int32_t a_row(constant Conv2dArgs& a, int32_t g, int32_t m) {
    return (g * rows(a) + m) * a.H_out * a.W_out;
  }
  static FM_FUNC int32_t a_k(constant Conv2dArgs& a, int32_t g, int32_t k) {
    const int32_t hw = a.H_out * a.W_out;
    const int32_t n = k / hw;
    return n * a.C_out * hw + (k - n * hw);
  }
  // B[n, oh, ow][ci, kh, kw] = the input value tap (kh, kw) of output pixel (oh, ow) read:
  // the forward's gather with the roles of k and c swapped.
  static FM_FUNC Tap k_tap(constant Conv2dArgs& a, int32_t g, int32_t k) {
    const int32_t hw = a.H_out * a.W_out;
    const int32_t n = k / hw, p = k - n * hw;
    const int32_t oh = p / a.W_out, ow = p - oh * a.W_out;
    return make_tap((n * a.C_in + g * (a.C_in / a.groups)) * a.H * a.W,
                    oh * a.stride_h - a.pad_h, ow * a.stride_w - a.pad_w);
  }
  static FM_FUNC Tap col_tap(constant Conv2dArgs& a, int32_t g, int32_t c) {
    const int32_t khw = a.kH * a.kW;
    const int32_t ci = c / khw, r = c - ci * khw;
    const int32_t kh = r / a.kW, kw = r - kh * a.kW;
    return make_tap(ci * a.H * a.W, kh * a.dil_h, kw * a.dil_w);
  }
  static FM_FUNC float load_b(constant Conv2dArgs& a, device const float* x, Tap kt, Tap ct) {
    return load_padded(a, x, kt.base + ct.base, kt.h + ct.h, kt.w + ct.w);
  }
  // Split s writes the s-th weight-sized slice of the output (the workspace when s > 1).
  static FM_FUNC int32_t out_row(constant Conv2dArgs& a, int32_t g, int32_t split, int32_t m) {
    return split * a.C_out * cols(a) + (g * rows(a) + m) * cols(a);
  }
  static FM_FUNC int32_t out_col(constant Conv2dArgs& a, int32_t c) { return c; }
  static FM_FUNC float bias_of(constant Conv2dArgs& a, device const float* bias, uint32_t flags,
                               int32_t g, int32_t m) {
    return 0.0f;
  }
};

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
// Grid (in threadgroups): x = column tiles, y = row tiles, z = groups * splits; the splits
// of the K range ("split-K") write separate slices of the output, added by
// conv2d_sum_splits (deterministic: no atomics).
// buffer(0) = A source, buffer(1) = B source, buffer(2) = bias (read only where flags & 1),
// buffer(3) = output, buffer(4) = Conv2dArgs, buffer(5) = flags.

// Element e of a slice's A tile: row m and depth kk (k-major or m-major, whichever reads
// memory contiguously along a SIMD group).
template <typename P, int BM, int BK>
FM_FUNC void a_coords(int32_t e, thread int32_t& m, thread int32_t& kk) {
  if (P::a_k_fast()) {
    m = e / BK;
    kk = e - m * BK;
  } else {
    kk = e / BM;
    m = e - kk * BM;
  }
}

template <typename P, int BN, int BK>
FM_FUNC void b_coords(int32_t e, thread int32_t& c, thread int32_t& kk) {
  if (P::b_k_fast()) {
    c = e / BK;
    kk = e - c * BK;
  } else {
    kk = e / BN;
    c = e - kk * BN;
  }
}

template <typename P, int BM, int BN, int BK, int TM, int TN>
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

  // Two buffers of each operand tile, and the k parts of two slices' addresses.
  threadgroup float4 As[2 * BK * BM / 4 + 2 * BK];  // 2 buffers of BK rows of AW
  threadgroup float4 Bs[2 * BK * BN / 4 + 2 * BK];  // 2 buffers of BK rows of BW
  threadgroup int32_t col_base[BN];
  threadgroup int32_t col_h[BN];
  threadgroup int32_t col_w[BN];
  threadgroup int32_t k_a[2][BK];
  threadgroup int32_t k_base[2][BK];
  threadgroup int32_t k_h[2][BK];
  threadgroup int32_t k_w[2][BK];

  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const int32_t M = P::rows(args), NC = P::cols(args), K = P::depth(args);
  const int32_t splits = int32_t(tg_count.z) / args.groups;
  const int32_t g = int32_t(tg_pos.z) / splits;
  const int32_t split = int32_t(tg_pos.z) - g * splits;
  const int32_t row0 = int32_t(tg_pos.y) * BM, col0 = int32_t(tg_pos.x) * BN;
  // This split's K range, whole BK slices.
  const int32_t slices = (K + BK - 1) / BK;
  const int32_t per_split = (slices + splits - 1) / splits;
  const int32_t k_begin = split * per_split * BK;
  const int32_t k_end = min(K, k_begin + per_split * BK);

  // Column parts of B's addresses (columns past the end read as zero via `kk` bounds below).
  for (uint32_t c = tid; c < uint32_t(BN); c += T) {
    const int32_t gc = col0 + int32_t(c);
    const Tap t = gc < NC ? P::col_tap(args, g, gc) : make_tap(0, 0, 0);
    col_base[c] = t.base;
    col_h[c] = t.h;
    col_w[c] = t.w;
  }
  // The first two slices' k tables.
  for (uint32_t e = tid; e < uint32_t(2 * BK); e += T) {
    const int32_t s = int32_t(e) / BK, kk = int32_t(e) - s * BK;
    const int32_t gk = k_begin + s * BK + kk;
    const bool in = gk < k_end;
    const Tap t = in ? P::k_tap(args, g, gk) : make_tap(0, 0, 0);
    k_a[s][kk] = in ? P::a_k(args, g, gk) : 0;
    k_base[s][kk] = t.base;
    k_h[s][kk] = t.h;
    k_w[s][kk] = t.w;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  float acc[TM * TN];
  if (T == uint32_t(V)) {
    // ---- fast path: one virtual thread per thread, double buffered
    const int32_t tr = int32_t(tid) / NT, tc = int32_t(tid) - tr * NT;
    for (int i = 0; i < TM * TN; ++i) acc[i] = 0.0f;
    // This thread's loads: fixed rows / columns, their address parts in registers.
    int32_t a_m[LA], a_kk[LA], a_off[LA], b_c[LB], b_kk[LB];
    Tap b_tap[LB];
    for (int j = 0; j < LA; ++j) {
      a_coords<P, BM, BK>(int32_t(tid) + j * V, a_m[j], a_kk[j]);
      a_off[j] = row0 + a_m[j] < M ? P::a_row(args, g, row0 + a_m[j]) : -1;
    }
    for (int j = 0; j < LB; ++j) {
      b_coords<P, BN, BK>(int32_t(tid) + j * V, b_c[j], b_kk[j]);
      b_tap[j] = make_tap(col_base[b_c[j]], col_h[b_c[j]], col_w[b_c[j]]);
      if (col0 + b_c[j] >= NC) b_tap[j].base = -1;
    }
    float ra[LA], rb[LB];
    // Loads slice `k0` (k table `t`) into ra / rb.
    int32_t t = 0;
    int32_t k0 = k_begin;
    for (int j = 0; j < LA; ++j)
      ra[j] = (a_off[j] >= 0 && k0 + a_kk[j] < k_end) ? asrc[a_off[j] + k_a[t][a_kk[j]]] : 0.0f;
    for (int j = 0; j < LB; ++j)
      rb[j] = (b_tap[j].base >= 0 && k0 + b_kk[j] < k_end)
                  ? P::load_b(args, bsrc,
                              make_tap(k_base[t][b_kk[j]], k_h[t][b_kk[j]], k_w[t][b_kk[j]]),
                              b_tap[j])
                  : 0.0f;
    for (int j = 0; j < LA; ++j) As[a_kk[j] * AW + (a_m[j] >> 2)][a_m[j] & 3] = ra[j];
    for (int j = 0; j < LB; ++j) Bs[b_kk[j] * BW + (b_c[j] >> 2)][b_c[j] & 3] = rb[j];
    threadgroup_barrier(mem_flags::mem_threadgroup);

    int32_t cur = 0;
    for (; k0 < k_end; k0 += BK) {
      const bool more = k0 + BK < k_end;
      const int32_t nk = k0 + BK, nt = 1 - cur;  // the next slice and its k table
      if (more) {
        for (int j = 0; j < LA; ++j)
          ra[j] = (a_off[j] >= 0 && nk + a_kk[j] < k_end) ? asrc[a_off[j] + k_a[nt][a_kk[j]]]
                                                          : 0.0f;
        for (int j = 0; j < LB; ++j)
          rb[j] = (b_tap[j].base >= 0 && nk + b_kk[j] < k_end)
                      ? P::load_b(args, bsrc,
                                  make_tap(k_base[nt][b_kk[j]], k_h[nt][b_kk[j]],
                                           k_w[nt][b_kk[j]]),
                                  b_tap[j])
                      : 0.0f;
      }
      for (int kk = 0; kk < BK; ++kk) {  // acc += A[k][rows] * B[k][columns], staged slice `cur`
        float4 av[TM / 4], bv[TN / 4];
        for (int i = 0; i < TM / 4; ++i) av[i] = As[(cur * BK + kk) * AW + i * MT + tr];
        for (int j = 0; j < TN / 4; ++j) bv[j] = Bs[(cur * BK + kk) * BW + j * NT + tc];
        for (int i = 0; i < TM; ++i)
          for (int j = 0; j < TN; ++j)
            acc[i * TN + j] = fma(av[i / 4][i % 4], bv[j / 4][j % 4], acc[i * TN + j]);
      }
      if (more) {
        for (int j = 0; j < LA; ++j)
          As[(nt * BK + a_kk[j]) * AW + (a_m[j] >> 2)][a_m[j] & 3] = ra[j];
        for (int j = 0; j < LB; ++j)
          Bs[(nt * BK + b_kk[j]) * BW + (b_c[j] >> 2)][b_c[j] & 3] = rb[j];
        // Slice k0 + 2*BK's k table replaces slice k0's (read before the last barrier).
        for (uint32_t kk = tid; kk < uint32_t(BK); kk += T) {
          const int32_t gk = k0 + 2 * BK + int32_t(kk);
          const bool in = gk < k_end;
          const Tap tp = in ? P::k_tap(args, g, gk) : make_tap(0, 0, 0);
          k_a[cur][kk] = in ? P::a_k(args, g, gk) : 0;
          k_base[cur][kk] = tp.base;
          k_h[cur][kk] = tp.h;
          k_w[cur][kk] = tp.w;
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      cur = nt;
    }
    // ---- epilogue: out[out_row(m) + out_col(c)]
    int32_t ocol[TN];
    for (int j = 0; j < TN; ++j) {
      const int32_t gc = col0 + ((j / 4) * NT + tc) * 4 + j % 4;
      ocol[j] = gc < NC ? P::out_col(args, gc) : -1;
    }
    for (int i = 0; i < TM; ++i) {
      const int32_t gm = row0 + ((i / 4) * MT + tr) * 4 + i % 4;
      if (gm >= M) continue;
      const int32_t orow = P::out_row(args, g, split, gm);
      const float b = P::bias_of(args, bias, flags, g, gm);
      for (int j = 0; j < TN; ++j)
        if (ocol[j] >= 0) out[orow + ocol[j]] = acc[i * TN + j] + b;
    }
  } else {
  // ---- any threadgroup size: passes of virtual threads, the tiles loaded with stride T
  for (uint32_t pass = 0; pass < uint32_t(V); pass += T) {
    const uint32_t v = pass + tid;
    const bool active = v < uint32_t(V);
    const int32_t tr = int32_t(v) / NT, tc = int32_t(v) - tr * NT;
    for (int i = 0; i < TM * TN; ++i) acc[i] = 0.0f;
    if (pass > 0) {
      // The previous pass left other slices' k tables: rebuild the first one.
      for (uint32_t kk = tid; kk < uint32_t(BK); kk += T) {
        const int32_t gk = k_begin + int32_t(kk);
        const bool in = gk < k_end;
        const Tap tp = in ? P::k_tap(args, g, gk) : make_tap(0, 0, 0);
        k_a[0][kk] = in ? P::a_k(args, g, gk) : 0;
        k_base[0][kk] = tp.base;
        k_h[0][kk] = tp.h;
        k_w[0][kk] = tp.w;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    int32_t cur = 0;
    for (int32_t k0 = k_begin; k0 < k_end; k0 += BK) {
      // Slice k0 into buffer `cur` (last read two slices ago, before the previous barrier).
      for (uint32_t e = tid; e < uint32_t(BM * BK); e += T) {
        int32_t m, kk;
        a_coords<P, BM, BK>(int32_t(e), m, kk);
        const int32_t gm = row0 + m, gk = k0 + kk;
        As[(cur * BK + kk) * AW + (m >> 2)][m & 3] =
            (gm < M && gk < k_end) ? asrc[P::a_row(args, g, gm) + k_a[cur][kk]] : 0.0f;
      }
      for (uint32_t e = tid; e < uint32_t(BN * BK); e += T) {
        int32_t c, kk;
        b_coords<P, BN, BK>(int32_t(e), c, kk);
        float value = 0.0f;
        if (col0 + c < NC && k0 + kk < k_end)
          value = P::load_b(args, bsrc, make_tap(k_base[cur][kk], k_h[cur][kk], k_w[cur][kk]),
                            make_tap(col_base[c], col_h[c], col_w[c]));
        Bs[(cur * BK + kk) * BW + (c >> 2)][c & 3] = value;
      }
      // The next slice's k table, into the other half.
      for (uint32_t kk = tid; kk < uint32_t(BK); kk += T) {
        const int32_t gk = k0 + BK + int32_t(kk);
        const bool in = gk < k_end;
        const Tap tp = in ? P::k_tap(args, g, gk) : make_tap(0, 0, 0);
        k_a[1 - cur][kk] = in ? P::a_k(args, g, gk) : 0;
        k_base[1 - cur][kk] = tp.base;
        k_h[1 - cur][kk] = tp.h;
        k_w[1 - cur][kk] = tp.w;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (active) {
        for (int kk = 0; kk < BK; ++kk) {  // acc += A[k][rows] * B[k][columns], staged slice `cur`
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
        const int32_t orow = P::out_row(args, g, split, gm);
        const float b = P::bias_of(args, bias, flags, g, gm);
        for (int j = 0; j < TN; ++j) {
          const int32_t gc = col0 + ((j / 4) * NT + tc) * 4 + j % 4;
          if (gc < NC) out[orow + P::out_col(args, gc)] = acc[i * TN + j] + b;
        }
      }
    }
  }
  }
}

// Tile shapes (rows x columns of C, threads = (BM/TM) * (BN/TN)); the host picks one per
// device and problem (csrc/ops/conv2d.cpp, docs/gpu_kernels.md says why):
//   128x128, 8x8 per thread, 256 threads, BK 8: large problems on NVIDIA-class GPUs
//   64x128,  8x8 per thread, 128 threads, BK 8: 64-row products, or to make more groups
//   64x64,   4x8 per thread, 128 threads, BK 16: Apple GPUs (MLX's 64x64x16 shape), and
//            small products elsewhere
//   32x64,   4x4 per thread, 128 threads, BK 16: at most 32 rows
FM_INSTANTIATE("conv2d_forward_128x128", conv2d_gemm, ConvForward, 128, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_forward_64x128", conv2d_gemm, ConvForward, 64, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_forward_64x64", conv2d_gemm, ConvForward, 64, 64, 16, 4, 8);
FM_INSTANTIATE("conv2d_forward_32x64", conv2d_gemm, ConvForward, 32, 64, 16, 4, 4);
FM_INSTANTIATE("conv2d_backward_input_128x128", conv2d_gemm, ConvBackwardInput, 128, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_backward_input_64x128", conv2d_gemm, ConvBackwardInput, 64, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_backward_input_64x64", conv2d_gemm, ConvBackwardInput, 64, 64, 16, 4, 8);
FM_INSTANTIATE("conv2d_backward_input_32x64", conv2d_gemm, ConvBackwardInput, 32, 64, 16, 4, 4);
FM_INSTANTIATE("conv2d_backward_weight_128x128", conv2d_gemm, ConvBackwardWeight, 128, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_backward_weight_64x128", conv2d_gemm, ConvBackwardWeight, 64, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_backward_weight_64x64", conv2d_gemm, ConvBackwardWeight, 64, 64, 16, 4, 8);
FM_INSTANTIATE("conv2d_backward_weight_32x64", conv2d_gemm, ConvBackwardWeight, 32, 64, 16, 4, 4);

// out[i] = sum over s of ws[s * n + i], n = C_out * C_in/groups * kH * kW (one weight).
kernel void conv2d_sum_splits(device const float* ws [[buffer(0)]],
                              device float* out [[buffer(1)]],
                              constant Conv2dArgs& a [[buffer(2)]],
                              constant uint32_t& splits [[buffer(3)]],
                              uint32_t i [[thread_position_in_grid]]) {
  const uint32_t n = uint32_t(a.C_out * (a.C_in / a.groups) * a.kH * a.kW);
  if (i >= n) return;
  float s = 0.0f;
  for (uint32_t p = 0; p < splits; ++p) s += ws[p * n + i];
  out[i] = s;
}

// ---------------------------------------------------------------- direct kernels
// One thread per output element; grid = (H_out * W_out, C_out, N).
kernel void conv2d_forward_direct(device const float* x [[buffer(0)]],
                                  device const float* w [[buffer(1)]],
                                  device const float* bias [[buffer(2)]],
                                  device float* y [[buffer(3)]],
                                  constant Conv2dArgs& a [[buffer(4)]],
                                  constant uint32_t& flags [[buffer(5)]],
                                  uint3 gid [[thread_position_in_grid]]) {
  const int32_t hw = a.H_out * a.W_out;
  const int32_t p = int32_t(gid.x), co = int32_t(gid.y), n = int32_t(gid.z);
  if (p >= hw || co >= a.C_out || n >= a.N) return;
  const int32_t oh = p / a.W_out, ow = p - oh * a.W_out;
  const int32_t cin_g = a.C_in / a.groups;
  const int32_t c0 = (co / (a.C_out / a.groups)) * cin_g;
  const int32_t ih0 = oh * a.stride_h - a.pad_h, iw0 = ow * a.stride_w - a.pad_w;
  float acc = 0.0f;
  for (int32_t ci = 0; ci < cin_g; ++ci) {
    device const float* xc = x + (n * a.C_in + c0 + ci) * a.H * a.W;
    device const float* wc = w + (co * cin_g + ci) * a.kH * a.kW;
    for (int32_t kh = 0; kh < a.kH; ++kh) {
      const int32_t ih = ih0 + kh * a.dil_h;
      if (ih < 0 || ih >= a.H) continue;
      for (int32_t kw = 0; kw < a.kW; ++kw) {
        const int32_t iw = iw0 + kw * a.dil_w;
        if (iw < 0 || iw >= a.W) continue;
        acc = fma(xc[ih * a.W + iw], wc[kh * a.kW + kw], acc);
      }
    }
  }
  if ((flags & 1u) != 0) acc += bias[co];
  y[(n * a.C_out + co) * hw + p] = acc;
}

// One thread per input element; grid = (H * W, C_in, N). Gathers every (output pixel,
// tap) that read this element: oh = (ih + pad - kh * dil) / stride where exact.
kernel void conv2d_backward_input_direct(device const float* gy [[buffer(0)]],
                                         device const float* w [[buffer(1)]],
                                         device float* gx [[buffer(2)]],
                                         constant Conv2dArgs& a [[buffer(3)]],
                                         uint3 gid [[thread_position_in_grid]]) {
  const int32_t hw = a.H * a.W;
  const int32_t p = int32_t(gid.x), c = int32_t(gid.y), n = int32_t(gid.z);
  if (p >= hw || c >= a.C_in || n >= a.N) return;
  const int32_t ih = p / a.W, iw = p - ih * a.W;
  const int32_t cin_g = a.C_in / a.groups, cout_g = a.C_out / a.groups;
  const int32_t g = c / cin_g, ci = c - g * cin_g;
  float acc = 0.0f;
  for (int32_t col = 0; col < cout_g; ++col) {
    const int32_t co = g * cout_g + col;
    device const float* gyc = gy + (n * a.C_out + co) * a.H_out * a.W_out;
    device const float* wc = w + (co * cin_g + ci) * a.kH * a.kW;
    for (int32_t kh = 0; kh < a.kH; ++kh) {
      const int32_t th = ih + a.pad_h - kh * a.dil_h;
      if (th < 0) continue;
      const int32_t oh = th / a.stride_h;
      if (oh * a.stride_h != th || oh >= a.H_out) continue;
      for (int32_t kw = 0; kw < a.kW; ++kw) {
        const int32_t tw = iw + a.pad_w - kw * a.dil_w;
        if (tw < 0) continue;
        const int32_t ow = tw / a.stride_w;
        if (ow * a.stride_w != tw || ow >= a.W_out) continue;
        acc = fma(gyc[oh * a.W_out + ow], wc[kh * a.kW + kw], acc);
      }
    }
  }
  gx[(n * a.C_in + c) * hw + p] = acc;
}

// ---------------------------------------------------------------- reductions
// out[o] = sum over i < N * H_out * W_out of R::term(o, i); one threadgroup per o
// (o = threadgroup_position_in_grid.x). Each thread sums a strided share, then the group
// adds the shares as a tree in threadgroup memory.
struct BiasSum {  // o = output channel
  static FM_FUNC float term(constant Conv2dArgs& a, device const float* gy, device const float* x,
                    int32_t o, int32_t i) {
    const int32_t hw = a.H_out * a.W_out;
    const int32_t n = i / hw, p = i - n * hw;
    return gy[(n * a.C_out + o) * hw + p];
  }
};

struct WeightDot {  // o = flat weight index (co, ci, kh, kw)
  static FM_FUNC float term(constant Conv2dArgs& a, device const float* gy, device const float* x,
                    int32_t o, int32_t i) {
    const int32_t khw = a.kH * a.kW;
    const int32_t cin_g = a.C_in / a.groups;
    const int32_t co = o / (cin_g * khw), r = o - co * (cin_g * khw);
    const int32_t ci = r / khw, t = r - ci * khw;
    const int32_t kh = t / a.kW, kw = t - kh * a.kW;
    const int32_t hw = a.H_out * a.W_out;
    const int32_t n = i / hw, p = i - n * hw;
    const int32_t oh = p / a.W_out, ow = p - oh * a.W_out;
    const int32_t ih = oh * a.stride_h - a.pad_h + kh * a.dil_h;
    const int32_t iw = ow * a.stride_w - a.pad_w + kw * a.dil_w;
    if (ih < 0 || ih >= a.H || iw < 0 || iw >= a.W) return 0.0f;
    const int32_t ch = (co / (a.C_out / a.groups)) * cin_g + ci;
    return gy[(n * a.C_out + co) * hw + p] * x[((n * a.C_in + ch) * a.H + ih) * a.W + iw];
  }
};

enum : uint32_t { kReduceSlots = 1024 };  // Metal's largest threadgroup

template <typename R>
kernel void conv2d_reduce(device const float* gy [[buffer(0)]],
                          device const float* x [[buffer(1)]],
                          device float* out [[buffer(2)]],
                          constant Conv2dArgs& a [[buffer(3)]],
                          uint3 tg_pos [[threadgroup_position_in_grid]],
                          uint32_t tid [[thread_index_in_threadgroup]],
                          uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup float partial[kReduceSlots];
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const int32_t o = int32_t(tg_pos.x);
  const int32_t count = a.N * a.H_out * a.W_out;
  float mine = 0.0f;
  for (int32_t i = int32_t(tid); i < count; i += int32_t(T)) mine += R::term(a, gy, x, o, i);
  // Fold threads beyond the slot count in, one round of kReduceSlots threads at a time.
  const uint32_t slots = min(T, uint32_t(kReduceSlots));
  for (uint32_t rnd = 0; rnd * kReduceSlots < T; ++rnd) {
    if (tid / kReduceSlots == rnd)
      partial[tid % kReduceSlots] = rnd == 0 ? mine : partial[tid % kReduceSlots] + mine;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  // Tree over `slots` entries (any count): halve a power-of-two span, skip missing partners.
  uint32_t span = 1;
  while (span < slots) span *= 2;
  for (uint32_t s = span / 2; s > 0; s /= 2) {
    if (tid < s && tid + s < slots) partial[tid] += partial[tid + s];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0) out[o] = partial[0];
}

FM_INSTANTIATE("conv2d_backward_bias", conv2d_reduce, BiasSum);
FM_INSTANTIATE("conv2d_backward_weight_reduce", conv2d_reduce, WeightDot);
