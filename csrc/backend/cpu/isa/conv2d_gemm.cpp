// Fast CPU conv2d (compiled once per ISA; see isa_dispatch.h). Two register-blocked
// micro-kernels do all the arithmetic:
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

namespace fm::cpu::FM_CPU_ISA {
namespace {

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

inline i64 round_up(i64 x, i64 m) { return (x + m - 1) / m * m; }
inline i64 ceil_div(i64 x, i64 m) { return (x + m - 1) / m; }

// Per-thread scratch, reused across calls (pool workers and Python threads each have their own).
// 64-byte aligned, so that rows a multiple of VL apart are aligned too.
float* scratch(int slot, i64 n) {
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
// K is split in blocks of KC so that the B rows one NR tile reads stay in L1 while every
// strip of A streams past them.
constexpr int KC = 128;
void gemm_block(int M, int K, const float* Ap, const i64* off, const float* src, i64 nq,
                float* C, i64 ldc, const float* bias = nullptr, bool spill = true,
                bool accumulate = false) {
  static constexpr auto first = kern_table<false>(std::make_index_sequence<NV>{});
  static constexpr auto more = kern_table<true>(std::make_index_sequence<NV>{});
  static thread_local std::vector<float> tail;
  const int strips = int(ceil_div(M, MR));
  const int nkb = int(ceil_div(K, KC));
  const int kc = int(ceil_div(K, nkb));  // balanced blocks
  for (i64 q = 0, w = NV; q < nq; q += w * VL) {
    // Narrower tiles at the end; 4 vectors left go as 2 + 2, not 3 + 1 (a 1-vector tile is
    // bound by its broadcasts).
    const i64 left = ceil_div(nq - q, VL);
    w = left == 4 && NV == 3 ? 2 : std::min<i64>(NV, left);
    const bool partial = !spill && q + w * VL > nq;
    if (partial && accumulate) throw std::logic_error("gemm_block: accumulate needs spill");
    if (partial && i64(tail.size()) < i64(strips) * MR * NR) tail.resize(std::size_t(strips) * MR * NR);
    float* Ct = partial ? tail.data() : C + q;
    const i64 ld = partial ? NR : ldc;
    for (int k0 = 0; k0 < K; k0 += kc) {
      const int kn = std::min(kc, K - k0);
      const auto& table = k0 == 0 && !accumulate ? first : more;
      for (int s = 0; s < strips; ++s) {
        const int m = std::min(MR, M - s * MR);
        table[int(w) - 1][m - 1](kn, Ap + (i64(s) * K + k0) * MR, src + q, off + k0, Ct + i64(s) * MR * ld,
                     ld, bias ? bias + s * MR : nullptr);
      }
    }
    if (partial)
      for (int m = 0; m < M; ++m)
        std::memcpy(C + m * ldc + q, Ct + m * NR, sizeof(float) * (nq - q));
  }
}

// Vector sums vacc[kb] (ceil(Nb / DNB) tiles of DMA x DNB x VL) += A_i . B_j over L, for
// i < ma <= DMA rows of A and j < Nb rows of B. L is walked in chunks so that the ma A rows
// stay in L1 while all of B streams past.
constexpr i64 LC = 2048;
constexpr int DTILE = DMA * DNB * VL;
void dot_acc(int ma, int Nb, const float* const* arows, const float* const* brows, i64 L,
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
void dot_reduce(int ma, int Nb, const float* vacc, float* out, i64 ldo) {
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
void pad_copy(const float* src, int C, int Hs, int Ws, float* dst, int Hp, int Wp, int top,
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
void im2col(const Conv2dArgs& a, const float* x /*image, first channel of the group*/, int Cg,
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
void col2im_add(const Conv2dArgs& a, const float* col, i64 ld, int Cg, i64 q0, i64 q1,
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
void copy_out(const float* C, i64 ldc, int M, i64 q0, i64 q1, int Wp, int outW, float* dst,
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

std::vector<const float*>& brow_cache() {
  static thread_local std::vector<const float*> v;
  return v;
}

// Wide positions per chunk: enough for several NR tiles, scratch (M x chunk) within L2.
i64 chunk_size(int M, i64 total) {
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

}  // namespace

// ------------------------------------------------------------------ forward
void conv2d_forward(const Conv2dArgs& a, const float* x, const float* w, const float* bias,
                    float* y) {
  const int G = a.groups, Cg = a.C_in / G, Mg = a.C_out / G, T = a.kH * a.kW, K = Cg * T;
  const i64 P = i64(a.H_out) * a.W_out;
  if (a.N <= 0 || a.C_out <= 0 || P <= 0) return;
  if (K == 0) {
    for (i64 i = 0; i < i64(a.N) * a.C_out; ++i)
      std::fill(y + i * P, y + (i + 1) * P, bias ? bias[i % a.C_out] : 0.f);
    return;
  }
  const i64 apg = packed_size(Mg, K);
  std::vector<float> Ap(std::size_t(apg * G));
  for (int g = 0; g < G; ++g)
    pack_a(Mg, K, [&](int m, int k) { return w[(i64(g) * Mg + m) * K + k]; }, Ap.data() + g * apg);
  const i64 x_image = i64(a.C_in) * a.H * a.W, y_image = i64(a.C_out) * P;

  // Stride 1 reads the padded image in place, unless K is so small (first layers: C_in = 1)
  // that building im2col costs less than the junk columns and the copy out of the wide rows.
  // Grouped / depthwise convs always go direct: per-group im2col is all bookkeeping.
  if (a.stride_h == 1 && a.stride_w == 1 && (K >= 32 || G > 1)) {
    const int Hp = a.H_out + (a.kH - 1) * a.dil_h, Wp = a.W_out + (a.kW - 1) * a.dil_w;
    const i64 plane = i64(Hp) * Wp;
    std::vector<i64> off(K);
    for (int ci = 0; ci < Cg; ++ci)
      for (int kh = 0; kh < a.kH; ++kh)
        for (int kw = 0; kw < a.kW; ++kw)
          off[(ci * a.kH + kh) * a.kW + kw] = ci * plane + i64(kh) * a.dil_h * Wp + i64(kw) * a.dil_w;
    Direct d{G, Mg, K, Ap.data(), apg, off.data(), Cg * plane, a.H_out, a.W_out, Wp, P, bias};
    // Reads reach src_group*(G-1) + off[K-1] + round_up(Q, NR).
    const i64 need = (G - 1) * Cg * plane + off[K - 1] + round_up(d.wide(), NR);
    const i64 slack = std::max<i64>(0, need - i64(a.C_in) * plane);
    run_direct(a.N, d, i64(a.C_in) * plane + slack, y_image, y, [&](int n, float* buf) {
      pad_copy(x + n * x_image, a.C_in, a.H, a.W, buf, Hp, Wp, a.pad_h, a.pad_w, slack);
    });
    return;
  }

  // im2col chunks (compact positions) feed the same kernel with off[k] = k * CQ, which writes
  // straight into y.
  const i64 CQ = chunk_size(K, P);
  const i64 nchunks = ceil_div(P, CQ);
  std::vector<i64> off(K);
  for (int k = 0; k < K; ++k) off[k] = k * CQ;
  auto do_chunk = [&](int n, i64 i) {
    const i64 q0 = i * CQ, q1 = std::min(P, q0 + CQ);
    float* col = scratch(0, i64(K) * CQ);
    for (int g = 0; g < G; ++g) {
      im2col(a, x + n * x_image + i64(g) * Cg * a.H * a.W, Cg, q0, q1, col, CQ);
      gemm_block(Mg, K, Ap.data() + g * apg, off.data(), col, q1 - q0,
                 y + n * y_image + i64(g) * Mg * P + q0, P, bias ? bias + g * Mg : nullptr,
                 /*spill=*/false);
    }
  };
  over_images(
      a.N, nchunks, [&](int n) { for (i64 i = 0; i < nchunks; ++i) do_chunk(n, i); },
      [](int) {}, do_chunk);
}

// ------------------------------------------------------------------ backward, input
void conv2d_backward_input(const Conv2dArgs& a, const float* gy, const float* w, float* gx) {
  const int G = a.groups, Cg = a.C_in / G, Mg = a.C_out / G, T = a.kH * a.kW;
  const i64 HW = i64(a.H) * a.W, P = i64(a.H_out) * a.W_out;
  const i64 x_image = i64(a.C_in) * HW, y_image = i64(a.C_out) * P;
  if (a.N <= 0 || x_image <= 0) return;
  if (Mg == 0 || P == 0) {
    std::memset(gx, 0, sizeof(float) * a.N * x_image);
    return;
  }

  if (a.stride_h == 1 && a.stride_w == 1) {
    // gx = stride-1 conv of gy padded by (k-1)*d - pad with W'[ci][co][kh][kw] =
    // W[co][ci][kH-1-kh][kW-1-kw].
    const int K = Mg * T;
    const int Hp = a.H + (a.kH - 1) * a.dil_h, Wp = a.W + (a.kW - 1) * a.dil_w;
    const int top = (a.kH - 1) * a.dil_h - a.pad_h, left = (a.kW - 1) * a.dil_w - a.pad_w;
    const i64 plane = i64(Hp) * Wp;
    const i64 apg = packed_size(Cg, K);
    std::vector<float> Ap(std::size_t(apg * G));
    for (int g = 0; g < G; ++g)
      pack_a(Cg, K,
             [&](int ci, int k) {
               const int co = k / T, t = k % T, kh = t / a.kW, kw = t % a.kW;
               return w[((i64(g) * Mg + co) * Cg + ci) * T + (a.kH - 1 - kh) * a.kW +
                        (a.kW - 1 - kw)];
             },
             Ap.data() + g * apg);
    std::vector<i64> off(K);
    for (int co = 0; co < Mg; ++co)
      for (int kh = 0; kh < a.kH; ++kh)
        for (int kw = 0; kw < a.kW; ++kw)
          off[(co * a.kH + kh) * a.kW + kw] = co * plane + i64(kh) * a.dil_h * Wp + i64(kw) * a.dil_w;
    Direct d{G, Cg, K, Ap.data(), apg, off.data(), Mg * plane, a.H, a.W, Wp, HW, nullptr};
    const i64 need = (G - 1) * Mg * plane + off[K - 1] + round_up(d.wide(), NR);
    const i64 slack = std::max<i64>(0, need - i64(a.C_out) * plane);
    run_direct(a.N, d, i64(a.C_out) * plane + slack, x_image, gx, [&](int n, float* buf) {
      pad_copy(gy + n * y_image, a.C_out, a.H_out, a.W_out, buf, Hp, Wp, top, left, slack);
    });
    return;
  }

  // Strided: gcol = W^T gY per chunk of output positions, then col2im (scatter-add); images
  // own disjoint gx, so parallel over images.
  const int K = Cg * T;
  const i64 apg = packed_size(K, Mg);
  std::vector<float> Ap(std::size_t(apg * G));
  for (int g = 0; g < G; ++g)
    pack_a(K, Mg, [&](int k, int co) { return w[(i64(g) * Mg + co) * K + k]; },
           Ap.data() + g * apg);
  const i64 CQ = chunk_size(std::max(K, Mg), P);
  std::vector<i64> off(Mg);
  for (int co = 0; co < Mg; ++co) off[co] = co * CQ;
  ThreadPool::instance().parallel_for(a.N, [&](i64 n) {
    float* gxi = gx + n * x_image;
    std::memset(gxi, 0, sizeof(float) * x_image);
    float* B = scratch(0, i64(Mg) * CQ);
    float* C = scratch(1, i64(K) * CQ);
    for (i64 q0 = 0; q0 < P; q0 += CQ) {
      const i64 q1 = std::min(P, q0 + CQ);
      for (int g = 0; g < G; ++g) {
        for (int co = 0; co < Mg; ++co) {
          const float* s = gy + n * y_image + (i64(g) * Mg + co) * P;
          std::memcpy(B + co * CQ, s + q0, sizeof(float) * (q1 - q0));
          std::fill(B + co * CQ + (q1 - q0), B + (co + 1) * CQ, 0.f);
        }
        gemm_block(K, Mg, Ap.data() + g * apg, off.data(), B, q1 - q0, C, CQ);
        col2im_add(a, C, CQ, Cg, q0, q1, gxi + i64(g) * Cg * HW);
      }
    }
  });
}

// ------------------------------------------------------------------ backward, weight
namespace {
// Stride 1 with enough input channels per group: one GEMM per tap,
//   gW[:, :, kh, kw] (C_out x Cg) += gY (C_out x Q) * Xt[q + tap] (Q x Cg),
// over the Q = H_out * Wp positions of the padded row pitch (gY zero on the junk columns),
// with Xt the zero-padded image in NHWC order: row q + tap of Xt is Cg contiguous floats, so
// the forward micro-kernel reads it in place and broadcasts packed gY.
void backward_weight_taps(const Conv2dArgs& a, const float* gy, const float* x, float* gw) {
  const int G = a.groups, Cg = a.C_in / G, Mg = a.C_out / G, T = a.kH * a.kW;
  const i64 HW = i64(a.H) * a.W, P = i64(a.H_out) * a.W_out;
  const i64 x_image = i64(a.C_in) * HW, y_image = i64(a.C_out) * P;
  const int Hp = a.H_out + (a.kH - 1) * a.dil_h, Wp = a.W_out + (a.kW - 1) * a.dil_w;
  const i64 Q = i64(a.H_out) * Wp;
  // Reads reach pixel Q - 1 + the largest tap, plus a partial tile past the last channel.
  const i64 pixels = i64(Hp) * Wp + i64(a.kW - 1) * a.dil_w;
  const i64 xt_floats = pixels * a.C_in + VL;
  const i64 apg = packed_size(Mg, int(Q));
  const i64 ldc = round_up(Cg, VL);
  const i64 ct_floats = i64(T) * G * Mg * ldc;
  std::vector<i64> off(static_cast<std::size_t>(Q));
  for (i64 q = 0; q < Q; ++q) off[q] = q * a.C_in;
  std::vector<i64> tap_off(T);
  for (int kh = 0; kh < a.kH; ++kh)
    for (int kw = 0; kw < a.kW; ++kw)
      tap_off[kh * a.kW + kw] = (i64(kh) * a.dil_h * Wp + i64(kw) * a.dil_w) * a.C_in;

  auto prepare = [&](int n, float* Ap, float* xt) {
    std::memset(xt, 0, sizeof(float) * xt_floats);
    const float* xi = x + n * x_image;
    const int r1 = std::min(a.H, Hp - a.pad_h), c1 = std::min(a.W, Wp - a.pad_w);
    for (int c = 0; c < a.C_in; ++c)
      for (int r = 0; r < r1; ++r) {
        const float* s = xi + c * HW + i64(r) * a.W;
        float* d = xt + (i64(r + a.pad_h) * Wp + a.pad_w) * a.C_in + c;
        for (int col = 0; col < c1; ++col) d[i64(col) * a.C_in] = s[col];
      }
    const float* gyi = gy + n * y_image;
    for (int g = 0; g < G; ++g)
      for (int s = 0; s < int(ceil_div(Mg, MR)); ++s) {
        float* d = Ap + g * apg + i64(s) * Q * MR;
        const int rows = std::min(MR, Mg - s * MR);
        std::memset(d, 0, sizeof(float) * Q * MR);
        for (int r = 0; r < rows; ++r) {
          const float* src = gyi + (i64(g) * Mg + s * MR + r) * P;
          for (int oh = 0; oh < a.H_out; ++oh) {
            float* dr = d + i64(oh) * Wp * MR + r;
            const float* sr = src + i64(oh) * a.W_out;
            for (int ow = 0; ow < a.W_out; ++ow) dr[i64(ow) * MR] = sr[ow];
          }
        }
      }
  };
  auto compute = [&](const float* Ap, const float* xt, int t, int g, float* Ct) {
    gemm_block(Mg, int(Q), Ap + g * apg, off.data(), xt + tap_off[t] + i64(g) * Cg, Cg,
               Ct + (i64(t) * G + g) * Mg * ldc, ldc, nullptr, /*spill=*/true,
               /*accumulate=*/true);
  };

  auto& pool = ThreadPool::instance();
  const int threads = pool.num_threads();
  const int parts = a.N >= 2 * threads ? std::min(a.N, 4 * threads) : 1;
  std::vector<float> ct(std::size_t(parts) * ct_floats, 0.f);
  if (parts > 1) {
    // Fixed, contiguous image ranges per part, summed in a fixed order below.
    pool.parallel_for(parts, [&](i64 p) {
      float* Ap = scratch(0, G * apg);
      float* xt = scratch(1, xt_floats);
      for (int n = int(p * a.N / parts); n < int((p + 1) * a.N / parts); ++n) {
        prepare(n, Ap, xt);
        for (int t = 0; t < T; ++t)
          for (int g = 0; g < G; ++g) compute(Ap, xt, t, g, ct.data() + p * ct_floats);
      }
    });
  } else {
    float* Ap = scratch(2, G * apg);
    float* xt = scratch(3, xt_floats);
    for (int n = 0; n < a.N; ++n) {
      prepare(n, Ap, xt);
      pool.parallel_for(i64(T) * G, [&](i64 i) { compute(Ap, xt, int(i / G), int(i % G), ct.data()); });
    }
  }
  // gw[g*Mg + co][ci][tap] = sum over parts of ct[tap][g][co][ci].
  for (int g = 0; g < G; ++g)
    for (int co = 0; co < Mg; ++co)
      for (int t = 0; t < T; ++t) {
        float* d = gw + (i64(g) * Mg + co) * Cg * T + t;
        for (int ci = 0; ci < Cg; ++ci) {
          float sum = 0.f;
          for (int p = 0; p < parts; ++p)
            sum += ct[p * ct_floats + ((i64(t) * G + g) * Mg + co) * ldc + ci];
          d[i64(ci) * T] = sum;
        }
      }
}
}  // namespace

void conv2d_backward_weight(const Conv2dArgs& a, const float* gy, const float* x, float* gw) {
  const int G = a.groups, Cg = a.C_in / G, Mg = a.C_out / G, T = a.kH * a.kW, K = Cg * T;
  const i64 HW = i64(a.H) * a.W, P = i64(a.H_out) * a.W_out;
  const i64 x_image = i64(a.C_in) * HW, y_image = i64(a.C_out) * P;
  const i64 wsize = i64(a.C_out) * K;
  if (wsize <= 0) return;
  std::memset(gw, 0, sizeof(float) * wsize);
  if (a.N <= 0 || P <= 0) return;
  // The per-tap GEMM is the faster one when its rows (Cg floats) fill whole full-width tiles,
  // or on narrow images where the dot form wastes more on junk columns (measured on AVX-512:
  // Cg 48: 122 vs 99 GF/s; Cg 32 on 24x24: 105 vs 98; Cg 64 on 56x56: 108 vs 113).
  const i64 vecs = Cg / VL;
  if (a.stride_h == 1 && a.stride_w == 1 && Cg % VL == 0 && vecs >= 2 &&
      (vecs % NV == 0 || a.W_out < 32)) {
    backward_weight_taps(a, gy, x, gw);
    return;
  }

  // A "unit" is A rows (gY, lda apart) and B rows (B + bgroup * g + boff[k]) over a common
  // length L; units sum into gw.
  //  * stride 1: nb consecutive images, each a padded plane (Hp x Wp) of x and the matching
  //    plane of gY (zeros off the H_out x W_out corner), planes of one channel adjacent; the
  //    taps are offsets into that run, and zero gY kills the junk. Several small images per
  //    unit keep L long, so the final reductions are amortised.
  //  * strided, or tiny K (C_in = 1 first layers, where the wide copy of gY would cost more
  //    than the arithmetic): via im2col, compact output positions of nb whole images side by
  //    side (gY copied), or of one image (gY read in place), or a chunk of one large image.
  const bool direct = a.stride_h == 1 && a.stride_w == 1 && (K >= 32 || G > 1);
  // The vector sums of every (group, row block) can stay live across units when they are
  // small enough (16x gw): then one image per unit is best (no zero rows, gY in place).
  const int mblocks = int(ceil_div(Mg, DMA));
  const i64 vtile = ceil_div(K, DNB) * DTILE;
  const i64 vtotal = i64(G) * mblocks * vtile;
  const bool persistent = vtotal <= (i64(1) << 21);
  const int Hp = a.H_out + (a.kH - 1) * a.dil_h, Wp = a.W_out + (a.kW - 1) * a.dil_w;
  const i64 plane = i64(Hp) * Wp;
  const i64 target = std::max<i64>(1024, 65536 / K);  // im2col: positions per unit
  const i64 CQ = direct ? 0 : std::min(P, target);
  // Tiny K: one image per unit, gY read in place (copying it costs more than the reductions).
  const int nb_max = int(std::min<i64>(
      a.N, persistent ? 1 : std::max<i64>(1, direct ? ceil_div(2048, plane) : K < 32 ? 1 : target / CQ)));
  const i64 chunks = direct ? 1 : ceil_div(P, CQ);
  const i64 ld_max = round_up(nb_max * CQ, VL);
  // Buffer sizes for the largest unit.
  auto direct_len = [&](int nb) { return round_up((nb - 1) * plane + i64(a.H_out) * Wp, VL); };
  auto direct_slack = [&](int nb) {
    const i64 cs = nb * plane;
    const i64 tap = i64(a.kH - 1) * a.dil_h * Wp + i64(a.kW - 1) * a.dil_w;
    return std::max<i64>(0, (a.C_in - 1) * cs + tap + direct_len(nb) - a.C_in * cs);
  };
  const i64 a_floats = direct ? a.C_out * round_up(nb_max * plane, VL) : a.C_out * ld_max;
  const i64 b_floats = direct ? a.C_in * nb_max * plane + direct_slack(nb_max) : i64(G) * K * ld_max;

  struct Unit {
    const float* A;
    i64 L, lda, bgroup;
    const i64* boff;
  };
  // Fills A and B for images [n0, n0 + nb) (direct) or chunk u of image n0 (strided).
  auto prepare = [&](int n0, int nb, i64 u, float* A, float* B, std::vector<i64>& boff) -> Unit {
    boff.resize(K);
    if (direct) {
      const i64 cs = nb * plane, lda = round_up(nb * plane, VL);
      const i64 L = direct_len(nb);
      for (int co = 0; co < a.C_out; ++co) {
        float* d = A + co * lda;
        std::memset(d, 0, sizeof(float) * lda);
        for (int i = 0; i < nb; ++i) {
          const float* s = gy + (n0 + i) * y_image + co * P;
          for (int oh = 0; oh < a.H_out; ++oh)
            std::memcpy(d + i * plane + i64(oh) * Wp, s + i64(oh) * a.W_out, sizeof(float) * a.W_out);
        }
      }
      for (int c = 0; c < a.C_in; ++c)
        for (int i = 0; i < nb; ++i)
          pad_copy(x + (n0 + i) * x_image + c * HW, 1, a.H, a.W, B + c * cs + i * plane, Hp, Wp,
                   a.pad_h, a.pad_w, 0);
      std::memset(B + a.C_in * cs, 0, sizeof(float) * direct_slack(nb));
      for (int ci = 0; ci < Cg; ++ci)
        for (int kh = 0; kh < a.kH; ++kh)
          for (int kw = 0; kw < a.kW; ++kw)
            boff[(ci * a.kH + kh) * a.kW + kw] = ci * cs + i64(kh) * a.dil_h * Wp + i64(kw) * a.dil_w;
      return Unit{A, L, lda, Cg * cs, boff.data()};
    }
    const i64 q0 = u * CQ, q1 = std::min(P, q0 + CQ), len = q1 - q0;
    const i64 ld = round_up(nb * len, VL);
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < nb; ++i)
        im2col(a, x + (n0 + i) * x_image + i64(g) * Cg * HW, Cg, q0, q1,
               B + i64(g) * K * ld + i * len, ld, i == nb - 1 ? ld - i * len : len);
    for (int k = 0; k < K; ++k) boff[k] = k * ld;
    if (nb == 1) return Unit{gy + n0 * y_image + q0, len, P, i64(K) * ld, boff.data()};
    for (int co = 0; co < a.C_out; ++co) {
      for (int i = 0; i < nb; ++i)
        std::memcpy(A + co * ld + i * len, gy + (n0 + i) * y_image + co * P + q0, sizeof(float) * len);
      std::fill(A + co * ld + nb * len, A + (co + 1) * ld, 0.f);
    }
    return Unit{A, ld, ld, i64(K) * ld, boff.data()};
  };
  // Accumulates the vector sums of rows [g*Mg + mb*DMA, ...) for one prepared unit, and
  // adds them into out.
  auto compute = [&](const float* B, const Unit& un, int g, int mb, float* vacc) {
    const int m0 = mb * DMA, ma = std::min(DMA, Mg - m0);
    const float* arows[DMA];
    for (int i = 0; i < ma; ++i) arows[i] = un.A + (i64(g) * Mg + m0 + i) * un.lda;
    std::vector<const float*>& brows = brow_cache();
    brows.resize(K);
    for (int k = 0; k < K; ++k) brows[k] = B + g * un.bgroup + un.boff[k];
    dot_acc(ma, K, arows, brows.data(), un.L, vacc);
  };
  auto finish = [&](int g, int mb, const float* vacc, float* out) {
    const int m0 = mb * DMA, ma = std::min(DMA, Mg - m0);
    dot_reduce(ma, K, vacc, out + (i64(g) * Mg + m0) * K, K);
  };

  auto& pool = ThreadPool::instance();
  const int threads = pool.num_threads();
  if (a.N >= 2 * threads * nb_max) {
    // Partial sums over fixed, contiguous ranges of images (a few per thread, for balance),
    // added in a fixed order: the result does not depend on scheduling.
    const int parts = int(std::min<i64>(ceil_div(a.N, nb_max), 4 * threads));
    std::vector<float> partial(std::size_t(parts - 1) * wsize, 0.f);
    pool.parallel_for(parts, [&](i64 t) {
      float* out = t == 0 ? gw : partial.data() + (t - 1) * wsize;
      float* A = scratch(0, a_floats);
      float* B = scratch(1, b_floats);
      float* vacc = scratch(4, persistent ? vtotal : vtile);
      if (persistent) std::memset(vacc, 0, sizeof(float) * vtotal);
      static thread_local std::vector<i64> boff;
      const int n_end = int((t + 1) * a.N / parts);
      for (int n = int(t * a.N / parts); n < n_end;) {
        const int nb = std::min(nb_max, n_end - n);
        for (i64 u = 0; u < chunks; ++u) {
          const Unit un = prepare(n, nb, u, A, B, boff);
          for (int g = 0; g < G; ++g)
            for (int mb = 0; mb < mblocks; ++mb) {
              float* v = persistent ? vacc + (i64(g) * mblocks + mb) * vtile : vacc;
              if (!persistent) std::memset(v, 0, sizeof(float) * vtile);
              compute(B, un, g, mb, v);
              if (!persistent) finish(g, mb, v, out);
            }
        }
        n += nb;
      }
      if (persistent)
        for (int g = 0; g < G; ++g)
          for (int mb = 0; mb < mblocks; ++mb)
            finish(g, mb, vacc + (i64(g) * mblocks + mb) * vtile, out);
    });
    for (int t = 1; t < parts; ++t) {
      const float* p = partial.data() + (t - 1) * wsize;
      for (i64 i = 0; i < wsize; ++i) gw[i] += p[i];
    }
    return;
  }
  // Small batch: prepare each unit here, split its rows (disjoint in gw) over the pool.
  float* A = scratch(2, a_floats);
  float* B = scratch(3, b_floats);
  std::vector<float> shared(std::size_t(persistent ? vtotal : 0), 0.f);
  std::vector<i64> boff;
  for (int n = 0; n < a.N;) {
    const int nb = std::min(nb_max, a.N - n);
    for (i64 u = 0; u < chunks; ++u) {
      const Unit un = prepare(n, nb, u, A, B, boff);
      pool.parallel_for(i64(G) * mblocks, [&](i64 i) {
        const int g = int(i / mblocks), mb = int(i % mblocks);
        float* v = persistent ? shared.data() + i * vtile : scratch(4, vtile);
        if (!persistent) std::memset(v, 0, sizeof(float) * vtile);
        compute(B, un, g, mb, v);
        if (!persistent) finish(g, mb, v, gw);
      });
    }
    n += nb;
  }
  if (persistent)
    pool.parallel_for(i64(G) * mblocks, [&](i64 i) {
      finish(int(i / mblocks), int(i % mblocks), shared.data() + i * vtile, gw);
    });
}

// ------------------------------------------------------------------ backward, bias
void conv2d_backward_bias(const Conv2dArgs& a, const float* gy, float* gb) {
  const i64 P = i64(a.H_out) * a.W_out;
  ThreadPool::instance().parallel_for(a.C_out, [&](i64 co) {
    double total = 0;
    for (int n = 0; n < a.N; ++n) {
      const float* p = gy + (i64(n) * a.C_out + co) * P;
      V s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
      i64 i = 0;
      for (; i + 4 * VL <= P; i += 4 * VL) {
        s0 = vadd(s0, vload(p + i));
        s1 = vadd(s1, vload(p + i + VL));
        s2 = vadd(s2, vload(p + i + 2 * VL));
        s3 = vadd(s3, vload(p + i + 3 * VL));
      }
      double part = vsum(vadd(vadd(s0, s1), vadd(s2, s3)));
      for (; i < P; ++i) part += p[i];
      total += part;
    }
    gb[co] = float(total);
  });
}

}  // namespace fm::cpu::FM_CPU_ISA
