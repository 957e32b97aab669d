// The fast CPU matrix product for fastmetal.matmul / linear, compiled once per ISA (see
// isa_dispatch.h), on strided, batched operands.
//
// Linear's forward (both operands contiguous along k) with few rows or columns takes dot
// products of rows (matmul_dot, below). Otherwise a blocked GEMM in the manner of BLIS /
// GotoBLAS: A is packed into MR-row strips (k-major, any strides; a large A group by group of
// row chunks, see Split); C is cut into tasks of column chunks (whole vectors) and row chunks
// for the threads; each task packs its columns of B, one K block (at most kKC rows) and kBBlock
// floats at a time, into contiguous kc x NR panels in a per-thread buffer that stays in L2,
// then runs the micro-kernel (MR x NR of C in registers, simd_kernels.h's register blocking)
// for every strip of A against every panel: the A strip (kc x MR) stays in L1 while B's panels
// stream from L2 in the order they were written. Tall or long-K products with few columns
// (a transformer's linears and their weight gradients) instead go as tiles whose tasks pack
// their own A slices right before use (Split::tiles). Packing B also does away with reading B's rows
// where they are, a power of two apart in memory (L1 set conflicts: 3x slower on AVX2 for
// MNIST's grad @ W), and with the row-pointer table of the conv2d kernel.
//
// Every element of C is the same chain of FMAs over k in order (a K block continues from
// the float that the previous one stored), whatever the tiling or the thread count, so
// results are bitwise reproducible for any FASTMETAL_NUM_THREADS.
#include "simd_kernels.h"
#include "matmul_args.h"

namespace fm::cpu::FM_CPU_ISA {
using namespace conv;

namespace {
i64 batch_offset(const MatmulArgs& p, i64 b, const int32_t* bs) {
  i64 off = 0;
  for (int d = p.batch_dims - 1; d >= 0; --d) {
    const i64 i = b % p.batch_shape[d];
    b /= p.batch_shape[d];
    off += i * bs[d];
  }
  return off;
}

// ------------------------------------------------------------------ packed GEMM
// K blocks of at most kKC rows; packed blocks of B of at most kBBlock floats (512 KB: L2 is
// 1-2 MB per core on current x86). Longer K blocks mean fewer passes of C through the caches
// (each K block loads and stores C); on a Zen 5 core, 512 / 128K ran a few percent ahead of
// 256 / 96K for 1024^2 on both AVX2 and AVX-512, with little difference in between.
constexpr int kKC = 512;
constexpr i64 kBBlock = 128 * 1024;

// C[M x W*VL] (+)= A strip (kc x MR, k-major) * B panel (kc x W*VL, row k at b + k * W*VL).
// `next`: the C tile of the following call, fetched into cache meanwhile (it is read at
// the start of that call, where every FMA waits on it).
template <int M, int W, bool ACC>
void pkern(int kc, const float* __restrict a, const float* __restrict b, float* __restrict c,
           i64 ldc, const float* next) {
  V acc[M][W];
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < W; ++j) acc[i][j] = ACC ? vload(c + i * ldc + j * VL) : vzero();
  int k = 0;
  auto step = [&] {
    V bv[W];
#pragma GCC unroll 4
    for (int j = 0; j < W; ++j) bv[j] = vload(b + j * VL);
#pragma GCC unroll 8
    for (int i = 0; i < M; ++i) {
      const V av = vset1(a[i]);
#pragma GCC unroll 4
      for (int j = 0; j < W; ++j) acc[i][j] = vfma(av, bv[j], acc[i][j]);
    }
    a += MR;
    b += W * VL;
  };
  // The first k steps, then one line of the next C tile per step.
  const int lines = (W * VL * int(sizeof(float)) + 63) / 64;
  for (; k < kc && k < 8; ++k) step();
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 4
    for (int l = 0; l < lines; ++l) {
      if (k < kc) {
        __builtin_prefetch(next + i * ldc + l * 16);
        step();
        ++k;
      }
    }
  }
  for (; k < kc; ++k) step();
#pragma GCC unroll 8
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < W; ++j) vstore(c + i * ldc + j * VL, acc[i][j]);
}

using PKernFn = void (*)(int, const float*, const float*, float*, i64, const float*);
template <int W, bool ACC, std::size_t... I>
constexpr auto pkern_row(std::index_sequence<I...>) {
  return std::array<PKernFn, sizeof...(I)>{&pkern<int(I) + 1, W, ACC>...};
}
// pkern_table<ACC>()[w - 1][m - 1]: m <= MR rows, w <= NV vectors.
template <bool ACC, std::size_t... J>
constexpr auto pkern_table(std::index_sequence<J...>) {
  return std::array<std::array<PKernFn, MR>, sizeof...(J)>{
      pkern_row<int(J) + 1, ACC>(std::make_index_sequence<MR>{})...};
}

// K blocks: balanced, from K alone.
struct KBlocks {
  int kc, n;
  explicit KBlocks(int K) : n(int(ceil_div(K, kKC))), kc(int(ceil_div(K, ceil_div(K, kKC)))) {}
};

// The panels of a block of nw columns: w vectors each (NV, narrower at the end; 4 vectors
// left go as 2 + 2, not 3 + 1: a 1-vector tile is bound by its broadcasts), `cols` real
// columns (fewer than w * VL only in the last one). Packed, panel j starts at kn * q.
struct Panel {
  int q, w, cols;
};
int panels_of(i64 nw, Panel* out) {
  int n = 0;
  for (i64 q = 0; q < nw;) {
    const i64 left = ceil_div(nw - q, VL);
    const int w = left == 4 && NV == 3 ? 2 : int(std::min<i64>(NV, left));
    out[n++] = {int(q), w, int(std::min<i64>(w * VL, nw - q))};
    q += w * VL;
  }
  return n;
}

// Packs B(k0 + k, n0 + j) for k < kn, j < nw into the panels `pan` (row k of a panel at
// k * w * VL; zero columns past nw).
void pack_b(const MatmulArgs& p, const float* bb, int k0, int kn, i64 n0, const Panel* pan,
            int npan, float* dst) {
  if (p.b_cs == 1) {  // rows contiguous: whole vectors, row by row
    // Rows far apart (a long row pitch) each start a new stream for the hardware
    // prefetcher: fetch a few rows ahead.
    constexpr int kAhead = 4;
    for (int k = 0; k < kn; ++k) {
      const float* src = bb + i64(k0 + k) * p.b_rs + n0;
      if (k + kAhead < kn) {
        const float* pf = src + i64(kAhead) * p.b_rs;
        const i64 len = pan[npan - 1].q + pan[npan - 1].cols;
        for (i64 q = 0; q < len; q += 16) __builtin_prefetch(pf + q);
      }
      for (int j = 0; j < npan; ++j) {
        const Panel& pn = pan[j];
        const int wv = pn.w * VL;
        float* d = dst + i64(kn) * pn.q + i64(k) * wv;
        const float* sp = src + pn.q;
        if (pn.cols == NR) {
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) vstore(d + v * VL, vload(sp + v * VL));
        } else {
          std::memcpy(d, sp, sizeof(float) * pn.cols);
          std::fill(d + pn.cols, d + wv, 0.f);
        }
      }
    }
    return;
  }
  // Columns contiguous along k (a transposed B: linear's W^T) or any strides: column by
  // column; with contiguous columns, blocks of 8 columns x 8 k transposed in registers
  // (element by element, packing MNIST's 9216 x 128 W^T took as long as a third of the
  // product on a Zen 5 core).
  for (int j = 0; j < npan; ++j) {
    const Panel& pn = pan[j];
    const int wv = pn.w * VL;
    float* d = dst + i64(kn) * pn.q;
    int c = 0;
#if defined(__AVX2__)
    if (p.b_rs == 1) {
      for (; c + 8 <= pn.cols; c += 8) {
        const float* src = bb + (n0 + pn.q + c) * p.b_cs + k0;
        int k = 0;
        for (; k + 8 <= kn; k += 8) {
          __m256 t[8];
          for (int r = 0; r < 8; ++r) t[r] = _mm256_loadu_ps(src + i64(r) * p.b_cs + k);
          transpose8(t);
          for (int r = 0; r < 8; ++r) _mm256_storeu_ps(d + i64(k + r) * wv + c, t[r]);
        }
        for (; k < kn; ++k)
          for (int r = 0; r < 8; ++r) d[i64(k) * wv + c + r] = src[i64(r) * p.b_cs + k];
      }
    }
#endif
    for (; c < pn.cols; ++c) {
      const float* src = bb + (n0 + pn.q + c) * p.b_cs + i64(k0) * p.b_rs;
      for (int k = 0; k < kn; ++k) d[i64(k) * wv + c] = src[i64(k) * p.b_rs];
    }
    if (pn.cols < wv)
      for (int k = 0; k < kn; ++k) std::fill(d + i64(k) * wv + pn.cols, d + i64(k + 1) * wv, 0.f);
  }
}

float* b_scratch(i64 n) {
  static thread_local std::vector<float> buf;
  if (i64(buf.size()) < n + 16) buf.resize(std::size_t(n + 16));
  const auto a = reinterpret_cast<std::uintptr_t>(buf.data());
  return buf.data() + ((64 - a % 64) % 64) / sizeof(float);
}

void pack_a_block(const MatmulArgs& p, const float* a, int s, int k0, int kn, float* dst);

// rows x cols of C at c (row pitch ldc) += bias[0, cols): linear's bias, added to each tile
// right after its last K block while it is in L1 (a separate add made another pass over all
// of C). The same one rounding per element as adding it to the finished product.
void add_bias(float* c, i64 ldc, int rows, int cols, const float* bias) {
  for (int i = 0; i < rows; ++i) {
    float* r = c + i * ldc;
    int j = 0;
    for (; j + VL <= cols; j += VL) vstore(r + j, vadd(vload(r + j), vload(bias + j)));
    for (; j < cols; ++j) r[j] = r[j] + bias[j];
  }
}

// One K block (k0, kn) of C's strips [s0, s1) against the packed panels pan[0, npan) of that
// block (panel j at bp + kn * pan[j].q, C columns from c + pan[j].q): A from ap
// (pack_a_strip's layout over all of K) or, with ap null, packed here from `a` into aslice,
// one strip at a time. Every path of the GEMM ends here, so each C element is the same FMA
// chain whichever path packed its operands. bias (C's columns from c's, or null): added
// after the last K block.
void strips_x_panels(const MatmulArgs& p, const float* ap, const float* a, float* aslice,
                     const float* bp, const Panel* pan, int npan, float* c, int s0, int s1,
                     int k0, int kn, const float* bias) {
  static constexpr auto first = pkern_table<false>(std::make_index_sequence<NV>{});
  static constexpr auto more = pkern_table<true>(std::make_index_sequence<NV>{});
  const int M = p.M, K = p.K;
  const i64 N = p.N;
  const auto& table = k0 == 0 ? first : more;
  if (k0 + kn < K) bias = nullptr;
  alignas(64) float tmp[MR * NR];
  for (int s = s0; s < s1; ++s) {
    const int rows = std::min(MR, M - s * MR);
    const float* as = ap ? ap + (i64(s) * K + k0) * MR : aslice;
    if (!ap) pack_a_block(p, a, s, k0, kn, aslice);
    float* cs = c + i64(s) * MR * N;
    for (int j = 0; j < npan; ++j) {
      const Panel& pn = pan[j];
      const float* bpan = bp + i64(kn) * pn.q;
      float* ct = cs + pn.q;
      const float* next = j + 1 < npan ? cs + pan[j + 1].q : cs + i64(MR) * N;
      const auto fn = table[pn.w - 1][rows - 1];
      if (pn.cols == pn.w * VL) {
        fn(kn, as, bpan, ct, N, next);
      } else {  // a partial last panel: through a tile of whole vectors
        if (k0 > 0)
          for (int i = 0; i < rows; ++i)
            std::memcpy(tmp + i * NR, ct + i * N, sizeof(float) * pn.cols);
        fn(kn, as, bpan, tmp, NR, next);
        for (int i = 0; i < rows; ++i)
          std::memcpy(ct + i * N, tmp + i * NR, sizeof(float) * pn.cols);
      }
      if (bias) add_bias(ct, N, rows, pn.cols, bias + pn.q);
    }
  }
}

// C rows of strips [s0, s1) and columns [n0, n1) (n0 a multiple of VL; n1 too or N) of one
// product: A packed (ap, pack_a_strip's layout over all of K), or, with ap null, packed here
// from `a`, one K block of one strip at a time (Split::tiles); B at bb through p's strides;
// plus bias (N floats) where not null.
void gemm_range(const MatmulArgs& p, const float* ap, const float* a, const float* bb, float* c,
                int s0, int s1, i64 n0, i64 n1, const float* bias) {
  const int K = p.K;
  const KBlocks kb(K);
  const i64 ncb = std::max<i64>(NR, kBBlock / kb.kc / NR * NR);
  float* bp = b_scratch(i64(kb.kc) * (std::min(ncb, n1 - n0) + NR));
  std::vector<Panel> pan_buf(std::size_t(ncb / VL + 2));
  Panel* pan = pan_buf.data();
  float* aslice = ap ? nullptr : scratch(4, i64(kb.kc) * MR);
  for (i64 nb0 = n0; nb0 < n1; nb0 += ncb) {
    const int npan = panels_of(std::min(ncb, n1 - nb0), pan);
    for (int k0 = 0; k0 < K; k0 += kb.kc) {
      const int kn = std::min(kb.kc, K - k0);
      pack_b(p, bb, k0, kn, nb0, pan, npan, bp);
      strips_x_panels(p, ap, a, aslice, bp, pan, npan, c + nb0, s0, s1, k0, kn,
                      bias ? bias + nb0 : nullptr);
    }
  }
}

struct Scratch {
  std::vector<float> ap;
  float* a(i64 n) {
    if (i64(ap.size()) < n) ap.resize(std::size_t(n));
    return ap.data();
  }
};
Scratch& thread_scratch() {
  static thread_local Scratch s;
  return s;
}

// A(s * MR + r, k0 + k) for r < MR, k < kn at dst[k * MR + r] (rows past M: zeros).
void pack_a_block(const MatmulArgs& p, const float* a, int s, int k0, int kn, float* dst) {
  const int m0 = s * MR, rows = std::min(MR, p.M - m0), K = kn;
  const float* src = a + i64(m0) * p.a_rs + i64(k0) * p.a_cs;
  int k = 0;
  if (rows == MR && p.a_rs == 1) {  // a column of A is contiguous: MR floats per k
    for (; k < K; ++k) std::memcpy(dst + i64(k) * MR, src + i64(k) * p.a_cs, sizeof(float) * MR);
    return;
  }
#if defined(__AVX2__)
  if (rows == MR && p.a_cs == 1 && MR <= 8) {
    // Rows contiguous: 8 k of every row, transposed in registers. Each k's store writes 8
    // floats (MR used, the rest overwritten by the next k), so the last block of the strip
    // is left to the loop below.
    for (; k + 8 < K; k += 8) {
      __m256 t[8];
      for (int r = 0; r < 8; ++r)
        t[r] = r < MR ? _mm256_loadu_ps(src + i64(r) * p.a_rs + k) : _mm256_setzero_ps();
      transpose8(t);
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + i64(k + j) * MR, t[j]);
    }
  }
#endif
  for (; k < K; ++k)
    for (int r = 0; r < MR; ++r)
      dst[i64(k) * MR + r] = r < rows ? src[i64(r) * p.a_rs + i64(k) * p.a_cs] : 0.f;
}

// Strip s of A (rows s * MR ...), all of K, at ap + s * K * MR.
void pack_a_strip(const MatmulArgs& p, const float* a, int s, float* ap) {
  pack_a_block(p, a, s, 0, p.K, ap + i64(s) * p.K * MR);
}

// How one product is cut into tasks: column chunks of whole panels, and row chunks of whole
// strips when there are too few panels or A is large. Results do not depend on it.
constexpr i64 kABlock = i64(1) << 20;
struct Split {
  int strips, panels, vecs, m_chunks, n_chunks;
  int groups, m_sub;  // m_chunks = groups x m_sub: groups run one after another
  Split(const MatmulArgs& p, int threads) {
    strips = int(ceil_div(p.M, MR));
    panels = int(ceil_div(p.N, NR));
    vecs = int(ceil_div(p.N, VL));
    // Three tasks per thread: a thread held up (a busy machine) leaves less behind; medians
    // at 1024^2 and 4096 x 1024 were 3-6% lower than with two, 2 threads, AVX-512.
    const int want = threads > 1 ? 3 * threads : 1;
    n_chunks = std::clamp(panels / 2, 1, want);
    // Too few panels for the threads: one column chunk each, whole vectors (at least two)
    // rather than row chunks, which would each pack all of B (linear's 9216 -> 128 at 64
    // rows, AVX-512: 432 -> 391 us on 2 threads of a Zen 5).
    if (n_chunks < threads && vecs >= 2 * threads) n_chunks = threads;
    // Row chunks only as many as make the tasks a multiple of the threads (or `want`): every
    // row chunk packs its column chunk of B again, a transpose as costly as a third of the
    // arithmetic for linear's 9216 x 128 W^T at 64 rows (6 row chunks: 830 us, 2: 420).
    m_sub = 1;
    while (n_chunks * m_sub < want && (n_chunks * m_sub) % threads != 0) ++m_sub;
    m_sub = std::clamp(m_sub, 1, strips);
    // Groups of row chunks of at most kABlock floats of packed A, one after another: a
    // group's strips are packed right before its tasks run and come from L3 for every
    // column chunk, not from memory (4096 x 1024 @ 1024^2: 8% faster on one core, though
    // B is packed once per group).
    groups = std::clamp<int>(int(ceil_div(i64(p.M) * p.K, kABlock)), 1,
                             std::max(1, strips / m_sub));
    m_chunks = groups * m_sub;
    tiles(p, threads);
  }
  // Tiles: row_chunks x col_chunks tasks that each pack their own strips of A, one K block
  // at a time, right before use (gemm_range with ap null), and their own columns of B, all
  // of them in one B block (so each A slice is packed once per task and used for every
  // panel of the tile). Against the shared packed A above this saves the pass over A and
  // reads each A slice from L1, not L3, but packs A col_chunks times and B row_chunks times:
  // `extra` below is that added packing per multiply-add. Chosen where it is small: three
  // tasks a thread if that adds at most 0.4%, else one a thread at most 1%; else
  // row_chunks = 0 (the shared A). On 2 threads of the EPYC (AVX2), BENCHMARKS.md: a GPT's
  // 4096-row linears 10-20% faster (forward 4096 x 512 -> 128: 4.5 -> 3.0 ms), its weight
  // gradients (K = 4096) up to 35% (512 x 4096 @ 4096 x 128: 5.4 -> 3.4 ms); 1024^3 stays on
  // the shared A (tiles would pack A 4 times: 5% slower).
  void tiles(const MatmulArgs& p, int threads) {
    const KBlocks kb(p.K);
    const i64 ncb = std::max<i64>(NR, kBBlock / kb.kc / NR * NR);
    double best = 1e30;
    for (const int per : {3, 1}) {
      const int t = threads > 1 ? per * threads : 1;
      for (int mc = 1; mc <= t; ++mc) {
        const int nc = t / mc;
        if (t % mc || mc > strips || nc > vecs || ceil_div(vecs, nc) * VL > ncb) continue;
        const double extra = double(mc - 1) / p.M + double(nc - 1) / p.N;
        if (extra < best) {
          best = extra;
          row_chunks = mc;
          col_chunks = nc;
        }
      }
      if (best <= (per == 3 ? 0.004 : 0.01)) return;
    }
    row_chunks = 0;
  }
  int row_chunks = 0, col_chunks = 1;
  int count() const { return m_chunks * n_chunks; }
  int per_group() const { return m_sub * n_chunks; }  // tasks g * per_group() ... are group g's
  int strip0(int mi) const { return int(i64(strips) * mi / m_chunks); }  // row chunk mi's first
  int group_strip0(int g) const { return strip0(g * m_sub); }
  void run(const MatmulArgs& p, const float* ap, const float* bb, float* c, i64 t,
           const float* bias) const {
    const int mi = int(t / n_chunks), ni = int(t % n_chunks);
    const int s0 = strip0(mi), s1 = strip0(mi + 1);
    // Column chunks of equal numbers of vectors (1024 columns in whole 48-column panels
    // would give chunks of 5 and 6 panels, threads 6% apart).
    const i64 n0 = i64(vecs) * ni / n_chunks * VL;
    const i64 n1 = std::min<i64>(p.N, i64(vecs) * (ni + 1) / n_chunks * VL);
    if (s0 < s1 && n0 < n1) gemm_range(p, ap, nullptr, bb, c, s0, s1, n0, n1, bias);
  }
};

// Both operands contiguous along k (A row-major, B the transpose of a row-major matrix:
// linear's x @ W^T) and few rows or columns: C[m][n] = A_m . B_n as dot products of rows (the
// engine's dot_acc), which needs no copy of B. The GEMM path transposes B into its panels
// first, which pays only from a few dozen rows on (2 threads of a Zen 5, AVX-512 / AVX2,
// BENCHMARKS.md: at 16 rows the dot path is ahead or even; at 32 rows it is ahead for 128
// columns or fewer (MNIST's 9216 -> 128: 257 against 276 us) and behind for 256 or more
// (32 x 1024 -> 1024: 249 against 183 us); for 20 columns it is ahead at any row count; the
// AVX2 GEMM is also behind for 9216 -> 128 at 64 to 512 rows, by 3-9%). Threads take column
// panels; each walks K in chunks of LC so that its panel's chunk of B (ncols x LC) stays in
// L2 while every group of DMA rows of A passes. Each element's sum runs over k in the same
// order whatever the panels, so results do not depend on the thread count; which path runs
// depends on the shape alone.
bool dot_path(const MatmulArgs& p) {
  if (p.a_cs != 1 || p.b_rs != 1 || p.b_cs == 1 || p.K < 128) return false;
  return p.M <= 16 || (p.M <= 512 && (p.N <= 32 || (p.N <= 128 && (p.M <= 32 || VL < 16))));
}

void matmul_dot(const MatmulArgs& p, const float* A, const float* B, float* C,
                const float* bias) {
  static constexpr auto table = dot_table(std::make_index_sequence<DMA>{});
  auto& pool = ThreadPool::instance();
  const int M = p.M, N = p.N;
  const i64 K = p.K;
  const i64 panel = std::max<i64>(DNB, round_up(ceil_div(N, pool.num_threads()), DNB));
  const i64 panels = ceil_div(N, panel), groups = ceil_div(M, DMA);
  for (i64 b = 0; b < p.batch; ++b) {
    const float* a = A + batch_offset(p, b, p.a_bs);
    const float* bb = B + batch_offset(p, b, p.b_bs);
    float* c = C + b * i64(M) * N;
    pool.parallel_for(panels, [&](i64 t) {
      const i64 j0 = t * panel;
      const int ncols = int(std::min<i64>(panel, N - j0)), nkb = int(ceil_div(ncols, DNB));
      static thread_local std::vector<float> vacc_buf;
      const i64 per_group = i64(nkb) * DTILE;
      if (i64(vacc_buf.size()) < groups * per_group) vacc_buf.resize(std::size_t(groups * per_group));
      float* vacc = vacc_buf.data();
      std::fill(vacc, vacc + groups * per_group, 0.f);
      const float* ap[DMA];
      const float* bp[DNB];
      for (i64 c0 = 0; c0 < K; c0 += LC) {
        const i64 len = std::min(LC, K - c0);
        for (i64 g = 0; g < groups; ++g) {
          const int ma = int(std::min<i64>(DMA, M - g * DMA));
          for (int i = 0; i < ma; ++i) ap[i] = a + (g * DMA + i) * i64(p.a_rs) + c0;
          for (int kb = 0; kb < nkb; ++kb) {
            const int nb = std::min(DNB, ncols - kb * DNB);
            for (int j = 0; j < nb; ++j) bp[j] = bb + (j0 + kb * DNB + j) * i64(p.b_cs) + c0;
            table[ma - 1][nb - 1](len, ap, bp, vacc + g * per_group + kb * DTILE);
          }
        }
      }
      for (i64 g = 0; g < groups; ++g) {
        const int ma = int(std::min<i64>(DMA, M - g * DMA));
        float* out = c + g * DMA * i64(N) + j0;
        for (int i = 0; i < ma; ++i) std::fill(out + i * i64(N), out + i * i64(N) + ncols, 0.f);
        dot_reduce(ma, ncols, vacc + g * per_group, out, N);
        if (bias) add_bias(out, N, ma, ncols, bias + j0);
      }
    });
  }
}

// ------------------------------------------------------------------ B packed once
// Many products a_i @ B with one B and one shape (a recurrent layer's h_{t-1} @ W_hh^T at
// every time step, and dg_t @ W_hh back): B is packed once into the panels (matmul_pack_b)
// and every product (matmul_packed) runs strips_x_panels on them, A packed per task one K
// block of one strip at a time, as Split::tiles does. Packing B was most of such a product's
// overhead: a 32 x 256 @ 256 x 1024 step packed the whole 1 MB W_hh^T (a transpose) for 8M
// multiply-adds. Layout: K block (k0, kn) at k0 * npad (npad: N in whole vectors); column
// chunk [n0, n1) of it at + kn * n0, its panels (panels_of its width) as pack_b writes them.
// Tasks are column chunks, one a thread (each thread's chunk of B stays in its L2 from one
// product to the next), and row chunks only where the columns are too few for the threads.
// The chunks depend on the pool's size, fixed for the process, so a packing serves every
// product of the same p. Results are matmul_gemm's: the same micro-kernels over the same K
// blocks (shapes on the dot path are not packed: packed_size is 0 there).
struct PackedB {
  int strips, vecs, col_chunks, row_chunks;
  i64 npad;
  PackedB(const MatmulArgs& p, int threads) {
    strips = int(ceil_div(p.M, MR));
    vecs = int(ceil_div(p.N, VL));
    npad = i64(vecs) * VL;
    // Too small to share (matmul_gemm's threshold): one task.
    if (i64(p.M) * p.N * p.K < (i64(1) << 17)) threads = 1;
    col_chunks = std::clamp(vecs / NV, 1, threads);
    row_chunks = std::clamp(threads / col_chunks, 1, strips);
  }
  i64 n0(int ni) const { return i64(vecs) * ni / col_chunks * VL; }
  i64 n1(const MatmulArgs& p, int ni) const { return std::min<i64>(p.N, n0(ni + 1)); }
};

Panel* panel_buffer(i64 cols) {
  static thread_local std::vector<Panel> buf;
  const std::size_t n = std::size_t(ceil_div(cols, VL) + 1);
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}
}  // namespace

std::int64_t matmul_packed_size(const MatmulArgs& p) {
  if (p.batch != 1 || i64(p.M) * p.N == 0 || p.K == 0 || dot_path(p)) return 0;
  return i64(p.K) * PackedB(p, ThreadPool::instance().num_threads()).npad;
}

void matmul_pack_b(const MatmulArgs& p, const float* B, float* packed) {
  auto& pool = ThreadPool::instance();
  const PackedB L(p, pool.num_threads());
  const KBlocks kb(p.K);
  pool.parallel_for(i64(L.col_chunks) * kb.n, [&](i64 t) {
    const int ni = int(t % L.col_chunks), k0 = int(t / L.col_chunks) * kb.kc;
    const int kn = std::min(kb.kc, p.K - k0);
    const i64 n0 = L.n0(ni), n1 = L.n1(p, ni);
    if (n0 >= n1) return;
    Panel* pan = panel_buffer(n1 - n0);
    const int npan = panels_of(n1 - n0, pan);
    pack_b(p, B, k0, kn, n0, pan, npan, packed + i64(k0) * L.npad + i64(kn) * n0);
  });
}

void matmul_packed(const MatmulArgs& p, const float* A, const float* packed, float* C) {
  auto& pool = ThreadPool::instance();
  const PackedB L(p, pool.num_threads());
  const KBlocks kb(p.K);
  pool.parallel_for(i64(L.col_chunks) * L.row_chunks, [&](i64 t) {
    const int mi = int(t / L.col_chunks), ni = int(t % L.col_chunks);
    const int s0 = int(i64(L.strips) * mi / L.row_chunks);
    const int s1 = int(i64(L.strips) * (mi + 1) / L.row_chunks);
    const i64 n0 = L.n0(ni), n1 = L.n1(p, ni);
    if (s0 >= s1 || n0 >= n1) return;
    Panel* pan = panel_buffer(n1 - n0);
    const int npan = panels_of(n1 - n0, pan);
    float* aslice = scratch(4, i64(kb.kc) * MR);
    for (int k0 = 0; k0 < p.K; k0 += kb.kc) {
      const int kn = std::min(kb.kc, p.K - k0);
      strips_x_panels(p, nullptr, A, aslice, packed + i64(k0) * L.npad + i64(kn) * n0, pan,
                      npan, C + n0, s0, s1, k0, kn, nullptr);
    }
  });
}


void matmul_gemm(const MatmulArgs& p, const float* A, const float* B, float* C,
                 const float* bias) {
  const i64 MN = i64(p.M) * p.N;
  if (MN == 0 || p.batch == 0) return;
  if (p.K == 0) {
    std::fill(C, C + MN * p.batch, 0.f);
    if (bias)
      for (i64 r = 0; r < i64(p.batch) * p.M; ++r) add_bias(C + r * p.N, p.N, 1, p.N, bias);
    return;
  }
  if (dot_path(p)) return matmul_dot(p, A, B, C, bias);
  auto& pool = ThreadPool::instance();
  const int threads = pool.num_threads();
  const Split sp(p, threads);
  const i64 strips = sp.strips;
  // Many products, or one too small to share (below 2^17 multiply-adds; VAE's 20 x 128 x 400
  // still ran faster on two threads, 16 vs 27 us on AVX2): one product per task, all on that
  // thread.
  if (p.batch >= 2 * threads || sp.count() == 1 || i64(p.M) * p.N * p.K < (i64(1) << 17)) {
    const Split one(p, 1);
    pool.parallel_for(p.batch, [&](i64 b) {
      float* ap = thread_scratch().a(strips * MR * p.K);
      const float* a = A + batch_offset(p, b, p.a_bs);
      const float* bb = B + batch_offset(p, b, p.b_bs);
      for (int g = 0; g < one.groups; ++g) {
        for (int s = one.group_strip0(g); s < one.group_strip0(g + 1); ++s)
          pack_a_strip(p, a, s, ap);
        for (int t = 0; t < one.per_group(); ++t)
          one.run(p, ap, bb, C + b * MN, i64(g) * one.per_group() + t, bias);
      }
    });
    return;
  }
  if (sp.row_chunks > 0) {  // tiles (see Split::tiles)
    for (i64 b = 0; b < p.batch; ++b) {
      const float* a = A + batch_offset(p, b, p.a_bs);
      const float* bb = B + batch_offset(p, b, p.b_bs);
      const int mc = sp.row_chunks, nc = sp.col_chunks;
      pool.parallel_for(i64(mc) * nc, [&](i64 t) {
        const i64 mi = t / nc, ni = t % nc;
        const int s0 = int(strips * mi / mc), s1 = int(strips * (mi + 1) / mc);
        const i64 n0 = i64(sp.vecs) * ni / nc * VL;
        const i64 n1 = std::min<i64>(p.N, i64(sp.vecs) * (ni + 1) / nc * VL);
        if (s0 < s1 && n0 < n1)
          gemm_range(p, nullptr, a, bb, C + b * MN, s0, s1, n0, n1, bias);
      });
    }
    return;
  }
  float* ap = thread_scratch().a(strips * MR * p.K);
  for (i64 b = 0; b < p.batch; ++b) {
    const float* a = A + batch_offset(p, b, p.a_bs);
    const float* bb = B + batch_offset(p, b, p.b_bs);
    for (int g = 0; g < sp.groups; ++g) {
      const int s0 = sp.group_strip0(g);
      pool.parallel_for(sp.group_strip0(g + 1) - s0,
                        [&](i64 s) { pack_a_strip(p, a, s0 + int(s), ap); });
      pool.parallel_for(sp.per_group(), [&](i64 t) {
        sp.run(p, ap, bb, C + b * MN, i64(g) * sp.per_group() + t, bias);
      });
    }
  }
}

}  // namespace fm::cpu::FM_CPU_ISA
