// The CPU's SIMD layer: a vector abstraction per instruction set (AVX-512, AVX2, a portable
// 4-lane fallback), the register-blocked GEMM and dot micro-kernels, and per-thread scratch.
// The fast conv2d (isa/conv2d_forward.cpp: forward, input gradient; isa/conv2d_weight_grad.cpp:
// weight and bias gradients) and matmul (isa/matmul_gemm.cpp) are built on it; it is included
// inside each ISA's compilation of those files (see isa_dispatch.h).
//
// Two register-blocked micro-kernels do all the arithmetic:
//
//  * kern<M, W>: C[M x W*VL] (+)= A[M x K] * B[K x W*VL] (AVX-512: 8 x 48 tile), A packed
//    (k-major, MR rows per strip), B read straight from memory as "row k starts at
//    src + off[k]". With a zero-padded copy of one image and off[k] = channel/tap offsets,
//    the flattened padded image IS the im2col matrix for stride 1 (output q = oh * Wp + ow,
//    the Wp - W_out columns past each row are junk and dropped), so stride-1 forward and
//    backward-input (a stride-1 conv of the padded output gradient with flipped, transposed
//    weights) need no im2col at all. Strided convs, and tiny K (C_in = 1 first layers),
//    build an im2col chunk and use off[k] = k * ld.
//  * dot<MA, NB>: vector sums of A_i . B_j over a long contiguous range (AVX-512: 4 x 6
//    tile), for the weight gradient gW[co, (ci,kh,kw)] = sum_q gY[co, q] * x_pad[ci, q + tap];
//    again no im2col for stride 1, only a copy of gY in the padded row pitch (zero junk).
//    Caveat: junk positions multiply zero by real neighbouring inputs, so an inf/NaN in x
//    can turn into NaN in gW entries where an exact im2col would stay finite.
//
// Work is spread over images (per-thread scratch reused across calls), or over chunks of one
// image when the batch is smaller than the pool. Results never depend on scheduling.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "conv2d_args.h"
#include "thread_pool.h"

// One namespace per ISA: each copy of this header belongs to the ISA its file is compiled
// for. Functions are `inline`, so the per-thread scratch buffers are shared by both files.
namespace fm::cpu::FM_CPU_ISA::conv {


using i64 = std::int64_t;

// ------------------------------------------------------------------ vector abstraction
#if defined(__AVX512F__)
using V = __m512;
constexpr int VL = 16;
constexpr int MR = 8, NV = 3;    // 8 x 48 tile: 24 accumulators of 32 zmm
constexpr int DMA = 4, DNB = 6;  // 4 x 6 dot tile: 24 accumulators
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V vset1(float x) { return _mm512_set1_ps(x); }
inline V vzero() { return _mm512_setzero_ps(); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline float vsum(V v) { return _mm512_reduce_add_ps(v); }
// The first n (< VL) floats at p, zeros after; reads nothing past p + n.
inline V vload_part(const float* p, int n) {
  return _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), p);
}
#elif defined(__AVX2__) && defined(__FMA__)
using V = __m256;
constexpr int VL = 8;
constexpr int MR = 6, NV = 2;  // 6 x 16 tile: 12 accumulators of 16 ymm
constexpr int DMA = 3, DNB = 4;  // 12 accumulators + 3 + 1 of 16 registers
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V vset1(float x) { return _mm256_set1_ps(x); }
inline V vzero() { return _mm256_setzero_ps(); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline float vsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#else
// Portable: GCC/Clang vector extension (SSE2 / NEON registers), else a plain struct.
#if defined(__GNUC__) || defined(__clang__)
typedef float V __attribute__((vector_size(16)));
#else
struct V {
  float e[4];
  float operator[](int i) const { return e[i]; }
  friend V operator*(V a, V b) { return V{a.e[0] * b.e[0], a.e[1] * b.e[1], a.e[2] * b.e[2], a.e[3] * b.e[3]}; }
  friend V operator+(V a, V b) { return V{a.e[0] + b.e[0], a.e[1] + b.e[1], a.e[2] + b.e[2], a.e[3] + b.e[3]}; }
};
#endif
constexpr int VL = 4;
constexpr int MR = 6, NV = 2;
constexpr int DMA = 3, DNB = 4;  // 12 accumulators + 3 + 1 of 16 registers
inline V vload(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, V v) { std::memcpy(p, &v, sizeof v); }
inline V vset1(float x) { return V{x, x, x, x}; }
inline V vzero() { return V{0, 0, 0, 0}; }
inline V vfma(V a, V b, V c) { return a * b + c; }
inline V vadd(V a, V b) { return a + b; }
inline float vsum(V v) { return (v[0] + v[1]) + (v[2] + v[3]); }
#endif
constexpr int NR = NV * VL;
#if !defined(__AVX512F__)
inline V vload_part(const float* p, int n) {
  alignas(64) float t[VL] = {};
  std::memcpy(t, p, sizeof(float) * n);
  return vload(t);
}
#endif

#if defined(__AVX2__)
// t[i] (8 floats each) := the transpose of the 8 x 8 block in t (the GEMM's and attention's
// packing of transposed operands).
inline void transpose8(__m256 t[8]) {
  __m256 u[8], v[8];
  for (int i = 0; i < 8; i += 2) {
    u[i] = _mm256_unpacklo_ps(t[i], t[i + 1]);
    u[i + 1] = _mm256_unpackhi_ps(t[i], t[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    v[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44);
    v[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xEE);
    v[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44);
    v[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2f128_ps(v[i], v[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(v[i], v[i + 4], 0x31);
  }
}
#endif

inline i64 round_up(i64 x, i64 m) { return (x + m - 1) / m * m; }
inline i64 ceil_div(i64 x, i64 m) { return (x + m - 1) / m; }

// Per-thread scratch, reused across calls (pool workers and Python threads each have their own).
// 64-byte aligned, so that rows a multiple of VL apart are aligned too.
inline float* scratch(int slot, i64 n) {
  static thread_local std::vector<float> bufs[5];
  auto& b = bufs[slot];
  if (i64(b.size()) < n + 16) b.resize(std::size_t(n + 16));
  const auto p = reinterpret_cast<std::uintptr_t>(b.data());
  return b.data() + ((64 - p % 64) % 64) / sizeof(float);
}

// ------------------------------------------------------------------ micro-kernels
// ACC: C += instead of C = bias (or 0) + (later blocks of K).
template <int M, int W, bool ACC>
void kern(int K, const float* __restrict A, const float* __restrict B, const i64* __restrict off,
          float* __restrict C, i64 ldc, const float* bias) {
  V acc[M][W];
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < W; ++j)
      acc[i][j] = ACC ? vload(C + i * ldc + j * VL) : bias ? vset1(bias[i]) : vzero();
  for (int k = 0; k < K; ++k) {
    const float* b = B + off[k];
    V bv[W];
#pragma GCC unroll 4
    for (int j = 0; j < W; ++j) bv[j] = vload(b + j * VL);
    const float* a = A + i64(k) * MR;
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      const V av = vset1(a[i]);
#pragma GCC unroll 4
      for (int j = 0; j < W; ++j) acc[i][j] = vfma(av, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < W; ++j) vstore(C + i * ldc + j * VL, acc[i][j]);
}

using KernFn = void (*)(int, const float*, const float*, const i64*, float*, i64, const float*);
template <int W, bool ACC, std::size_t... I>
constexpr auto kern_row(std::index_sequence<I...>) {
  return std::array<KernFn, sizeof...(I)>{&kern<int(I) + 1, W, ACC>...};
}
// table[w - 1][m - 1]: tiles of m <= MR rows and w <= NV vectors (narrower tails).
template <bool ACC, std::size_t... J>
constexpr auto kern_table(std::index_sequence<J...>) {
  return std::array<std::array<KernFn, MR>, sizeof...(J)>{
      kern_row<int(J) + 1, ACC>(std::make_index_sequence<MR>{})...};
}

// Vector partial sums vacc[i][j][:] (DMA x DNB x VL) += a[i][q] * b[j][q] over q in [0, L);
// reduced to scalars only once at the end (see dot_block).
template <int MA, int NB>
void dot(i64 L, const float* const* a, const float* const* b, float* vacc) {
  V acc[MA][NB];
#pragma GCC unroll 8
  for (int i = 0; i < MA; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[i][j] = vload(vacc + (i * DNB + j) * VL);
  const float* ap[MA];
  const float* bp[NB];
  for (int i = 0; i < MA; ++i) ap[i] = a[i];
  for (int j = 0; j < NB; ++j) bp[j] = b[j];
  const i64 Lv = L - L % VL;
  for (i64 q = 0; q < Lv; q += VL) {
    V av[MA];
#pragma GCC unroll 8
    for (int i = 0; i < MA; ++i) av[i] = vload(ap[i] + q);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const V bv = vload(bp[j] + q);
#pragma GCC unroll 8
      for (int i = 0; i < MA; ++i) acc[i][j] = vfma(av[i], bv, acc[i][j]);
    }
  }
  if (Lv < L) {  // tail: rows may end right there (user memory)
    const int n = int(L - Lv);
    V av[MA];
    for (int i = 0; i < MA; ++i) av[i] = vload_part(ap[i] + Lv, n);
    for (int j = 0; j < NB; ++j) {
      const V bv = vload_part(bp[j] + Lv, n);
      for (int i = 0; i < MA; ++i) acc[i][j] = vfma(av[i], bv, acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MA; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) vstore(vacc + (i * DNB + j) * VL, acc[i][j]);
}

using DotFn = void (*)(i64, const float* const*, const float* const*, float*);
template <int MA, std::size_t... J>
constexpr auto dot_row(std::index_sequence<J...>) {
  return std::array<DotFn, sizeof...(J)>{&dot<MA, int(J) + 1>...};
}
template <std::size_t... I>
constexpr auto dot_table(std::index_sequence<I...>) {
  return std::array<std::array<DotFn, DNB>, sizeof...(I)>{
      dot_row<int(I) + 1>(std::make_index_sequence<DNB>{})...};
}

// C[m][q] (m < M, q < nq) = bias[m] (or 0) + sum_k A(m, k) * src[off[k] + q]; src is
// readable up to round_up(nq, NR). C is written only where q < nq unless `spill` (then whole
// NR tiles are written: C has room up to round_up(nq, NR)).
// K is split in blocks of KC (balanced, from K alone: every element of C is the same chain
// of FMAs whatever the order below). Default order: per NR tile, every K block, so that the
// B rows the tile reads stay in L1 while every strip of A streams past them. `k_outer`: per
// K block, every tile, so that the block of A (M x KC) stays in L1/L2 while B streams past
// once: for a long K with few rows (linear's 9216 inputs), where the default order would
// stream all of A from memory once per tile.
constexpr int KC = 128;
inline void gemm_block(int M, int K, const float* Ap, const i64* off, const float* src, i64 nq,
                float* C, i64 ldc, const float* bias = nullptr, bool spill = true,
                bool accumulate = false, bool k_outer = false) {
  static constexpr auto first = kern_table<false>(std::make_index_sequence<NV>{});
  static constexpr auto more = kern_table<true>(std::make_index_sequence<NV>{});
  static thread_local std::vector<float> tail;
  const int strips = int(ceil_div(M, MR));
  const int nkb = int(ceil_div(K, KC));
  const int kc = int(ceil_div(K, nkb));  // balanced blocks
  // Tile widths: narrower tiles at the end; 4 vectors left go as 2 + 2, not 3 + 1 (a
  // 1-vector tile is bound by its broadcasts).
  auto width = [&](i64 q) {
    const i64 left = ceil_div(nq - q, VL);
    return left == 4 && NV == 3 ? i64(2) : std::min<i64>(NV, left);
  };
  // Only the last tile can be partial; it accumulates in `tail` (across K blocks too).
  auto is_partial = [&](i64 q, i64 w) { return !spill && q + w * VL > nq; };
  auto run = [&](i64 q, i64 w, int k0) {
    const bool partial = is_partial(q, w);
    float* Ct = partial ? tail.data() : C + q;
    const i64 ld = partial ? NR : ldc;
    const int kn = std::min(kc, K - k0);
    const auto& table = k0 == 0 && !accumulate ? first : more;
    for (int s = 0; s < strips; ++s) {
      const int m = std::min(MR, M - s * MR);
      table[int(w) - 1][m - 1](kn, Ap + (i64(s) * K + k0) * MR, src + q, off + k0, Ct + i64(s) * MR * ld,
                   ld, bias ? bias + s * MR : nullptr);
    }
  };
  auto flush = [&](i64 q) {
    for (int m = 0; m < M; ++m) std::memcpy(C + m * ldc + q, tail.data() + m * NR, sizeof(float) * (nq - q));
  };
  i64 partial_q = -1;
  for (i64 q = 0, w; q < nq; q += w * VL) {
    w = width(q);
    if (is_partial(q, w)) {
      if (accumulate) throw std::logic_error("gemm_block: accumulate needs spill");
      if (i64(tail.size()) < i64(strips) * MR * NR) tail.resize(std::size_t(strips) * MR * NR);
      partial_q = q;
    }
  }
  if (k_outer) {
    for (int k0 = 0; k0 < K; k0 += kc)
      for (i64 q = 0, w; q < nq; q += w * VL) run(q, w = width(q), k0);
  } else {
    for (i64 q = 0, w; q < nq; q += w * VL) {
      w = width(q);
      for (int k0 = 0; k0 < K; k0 += kc) run(q, w, k0);
    }
  }
  if (partial_q >= 0) flush(partial_q);
}

// Vector sums vacc[kb] (ceil(Nb / DNB) tiles of DMA x DNB x VL) += A_i . B_j over L, for
// i < ma <= DMA rows of A and j < Nb rows of B. L is walked in chunks so that the ma A rows
// stay in L1 while all of B streams past.
constexpr i64 LC = 2048;
constexpr int DTILE = DMA * DNB * VL;
inline void dot_acc(int ma, int Nb, const float* const* arows, const float* const* brows, i64 L,
             float* vacc) {
  static constexpr auto table = dot_table(std::make_index_sequence<DMA>{});
  const int nkb = int(ceil_div(Nb, DNB));
  const float* a[DMA];
  const float* b[DNB];
  for (i64 c0 = 0; c0 < L; c0 += LC) {
    const i64 len = std::min(LC, L - c0);
    for (int i = 0; i < ma; ++i) a[i] = arows[i] + c0;
    for (int kb = 0; kb < nkb; ++kb) {
      const int j0 = kb * DNB, nb = std::min(DNB, Nb - j0);
      for (int j = 0; j < nb; ++j) b[j] = brows[j0 + j] + c0;
      table[ma - 1][nb - 1](len, a, b, vacc + kb * DTILE);
    }
  }
}
// out[i * ldo + j] += the horizontal sums of vacc (as filled by dot_acc).
inline void dot_reduce(int ma, int Nb, const float* vacc, float* out, i64 ldo) {
  for (int kb = 0; kb < ceil_div(Nb, DNB); ++kb) {
    const int j0 = kb * DNB, nb = std::min(DNB, Nb - j0);
    for (int i = 0; i < ma; ++i)
      for (int j = 0; j < nb; ++j)
        out[i * ldo + j0 + j] += vsum(vload(vacc + kb * DTILE + (i * DNB + j) * VL));
  }
}

// Packs A(m, k) for m < M, k < K into MR-row strips, k-major, zero rows past M.
template <class F>
void pack_a(int M, int K, F at, float* dst) {
  const int strips = int(ceil_div(M, MR));
  for (int s = 0; s < strips; ++s)
    for (int k = 0; k < K; ++k)
      for (int r = 0; r < MR; ++r) {
        const int m = s * MR + r;
        dst[(i64(s) * K + k) * MR + r] = m < M ? at(m, k) : 0.f;
      }
}
inline i64 packed_size(int M, int K) { return ceil_div(M, MR) * MR * i64(K); }

// Copies C planes (Hs x Ws) into a zeroed (Hp x Wp) frame at (top, left) (negative: cropped),
// then zeroes `slack` floats after the last plane.
inline void pad_copy(const float* src, int C, int Hs, int Ws, float* dst, int Hp, int Wp, int top,
              int left, i64 slack) {
  const i64 plane = i64(Hp) * Wp;
  const int c0 = std::max(0, left), c1 = std::min(Wp, left + Ws);
  for (int c = 0; c < C; ++c) {
    const float* s = src + i64(c) * Hs * Ws;
    float* d = dst + c * plane;
    for (int r = 0; r < Hp; ++r) {
      float* row = d + i64(r) * Wp;
      const int sr = r - top;
      if (sr < 0 || sr >= Hs || c1 <= c0) {
        std::memset(row, 0, sizeof(float) * Wp);
        continue;
      }
      if (c0 > 0) std::memset(row, 0, sizeof(float) * c0);
      std::memcpy(row + c0, s + i64(sr) * Ws + (c0 - left), sizeof(float) * (c1 - c0));
      if (c1 < Wp) std::memset(row + c1, 0, sizeof(float) * (Wp - c1));
    }
  }
  if (slack > 0) std::memset(dst + C * plane, 0, sizeof(float) * slack);
}

// The output columns [lo, hi) within [ow0, ow1) whose input column ow * stride_w + iw0
// lies inside [0, W).
inline void valid_cols(const Conv2dArgs& a, int iw0, int ow0, int ow1, int& lo, int& hi) {
  const int s = a.stride_w;
  const i64 first = iw0 >= 0 ? 0 : (i64(-iw0) + s - 1) / s;      // iw >= 0
  const i64 last = a.W - iw0 <= 0 ? 0 : (i64(a.W - iw0) + s - 1) / s;  // iw < W
  lo = int(std::clamp<i64>(first, ow0, ow1));
  hi = int(std::clamp<i64>(last, lo, ow1));
}

// im2col rows k = (ci, kh, kw) (ld apart) of one image for compact output positions
// [q0, q1), then zeros up to column zero_to (default ld).
inline void im2col(const Conv2dArgs& a, const float* x /*image, first channel of the group*/, int Cg,
            i64 q0, i64 q1, float* col, i64 ld, i64 zero_to = -1) {
  if (zero_to < 0) zero_to = ld;
  for (int ci = 0; ci < Cg; ++ci)
    for (int kh = 0; kh < a.kH; ++kh)
      for (int kw = 0; kw < a.kW; ++kw) {
        float* dst = col + (i64(ci * a.kH + kh) * a.kW + kw) * ld;
        const float* plane = x + i64(ci) * a.H * a.W;
        i64 q = q0;
        while (q < q1) {
          const i64 oh = q / a.W_out;
          const int ow0 = int(q - oh * a.W_out);
          const int ow1 = int(std::min<i64>(a.W_out, ow0 + (q1 - q)));
          float* d = dst + (q - q0);
          const i64 ih = oh * a.stride_h - a.pad_h + i64(kh) * a.dil_h;
          if (ih < 0 || ih >= a.H) {
            std::memset(d, 0, sizeof(float) * (ow1 - ow0));
          } else {
            const float* row = plane + ih * a.W;
            const int iw0 = -a.pad_w + kw * a.dil_w;
            if (a.stride_w == 1) {  // zeros, one contiguous copy, zeros
              const int lo = std::clamp(-iw0, ow0, ow1), hi = std::clamp(a.W - iw0, lo, ow1);
              std::fill(d, d + (lo - ow0), 0.f);
              std::memcpy(d + (lo - ow0), row + lo + iw0, sizeof(float) * (hi - lo));
              std::fill(d + (hi - ow0), d + (ow1 - ow0), 0.f);
            } else {
              int lo, hi;
              valid_cols(a, iw0, ow0, ow1, lo, hi);
              std::fill(d, d + (lo - ow0), 0.f);
              const int sw = a.stride_w;
              for (int ow = lo; ow < hi; ++ow) d[ow - ow0] = row[i64(ow) * sw + iw0];
              std::fill(d + (hi - ow0), d + (ow1 - ow0), 0.f);
            }
          }
          q += ow1 - ow0;
        }
        if (zero_to > q1 - q0) std::fill(dst + (q1 - q0), dst + zero_to, 0.f);
      }
}

// gx (image, first channel of the group) += col2im of gcol rows k = (ci, kh, kw) over
// compact output positions [q0, q1).
inline void col2im_add(const Conv2dArgs& a, const float* col, i64 ld, int Cg, i64 q0, i64 q1,
                float* gx) {
  for (int ci = 0; ci < Cg; ++ci)
    for (int kh = 0; kh < a.kH; ++kh)
      for (int kw = 0; kw < a.kW; ++kw) {
        const float* s = col + (i64(ci * a.kH + kh) * a.kW + kw) * ld;
        float* plane = gx + i64(ci) * a.H * a.W;
        i64 q = q0;
        while (q < q1) {
          const i64 oh = q / a.W_out;
          const int ow0 = int(q - oh * a.W_out);
          const int ow1 = int(std::min<i64>(a.W_out, ow0 + (q1 - q)));
          const i64 ih = oh * a.stride_h - a.pad_h + i64(kh) * a.dil_h;
          if (ih >= 0 && ih < a.H) {
            float* row = plane + ih * a.W;
            const int iw0 = -a.pad_w + kw * a.dil_w;
            const float* sp = s + (q - q0);
            int lo, hi;
            valid_cols(a, iw0, ow0, ow1, lo, hi);
            const int sw = a.stride_w;
            for (int ow = lo; ow < hi; ++ow) row[i64(ow) * sw + iw0] += sp[ow - ow0];
          }
          q += ow1 - ow0;
        }
      }
}

// Wide scratch rows C[m][q - q0] -> compact dst[m][oh * outW + ow] (+ bias[m]) for the
// wide positions [q0, q1) of pitch Wp (columns >= outW are junk).
inline void copy_out(const float* C, i64 ldc, int M, i64 q0, i64 q1, int Wp, int outW, float* dst,
              i64 dst_plane, const float* bias) {
  for (int m = 0; m < M; ++m) {
    const float b = bias ? bias[m] : 0.f;
    const float* c = C + m * ldc;
    float* d = dst + m * dst_plane;
    i64 q = q0;
    while (q < q1) {
      const i64 oh = q / Wp;
      const i64 ow = q - oh * Wp;
      const i64 row_end = std::min(q1, (oh + 1) * Wp);
      if (ow < outW) {
        const i64 e = std::min(row_end, oh * Wp + outW);
        const float* s = c + (q - q0);
        float* o = d + oh * outW + ow;
        const i64 n = e - q;
        if (bias)
          for (i64 i = 0; i < n; ++i) o[i] = s[i] + b;
        else
          std::memcpy(o, s, sizeof(float) * n);
      }
      q = row_end;
    }
  }
}

inline std::vector<const float*>& brow_cache() {
  static thread_local std::vector<const float*> v;
  return v;
}

// Wide positions per chunk: enough for several NR tiles, scratch (M x chunk) within L2.
inline i64 chunk_size(int M, i64 total) {
  i64 c = std::max<i64>(NR, round_up(std::max<i64>(1, (1 << 16) / std::max(1, M)), NR));
  c = std::min(c, round_up(total, NR));
  return c;
}

// Runs `image(n)` for every image, or, when the batch is smaller than the pool,
// `prepare(n)` on this thread and `chunk(n, i)` for i < nchunks in parallel.
template <class Image, class Prepare, class Chunk>
void over_images(int N, i64 nchunks, Image image, Prepare prepare, Chunk chunk) {
  auto& pool = ThreadPool::instance();
  if (N >= pool.num_threads() || nchunks <= 1) {
    pool.parallel_for(N, [&](i64 n) { image(int(n)); });
  } else {
    for (int n = 0; n < N; ++n) {
      prepare(n);
      pool.parallel_for(nchunks, [&](i64 i) { chunk(n, i); });
    }
  }
}

// A stride-1 "forward" of G groups over padded sources: dst[g*M + m] = sum_k A_g(m,k) *
// src_g[off[k] + q] on wide positions q of pitch Wp, compacted to outH x outW.
struct Direct {
  int G, M, K;
  const float* Ap;
  i64 ap_group;
  const i64* off;
  i64 src_group;  // floats between groups in the padded source
  int outH, outW, Wp;
  i64 dst_plane;  // outH * outW
  const float* bias;

  i64 wide() const { return i64(outH) * Wp; }
  void run(const float* src, float* dst, i64 q0, i64 q1, float* C, i64 ldc) const {
    const i64 nq = q1 - q0;
    for (int g = 0; g < G; ++g) {
      if (Wp == outW) {  // no junk columns (1x1, no horizontal padding): write dst directly
        gemm_block(M, K, Ap + g * ap_group, off, src + g * src_group + q0, nq,
                   dst + i64(g) * M * dst_plane + q0, dst_plane, bias ? bias + g * M : nullptr,
                   /*spill=*/false);
        continue;
      }
      gemm_block(M, K, Ap + g * ap_group, off, src + g * src_group + q0, nq, C, ldc);
      copy_out(C, ldc, M, q0, q1, Wp, outW, dst + i64(g) * M * dst_plane, dst_plane,
               bias ? bias + g * M : nullptr);
    }
  }
};

// Runs a Direct over all images; `prep(n, buf)` writes image n's padded source into buf
// (src_floats floats: the planes plus zeroed slack for the over-reads of the last tile).
template <class Prep>
void run_direct(int N, const Direct& d, i64 src_floats, i64 dst_image, float* dst, Prep prep) {
  const i64 Q = d.wide();
  const i64 CQ = chunk_size(d.M, Q);
  const i64 nchunks = ceil_div(Q, CQ);
  float* shared_src = nullptr;
  over_images(
      N, nchunks,
      [&](int n) {
        float* src = scratch(0, src_floats);
        prep(n, src);
        float* C = scratch(1, i64(d.M) * CQ);
        for (i64 i = 0; i < nchunks; ++i)
          d.run(src, dst + n * dst_image, i * CQ, std::min(Q, (i + 1) * CQ), C, CQ);
      },
      [&](int n) {
        shared_src = scratch(2, src_floats);
        prep(n, shared_src);
      },
      [&](int n, i64 i) {
        float* C = scratch(1, i64(d.M) * CQ);
        d.run(shared_src, dst + n * dst_image, i * CQ, std::min(Q, (i + 1) * CQ), C, CQ);
      });
}

}  // namespace fm::cpu::FM_CPU_ISA::conv
