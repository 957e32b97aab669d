// Fused attention on the CPU (native ops "sdpa_forward" / "sdpa_backward", see
// ../attention_cpu.cpp), compiled once per ISA. The same algorithm as the MSL kernels
// (metal/attention_forward.metal, attention_backward.metal), cut for a CPU core's caches
// instead of threadgroup memory:
//
// Forward: K is transposed once into D x KB tiles per key block (as large as K). A task is
// (batch index, block of QB = 32 query rows). It walks key blocks of KB = 64: S = (scale Q)
// K^T into a 32 x 64 tile (8 KiB), the masks, the online softmax (running max and sum per row,
// the output rows rescaled when the max grows), O += P V. Scratch per task: the Q block, the
// S tile, the O rows (and a widened V block for float16), under 70 KiB at head dim 128, a few
// KiB at head dim 16; nothing of size L x S. The forward saves lse.
//
// Backward (FlashAttention-2, deterministic): delta = rowsum(dO * O), K and V transposed as
// above, then per key block every query block recomputes S and P = exp(S - lse), dP = dO V^T,
// dS = P * (dP - delta) and adds P^T dO into dV, dS^T (scale Q) into dK and
// dS K into dQ: one pass, S computed once. A task is a batch entry's key blocks (all of them,
// or one group of up to 4 when there are fewer than 16 entries), dK/dV its own rows, dQ a
// partial of its own summed in a fixed order afterwards: no atomics, and the same bits for
// any thread count.
//
// Every product goes through gemm_acc: a tile of C in registers (4 rows x 16 columns on AVX2,
// 8 x 16 on AVX-512), one broadcast and one vector FMA per (row, k) step. exp is a
// Cody-Waite + degree-6 polynomial (Cephes' expf, ~1 ulp) written so the loops vectorise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../thread_pool.h"
#include "attention_args.h"
#include "float_lanes.h"
#include "simd_kernels.h"

namespace fm::cpu::FM_CPU_ISA {

namespace {
using i64 = std::int64_t;
constexpr int QB = 32;  // query rows per block
constexpr int KB = 64;  // keys per block

inline float to_float(float x) { return x; }
inline float to_float(_Float16 x) { return float(x); }
template <typename T>
inline T from_float(float x) { return T(x); }

// exp(x), 0 below -87 (the masked -inf included), NaN kept. Branch-free so loops over it
// vectorise: round-to-nearest by the 1.5 * 2^23 trick, 2^n built in the exponent field.
inline float exp_ps(float x) {
  float xc = x < -87.0f ? -87.0f : x;
  xc = xc > 88.0f ? 88.0f : xc;
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t e = (std::int32_t(n) + 127) << 23;
  float s;
  std::memcpy(&s, &e, sizeof(s));
  return x < -87.0f ? 0.0f : p * s;
}

// Register tile of gemm_acc: TR rows x TW columns of C in 8 native-width GCC vectors (AVX-512:
// 8 rows of one zmm; AVX2: 4 rows of two ymm; SSE: 4 rows of two xmm): enough independent FMAs
// to cover their latency. Plain float arrays were partly spilled by GCC (a store-to-load chain
// per k step), and 64-byte vectors on AVX2 went through the stack: 2.2x and 1.3x slower.
constexpr int VW = kFloatLanes;       // vector width (floats)
constexpr int NV = VW == 16 ? 1 : 2;  // vectors per row
constexpr int TR = VW == 16 ? 8 : 4;  // rows
constexpr int TW = VW * NV;  // columns of a tile
typedef float vec __attribute__((vector_size(VW * sizeof(float))));

inline vec load_vec(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store_vec(float* p, vec v) { std::memcpy(p, &v, sizeof(v)); }

// C[m][n] (row stride ldc) += sum_k A(m, k) B[k][n] (row stride ldb), A(m, k) = A[m * am + k *
// ak], for R rows and TW columns: each C element accumulates its k terms in order, whatever the
// tile it falls in.
template <int R>
inline void gemm_tile(int K, const float* A, i64 am, i64 ak, const float* B, i64 ldb, float* C,
                      i64 ldc) {
  vec acc[R * NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r * NV + v] = load_vec(C + r * ldc + v * VW);
  for (int k = 0; k < K; ++k) {
    vec b[NV];
    for (int v = 0; v < NV; ++v) b[v] = load_vec(B + k * ldb + v * VW);
    for (int r = 0; r < R; ++r) {
      const float a = A[r * am + k * ak];
      for (int v = 0; v < NV; ++v) acc[r * NV + v] += a * b[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store_vec(C + r * ldc + v * VW, acc[r * NV + v]);
}

void gemm_acc(int M, int N, int K, const float* A, i64 am, i64 ak, const float* B, i64 ldb,
              float* C, i64 ldc) {
  int n0 = 0;
  for (; n0 + TW <= N; n0 += TW) {
    int m0 = 0;
    for (; m0 + TR <= M; m0 += TR)
      gemm_tile<TR>(K, A + m0 * am, am, ak, B + n0, ldb, C + m0 * ldc + n0, ldc);
    for (; m0 < M; ++m0) gemm_tile<1>(K, A + m0 * am, am, ak, B + n0, ldb, C + m0 * ldc + n0, ldc);
  }
  if (n0 < N) {
    for (int m = 0; m < M; ++m) {
      float* c = C + m * ldc;
      for (int k = 0; k < K; ++k) {
        const float av = A[m * am + k * ak];
        const float* b = B + k * ldb;
        for (int n = n0; n < N; ++n) c[n] += av * b[n];
      }
    }
  }
}

float row_sum(const float* x, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < n; ++j) s += x[j];
  return s;
}

float row_max(const float* x, int n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// Philox-4x32-10 of (c0, c1, 0, 0) under (k0, k1): metal/philox.h with 64-bit products.
void philox(std::uint32_t c0, std::uint32_t c1, std::uint32_t k0, std::uint32_t k1,
            std::uint32_t r[4]) {
  std::uint32_t x0 = c0, x1 = c1, x2 = 0, x3 = 0;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t(0xD2511F53u) * x0;
    const std::uint64_t p1 = std::uint64_t(0xCD9E8D57u) * x2;
    const std::uint32_t n0 = std::uint32_t(p1 >> 32) ^ x1 ^ k0;
    const std::uint32_t n2 = std::uint32_t(p0 >> 32) ^ x3 ^ k1;
    x1 = std::uint32_t(p1);
    x3 = std::uint32_t(p0);
    x0 = n0;
    x2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  r[0] = x0;
  r[1] = x1;
  r[2] = x2;
  r[3] = x3;
}

// Dropout factors (0 or drop_scale) of scores (b, i, j0 .. j0 + n - 1) (attention_args.h).
void keep_row(const SdpaArgs& a, i64 b, i64 i, i64 j0, int n, float* out) {
  const std::uint64_t base = (std::uint64_t(b) * std::uint64_t(a.L) + std::uint64_t(i)) *
                                 std::uint64_t(a.S) + std::uint64_t(j0);
  std::uint32_t r[4];
  for (int t = 0; t < n; ++t) {
    const std::uint64_t idx = base + std::uint64_t(t);
    if (t == 0 || (idx & 3u) == 0)
      philox(std::uint32_t(idx >> 2), std::uint32_t(idx >> 34), a.key0, a.key1, r);
    out[t] = (r[idx & 3u] >> 8) >= a.threshold ? a.drop_scale : 0.0f;
  }
}

// Element offsets of batch index b in every operand (FM_SDPA_Q ..) and in the mask.
struct Offsets {
  i64 x[FM_SDPA_OPERANDS];
  i64 m;
};

Offsets offsets(const SdpaArgs& a, i64 b) {
  Offsets o{};
  for (int d = a.batch_dims - 1; d >= 0; --d) {
    const i64 i = b % a.batch_shape[d];
    b /= a.batch_shape[d];
    for (int w = 0; w < FM_SDPA_OPERANDS; ++w) o.x[w] += i * a.bs[w][d];
    o.m += i * a.m_bs[d];
  }
  return o;
}

// Applies the masks to a rows x kn tile of scaled scores (row stride KB) of query rows
// i0.. and keys k0..: -inf where masked out or above the diagonal, the additive mask added.
void apply_masks(const SdpaArgs& a, const float* mask, i64 mo, i64 i0, int rows, i64 k0,
                 int kn, float* s) {
  for (int r = 0; r < rows; ++r) {
    float* row = s + r * KB;
    const i64 i = i0 + r;
    if (a.mask_kind != FM_SDPA_MASK_NONE) {
      const float* mr = mask + mo + i * a.m_rs + k0 * a.m_cs;
      const i64 cs = a.m_cs;
      if (a.mask_kind == FM_SDPA_MASK_BOOL) {
        for (int j = 0; j < kn; ++j) row[j] = mr[j * cs] != 0.0f ? row[j] : -INFINITY;
      } else {
        for (int j = 0; j < kn; ++j) row[j] += mr[j * cs];
      }
    }
    if (a.causal != 0)
      for (int j = int(std::max<i64>(0, i - k0 + 1)); j < kn; ++j) row[j] = -INFINITY;
  }
}

// Scratch of one task, kept per thread between tasks.
std::vector<float>& scratch(std::size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// Rows i0 .. i0 + rows - 1 (row stride rs): dst[r * D + d] = src row (i0 + r) * scale.
template <typename T>
void load_rows(const T* src, i64 rs, i64 i0, int rows, int D, float scale, float* dst) {
  for (int r = 0; r < rows; ++r) {
    const T* s = src + (i0 + r) * rs;
    for (int d = 0; d < D; ++d) dst[r * D + d] = to_float(s[d]) * scale;
  }
}

// Operand `which` (K or V) of every batch entry transposed once, key block by key block: the
// D x KB tile of block kb of entry b at kt_block(t, a, b, kb, D), row stride KB, zero past S
// (O(batch * S * D) floats, as the operand). Transposing each key block for each query block
// instead took 30% of a long forward; one S-wide transposed row per d (row stride S) cost TLB
// misses instead.
template <typename T>
void transpose_all(const SdpaArgs& a, const T* src, int which, int D, float* t) {
  const i64 S = a.S, blocks = (S + KB - 1) / KB;
  ThreadPool::instance().parallel_for(i64(a.nbatch) * blocks, [&](i64 task) {
    const i64 b = task / blocks, kb = task % blocks;
    const T* base = src + offsets(a, b).x[which] + kb * KB * a.rs[which];
    const i64 rs = a.rs[which];
    float* dst = t + task * D * KB;
    const int kn = int(std::min<i64>(KB, S - kb * KB));
    int j = 0;
#if defined(__AVX2__)
    // 8 keys x 8 features transposed in registers (element by element this took 11% of a
    // small GPT's attention forward and backward on AVX2).
    if constexpr (std::is_same_v<T, float>) {
      for (; j + 8 <= kn; j += 8) {
        int d = 0;
        for (; d + 8 <= D; d += 8) {
          __m256 r[8];
          for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(base + (j + i) * rs + d);
          conv::transpose8(r);
          for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (d + i) * KB + j, r[i]);
        }
        for (; d < D; ++d)
          for (int i = 0; i < 8; ++i) dst[d * KB + j + i] = base[(j + i) * rs + d];
      }
    }
#endif
    for (; j < kn; ++j) {
      const T* row = base + j * rs;
      for (int d = 0; d < D; ++d) dst[d * KB + j] = to_float(row[d]);
    }
    for (int d = 0; d < D; ++d) std::fill(dst + d * KB + kn, dst + (d + 1) * KB, 0.0f);
  });
}

// Buffers of one call (transposed K and V, dQ partials, delta), kept per calling thread
// between calls: fresh vectors of these sizes each call cost page faults and a memset, 5% of
// a small GPT's attention.
float* call_buffer(int slot, i64 n) {
  thread_local std::vector<float> bufs[4];
  std::vector<float>& b = bufs[slot];
  if (i64(b.size()) < n) b.resize(std::size_t(n));
  return b.data();
}

float* transposed(const SdpaArgs& a, int slot, int D) {
  return call_buffer(slot, std::max<i64>(1, i64(a.nbatch) * ((i64(a.S) + KB - 1) / KB) * D * KB));
}

inline const float* kt_block(const float* t, const SdpaArgs& a, i64 b, i64 k0, int D) {
  const i64 blocks = (i64(a.S) + KB - 1) / KB;
  return t + ((b * blocks + k0 / KB) * D) * KB;
}

// Rows of a key block as float rows (first element, row stride): the input itself for
// float32, else widened into dst (row stride D).
struct Rows {
  const float* p;
  i64 ld;
};

template <typename T>
Rows key_rows(const T* src, i64 rs, i64 k0, int kn, int D, float* dst) {
  if constexpr (std::is_same_v<T, float>) {
    (void)kn;
    (void)dst;
    (void)D;
    return {src + k0 * rs, rs};
  } else {
    load_rows(src, rs, k0, kn, D, 1.0f, dst);
    return {dst, D};
  }
}

template <typename T>
void forward_block(const SdpaArgs& a, const T* q, const float* kt, const T* v,
                   const float* mask, T* out, float* lse, i64 b, i64 i0, int rows) {
  const int D = a.E, Dv = a.Ev;
  const Offsets o = offsets(a, b);
  std::vector<float>& w = scratch(std::size_t(QB) * D + std::size_t(KB) * Dv +
                                  std::size_t(QB) * KB + std::size_t(QB) * Dv + 3 * QB + KB);
  float* Qs = w.data();
  float* Vb = Qs + QB * D;
  float* Sb = Vb + KB * Dv;
  float* Ob = Sb + QB * KB;
  float* m = Ob + QB * Dv;
  float* l = m + QB;
  float* keep = l + QB;
  load_rows(q + o.x[FM_SDPA_Q], a.rs[FM_SDPA_Q], i0, rows, D, a.scale, Qs);
  std::fill(Ob, Ob + rows * Dv, 0.0f);
  for (int r = 0; r < rows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  const i64 k_end = a.causal != 0 ? std::min<i64>(a.S, i0 + rows) : a.S;
  for (i64 k0 = 0; k0 < k_end; k0 += KB) {
    const int kn = int(std::min<i64>(KB, k_end - k0));
    const Rows V = key_rows(v + o.x[FM_SDPA_V], a.rs[FM_SDPA_V], k0, kn, Dv, Vb);
    std::fill(Sb, Sb + rows * KB, 0.0f);
    gemm_acc(rows, kn, D, Qs, D, 1, kt_block(kt, a, b, k0, D), KB, Sb, KB);
    apply_masks(a, mask, o.m, i0, rows, k0, kn, Sb);
    for (int r = 0; r < rows; ++r) {
      float* row = Sb + r * KB;
      const float m_new = std::fmax(m[r], row_max(row, kn));
      // A row with no key yet keeps p = 0 instead of exp(-inf + inf).
      const float mu = m_new == -INFINITY ? 0.0f : m_new;
      for (int j = 0; j < kn; ++j) row[j] = exp_ps(row[j] - mu);
      const float alpha = exp_ps(m[r] - mu);
      l[r] = l[r] * alpha + row_sum(row, kn);
      m[r] = m_new;
      if (alpha != 1.0f)
        for (int c = 0; c < Dv; ++c) Ob[r * Dv + c] *= alpha;
      if (a.threshold != 0u) {
        keep_row(a, b, i0 + r, k0, kn, keep);
        for (int j = 0; j < kn; ++j) row[j] *= keep[j];
      }
    }
    gemm_acc(rows, Dv, kn, Sb, KB, 1, V.p, V.ld, Ob, Dv);
  }
  for (int r = 0; r < rows; ++r) {
    const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];  // no key takes part: 0, as the kernel
    T* orow = out + o.x[FM_SDPA_O] + (i0 + r) * a.rs[FM_SDPA_O];
    for (int c = 0; c < Dv; ++c) orow[c] = from_float<T>(Ob[r * Dv + c] * inv);
    lse[b * a.L + i0 + r] = m[r] + std::log(l[r]);
  }
}

// The backward's per-tile work shared by both forms: for query rows i0 .. i0 + rows - 1 and
// keys k0 .. k0 + kn - 1 (Kt, Vt: the transposed key block, row stride ldt), fills Pd
// (dropped P) and dS, row stride KB.
struct BackwardTile {
  const SdpaArgs* a;
  const float* mask;
  i64 mo, b;
  const float* lse;    // of batch entry b, by row
  const float* delta;  // likewise
};

void tile_ds(const BackwardTile& t, const float* Qs, const float* G, const float* Kt,
             const float* Vt, i64 ldt, i64 i0, int rows, i64 k0, int kn, float* Pd, float* dS,
             float* keep) {
  const SdpaArgs& a = *t.a;
  const int D = a.E, Dv = a.Ev;
  std::fill(Pd, Pd + rows * KB, 0.0f);
  std::fill(dS, dS + rows * KB, 0.0f);
  gemm_acc(rows, kn, D, Qs, D, 1, Kt, ldt, Pd, KB);
  gemm_acc(rows, kn, Dv, G, Dv, 1, Vt, ldt, dS, KB);
  apply_masks(a, t.mask, t.mo, i0, rows, k0, kn, Pd);
  for (int r = 0; r < rows; ++r) {
    float* p = Pd + r * KB;
    float* ds = dS + r * KB;
    const float lse = t.lse[i0 + r], delta = t.delta[i0 + r];
    for (int j = 0; j < kn; ++j) p[j] = p[j] == -INFINITY ? 0.0f : exp_ps(p[j] - lse);
    if (a.threshold != 0u) {
      keep_row(a, t.b, i0 + r, k0, kn, keep);
      for (int j = 0; j < kn; ++j) {
        ds[j] = p[j] == 0.0f ? 0.0f : p[j] * (ds[j] * keep[j] - delta);
        p[j] *= keep[j];
      }
    } else {
      for (int j = 0; j < kn; ++j) ds[j] = p[j] == 0.0f ? 0.0f : p[j] * (ds[j] - delta);
    }
  }
}

// Layout of one backward task's scratch.
struct BackwardScratch {
  float *Qs, *G, *Kr, *Pd, *dS, *dK, *dV, *keep;
  static std::size_t floats(int D, int Dv) {
    return std::size_t(QB) * (D + Dv) + std::size_t(KB) * (D + Dv) + 2 * QB * KB +
           std::size_t(KB) * D + KB;
  }
  BackwardScratch(float* w, int D, int Dv) {
    Qs = w;
    G = Qs + QB * D;
    Kr = G + QB * Dv;
    Pd = Kr + KB * D;
    dS = Pd + QB * KB;
    dK = dS + QB * KB;
    dV = dK + KB * D;
    keep = dV + KB * Dv;
  }
};

// dK, dV of keys k0 .. k0 + kn - 1 of batch entry b; with dq_acc (L x E floats of entry b), also
// its dS K terms.
template <typename T>
void backward_keys(const SdpaArgs& a, const T* go, const T* q, const T* k,
                   const float* kt, const float* vt, const float* mask,
                   const float* lse, const float* delta, T* dk, T* dv, float* dq_acc, i64 b,
                   i64 k0, int kn) {
  const int D = a.E, Dv = a.Ev;
  const Offsets o = offsets(a, b);
  BackwardScratch w(scratch(BackwardScratch::floats(D, Dv)).data(), D, Dv);
  const BackwardTile t{&a, mask, o.m, b, lse + b * a.L, delta + b * a.L};
  const float* Kt = kt_block(kt, a, b, k0, D);
  const float* Vt = kt_block(vt, a, b, k0, Dv);
  const Rows Kr = key_rows(k + o.x[FM_SDPA_K], a.rs[FM_SDPA_K], k0, kn, D, w.Kr);
  std::fill(w.dK, w.dK + kn * D, 0.0f);
  std::fill(w.dV, w.dV + kn * Dv, 0.0f);
  for (i64 i0 = a.causal != 0 ? k0 : 0; i0 < a.L; i0 += QB) {
    const int rows = int(std::min<i64>(QB, a.L - i0));
    load_rows(q + o.x[FM_SDPA_Q], a.rs[FM_SDPA_Q], i0, rows, D, a.scale, w.Qs);
    load_rows(go + o.x[FM_SDPA_G], a.rs[FM_SDPA_G], i0, rows, Dv, 1.0f, w.G);
    // Causal: keys past the block's last row are masked for all its rows (P = dS = 0) and
    // left out, as the forward leaves them out (a third less work on a GPT's diagonal blocks).
    const int kv = a.causal != 0 ? int(std::min<i64>(kn, i0 + rows - k0)) : kn;
    tile_ds(t, w.Qs, w.G, Kt, Vt, KB, i0, rows, k0, kv, w.Pd, w.dS, w.keep);
    gemm_acc(kv, Dv, rows, w.Pd, 1, KB, w.G, Dv, w.dV, Dv);
    gemm_acc(kv, D, rows, w.dS, 1, KB, w.Qs, D, w.dK, D);
    if (dq_acc) gemm_acc(rows, D, kv, w.dS, KB, 1, Kr.p, Kr.ld, dq_acc + i0 * D, D);
  }
  for (int j = 0; j < kn; ++j) {
    T* kr = dk + o.x[FM_SDPA_DK] + (k0 + j) * a.rs[FM_SDPA_DK];
    T* vr = dv + o.x[FM_SDPA_DV] + (k0 + j) * a.rs[FM_SDPA_DV];
    for (int d = 0; d < D; ++d) kr[d] = from_float<T>(w.dK[j * D + d]);
    for (int c = 0; c < Dv; ++c) vr[c] = from_float<T>(w.dV[j * Dv + c]);
  }
}

template <typename T>
void forward_impl(const SdpaArgs& a, const T* q, const T* k, const T* v, const float* mask,
                  T* out, float* lse) {
  const i64 blocks = (i64(a.L) + QB - 1) / QB;
  float* kt = transposed(a, 0, a.E);
  transpose_all(a, k, FM_SDPA_K, a.E, kt);
  ThreadPool::instance().parallel_for(i64(a.nbatch) * blocks, [&](i64 task) {
    const i64 b = task / blocks, i0 = (task % blocks) * QB;
    forward_block(a, q, kt, v, mask, out, lse, b, i0, int(std::min<i64>(QB, a.L - i0)));
  });
}

template <typename T>
void backward_impl(const SdpaArgs& a, const T* go, const T* q, const T* k, const T* v,
                   const float* mask, const T* out, const float* lse, T* dq, T* dk, T* dv) {
  const i64 nb = a.nbatch, L = a.L, S = a.S, D = a.E, Dv = a.Ev;
  ThreadPool& pool = ThreadPool::instance();
  float* delta = call_buffer(3, std::max<i64>(1, nb * L));
  pool.parallel_for(nb, [&](i64 b) {
    const Offsets o = offsets(a, b);
    for (i64 i = 0; i < L; ++i) {
      const T* g = go + o.x[FM_SDPA_G] + i * a.rs[FM_SDPA_G];
      const T* y = out + o.x[FM_SDPA_O] + i * a.rs[FM_SDPA_O];
      float s = 0.0f;
      for (i64 c = 0; c < Dv; ++c) s += to_float(g[c]) * to_float(y[c]);
      delta[b * L + i] = s;
    }
  });
  const i64 kblocks = (S + KB - 1) / KB;
  float* kt = transposed(a, 0, int(D));
  float* vt = transposed(a, 1, int(Dv));
  transpose_all(a, k, FM_SDPA_K, int(D), kt);
  transpose_all(a, v, FM_SDPA_V, int(Dv), vt);
  // Key blocks of an entry in G groups (block kb in group kb % G: causal groups stay even),
  // each a task with its own dQ partial, the partials summed in group order. G depends on the
  // shape only (the bits never depend on the thread count): 1 with 16 entries or more, else
  // up to 4 so that a few long entries still spread over the threads.
  const i64 G = std::max<i64>(1, std::min<i64>({kblocks, 4, 16 / std::max<i64>(1, nb)}));
  float* part = call_buffer(2, std::max<i64>(1, nb * G * L * D));
  pool.parallel_for(nb * G, [&](i64 task) {
    const i64 b = task / G, g = task % G;
    std::fill(part + task * L * D, part + (task + 1) * L * D, 0.0f);
    for (i64 kb = g; kb < kblocks; kb += G)
      backward_keys(a, go, q, k, kt, vt, mask, lse, delta, dk, dv, part + task * L * D, b,
                    kb * KB, int(std::min<i64>(KB, S - kb * KB)));
  });
  pool.parallel_for(nb, [&](i64 b) {
    T* base = dq + offsets(a, b).x[FM_SDPA_DQ];
    const float* p0 = part + b * G * L * D;
    for (i64 i = 0; i < L; ++i) {
      T* row = base + i * a.rs[FM_SDPA_DQ];
      for (i64 d = 0; d < D; ++d) {
        float s = p0[i * D + d];
        for (i64 g = 1; g < G; ++g) s += p0[(g * L + i) * D + d];
        row[d] = from_float<T>(s * a.scale);
      }
    }
  });
}

}  // namespace

// Arrays in host memory, laid out as SdpaArgs says; half = true: float16 storage (_Float16).
void sdpa_forward_native(const SdpaArgs& a, bool half, const void* q, const void* k,
                         const void* v, const float* mask, void* out, float* lse) {
  if (half)
    forward_impl(a, static_cast<const _Float16*>(q), static_cast<const _Float16*>(k),
                 static_cast<const _Float16*>(v), mask, static_cast<_Float16*>(out), lse);
  else
    forward_impl(a, static_cast<const float*>(q), static_cast<const float*>(k),
                 static_cast<const float*>(v), mask, static_cast<float*>(out), lse);
}

void sdpa_backward_native(const SdpaArgs& a, bool half, const void* go, const void* q,
                          const void* k, const void* v, const float* mask, const void* out,
                          const float* lse, void* dq, void* dk, void* dv) {
  if (half) {
    using H = _Float16;
    backward_impl(a, static_cast<const H*>(go), static_cast<const H*>(q), static_cast<const H*>(k),
                  static_cast<const H*>(v), mask, static_cast<const H*>(out), lse,
                  static_cast<H*>(dq), static_cast<H*>(dk), static_cast<H*>(dv));
  } else {
    backward_impl(a, static_cast<const float*>(go), static_cast<const float*>(q),
                  static_cast<const float*>(k), static_cast<const float*>(v), mask,
                  static_cast<const float*>(out), lse, static_cast<float*>(dq),
                  static_cast<float*>(dk), static_cast<float*>(dv));
  }
}

}  // namespace fm::cpu::FM_CPU_ISA
