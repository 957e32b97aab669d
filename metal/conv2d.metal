// conv2d kernels: forward, input gradient, weight gradient, and the first pass of the bias
// gradient (its second is reduce.metal's row sum: csrc/ops/conv2d.cpp).
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
// conv2d_gemm<Problem, BM, BN, BK, TM, TN> (metal/conv_gemm.h; this file holds the problem
// descriptions and instantiates it) computes a BM x BN tile of C per threadgroup,
// stepping through K in BK-deep slices staged in threadgroup memory, each thread holding
// TM x TN outputs in registers; with the (BM/TM) * (BN/TN) threads the host asks for it
// double-buffers the slices, and any other threadgroup size gives the same result through
// passes of "virtual threads" (see the kernel). Tile shapes and why: docs/gpu_kernels.md.
//
// The weight gradient has a long K (N*H_out*W_out) and a small output: it is split over
// K ("split-K"): threadgroups_per_grid.z = groups * splits, each split writes its partial
// product to its own slice of a workspace and conv2d_sum_splits adds the slices
// (deterministic: no atomics). The input gradient does the same where its tiles are too few
// to fill the GPU (a 1x1 layer with many output channels).
//
// Where the GEMM has only a few rows (depthwise convolutions: one channel per group) most
// of a tile would idle, so the host (csrc/ops/conv2d.cpp) uses direct kernels instead:
// conv2d_forward_direct when C_out/groups <= 4 and conv2d_backward_input_direct when
// C_in/groups <= 4 (one thread per output element, no barriers), and
// conv2d_reduce<WeightDot> (one threadgroup per weight element) when
// (C_out/groups) * (C_in/groups) <= 4. Where the weight gradient's GEMM has only a few
// columns (at most 16 weights per output channel: first layers) most of a tile would idle
// too: conv2d_backward_weight_narrow (below) takes it.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "conv2d_args.h"
#include "conv_gemm.h"
#include "split_sum.h"
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

// x(ih, iw) of the channel plane at `base` where `in` and the point is inside the image,
// else 0 (a predicated load: load_or_zero in metal/conv_gemm.h says why).
FM_FUNC float load_padded(thread const Conv2dArgs& a, device const float* x, bool in,
                          int32_t base, int32_t ih, int32_t iw) {
  // One unsigned compare per axis: negative coordinates wrap to huge values.
  const bool inside = in && uint32_t(ih) < uint32_t(a.H) && uint32_t(iw) < uint32_t(a.W);
  return load_or_zero(x, inside, base + ih * a.W + iw);
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
    return (flags & FM_CONV_BIAS) != 0u ? bias[g * rows(a) + m] : 0.0f;
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
    return load_or_zero(gy, inside, ct.base + kp.y + oh * a.W_out + ow);
  }
  // Split s (split-K, where the host asks for it) writes the s-th input-sized slice.
  static FM_FUNC int32_t out_row(thread const Conv2dArgs& a, int32_t g, int32_t split, int32_t m) {
    return split * a.N * a.C_in * a.H * a.W + (g * rows(a) + m) * a.H * a.W;
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
    return load_or_zero(v, in, ct.base + kp.y);
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

// Weight gradient (F(m x m, 3x3), m = 2 or 4): dU[split][t][co][ci] = sum_p Z[t][co][p] *
// V[t][ci][p] over this split's tiles (Z transformed output-gradient tiles, V transformed
// input tiles); the weight transform's adjoint adds the splits.
template <int TILE>
struct WinogradWeight {
  static FM_FUNC int32_t batches(thread const Conv2dArgs& a) { return (TILE + 2) * (TILE + 2); }
  static FM_FUNC int32_t rows(thread const Conv2dArgs& a) { return a.C_out; }
  static FM_FUNC int32_t cols(thread const Conv2dArgs& a) { return a.C_in; }
  static FM_FUNC int32_t depth(thread const Conv2dArgs& a) { return winograd_tiles<TILE>(a); }
  static FM_FUNC bool a_k_fast() { return true; }
  static FM_FUNC bool b_k_fast() { return true; }
  static FM_FUNC int32_t r1(thread const Conv2dArgs& a) { return 1; }
  static FM_FUNC int32_t r2(thread const Conv2dArgs& a) { return 1; }
  static FM_FUNC int32_t a_row(thread const Conv2dArgs& a, int32_t t, int32_t m) {
    return (t * a.C_out + m) * winograd_tiles<TILE>(a);
  }
  static FM_FUNC int4 k_parts(thread const Conv2dArgs& a, int32_t t, int32_t q, int32_t u,
                              int32_t v) {
    return int4(q, q, 0, 0);
  }
  static FM_FUNC Tap col_tap(thread const Conv2dArgs& a, int32_t t, int32_t c) {
    return make_tap((t * a.C_in + c) * winograd_tiles<TILE>(a), 0, 0);
  }
  static FM_FUNC float load_b(thread const Conv2dArgs& a, device const float* v, bool in,
                              int4 kp, Tap ct) {
    return load_or_zero(v, in, ct.base + kp.y);
  }
  static FM_FUNC int32_t out_row(thread const Conv2dArgs& a, int32_t t, int32_t split, int32_t m) {
    return ((split * batches(a) + t) * a.C_out + m) * a.C_in;
  }
  static FM_FUNC int32_t out_col(thread const Conv2dArgs& a, int32_t c) { return c; }
  static FM_FUNC float bias_of(thread const Conv2dArgs& a, device const float* bias,
                               uint32_t flags, int32_t t, int32_t m) {
    return 0.0f;
  }
};

// Tile shapes (rows x columns of C, threads = (BM/TM) * (BN/TN)); the host picks one per
// device and problem (csrc/ops/conv2d_gemm.cpp, docs/gpu_kernels.md says why):
//   128x128, 8x8 per thread, 256 threads, BK 8: large problems on NVIDIA-class GPUs
//   64x128,  8x8 per thread, 128 threads, BK 8: 64-row products, or too few 128x128 tiles
//   64x64,   4x8 per thread, 128 threads, BK 16: Apple GPUs (MLX's 64x64x16 shape)
//   32x64,   4x4 per thread, 128 threads, BK 16: at most 32 rows
FM_INSTANTIATE("conv2d_forward_128x128", conv2d_gemm, ConvForward, 128, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_forward_64x128", conv2d_gemm, ConvForward, 64, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_forward_64x64", conv2d_gemm, ConvForward, 64, 64, 16, 4, 8, false);
FM_INSTANTIATE("conv2d_forward_32x64", conv2d_gemm, ConvForward, 32, 64, 16, 4, 4, false);
// The forward with relu applied as it stores (RELU; fastmetal.compile's fusion pass).
FM_INSTANTIATE("conv2d_forward_128x128_relu", conv2d_gemm, ConvForward, 128, 128, 8, 8, 8, false, true);
FM_INSTANTIATE("conv2d_forward_64x128_relu", conv2d_gemm, ConvForward, 64, 128, 8, 8, 8, false, true);
FM_INSTANTIATE("conv2d_forward_64x64_relu", conv2d_gemm, ConvForward, 64, 64, 16, 4, 8, false, true);
FM_INSTANTIATE("conv2d_forward_32x64_relu", conv2d_gemm, ConvForward, 32, 64, 16, 4, 4, false, true);
FM_INSTANTIATE("conv2d_backward_input_128x128", conv2d_gemm, ConvBackwardInput, 128, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_backward_input_64x128", conv2d_gemm, ConvBackwardInput, 64, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_backward_input_64x64", conv2d_gemm, ConvBackwardInput, 64, 64, 16, 4, 8, false);
FM_INSTANTIATE("conv2d_backward_input_32x64", conv2d_gemm, ConvBackwardInput, 32, 64, 16, 4, 4, false);
FM_INSTANTIATE("conv2d_backward_weight_128x128", conv2d_gemm, ConvBackwardWeight, 128, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_backward_weight_64x128", conv2d_gemm, ConvBackwardWeight, 64, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_backward_weight_64x64", conv2d_gemm, ConvBackwardWeight, 64, 64, 16, 4, 8, false);
FM_INSTANTIATE("conv2d_backward_weight_32x64", conv2d_gemm, ConvBackwardWeight, 32, 64, 16, 4, 4, false);
FM_INSTANTIATE("conv2d_winograd_gemm_128x128", conv2d_gemm, WinogradForward<2>, 128, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_winograd_gemm_64x128", conv2d_gemm, WinogradForward<2>, 64, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_winograd_gemm_64x64", conv2d_gemm, WinogradForward<2>, 64, 64, 16, 4, 8, false);
FM_INSTANTIATE("conv2d_winograd_gemm_32x64", conv2d_gemm, WinogradForward<2>, 32, 64, 16, 4, 4, false);
FM_INSTANTIATE("conv2d_winograd4_gemm_128x128", conv2d_gemm, WinogradForward<4>, 128, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_winograd4_gemm_64x128", conv2d_gemm, WinogradForward<4>, 64, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_winograd4_gemm_64x64", conv2d_gemm, WinogradForward<4>, 64, 64, 16, 4, 8, false);
FM_INSTANTIATE("conv2d_winograd4_gemm_32x64", conv2d_gemm, WinogradForward<4>, 32, 64, 16, 4, 4, false);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_128x128", conv2d_gemm, WinogradWeight<2>, 128, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_64x128", conv2d_gemm, WinogradWeight<2>, 64, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_64x64", conv2d_gemm, WinogradWeight<2>, 64, 64, 16, 4, 8, false);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_32x64", conv2d_gemm, WinogradWeight<2>, 32, 64, 16, 4, 4, false);
FM_INSTANTIATE("conv2d_winograd4_weight_gemm_128x128", conv2d_gemm, WinogradWeight<4>, 128, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_winograd4_weight_gemm_64x128", conv2d_gemm, WinogradWeight<4>, 64, 128, 8, 8, 8, false);
FM_INSTANTIATE("conv2d_winograd4_weight_gemm_64x64", conv2d_gemm, WinogradWeight<4>, 64, 64, 16, 4, 8, false);
FM_INSTANTIATE("conv2d_winograd4_weight_gemm_32x64", conv2d_gemm, WinogradWeight<4>, 32, 64, 16, 4, 4, false);
// The same products with 16-byte loads, where the host finds every operand row 16-byte
// aligned and a multiple of 4 long (csrc/ops/conv2d_winograd.cpp, winograd_vec4).
FM_INSTANTIATE("conv2d_winograd_gemm_128x128_vec4", conv2d_gemm, WinogradForward<2>, 128, 128, 8, 8, 8, true);
FM_INSTANTIATE("conv2d_winograd_gemm_64x128_vec4", conv2d_gemm, WinogradForward<2>, 64, 128, 8, 8, 8, true);
FM_INSTANTIATE("conv2d_winograd_gemm_64x64_vec4", conv2d_gemm, WinogradForward<2>, 64, 64, 16, 4, 8, true);
FM_INSTANTIATE("conv2d_winograd_gemm_32x64_vec4", conv2d_gemm, WinogradForward<2>, 32, 64, 16, 4, 4, true);
FM_INSTANTIATE("conv2d_winograd4_gemm_128x128_vec4", conv2d_gemm, WinogradForward<4>, 128, 128, 8, 8, 8, true);
FM_INSTANTIATE("conv2d_winograd4_gemm_64x128_vec4", conv2d_gemm, WinogradForward<4>, 64, 128, 8, 8, 8, true);
FM_INSTANTIATE("conv2d_winograd4_gemm_64x64_vec4", conv2d_gemm, WinogradForward<4>, 64, 64, 16, 4, 8, true);
FM_INSTANTIATE("conv2d_winograd4_gemm_32x64_vec4", conv2d_gemm, WinogradForward<4>, 32, 64, 16, 4, 4, true);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_128x128_vec4", conv2d_gemm, WinogradWeight<2>, 128, 128, 8, 8, 8, true);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_64x128_vec4", conv2d_gemm, WinogradWeight<2>, 64, 128, 8, 8, 8, true);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_64x64_vec4", conv2d_gemm, WinogradWeight<2>, 64, 64, 16, 4, 8, true);
FM_INSTANTIATE("conv2d_winograd_weight_gemm_32x64_vec4", conv2d_gemm, WinogradWeight<2>, 32, 64, 16, 4, 4, true);
FM_INSTANTIATE("conv2d_winograd4_weight_gemm_128x128_vec4", conv2d_gemm, WinogradWeight<4>, 128, 128, 8, 8, 8, true);
FM_INSTANTIATE("conv2d_winograd4_weight_gemm_64x128_vec4", conv2d_gemm, WinogradWeight<4>, 64, 128, 8, 8, 8, true);
FM_INSTANTIATE("conv2d_winograd4_weight_gemm_64x64_vec4", conv2d_gemm, WinogradWeight<4>, 64, 64, 16, 4, 8, true);
FM_INSTANTIATE("conv2d_winograd4_weight_gemm_32x64_vec4", conv2d_gemm, WinogradWeight<4>, 32, 64, 16, 4, 4, true);

// out[i] = sum over s of ws[s * n + i], the split-K slices of one output (a weight
// gradient, or an input gradient), added in a fixed order.
kernel void conv2d_sum_splits(device const float* ws [[buffer(0)]],
                              device float* out [[buffer(1)]],
                              constant uint32_t& n [[buffer(2)]],
                              constant uint32_t& splits [[buffer(3)]],
                              uint32_t i [[thread_position_in_grid]]) {
  if (i < n) out[i] = sum_slices(ws, n, splits, i);
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
  if ((flags & FM_CONV_BIAS) != 0u) acc += bias[co];
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

FM_INSTANTIATE("conv2d_backward_weight_reduce", conv2d_reduce, WeightDot);

// ------------------------------------------------------------ narrow weight gradient
// conv2d_backward_weight_narrow<COLS>: the weight gradient of a layer with few weights per
// output channel (cols = C_in/groups * kH * kW <= COLS, COLS = 4, 9 or 16), such as MNIST's
// conv1: 9 weights per channel against K = N * H_out * W_out = 43,264 positions. As a GEMM
// it fills 9 of a tile's 64 columns (on an H100: 21.3 us plus 5.9 us of split-K sums).
// A threadgroup takes FM_CONV_NARROW_LANES output channels, one a lane, and one chunk of
// RUNS * FM_CONV_NARROW_RUN positions; virtual thread (run r, lane l) walks run r's positions
// in order, and for each one loads gy (its channel's) and the cols inputs of the position's
// taps, which are the same for every lane (one broadcast load each), for cols FMAs: the
// index and bounds arithmetic of a tap is done once for all the lanes. (A first version
// with the lanes over positions redid it for every channel: 31.8 us.) The runs' sums meet in
// threadgroup memory and are added in run order into ws[co * cols + col][chunk];
// reduce.metal's row sum then adds each weight's chunks (csrc/ops/conv2d_gemm.cpp). With `flags`
// bit 0 the bias gradient comes along: the sums of gy (one more add a position) into
// wsb[co][chunk], in place of conv2d_bias_grad_chunks' second pass over gy. Fixed orders
// throughout; any group size (virtual threads).
// Grid: x = chunks * group size threads, y = ceil(C_out / FM_CONV_NARROW_LANES).
template <int COLS>
kernel void conv2d_backward_weight_narrow(device const float* gy [[buffer(0)]],
                                          device const float* x [[buffer(1)]],
                                          device float* ws [[buffer(2)]],
                                          device float* wsb [[buffer(3)]],
                                          constant Conv2dArgs& a [[buffer(4)]],
                                          constant uint32_t& flags [[buffer(5)]],
                                          uint3 tg_pos [[threadgroup_position_in_grid]],
                                          uint32_t tid [[thread_index_in_threadgroup]],
                                          uint3 tg_size [[threads_per_threadgroup]]) {
  constexpr int32_t LANES = FM_CONV_NARROW_LANES, RUNS = FM_CONV_NARROW_RUNS;
  constexpr int32_t PER = RUNS * FM_CONV_NARROW_RUN;  // positions per chunk
  // [run][lane][col], rows of FM_CONV_NARROW_COLS + 1 floats; then the bias sums [run][lane]
  threadgroup float partial[FM_CONV_NARROW_RUNS * FM_CONV_NARROW_LANES * FM_CONV_NARROW_COLS +
                            FM_CONV_NARROW_RUNS * FM_CONV_NARROW_LANES];
  threadgroup float partial_b[FM_CONV_NARROW_RUNS * FM_CONV_NARROW_LANES];
  constexpr int32_t PITCH = FM_CONV_NARROW_COLS + 1;
  const int32_t T = int32_t(tg_size.x * tg_size.y * tg_size.z);
  const int32_t chunk = int32_t(tg_pos.x), co0 = int32_t(tg_pos.y) * LANES;
  const int32_t khw = a.kH * a.kW, cin_g = a.C_in / a.groups, cols = cin_g * khw;
  const int32_t hw = a.H_out * a.W_out, depth = a.N * hw, plane = a.H * a.W;
  // Column j's tap: its offset in x from (the group's first channel, ih0, iw0), its shifts.
  int32_t off[COLS], dh[COLS], dw[COLS];
  FM_UNROLL
  for (int32_t j = 0; j < COLS; ++j) {
    const int32_t ci = j / khw, t = j - ci * khw, kh = t / a.kW, kw = t - kh * a.kW;
    dh[j] = kh * a.dil_h;
    dw[j] = kw * a.dil_w;
    off[j] = ci * plane + dh[j] * a.W + dw[j];
  }
  for (int32_t v = int32_t(tid); v < RUNS * LANES; v += T) {
    const int32_t run = v / LANES, lane = v - run * LANES, co = co0 + lane;
    const bool live = co < a.C_out;
    const int32_t g = min(co, a.C_out - 1) / (a.C_out / a.groups);
    float acc[COLS];
    float bsum = 0.0f;
    FM_UNROLL
    for (int32_t j = 0; j < COLS; ++j) acc[j] = 0.0f;
    const int32_t begin = chunk * PER + run * FM_CONV_NARROW_RUN;
    const int32_t end = min(depth, begin + FM_CONV_NARROW_RUN);
    // The first position's (n, p, oh, ow), then one step at a time without a division.
    int32_t n = begin / hw, p = begin - n * hw;
    int32_t oh = p / a.W_out, ow = p - oh * a.W_out;
    for (int32_t i = begin; i < end; ++i) {
      const int32_t ih0 = oh * a.stride_h - a.pad_h, iw0 = ow * a.stride_w - a.pad_w;
      float gv = 0.0f;
      if (live) gv = gy[(n * a.C_out + co) * hw + p];
      bsum += gv;
      const int32_t xb = (n * a.C_in + g * cin_g) * plane + ih0 * a.W + iw0;  // may be < 0
      FM_UNROLL
      for (int32_t j = 0; j < COLS; ++j) {
        const int32_t ih = ih0 + dh[j], iw = iw0 + dw[j];
        float xv = 0.0f;  // a predicated load (load_or_zero in metal/conv_gemm.h says why)
        if (j < cols && ih >= 0 && ih < a.H && iw >= 0 && iw < a.W) xv = x[xb + off[j]];
        acc[j] = fma(gv, xv, acc[j]);
      }
      ++p;
      if (++ow == a.W_out) {
        ow = 0;
        if (++oh == a.H_out) {
          oh = 0;
          p = 0;
          ++n;
        }
      }
    }
    FM_UNROLL
    for (int32_t j = 0; j < COLS; ++j) partial[(run * LANES + lane) * PITCH + j] = acc[j];
    partial_b[run * LANES + lane] = bsum;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const int32_t chunks = (depth + PER - 1) / PER;
  const bool with_bias = (flags & FM_CONV_BIAS) != 0u;
  for (int32_t o = int32_t(tid); o < LANES * COLS + LANES; o += T) {
    if (o < LANES * COLS) {
      const int32_t lane = o / COLS, j = o - lane * COLS, co = co0 + lane;
      if (co < a.C_out && j < cols) {
        float s = 0.0f;
        for (int32_t run = 0; run < RUNS; ++run) s += partial[(run * LANES + lane) * PITCH + j];
        ws[(co * cols + j) * chunks + chunk] = s;
      }
    } else if (with_bias && co0 + o - LANES * COLS < a.C_out) {
      const int32_t lane = o - LANES * COLS;
      float s = 0.0f;
      for (int32_t run = 0; run < RUNS; ++run) s += partial_b[run * LANES + lane];
      wsb[(co0 + lane) * chunks + chunk] = s;
    }
  }
}

FM_INSTANTIATE("conv2d_backward_weight_narrow4", conv2d_backward_weight_narrow, 4);
FM_INSTANTIATE("conv2d_backward_weight_narrow9", conv2d_backward_weight_narrow, 9);
FM_INSTANTIATE("conv2d_backward_weight_narrow16", conv2d_backward_weight_narrow, 16);

// ------------------------------------------------------------------- bias gradient
// conv2d_bias_grad_chunks: ws[co][chunk] = the sum of gy[n][co][p] over the chunk's `per`
// positions (i = n * H_out * W_out + p). Each thread sums positions tid, tid + T, .. of the
// chunk in that order, four loads in flight before their adds (one at a time, every load's
// latency was waited out in turn), then the group adds its threads' sums as a fixed tree in
// threadgroup memory; reduce.metal's compensated row sum then adds each channel's chunks.
// On an H100 the earlier two passes (per-pixel sums over 8 images, then 64 long row sums)
// took 7 + 6 us for MNIST conv2. Any group size (threads past kBiasSlots fold in by rounds,
// as in conv2d_reduce); a fixed order, so every run gives the same bits.
// Grid: x = chunks * group size threads, y = C_out.
enum : uint32_t { kBiasSlots = 128 };

kernel void conv2d_bias_grad_chunks(device const float* gy [[buffer(0)]],
                                    device float* ws [[buffer(1)]],
                                    constant Conv2dArgs& a [[buffer(2)]],
                                    constant uint32_t& per [[buffer(3)]],
                                    uint3 tg_pos [[threadgroup_position_in_grid]],
                                    uint32_t tid [[thread_index_in_threadgroup]],
                                    uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup float partial[kBiasSlots];
  const int32_t T = int32_t(tg_size.x * tg_size.y * tg_size.z);
  const int32_t chunk = int32_t(tg_pos.x), co = int32_t(tg_pos.y);
  const int32_t hw = a.H_out * a.W_out, depth = a.N * hw;
  const int32_t begin = chunk * int32_t(per), end = min(depth, begin + int32_t(per));
  float sum = 0.0f;
  for (int32_t i = begin + int32_t(tid); i < end; i += 4 * T) {
    float v[4];
    FM_UNROLL for (int32_t j = 0; j < 4; ++j) {
      const int32_t k = i + j * T, n = k / hw;
      v[j] = k < end ? gy[(n * a.C_out + co) * hw + (k - n * hw)] : 0.0f;
    }
    FM_UNROLL for (int32_t j = 0; j < 4; ++j) sum += v[j];
  }
  const uint32_t slots = min(uint32_t(T), uint32_t(kBiasSlots));
  for (uint32_t rnd = 0; rnd * kBiasSlots < uint32_t(T); ++rnd) {
    if (tid / kBiasSlots == rnd)
      partial[tid % kBiasSlots] = rnd == 0 ? sum : partial[tid % kBiasSlots] + sum;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  uint32_t span = 1;
  while (span < slots) span *= 2;
  for (uint32_t s = span / 2; s > 0; s /= 2) {
    if (tid < s && tid + s < slots) partial[tid] += partial[tid + s];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  const int32_t chunks = (depth + int32_t(per) - 1) / int32_t(per);
  if (tid == 0) ws[co * chunks + chunk] = partial[0];
}

// ---------------------------------------------------------------- conv_transpose2d
// conv_transpose2d's forward is conv2d's input gradient (csrc/ops/conv2d.cpp); its bias is
// then added here: y[n, c, p] += bias[c], y being that conv2d's input (N, C_in, H, W).
// Grid: (H * W, C_in, N).
kernel void conv_transpose2d_add_bias(device const float* bias [[buffer(0)]],
                                      device float* y [[buffer(1)]],
                                      constant Conv2dArgs& a [[buffer(2)]],
                                      uint3 gid [[thread_position_in_grid]]) {
  const int32_t hw = a.H * a.W;
  const int32_t p = int32_t(gid.x), c = int32_t(gid.y), n = int32_t(gid.z);
  if (p >= hw || c >= a.C_in || n >= a.N) return;
  y[(n * a.C_in + c) * hw + p] += bias[c];
}
