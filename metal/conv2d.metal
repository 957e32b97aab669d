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
// stepping through K in BK-deep slices staged in threadgroup memory, each thread holding
// TM x TN outputs in registers; with the (BM/TM) * (BN/TN) threads the host asks for it
// double-buffers the slices, and any other threadgroup size gives the same result through
// passes of "virtual threads" (see the kernel). Tile shapes and why: docs/gpu_kernels.md.
//
// The weight gradient has a long K (N*H_out*W_out) and a small output: it is split over
// K ("split-K"): threadgroups_per_grid.z = groups * splits, each split writes its partial
// product to its own slice of a workspace and conv2d_sum_splits adds the slices
// (deterministic: no atomics).
//
// Where the GEMM has only a few rows (depthwise convolutions: one channel per group) most
// of a tile would idle, so the host (csrc/ops/conv2d.cpp) uses direct kernels instead:
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
// depends on k alone. k is a mixed-radix number (q, u, v), v < r2, u < r1 (input channel
// and tap for the forward, output channel and tap for the input gradient, image and
// output pixel for the weight gradient); k_parts(q, u, v) gives its part of both operands'
// addresses {A offset, B offset, B row, B column}. A[m][k] = asrc[a_row(m) + A offset]
// inside the GEMM's bounds; B is a gather that load_b assembles from the k parts and the
// column parts col_tap(c) ({offset, row, column}), zero outside the image. The kernel keeps
// the k parts of two slices in threadgroup memory, advancing (q, u, v) by one slice with
// additions (no division per slice), and the column parts of its loads in registers.
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

// x(ih, iw) of the channel plane at `base` where `in` and the point is inside the image,
// else 0. Branch-free: the load always reads a valid address (element 0 when out of range),
// so a thread's loads issue back to back.
FM_FUNC float load_padded(thread const Conv2dArgs& a, device const float* x, bool in,
                          int32_t base, int32_t ih, int32_t iw) {
  // One unsigned compare per axis: negative coordinates wrap to huge values.
  const bool inside = in && uint32_t(ih) < uint32_t(a.H) && uint32_t(iw) < uint32_t(a.W);
  const float v = x[inside ? base + ih * a.W + iw : 0];
  return inside ? v : 0.0f;
}

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

struct ConvForward {
  static FM_FUNC int32_t batches(thread const Conv2dArgs& a) { return a.groups; }
  static FM_FUNC int32_t rows(thread const Conv2dArgs& a) { return a.C_out / a.groups; }
  static FM_FUNC int32_t cols(thread const Conv2dArgs& a) { return a.N * a.H_out * a.W_out; }
  static FM_FUNC int32_t depth(thread const Conv2dArgs& a) { return (a.C_in / a.groups) * a.kH * a.kW; }
  static FM_FUNC bool a_k_fast() { return true; }
  static FM_FUNC bool b_k_fast() { return false; }
  // k = (ci, kh, kw).
  static FM_FUNC int32_t r1(thread const Conv2dArgs& a) { return a.kH; }
  static FM_FUNC int32_t r2(thread const Conv2dArgs& a) { return a.kW; }
  // A = weight rows of group g: row co holds its C_in/groups * kH * kW taps contiguously.
  // B[ci, kh, kw][n, oh, ow] = x[n][g*C_in/groups + ci][oh*s - p + kh*d][ow*s - p + kw*d].
  static FM_FUNC int32_t a_row(thread const Conv2dArgs& a, int32_t g, int32_t m) {
    return (g * rows(a) + m) * depth(a);
  }
  static FM_FUNC int4 k_parts(thread const Conv2dArgs& a, int32_t g, int32_t q, int32_t u,
                              int32_t v) {
    return int4((q * a.kH + u) * a.kW + v, q * a.H * a.W, u * a.dil_h, v * a.dil_w);
  }
  static FM_FUNC Tap col_tap(thread const Conv2dArgs& a, int32_t g, int32_t c) {
    const int32_t hw = a.H_out * a.W_out;
    const int32_t n = c / hw, p = c - n * hw;
    const int32_t oh = p / a.W_out, ow = p - oh * a.W_out;
    return make_tap((n * a.C_in + g * (a.C_in / a.groups)) * a.H * a.W,
                    oh * a.stride_h - a.pad_h, ow * a.stride_w - a.pad_w);
  }
  static FM_FUNC float load_b(thread const Conv2dArgs& a, device const float* x, bool in,
                              int4 kp, Tap ct) {
    return load_padded(a, x, in, ct.base + kp.y, ct.h + kp.z, ct.w + kp.w);
  }
  static FM_FUNC int32_t out_row(thread const Conv2dArgs& a, int32_t g, int32_t split, int32_t m) {
    return (g * rows(a) + m) * a.H_out * a.W_out;
  }
  static FM_FUNC int32_t out_col(thread const Conv2dArgs& a, int32_t c) {
    const int32_t hw = a.H_out * a.W_out;
    const int32_t n = c / hw;
    return n * a.C_out * hw + (c - n * hw);
  }
  static FM_FUNC float bias_of(thread const Conv2dArgs& a, device const float* bias,
                               uint32_t flags, int32_t g, int32_t m) {
    return (flags & 1u) != 0 ? bias[g * rows(a) + m] : 0.0f;
  }
};

struct ConvBackwardInput {
  static FM_FUNC int32_t batches(thread const Conv2dArgs& a) { return a.groups; }
  static FM_FUNC int32_t rows(thread const Conv2dArgs& a) { return a.C_in / a.groups; }
  static FM_FUNC int32_t cols(thread const Conv2dArgs& a) { return a.N * a.H * a.W; }
  static FM_FUNC int32_t depth(thread const Conv2dArgs& a) { return (a.C_out / a.groups) * a.kH * a.kW; }
  static FM_FUNC bool a_k_fast() { return true; }
  static FM_FUNC bool b_k_fast() { return false; }
  // k = (co, kh, kw).
  static FM_FUNC int32_t r1(thread const Conv2dArgs& a) { return a.kH; }
  static FM_FUNC int32_t r2(thread const Conv2dArgs& a) { return a.kW; }
  // A[ci][co, kh, kw] = w[g*C_out/groups + co][ci][kh][kw] (the transposed weight).
  // B[co, kh, kw][n, ih, iw] = gy at the output pixel whose tap (kh, kw) read (ih, iw):
  // oh = (ih + p - kh*d) / s where that division is exact and oh is in range.
  static FM_FUNC int32_t a_row(thread const Conv2dArgs& a, int32_t g, int32_t m) {
    return m * a.kH * a.kW;
  }
  static FM_FUNC int4 k_parts(thread const Conv2dArgs& a, int32_t g, int32_t q, int32_t u,
                              int32_t v) {
    const int32_t khw = a.kH * a.kW;
    return int4((g * (a.C_out / a.groups) + q) * rows(a) * khw + u * a.kW + v,
                q * a.H_out * a.W_out, u * a.dil_h, v * a.dil_w);
  }
  static FM_FUNC Tap col_tap(thread const Conv2dArgs& a, int32_t g, int32_t c) {
    const int32_t hw = a.H * a.W;
    const int32_t n = c / hw, p = c - n * hw;
    const int32_t ih = p / a.W, iw = p - ih * a.W;
    return make_tap((n * a.C_out + g * (a.C_out / a.groups)) * a.H_out * a.W_out,
                    ih + a.pad_h, iw + a.pad_w);
  }
  static FM_FUNC float load_b(thread const Conv2dArgs& a, device const float* gy, bool in,
                              int4 kp, Tap ct) {
    int32_t oh = ct.h - kp.z, ow = ct.w - kp.w;
    if (a.stride_h != 1 || a.stride_w != 1) {  // uniform: no division for stride 1
      const int32_t th = oh, tw = ow;
      oh = th / a.stride_h;
      ow = tw / a.stride_w;
      in = in && th >= 0 && tw >= 0 && oh * a.stride_h == th && ow * a.stride_w == tw;
    }
    const bool inside = in && uint32_t(oh) < uint32_t(a.H_out) && uint32_t(ow) < uint32_t(a.W_out);
    const float v = gy[inside ? ct.base + kp.y + oh * a.W_out + ow : 0];
    return inside ? v : 0.0f;
  }
  static FM_FUNC int32_t out_row(thread const Conv2dArgs& a, int32_t g, int32_t split, int32_t m) {
    return (g * rows(a) + m) * a.H * a.W;
  }
  static FM_FUNC int32_t out_col(thread const Conv2dArgs& a, int32_t c) {
    const int32_t hw = a.H * a.W;
    const int32_t n = c / hw;
    return n * a.C_in * hw + (c - n * hw);
  }
  static FM_FUNC float bias_of(thread const Conv2dArgs& a, device const float* bias,
                               uint32_t flags, int32_t g, int32_t m) {
    return 0.0f;
  }
};

struct ConvBackwardWeight {
  static FM_FUNC int32_t batches(thread const Conv2dArgs& a) { return a.groups; }
  static FM_FUNC int32_t rows(thread const Conv2dArgs& a) { return a.C_out / a.groups; }
  static FM_FUNC int32_t cols(thread const Conv2dArgs& a) { return (a.C_in / a.groups) * a.kH * a.kW; }
  static FM_FUNC int32_t depth(thread const Conv2dArgs& a) { return a.N * a.H_out * a.W_out; }
  static FM_FUNC bool a_k_fast() { return true; }
  static FM_FUNC bool b_k_fast() { return true; }
  // k = (n, oh, ow).
  static FM_FUNC int32_t r1(thread const Conv2dArgs& a) { return a.H_out; }
  static FM_FUNC int32_t r2(thread const Conv2dArgs& a) { return a.W_out; }
  // A[co][n, oh, ow] = gy. B[n, oh, ow][ci, kh, kw] = the input value tap (kh, kw) of
  // output pixel (oh, ow) read: the forward's gather with the roles of k and c swapped.
  static FM_FUNC int32_t a_row(thread const Conv2dArgs& a, int32_t g, int32_t m) {
    return (g * rows(a) + m) * a.H_out * a.W_out;
  }
  static FM_FUNC int4 k_parts(thread const Conv2dArgs& a, int32_t g, int32_t q, int32_t u,
                              int32_t v) {
    return int4((q * a.C_out * a.H_out + u) * a.W_out + v,
                (q * a.C_in + g * (a.C_in / a.groups)) * a.H * a.W,
                u * a.stride_h - a.pad_h, v * a.stride_w - a.pad_w);
  }
  static FM_FUNC Tap col_tap(thread const Conv2dArgs& a, int32_t g, int32_t c) {
    const int32_t khw = a.kH * a.kW;
    const int32_t ci = c / khw, r = c - ci * khw;
    const int32_t kh = r / a.kW, kw = r - kh * a.kW;
    return make_tap(ci * a.H * a.W, kh * a.dil_h, kw * a.dil_w);
  }
  static FM_FUNC float load_b(thread const Conv2dArgs& a, device const float* x, bool in,
                              int4 kp, Tap ct) {
    return load_padded(a, x, in, kp.y + ct.base, kp.z + ct.h, kp.w + ct.w);
  }
  // Split s writes the s-th weight-sized slice of the output (the workspace when s > 1).
  static FM_FUNC int32_t out_row(thread const Conv2dArgs& a, int32_t g, int32_t split, int32_t m) {
    return split * a.C_out * cols(a) + (g * rows(a) + m) * cols(a);
  }
  static FM_FUNC int32_t out_col(thread const Conv2dArgs& a, int32_t c) { return c; }
  static FM_FUNC float bias_of(thread const Conv2dArgs& a, device const float* bias,
                               uint32_t flags, int32_t g, int32_t m) {
    return 0.0f;
  }
};

// ---- Winograd products (metal/conv_winograd.metal has the transforms and the layout of
// the transformed tensors). F(m x m, 3x3) with m = 2 (16 transform points) or m = 4 (36):
// each transform point t is one plain GEMM, batched along z in place of the groups; k has
// one digit (r1 = r2 = 1). `a` is the argument block of the stride-1 3x3 convolution being
// computed (for the input gradient, the equivalent forward convolution of gy),
// tiles = N * ceil(H_out/m) * ceil(W_out/m).
template <int TILE>
FM_FUNC int32_t winograd_tiles(thread const Conv2dArgs& a) {
  return a.N * ((a.H_out + TILE - 1) / TILE) * ((a.W_out + TILE - 1) / TILE);
}

// Forward: M[t][co][p] = sum_ci U[t][co][ci] * V[t][ci][p] (U transformed weights,
// V transformed input tiles).
template <int TILE>
struct WinogradForward {
  static FM_FUNC int32_t batches(thread const Conv2dArgs& a) { return (TILE + 2) * (TILE + 2); }
  static FM_FUNC int32_t rows(thread const Conv2dArgs& a) { return a.C_out; }
  static FM_FUNC int32_t cols(thread const Conv2dArgs& a) { return winograd_tiles<TILE>(a); }
  static FM_FUNC int32_t depth(thread const Conv2dArgs& a) { return a.C_in; }
  static FM_FUNC bool a_k_fast() { return true; }
  static FM_FUNC bool b_k_fast() { return false; }
  static FM_FUNC int32_t r1(thread const Conv2dArgs& a) { return 1; }
  static FM_FUNC int32_t r2(thread const Conv2dArgs& a) { return 1; }
  static FM_FUNC int32_t a_row(thread const Conv2dArgs& a, int32_t t, int32_t m) {
    return (t * a.C_out + m) * a.C_in;
  }
  static FM_FUNC int4 k_parts(thread const Conv2dArgs& a, int32_t t, int32_t q, int32_t u,
                              int32_t v) {
    return int4(q, q * winograd_tiles<TILE>(a), 0, 0);
  }
  static FM_FUNC Tap col_tap(thread const Conv2dArgs& a, int32_t t, int32_t c) {
    return make_tap(t * a.C_in * winograd_tiles<TILE>(a) + c, 0, 0);
  }
  static FM_FUNC float load_b(thread const Conv2dArgs& a, device const float* v, bool in,
                              int4 kp, Tap ct) {
    const float x = v[in ? ct.base + kp.y : 0];
    return in ? x : 0.0f;
  }
  static FM_FUNC int32_t out_row(thread const Conv2dArgs& a, int32_t t, int32_t split, int32_t m) {
    return (t * a.C_out + m) * winograd_tiles<TILE>(a);
  }
  static FM_FUNC int32_t out_col(thread const Conv2dArgs& a, int32_t c) { return c; }
  static FM_FUNC float bias_of(thread const Conv2dArgs& a, device const float* bias,
                               uint32_t flags, int32_t t, int32_t m) {
    return 0.0f;  // added by the output transform
  }
};

// Weight gradient (F(2x2, 3x3)): dU[split][t][co][ci] = sum_p Z[t][co][p] * V[t][ci][p] over
// this split's tiles (Z transformed output-gradient tiles, V transformed input tiles); the
// weight transform's adjoint adds the splits.
struct WinogradWeight {
  static FM_FUNC int32_t batches(thread const Conv2dArgs& a) { return 16; }
  static FM_FUNC int32_t rows(thread const Conv2dArgs& a) { return a.C_out; }
  static FM_FUNC int32_t cols(thread const Conv2dArgs& a) { return a.C_in; }
  static FM_FUNC int32_t depth(thread const Conv2dArgs& a) { return winograd_tiles<2>(a); }
  static FM_FUNC bool a_k_fast() { return true; }
  static FM_FUNC bool b_k_fast() { return true; }
  static FM_FUNC int32_t r1(thread const Conv2dArgs& a) { return 1; }
  static FM_FUNC int32_t r2(thread const Conv2dArgs& a) { return 1; }
  static FM_FUNC int32_t a_row(thread const Conv2dArgs& a, int32_t t, int32_t m) {
    return (t * a.C_out + m) * winograd_tiles<2>(a);
  }
  static FM_FUNC int4 k_parts(thread const Conv2dArgs& a, int32_t t, int32_t q, int32_t u,
                              int32_t v) {
    return int4(q, q, 0, 0);
  }
  static FM_FUNC Tap col_tap(thread const Conv2dArgs& a, int32_t t, int32_t c) {
    return make_tap((t * a.C_in + c) * winograd_tiles<2>(a), 0, 0);
  }
  static FM_FUNC float load_b(thread const Conv2dArgs& a, device const float* v, bool in,
                              int4 kp, Tap ct) {
    const float x = v[in ? ct.base + kp.y : 0];
    return in ? x : 0.0f;
  }
  static FM_FUNC int32_t out_row(thread const Conv2dArgs& a, int32_t t, int32_t split, int32_t m) {
    return ((split * 16 + t) * a.C_out + m) * a.C_in;
  }
  static FM_FUNC int32_t out_col(thread const Conv2dArgs& a, int32_t c) { return c; }
  static FM_FUNC float bias_of(thread const Conv2dArgs& a, device const float* bias,
                               uint32_t flags, int32_t t, int32_t m) {
    return 0.0f;
  }
};

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
    // This thread's loads: fixed rows / columns, their address parts in registers.
    int32_t a_m[LA], a_kk[LA], a_off[LA], b_c[LB], b_kk[LB];
    bool b_in[LB];
    Tap b_tap[LB];
    for (int j = 0; j < LA; ++j) {
      a_coords<P, BM, BK>(int32_t(tid) + j * V, a_m[j], a_kk[j]);
      a_off[j] = row0 + a_m[j] < M ? P::a_row(a, g, row0 + a_m[j]) : -1;
    }
    for (int j = 0; j < LB; ++j) {
      b_coords<P, BN, BK>(int32_t(tid) + j * V, b_c[j], b_kk[j]);
      b_tap[j] = make_tap(col_base[b_c[j]], col_h[b_c[j]], col_w[b_c[j]]);
      b_in[j] = col0 + b_c[j] < NC;
    }
    // The k parts of slice k0 + 2 * BK + tid, kept by the first BK threads.
    KCounter kc_next = k_split(k_begin + 2 * BK + int32_t(tid), R1, R2);
    float ra[LA], rb[LB];
    int32_t k0 = k_begin;
    for (int j = 0; j < LA; ++j) {
      const bool in = a_off[j] >= 0 && k0 + a_kk[j] < k_end;
      const float v = asrc[in ? a_off[j] + k_tab[a_kk[j]].x : 0];
      ra[j] = in ? v : 0.0f;
    }
    for (int j = 0; j < LB; ++j)
      rb[j] = P::load_b(a, bsrc, b_in[j] && k0 + b_kk[j] < k_end, k_tab[b_kk[j]], b_tap[j]);
    for (int j = 0; j < LA; ++j) As[a_kk[j] * AW + (a_m[j] >> 2)][a_m[j] & 3] = ra[j];
    for (int j = 0; j < LB; ++j) Bs[b_kk[j] * BW + (b_c[j] >> 2)][b_c[j] & 3] = rb[j];
    threadgroup_barrier(mem_flags::mem_threadgroup);

    int32_t cur = 0;
    for (; k0 < k_end; k0 += BK) {
      const bool more = k0 + BK < k_end;
      const int32_t nk = k0 + BK, nt = 1 - cur;  // the next slice and its k parts
      if (more) {
        for (int j = 0; j < LA; ++j) {
          const bool in = a_off[j] >= 0 && nk + a_kk[j] < k_end;
          const float v = asrc[in ? a_off[j] + k_tab[nt * BK + a_kk[j]].x : 0];
          ra[j] = in ? v : 0.0f;
        }
        for (int j = 0; j < LB; ++j)
          rb[j] = P::load_b(a, bsrc, b_in[j] && nk + b_kk[j] < k_end, k_tab[nt * BK + b_kk[j]],
                            b_tap[j]);
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
        for (int j = 0; j < LA; ++j)
          As[(nt * BK + a_kk[j]) * AW + (a_m[j] >> 2)][a_m[j] & 3] = ra[j];
        for (int j = 0; j < LB; ++j)
          Bs[(nt * BK + b_kk[j]) * BW + (b_c[j] >> 2)][b_c[j] & 3] = rb[j];
        // Slice k0 + 2*BK's k parts replace slice k0's (read before the last barrier).
        if (tid < uint32_t(BK)) {
          k_tab[cur * BK + int32_t(tid)] = P::k_parts(a, g, kc_next.q, kc_next.u, kc_next.v);
          kc_next = k_step(kc_next, slice_step, R1, R2);
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      cur = nt;
    }
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
        a_coords<P, BM, BK>(int32_t(e), m, kk);
        const int32_t gm = row0 + m, gk = k0 + kk;
        As[(cur * BK + kk) * AW + (m >> 2)][m & 3] =
            (gm < M && gk < k_end) ? asrc[P::a_row(a, g, gm) + k_tab[cur * BK + kk].x] : 0.0f;
      }
      for (uint32_t e = tid; e < uint32_t(BN * BK); e += T) {
        int32_t c, kk;
        b_coords<P, BN, BK>(int32_t(e), c, kk);
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
          if (gc < NC) out[orow + P::out_col(a, gc)] = acc[i * TN + j] + b;
        }
      }
    }
  }
  }
}

// Tile shapes (rows x columns of C, threads = (BM/TM) * (BN/TN)); the host picks one per
// device and problem (csrc/ops/conv2d.cpp, docs/gpu_kernels.md says why):
//   128x128, 8x8 per thread, 256 threads, BK 8: large problems on NVIDIA-class GPUs
//   64x128,  8x8 per thread, 128 threads, BK 8: 64-row products, or too few 128x128 tiles
//   64x64,   4x8 per thread, 128 threads, BK 16: Apple GPUs (MLX's 64x64x16 shape)
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
FM_INSTANTIATE("conv2d_winograd_gemm_128x128", conv2d_gemm, WinogradForward<2>, 128, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_winograd_gemm_64x128", conv2d_gemm, WinogradForward<2>, 64, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_winograd_gemm_64x64", conv2d_gemm, WinogradForward<2>, 64, 64, 16, 4, 8);
FM_INSTANTIATE("conv2d_winograd_gemm_32x64", conv2d_gemm, WinogradForward<2>, 32, 64, 16, 4, 4);
FM_INSTANTIATE("conv2d_winograd4_gemm_128x128", conv2d_gemm, WinogradForward<4>, 128, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_winograd4_gemm_64x128", conv2d_gemm, WinogradForward<4>, 64, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_winograd4_gemm_64x64", conv2d_gemm, WinogradForward<4>, 64, 64, 16, 4, 8);
FM_INSTANTIATE("conv2d_winograd4_gemm_32x64", conv2d_gemm, WinogradForward<4>, 32, 64, 16, 4, 4);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_128x128", conv2d_gemm, WinogradWeight, 128, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_64x128", conv2d_gemm, WinogradWeight, 64, 128, 8, 8, 8);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_64x64", conv2d_gemm, WinogradWeight, 64, 64, 16, 4, 8);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_32x64", conv2d_gemm, WinogradWeight, 32, 64, 16, 4, 4);

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
