// Winograd transforms for stride-1, dilation-1, 3x3 convolutions of one group (the non-fused
// scheme, as cuDNN's WINOGRAD_NONFUSED): F(2x2, 3x3) (below) and F(4x4, 3x3) (at the end), each
// for every pass. The products between the transforms are independent GEMMs, one per
// transform point (16 or 36), run by conv2d_gemm with the WinogradForward<m> /
// WinogradWeight<m> problems of metal/conv2d.metal. The host's choice:
// csrc/ops/conv2d_winograd.cpp (winograd_choice); the design: docs/gpu_kernels.md.
//
// Each 2x2 block of outputs (a "tile") is Y = A^T [ (G g G^T) (.) (B^T d B) ] A, d the 4x4
// input patch it reads, g a 3x3 filter, (.) the elementwise product over the 4x4 transform
// points t = 4 * i + j:
//
//   B^T = [1  0 -1  0]     G = [ 1    0    0 ]     A^T = [1  1  1  0]
//         [0  1  1  0]         [1/2  1/2  1/2]           [0  1 -1 -1]
//         [0 -1  1  0]         [1/2 -1/2  1/2]
//         [0  1  0 -1]         [ 0    0    1 ]
//
// Summed over input channels, point by point, this is the product per t:
// M[t][co][p] = sum_ci U[t][co][ci] * V[t][ci][p]. The weight gradient is its adjoint:
// dU[t][co][ci] = sum_p Z[t][co][p] * V[t][ci][p] with Z = A gy_tile A^T, and
// dg = G^T dU G.
//
// Tiles p = (n * tiles_h + th) * tiles_w + tw, tiles_h = ceil(H_out / 2) (likewise w);
// the tile's outputs are rows 2*th, 2*th + 1 (those < H_out), its input patch rows
// 2*th - pad_h .. 2*th - pad_h + 3 (zero outside the image; pad may be negative: the input
// gradient runs as the forward of gy with padding 2 - pad). Layouts (all float32):
//   U  [16][C_out][C_in]          transformed weights
//   V  [16][C_in][tiles]          transformed input tiles
//   M  [16][C_out][tiles]         products, before the output transform
//   Z  [16][C_out][tiles]         transformed output-gradient tiles
//   dU [splits][16][C_out][C_in]  the weight gradient's products, one slice per split
// The transforms into the products' layouts are one thread per output element, no
// threadgroup memory, no barriers; the last steps (the output transform, the weight
// gradient's split sum and adjoint transform) take a thread per row of transform points
// and add the rows through threadgroup memory (their comments, at the end, say why).
// The rounding differs from the direct sum (the transforms add and halve before the
// products); docs/gpu_kernels.md says by how much and how the tests bound it.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "conv2d_args.h"
#include "fm_math.h"
using namespace metal;

FM_FUNC int32_t wino_tiles_h(constant Conv2dArgs& a) { return (a.H_out + 1) >> 1; }
FM_FUNC int32_t wino_tiles_w(constant Conv2dArgs& a) { return (a.W_out + 1) >> 1; }

// The transforms into the products' layouts, one element each (specialised for M = 2 and 4
// below; the launches that run them are at the end of this file). Elements past the tensor
// return at once.
template <int M>  // weight element i = co * C_in + ci
FM_FUNC void wino_weight(device const float* w, device float* u, constant Conv2dArgs& a,
                         uint32_t flags, int32_t i);
template <int M>  // tile p of input channel ci
FM_FUNC void wino_input(device const float* x, device float* v, constant Conv2dArgs& a,
                        int32_t p, int32_t ci);
template <int M>  // tile p of output-gradient channel co
FM_FUNC void wino_grad_output(device const float* gy, device float* z, constant Conv2dArgs& a,
                              int32_t p, int32_t co);

// U[t][co][ci] = (G g G^T)[t] for g = w[co][ci] (flags & 1: g = the filter of the input
// gradient's equivalent convolution, w_orig[ci][co] rotated by 180 degrees, where w_orig
// (C_in, C_out, 3, 3) is the layer's weight: a.C_out is the layer's C_in and vice versa).
template <>
FM_FUNC void wino_weight<2>(device const float* w, device float* u, constant Conv2dArgs& a,
                            uint32_t flags, int32_t i) {
  const int32_t kc = a.C_out * a.C_in;
  if (i >= kc) return;
  const int32_t co = i / a.C_in, ci = i - co * a.C_in;
  float g[9];
  if ((flags & 1u) != 0) {
    device const float* src = w + (ci * a.C_out + co) * 9;
    for (int r = 0; r < 9; ++r) g[r] = src[8 - r];
  } else {
    device const float* src = w + i * 9;
    for (int r = 0; r < 9; ++r) g[r] = src[r];
  }
  float gg[12];  // G g: 4 x 3
  for (int c = 0; c < 3; ++c) {
    const float g0 = g[c], g1 = g[3 + c], g2 = g[6 + c];
    gg[c] = g0;
    gg[3 + c] = 0.5f * (g0 + g1 + g2);
    gg[6 + c] = 0.5f * (g0 - g1 + g2);
    gg[9 + c] = g2;
  }
  for (int r = 0; r < 4; ++r) {  // (G g) G^T: 4 x 4
    const float g0 = gg[3 * r], g1 = gg[3 * r + 1], g2 = gg[3 * r + 2];
    u[(4 * r + 0) * kc + i] = g0;
    u[(4 * r + 1) * kc + i] = 0.5f * (g0 + g1 + g2);
    u[(4 * r + 2) * kc + i] = 0.5f * (g0 - g1 + g2);
    u[(4 * r + 3) * kc + i] = g2;
  }
}

// V[t][ci][p] = (B^T d B)[t], d the 4x4 input patch of tile p in channel ci.
template <>
FM_FUNC void wino_input<2>(device const float* x, device float* v, constant Conv2dArgs& a,
                           int32_t p, int32_t ci) {
  const int32_t th_n = wino_tiles_h(a), tw_n = wino_tiles_w(a);
  const int32_t tiles = a.N * th_n * tw_n;
  if (p >= tiles || ci >= a.C_in) return;
  const int32_t n = p / (th_n * tw_n), r = p - n * (th_n * tw_n);
  const int32_t th = r / tw_n, tw = r - th * tw_n;
  const int32_t h0 = 2 * th - a.pad_h, w0 = 2 * tw - a.pad_w;
  device const float* plane = x + (n * a.C_in + ci) * a.H * a.W;
  float d[16];
  for (int i = 0; i < 4; ++i) {
    const int32_t h = h0 + i;
    const bool row_in = uint32_t(h) < uint32_t(a.H);
    for (int j = 0; j < 4; ++j) {
      const int32_t ww = w0 + j;
      const bool in = row_in && uint32_t(ww) < uint32_t(a.W);
      const float val = plane[in ? h * a.W + ww : 0];
      d[4 * i + j] = in ? val : 0.0f;
    }
  }
  float bd[16];  // B^T d
  for (int j = 0; j < 4; ++j) {
    const float d0 = d[j], d1 = d[4 + j], d2 = d[8 + j], d3 = d[12 + j];
    bd[j] = d0 - d2;
    bd[4 + j] = d1 + d2;
    bd[8 + j] = d2 - d1;
    bd[12 + j] = d1 - d3;
  }
  const int32_t stride = a.C_in * tiles;
  device float* out = v + ci * tiles + p;
  for (int i = 0; i < 4; ++i) {  // (B^T d) B
    const float e0 = bd[4 * i], e1 = bd[4 * i + 1], e2 = bd[4 * i + 2], e3 = bd[4 * i + 3];
    out[(4 * i + 0) * stride] = e0 - e2;
    out[(4 * i + 1) * stride] = e1 + e2;
    out[(4 * i + 2) * stride] = e2 - e1;
    out[(4 * i + 3) * stride] = e1 - e3;
  }
}

// The M x M block z of an output-gradient plane at tile (th, tw), in row-major order; zero
// past H_out x W_out (the read goes to a valid address and is replaced).
template <int M>
FM_FUNC void wino_gy_block(device const float* plane, constant Conv2dArgs& a, int32_t th,
                           int32_t tw, thread float* e) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < M; ++j) {
      const int32_t oh = M * th + i, ow = M * tw + j;
      const bool in = oh < a.H_out && ow < a.W_out;
      const float val = plane[in ? oh * a.W_out + ow : 0];
      e[M * i + j] = in ? val : 0.0f;
    }
}

// Z[t][co][p] = (A z A^T)[t], z the 2x2 block of the output gradient gy[n][co] at tile p
// (zero past H_out x W_out).
template <>
FM_FUNC void wino_grad_output<2>(device const float* gy, device float* z,
                                 constant Conv2dArgs& a, int32_t p, int32_t co) {
  const int32_t th_n = wino_tiles_h(a), tw_n = wino_tiles_w(a);
  const int32_t tiles = a.N * th_n * tw_n;
  if (p >= tiles || co >= a.C_out) return;
  const int32_t n = p / (th_n * tw_n), r = p - n * (th_n * tw_n);
  const int32_t th = r / tw_n, tw = r - th * tw_n;
  device const float* plane = gy + (n * a.C_out + co) * a.H_out * a.W_out;
  float e[4];
  wino_gy_block<2>(plane, a, th, tw, e);
  // A z: rows z0, z0 + z1, z0 - z1, -z1 (z0, z1 the rows of z).
  float az[8];
  for (int j = 0; j < 2; ++j) {
    const float z0 = e[j], z1 = e[2 + j];
    az[j] = z0;
    az[2 + j] = z0 + z1;
    az[4 + j] = z0 - z1;
    az[6 + j] = -z1;
  }
  const int32_t stride = a.C_out * tiles;
  device float* out = z + co * tiles + p;
  for (int i = 0; i < 4; ++i) {  // (A z) A^T
    const float z0 = az[2 * i], z1 = az[2 * i + 1];
    out[(4 * i + 0) * stride] = z0;
    out[(4 * i + 1) * stride] = z0 + z1;
    out[(4 * i + 2) * stride] = z0 - z1;
    out[(4 * i + 3) * stride] = -z1;
  }
}


// ---------------------------------------------------------------- F(4x4, 3x3)
// 4x4 output tiles from 6x6 input patches, 36 transform points t = 6 * i + j (Lavin and
// Gray's points 0, 1, -1, 2, -2, infinity):
//
//   B^T = [4  0 -5  0  1  0]    G = [ 1/4     0     0  ]    A^T = [1  1  1  1  1  0]
//         [0 -4 -4  1  1  0]        [-1/6  -1/6  -1/6 ]          [0  1 -1  2 -2  0]
//         [0  4 -4 -1  1  0]        [-1/6   1/6  -1/6 ]          [0  1  1  4  4  0]
//         [0 -2 -1  2  1  0]        [1/24  1/12  1/6  ]          [0  1 -1  8 -8  1]
//         [0  2 -1 -2  1  0]        [1/24 -1/12  1/6  ]
//         [0  4  0 -5  0  1]        [  0     0     1  ]
//
// Same layouts as above with 36 points and tiles = N * ceil(H_out/4) * ceil(W_out/4), the
// tile's input patch at rows 4*th - pad_h .. 4*th - pad_h + 5. About 1.8x fewer products
// than F(2x2, 3x3) and 1.8x less transformed data; the larger transform coefficients
// round more (docs/gpu_kernels.md; the weight gradient's adjoint transforms likewise).

// out[k * os] = (B^T d)[k] for d[k * is], k < 6.
FM_FUNC void wino4_bt(thread const float* d, int is, thread float* out, int os) {
  const float d0 = d[0], d1 = d[is], d2 = d[2 * is], d3 = d[3 * is], d4 = d[4 * is],
              d5 = d[5 * is];
  out[0] = fma(4.0f, d0, fma(-5.0f, d2, d4));
  out[os] = fma(-4.0f, d1 + d2, d3 + d4);
  out[2 * os] = fma(4.0f, d1 - d2, d4 - d3);
  out[3 * os] = fma(2.0f, d3 - d1, d4 - d2);
  out[4 * os] = fma(2.0f, d1 - d3, d4 - d2);
  out[5 * os] = fma(4.0f, d1, fma(-5.0f, d3, d5));
}

// out[k * os] = (G g)[k] for g[k * is], k < 3.
FM_FUNC void wino4_g(thread const float* g, int is, thread float* out, int os) {
  const float g0 = g[0], g1 = g[is], g2 = g[2 * is];
  out[0] = 0.25f * g0;
  out[os] = (-1.0f / 6.0f) * (g0 + g1 + g2);
  out[2 * os] = (-1.0f / 6.0f) * (g0 - g1 + g2);
  out[3 * os] = fma(1.0f / 24.0f, g0, fma(1.0f / 12.0f, g1, (1.0f / 6.0f) * g2));
  out[4 * os] = fma(1.0f / 24.0f, g0, fma(-1.0f / 12.0f, g1, (1.0f / 6.0f) * g2));
  out[5 * os] = g2;
}

// out[k * os] = (A^T m)[k] for m[k * is], k < 4.
FM_FUNC void wino4_at(thread const float* m, int is, thread float* out, int os) {
  const float m0 = m[0], m1 = m[is], m2 = m[2 * is], m3 = m[3 * is], m4 = m[4 * is],
              m5 = m[5 * is];
  const float s12 = m1 + m2, d12 = m1 - m2, s34 = m3 + m4, d34 = m3 - m4;
  out[0] = m0 + s12 + s34;
  out[os] = fma(2.0f, d34, d12);
  out[2 * os] = fma(4.0f, s34, s12);
  out[3 * os] = fma(8.0f, d34, d12) + m5;
}

// U[t][co][ci] = (G g G^T)[t]; flags & 1 as wino_weight<2>.
template <>
FM_FUNC void wino_weight<4>(device const float* w, device float* u, constant Conv2dArgs& a,
                            uint32_t flags, int32_t i) {
  const int32_t kc = a.C_out * a.C_in;
  if (i >= kc) return;
  const int32_t co = i / a.C_in, ci = i - co * a.C_in;
  float g[9];
  if ((flags & 1u) != 0) {
    device const float* src = w + (ci * a.C_out + co) * 9;
    for (int r = 0; r < 9; ++r) g[r] = src[8 - r];
  } else {
    device const float* src = w + i * 9;
    for (int r = 0; r < 9; ++r) g[r] = src[r];
  }
  float gg[18];  // G g: 6 x 3
  for (int c = 0; c < 3; ++c) wino4_g(g + c, 3, gg + c, 3);
  float ggg[36];  // (G g) G^T: 6 x 6
  for (int r = 0; r < 6; ++r) wino4_g(gg + 3 * r, 1, ggg + 6 * r, 1);
  for (int t = 0; t < 36; ++t) u[t * kc + i] = ggg[t];
}

// V[t][ci][p] = (B^T d B)[t], d the 6x6 input patch of tile p.
template <>
FM_FUNC void wino_input<4>(device const float* x, device float* v, constant Conv2dArgs& a,
                           int32_t p, int32_t ci) {
  const int32_t th_n = (a.H_out + 3) >> 2, tw_n = (a.W_out + 3) >> 2;
  const int32_t tiles = a.N * th_n * tw_n;
  if (p >= tiles || ci >= a.C_in) return;
  const int32_t n = p / (th_n * tw_n), r = p - n * (th_n * tw_n);
  const int32_t th = r / tw_n, tw = r - th * tw_n;
  const int32_t h0 = 4 * th - a.pad_h, w0 = 4 * tw - a.pad_w;
  device const float* plane = x + (n * a.C_in + ci) * a.H * a.W;
  // d B row by row as the rows arrive, then B^T (d B) column by column, each column's six
  // points stored at once: at most 36 + 6 values live (88 registers on an H100 as d, B^T d
  // and (B^T d) B, a quarter of the threads resident).
  float db[36];
  for (int i = 0; i < 6; ++i) {
    const int32_t h = h0 + i;
    const bool row_in = uint32_t(h) < uint32_t(a.H);
    float d[6];
    for (int j = 0; j < 6; ++j) {
      const int32_t ww = w0 + j;
      const bool in = row_in && uint32_t(ww) < uint32_t(a.W);
      const float val = plane[in ? h * a.W + ww : 0];
      d[j] = in ? val : 0.0f;
    }
    wino4_bt(d, 1, db + 6 * i, 1);  // (B^T d_i^T)^T = d_i B
  }
  const int32_t stride = a.C_in * tiles;
  device float* out = v + ci * tiles + p;
  for (int j = 0; j < 6; ++j) {
    float col[6];
    wino4_bt(db + j, 6, col, 1);
    for (int i = 0; i < 6; ++i) out[(6 * i + j) * stride] = col[i];
  }
}

// ---- F(4x4, 3x3) weight gradient: the adjoint of the forward above, as for F(2x2):
// Z = A z A^T of each 4x4 block z of gy (A = (A^T)^T, 6 x 4), dU[t] = Z[t] . V[t]^T over
// the tiles (the WinogradWeight<4> GEMMs), dg = G^T dU G.

// out[k * os] = (A z)[k] for z[k * is], k < 6 (rows of A: 1 0 0 0 | 1 1 1 1 | 1 -1 1 -1 |
// 1 2 4 8 | 1 -2 4 -8 | 0 0 0 1).
FM_FUNC void wino4_a(thread const float* z, int is, thread float* out, int os) {
  const float z0 = z[0], z1 = z[is], z2 = z[2 * is], z3 = z[3 * is];
  const float s02 = z0 + z2, s13 = z1 + z3;
  const float e = fma(4.0f, z2, z0), f = fma(4.0f, z3, z1);
  out[0] = z0;
  out[os] = s02 + s13;
  out[2 * os] = s02 - s13;
  out[3 * os] = fma(2.0f, f, e);
  out[4 * os] = fma(-2.0f, f, e);
  out[5 * os] = z3;
}

// out[k * os] = (G^T s)[k] for s[k * is], k < 3.
FM_FUNC void wino4_gt(thread const float* s, int is, thread float* out, int os) {
  const float s0 = s[0], s1 = s[is], s2 = s[2 * is], s3 = s[3 * is], s4 = s[4 * is],
              s5 = s[5 * is];
  const float p12 = s1 + s2, p34 = s3 + s4;
  out[0] = fma(0.25f, s0, fma(-1.0f / 6.0f, p12, (1.0f / 24.0f) * p34));
  out[os] = fma(1.0f / 6.0f, s2 - s1, (1.0f / 12.0f) * (s3 - s4));
  out[2 * os] = fma(1.0f / 6.0f, p34 - p12, s5);
}

// Z[t][co][p] = (A z A^T)[t], z the 4x4 block of gy[n][co] at tile p (zero past
// H_out x W_out).
template <>
FM_FUNC void wino_grad_output<4>(device const float* gy, device float* z,
                                 constant Conv2dArgs& a, int32_t p, int32_t co) {
  const int32_t th_n = (a.H_out + 3) >> 2, tw_n = (a.W_out + 3) >> 2;
  const int32_t tiles = a.N * th_n * tw_n;
  if (p >= tiles || co >= a.C_out) return;
  const int32_t n = p / (th_n * tw_n), r = p - n * (th_n * tw_n);
  const int32_t th = r / tw_n, tw = r - th * tw_n;
  device const float* plane = gy + (n * a.C_out + co) * a.H_out * a.W_out;
  float e[16];
  wino_gy_block<4>(plane, a, th, tw, e);
  float az[24];  // A z: 6 x 4
  for (int j = 0; j < 4; ++j) wino4_a(e + j, 4, az + j, 4);
  float aza[36];  // (A z) A^T: 6 x 6
  for (int i = 0; i < 6; ++i) wino4_a(az + 4 * i, 1, aza + 6 * i, 1);
  const int32_t stride = a.C_out * tiles;
  device float* out = z + co * tiles + p;
  for (int t = 0; t < 36; ++t) out[t * stride] = aza[t];
}

// ---- both weight gradients' last step: gw[co][ci] = G^T S G (3 x 3), S the sum over splits
// of dU[.][co][ci] ((M+2) x (M+2) points). G^T S G = sum over rows r of G[r]^T (S[r] G), so
// thread (r, o) of a group takes row r of output o: the splits' sum of that row (coalesced:
// a SIMD group reads 32 consecutive outputs of one row), its product with G and the outer
// product with G[r]; the group adds the M+2 rows in a fixed order (deterministic) and writes
// its outputs' 9 weights contiguously. (M+2) times the threads of one per output: one per
// output left an H100 waiting on memory at a quarter of its occupancy.
// Grid: x = ceil(C_out * C_in / FM_WINOGRAD_WGRAD_OUTPUTS) groups; any threadgroup size.

// G[r][0..2], row r of G (M + 2 rows).
template <int M>
FM_FUNC void wino_g_row(int32_t r, thread float* g);
template <>
FM_FUNC void wino_g_row<2>(int32_t r, thread float* g) {
  g[0] = r == 0 ? 1.0f : r == 3 ? 0.0f : 0.5f;
  g[1] = r == 1 ? 0.5f : r == 2 ? -0.5f : 0.0f;
  g[2] = r == 0 ? 0.0f : r == 3 ? 1.0f : 0.5f;
}
template <>
FM_FUNC void wino_g_row<4>(int32_t r, thread float* g) {
  g[0] = r == 0 ? 0.25f : r <= 2 ? -1.0f / 6.0f : r <= 4 ? 1.0f / 24.0f : 0.0f;
  g[1] = r == 1 ? -1.0f / 6.0f : r == 2 ? 1.0f / 6.0f : r == 3 ? 1.0f / 12.0f
       : r == 4 ? -1.0f / 12.0f : 0.0f;
  g[2] = r == 0 ? 0.0f : r <= 2 ? -1.0f / 6.0f : r <= 4 ? 1.0f / 6.0f : 1.0f;
}

// sg = s G for a row s of M + 2 points.
template <int M>
FM_FUNC void wino_row_g(thread const float* s, thread float* sg);
template <>
FM_FUNC void wino_row_g<2>(thread const float* s, thread float* sg) {
  sg[0] = s[0] + 0.5f * (s[1] + s[2]);
  sg[1] = 0.5f * (s[1] - s[2]);
  sg[2] = 0.5f * (s[1] + s[2]) + s[3];
}
template <>
FM_FUNC void wino_row_g<4>(thread const float* s, thread float* sg) {
  wino4_gt(s, 1, sg, 1);  // (G^T s^T)^T = s G
}

template <int R>  // R = M + 2 rows (and columns) of transform points
kernel void conv2d_winograd_weight_grad_rows(device const float* du [[buffer(0)]],
                                             device float* gw [[buffer(1)]],
                                             constant Conv2dArgs& a [[buffer(2)]],
                                             constant uint32_t& splits [[buffer(3)]],
                                             uint3 tg_pos [[threadgroup_position_in_grid]],
                                             uint32_t tid [[thread_index_in_threadgroup]],
                                             uint3 tg_size [[threads_per_threadgroup]]) {
  constexpr int32_t M = R - 2, POINTS = R * R, OUTS = FM_WINOGRAD_WGRAD_OUTPUTS;
  threadgroup float part[R * FM_WINOGRAD_WGRAD_OUTPUTS * 9];  // [row][output][3 x 3]
  const int32_t kc = a.C_out * a.C_in, first = int32_t(tg_pos.x) * OUTS;
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  for (uint32_t e = tid; e < uint32_t(R * OUTS); e += T) {
    const int32_t r = int32_t(e) / OUTS, o = int32_t(e) - r * OUTS, i = first + o;
    float s[R];
    for (int c = 0; c < R; ++c) s[c] = 0.0f;
    if (i < kc) {
      for (uint32_t sp = 0; sp < splits; ++sp)
        for (int c = 0; c < R; ++c) s[c] += du[(int32_t(sp) * POINTS + r * R + c) * kc + i];
    }
    float sg[3], g[3];
    wino_row_g<M>(s, sg);
    wino_g_row<M>(r, g);
    for (int k = 0; k < 3; ++k)
      for (int j = 0; j < 3; ++j) part[(r * OUTS + o) * 9 + 3 * k + j] = g[k] * sg[j];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const int32_t outs = min(OUTS, kc - first);
  for (uint32_t e = tid; e < uint32_t(outs * 9); e += T) {
    float v = part[e];
    for (int r = 1; r < R; ++r) v += part[r * OUTS * 9 + int32_t(e)];
    gw[first * 9 + int32_t(e)] = v;
  }
}
FM_INSTANTIATE("conv2d_winograd_weight_grad", conv2d_winograd_weight_grad_rows, 4);
FM_INSTANTIATE("conv2d_winograd4_weight_grad", conv2d_winograd_weight_grad_rows, 6);

// ---- both forwards' last step: y[n][co][m*th + i][m*tw + j] = (A^T M A)[i][j] (+ bias[co]
// where flags & 1), the outputs inside H_out x W_out. A^T M A = sum over rows r of
// A^T[.][r] (M[r] A), so thread (r, q) of a group takes row r of tile q: its M + 2 products
// (coalesced: a SIMD group reads 32 consecutive tiles of one row), their product with A and
// the outer product with column r of A^T; the group adds the rows in a fixed order through
// threadgroup memory and writes its tiles' outputs row by row. One thread per tile and
// channel left the H100 waiting on memory below half a wave (ResNet-50 layer3: 22.9 us for
// 25 MB moved). Grid: x = ceil(tiles / FM_WINOGRAD_OUT_TILES) groups, y = C_out; any
// threadgroup size.

// at[i] = A^T[i][r], column r of A^T (M + 2 columns).
template <int M>
FM_FUNC void wino_at_col(int32_t r, thread float* at);
template <>
FM_FUNC void wino_at_col<2>(int32_t r, thread float* at) {  // A^T = [1 1 1 0; 0 1 -1 -1]
  at[0] = r == 3 ? 0.0f : 1.0f;
  at[1] = r == 0 ? 0.0f : r == 1 ? 1.0f : -1.0f;
}
template <>
FM_FUNC void wino_at_col<4>(int32_t r, thread float* at) {  // the rows of A in wino4_a
  const float two_r = r == 3 ? 2.0f : r == 4 ? -2.0f : r == 1 ? 1.0f : r == 2 ? -1.0f : 0.0f;
  at[0] = r == 5 ? 0.0f : 1.0f;
  at[1] = two_r;
  at[2] = two_r * two_r;
  at[3] = r == 5 ? 1.0f : two_r * two_r * two_r;
}

// ma = m A for a row m of M + 2 products.
template <int M>
FM_FUNC void wino_row_a(thread const float* m, thread float* ma);
template <>
FM_FUNC void wino_row_a<2>(thread const float* m, thread float* ma) {
  ma[0] = m[0] + m[1] + m[2];
  ma[1] = m[1] - m[2] - m[3];
}
template <>
FM_FUNC void wino_row_a<4>(thread const float* m, thread float* ma) {
  wino4_at(m, 1, ma, 1);  // (A^T m^T)^T = m A
}

template <int R>  // R = M + 2 rows (and columns) of transform points
kernel void conv2d_winograd_output_rows(device const float* m [[buffer(0)]],
                                        device const float* bias [[buffer(1)]],
                                        device float* y [[buffer(2)]],
                                        constant Conv2dArgs& a [[buffer(3)]],
                                        constant uint32_t& flags [[buffer(4)]],
                                        uint3 tg_pos [[threadgroup_position_in_grid]],
                                        uint32_t tid [[thread_index_in_threadgroup]],
                                        uint3 tg_size [[threads_per_threadgroup]]) {
  constexpr int32_t M = R - 2, TILES = FM_WINOGRAD_OUT_TILES;
  constexpr int32_t S = M * M + 1;  // floats per (row, tile): odd, so no bank conflicts
  threadgroup float part[R * FM_WINOGRAD_OUT_TILES * 17];  // [row][tile][M x M], S <= 17
  const int32_t th_n = (a.H_out + M - 1) / M, tw_n = (a.W_out + M - 1) / M;
  const int32_t tiles = a.N * th_n * tw_n;
  const int32_t first = int32_t(tg_pos.x) * TILES, co = int32_t(tg_pos.y);
  const int32_t stride = a.C_out * tiles;  // between transform points
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  for (uint32_t e = tid; e < uint32_t(R * TILES); e += T) {
    const int32_t r = int32_t(e) / TILES, q = int32_t(e) - r * TILES, p = first + q;
    float row[R];
    for (int c = 0; c < R; ++c) row[c] = 0.0f;
    if (p < tiles) {
      device const float* src = m + co * tiles + p;
      for (int c = 0; c < R; ++c) row[c] = src[(r * R + c) * stride];
    }
    float ma[M], at[M];
    wino_row_a<M>(row, ma);
    wino_at_col<M>(r, at);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < M; ++j) part[(r * TILES + q) * S + M * i + j] = at[i] * ma[j];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const float b = (flags & FM_CONV_BIAS) != 0u ? bias[co] : 0.0f;
  for (uint32_t e = tid; e < uint32_t(TILES * M * M); e += T) {
    // e = (i * TILES + q) * M + j: consecutive threads write consecutive columns
    const int32_t i = int32_t(e) / (TILES * M), rest = int32_t(e) - i * (TILES * M);
    const int32_t q = rest / M, j = rest - q * M, p = first + q;
    if (p >= tiles) continue;
    const int32_t n = p / (th_n * tw_n), t = p - n * (th_n * tw_n);
    const int32_t th = t / tw_n, tw = t - th * tw_n;
    const int32_t oh = M * th + i, ow = M * tw + j;
    if (oh >= a.H_out || ow >= a.W_out) continue;
    float v = part[q * S + M * i + j];
    for (int r = 1; r < R; ++r) v += part[(r * TILES + q) * S + M * i + j];
    const int32_t at = ((n * a.C_out + co) * a.H_out + oh) * a.W_out + ow;
    v += b;
    if ((flags & FM_CONV_RELU) != 0u) v = fm_relu(v);
    if ((flags & FM_CONV_RELU_MASK) != 0u) v = bias[at] <= 0.0f ? 0.0f : v;  // relu_grad
    y[at] = v;
  }
}
FM_INSTANTIATE("conv2d_winograd_output", conv2d_winograd_output_rows, 4);
FM_INSTANTIATE("conv2d_winograd4_output", conv2d_winograd_output_rows, 6);

// ---- the transforms' launches: two transforms in one grid, since each alone leaves an H100
// mostly idle (ncu, BENCHMARKS.md: MNIST conv2's weight transform, 2,048 threads in 8
// groups, took 4.8 us before its 15 us input transform could start; ResNet-50 layer3's input
// and output-gradient transforms, 512 groups each, ran at 21% and 39% occupancy, 10.9 and
// 9.7 us one after the other). Grid: x = tiles (N * ceil(H_out / M) * ceil(W_out / M)).

// U and V for a forward product (the forward, and the input gradient as the forward of gy):
// rows y < wrows take weight elements y * tiles + x, first, so that the GPU starts their
// short work before the input's; rows wrows + ci the input's channel ci.
// Grid: y = wrows + C_in, wrows = ceil(C_out * C_in / tiles).
template <int M>
kernel void conv2d_winograd_transforms(device const float* x [[buffer(0)]],
                                       device float* v [[buffer(1)]],
                                       device const float* w [[buffer(2)]],
                                       device float* u [[buffer(3)]],
                                       constant Conv2dArgs& a [[buffer(4)]],
                                       constant uint32_t& flags [[buffer(5)]],
                                       uint3 gid [[thread_position_in_grid]]) {
  const int32_t tiles = a.N * ((a.H_out + M - 1) / M) * ((a.W_out + M - 1) / M);
  const int32_t wrows = (a.C_out * a.C_in + tiles - 1) / tiles;
  const int32_t col = int32_t(gid.x), row = int32_t(gid.y);
  if (col >= tiles) return;
  if (row < wrows) {
    wino_weight<M>(w, u, a, flags, row * tiles + col);
  } else {
    wino_input<M>(x, v, a, col, row - wrows);
  }
}
FM_INSTANTIATE("conv2d_winograd_transforms", conv2d_winograd_transforms, 2);
FM_INSTANTIATE("conv2d_winograd4_transforms", conv2d_winograd_transforms, 4);

// V and Z for the weight gradient's product: rows y < C_in the input's channel y, the rest
// the output gradient's channel y - C_in. Grid: y = C_in + C_out.
template <int M>
kernel void conv2d_winograd_grad_transforms(device const float* x [[buffer(0)]],
                                            device float* v [[buffer(1)]],
                                            device const float* gy [[buffer(2)]],
                                            device float* z [[buffer(3)]],
                                            constant Conv2dArgs& a [[buffer(4)]],
                                            uint3 gid [[thread_position_in_grid]]) {
  const int32_t col = int32_t(gid.x), row = int32_t(gid.y);
  if (row < a.C_in) {
    wino_input<M>(x, v, a, col, row);
  } else {
    wino_grad_output<M>(gy, z, a, col, row - a.C_in);
  }
}
FM_INSTANTIATE("conv2d_winograd_grad_transforms", conv2d_winograd_grad_transforms, 2);
FM_INSTANTIATE("conv2d_winograd4_grad_transforms", conv2d_winograd_grad_transforms, 4);
