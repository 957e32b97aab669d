// The fast CPU matrix product for fastmetal.matmul / linear: the register-blocked
// micro-kernels of the conv2d engine (conv2d_engine.h: gemm_block, pack_a) on strided,
// batched operands. Compiled once per ISA (see isa_dispatch.h).
//
// Linear's forward (both operands contiguous along k, few rows) takes dot products of rows
// instead (matmul_dot, below). Otherwise, per batch: A is packed into MR-row strips (any
// strides), B is copied into a row-padded contiguous panel (the micro-kernel reads whole
// vectors) unless it can be read in place (b_in_place), then tiles of at most
// kRowBlock rows x kColPanel columns (smaller when there would be fewer tiles than twice
// the threads) run in parallel. Every element of C is the same
// chain of FMAs over k whatever the tiling or the thread count, so results are bitwise
// reproducible for any FASTMETAL_NUM_THREADS.
#include "conv2d_engine.h"
#include "matmul_args.h"

namespace fm::cpu::FM_CPU_ISA {
using namespace conv;

namespace {
constexpr int kRowBlock = MR * 16;
constexpr i64 kColPanel = NR * 32;

i64 batch_offset(const MatmulArgs& p, i64 b, const int32_t* bs) {
  i64 off = 0;
  for (int d = p.batch_dims - 1; d >= 0; --d) {
    const i64 i = b % p.batch_shape[d];
    b /= p.batch_shape[d];
    off += i * bs[d];
  }
  return off;
}

struct Scratch {
  std::vector<float> ap, bp;
  std::vector<i64> off;
};
Scratch& thread_scratch() {
  static thread_local Scratch s;
  return s;
}

// Whether the micro-kernel reads B where it is (row k at B + k * b_rs) instead of a copy:
// rows contiguous, every vector it reads inside the operand (the last tile reads up to a
// whole vector: N % VL == 0), and at most 128 rows of C, where copying B (K x N floats
// written and read back) costs as much as the product (linear's input gradient g @ W: 64
// rows of C, W 128 x 9216). With more rows the padded copy pays: its row pitch keeps B's
// rows off the same L1 sets.
bool b_in_place(const MatmulArgs& p) { return p.b_cs == 1 && p.N % VL == 0 && p.M <= 128; }

// Packs batch b's operands into s; returns where the micro-kernel reads B (s.off[k]: row k).
const float* pack(const MatmulArgs& p, const float* A, const float* B, i64 b, Scratch& s,
                  bool parallel) {
  const int M = p.M, N = p.N, K = p.K;
  const float* a = A + batch_offset(p, b, p.a_bs);
  const float* bb = B + batch_offset(p, b, p.b_bs);
  const bool in_place = b_in_place(p);
  // Row pitch of the copy: a multiple of NR, but not of 128 floats (rows a power of two
  // apart map onto the same L1 sets, and the micro-kernel walks B down its rows).
  i64 ldb = round_up(N, NR);
  if (ldb % 128 == 0) ldb += NR;
  const int strips = int(ceil_div(M, MR));
  if (i64(s.ap.size()) < packed_size(M, K)) s.ap.resize(std::size_t(packed_size(M, K)));
  if (!in_place && i64(s.bp.size()) < ldb * K + NR) s.bp.resize(std::size_t(ldb * K + NR));
  if (i64(s.off.size()) < K) s.off.resize(std::size_t(K));
  for (int k = 0; k < K; ++k) s.off[k] = in_place ? k * i64(p.b_rs) : k * ldb;
  float* ap = s.ap.data();
  float* bp = s.bp.data();
  auto pack_strip = [&](i64 st) {
    const int m0 = int(st) * MR, rows = std::min(MR, M - m0);
    pack_a(rows, K, [&](int m, int k) { return a[i64(m0 + m) * p.a_rs + i64(k) * p.a_cs]; },
           ap + st * i64(K) * MR);
  };
  auto copy_row = [&](i64 k) {
    float* dst = bp + k * ldb;
    const float* src = bb + k * p.b_rs;
    if (p.b_cs == 1) {
      std::memcpy(dst, src, sizeof(float) * N);
    } else {
      for (int n = 0; n < N; ++n) dst[n] = src[i64(n) * p.b_cs];
    }
    std::fill(dst + N, dst + ldb, 0.f);
  };
  // A transposed B (B^T contiguous: linear's weight.T) is copied in blocks of kTransK rows,
  // reading each column's run contiguously while the block's destination rows stay cached.
  constexpr i64 kTransK = 64;
  const bool transposed = p.b_rs == 1 && p.b_cs != 1;
  auto copy_block = [&](i64 blk) {
    const i64 k0 = blk * kTransK, k1 = std::min<i64>(K, k0 + kTransK);
    for (int n = 0; n < N; ++n) {
      const float* src = bb + i64(n) * p.b_cs;
      for (i64 k = k0; k < k1; ++k) bp[k * ldb + n] = src[k];
    }
    for (i64 k = k0; k < k1; ++k) std::fill(bp + k * ldb + N, bp + (k + 1) * ldb, 0.f);
  };
  const i64 copies = in_place ? 0 : transposed ? ceil_div(K, kTransK) : K;
  auto copy = [&](i64 i) { transposed ? copy_block(i) : copy_row(i); };
  if (parallel) {
    auto& pool = ThreadPool::instance();
    pool.parallel_for(strips, pack_strip);
    pool.parallel_for(copies, copy);
  } else {
    for (i64 st = 0; st < strips; ++st) pack_strip(st);
    for (i64 i = 0; i < copies; ++i) copy(i);
  }
  return in_place ? bb : bp;
}

// How C is cut into tiles (rows x cols) for the threads. Results do not depend on it (only
// the K blocks of gemm_block shape the sums, and they depend on K alone).
struct Tiling {
  int rows;
  i64 cols;
  i64 row_blocks, col_panels;
  i64 count() const { return row_blocks * col_panels; }
};
Tiling tiling(const MatmulArgs& p, int threads) {
  Tiling t{kRowBlock, kColPanel, 0, 0};
  auto recount = [&] {
    t.row_blocks = ceil_div(p.M, t.rows);
    t.col_panels = ceil_div(p.N, t.cols);
  };
  recount();
  // A product of few tiles (linear at a small batch: 64 x 128) is still cut for every
  // thread: narrower panels first (each still 2 NR tiles wide), then fewer rows.
  const i64 want = threads > 1 && p.batch < 2 * i64(threads) ? 2 * i64(threads) : 1;
  while (t.count() < want && t.cols > 2 * NR) {
    t.cols = round_up(t.cols / 2, NR);
    recount();
  }
  while (t.count() < want && t.rows > 2 * MR) {
    t.rows = int(round_up(t.rows / 2, MR));
    recount();
  }
  return t;
}

void tile(const MatmulArgs& p, const Tiling& tl, const Scratch& s, const float* bsrc, float* c,
          i64 t) {
  const int m0 = int(t / tl.col_panels) * tl.rows;
  const i64 n0 = (t % tl.col_panels) * tl.cols;
  const int rows = std::min(tl.rows, p.M - m0);
  const i64 cols = std::min<i64>(tl.cols, p.N - n0);
  // A long K: keep each K block of the tile's A strips cached while B streams past
  // (gemm_block's k_outer), rather than streaming all of A from memory once per NR tile.
  const bool k_outer = i64(rows) * p.K * i64(sizeof(float)) > (i64(256) << 10);
  gemm_block(rows, p.K, s.ap.data() + i64(m0) * p.K, s.off.data(), bsrc + n0, cols,
             c + i64(m0) * p.N + n0, p.N, nullptr, /*spill=*/false, /*accumulate=*/false, k_outer);
}
// Both operands contiguous along k (A row-major, B the transpose of a row-major matrix:
// linear's x @ W^T) and few rows: C[m][n] = A_m . B_n as dot products of rows (the engine's
// dot_acc), which needs no copy of B, where the GEMM path first copies W^T into a row-major
// panel (4.7 MB for MNIST's 128 x 9216 weight, as much memory traffic as the product's
// arithmetic takes time on two cores). Threads take column panels; each walks K in chunks
// of LC so that its panel's chunk of B (ncols x LC) stays in L2 while every group of DMA
// rows of A passes. Each element's sum runs over k in the same order whatever the panels,
// so results do not depend on the thread count.
bool dot_path(const MatmulArgs& p) {
  return p.a_cs == 1 && p.b_rs == 1 && p.b_cs != 1 && p.K >= 128 && p.M <= 512;
}

void matmul_dot(const MatmulArgs& p, const float* A, const float* B, float* C) {
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
      }
    });
  }
}
}  // namespace

void matmul_gemm(const MatmulArgs& p, const float* A, const float* B, float* C) {
  const i64 MN = i64(p.M) * p.N;
  if (MN == 0 || p.batch == 0) return;
  if (p.K == 0) {
    std::fill(C, C + MN * p.batch, 0.f);
    return;
  }
  if (dot_path(p)) return matmul_dot(p, A, B, C);
  auto& pool = ThreadPool::instance();
  const Tiling tl = tiling(p, pool.num_threads());
  const i64 tiles = tl.count();
  if (p.batch >= 2 * pool.num_threads() || tiles == 1) {
    // Many small products: one batch per task, all on that thread.
    pool.parallel_for(p.batch, [&](i64 b) {
      Scratch& s = thread_scratch();
      const float* bsrc = pack(p, A, B, b, s, false);
      for (i64 t = 0; t < tiles; ++t) tile(p, tl, s, bsrc, C + b * MN, t);
    });
    return;
  }
  Scratch shared;
  for (i64 b = 0; b < p.batch; ++b) {
    const float* bsrc = pack(p, A, B, b, shared, true);
    pool.parallel_for(tiles, [&](i64 t) { tile(p, tl, shared, bsrc, C + b * MN, t); });
  }
}

}  // namespace fm::cpu::FM_CPU_ISA
