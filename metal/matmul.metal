// Batched matrix product C[b] = A[b] @ B[b] (matmul_args.h): a register-blocked, double-
// buffered tiled GEMM, float32 loads and float32 FMA accumulation (no reduced-precision
// matrix units: the result is what a float32 dot product in k order gives).
//
// One threadgroup computes a BM x BN tile of C, stepping through its k range in BK-deep
// slices staged in threadgroup memory as float4 rows (As[k][m], Bs[k][n]; one float4 of
// padding per row keeps the transposing stores free of bank conflicts). V = (BM/TM) *
// (BN/TN) virtual threads each accumulate TM x TN outputs in registers: rows (i4 * BM/TM +
// tr) * 4 + {0..3} for i4 < TM/4, columns likewise, so one k step costs TM/4 + TN/4
// 16-byte threadgroup reads for TM * TN FMAs (8x8: 4 reads, 64 FMAs).
//
// Two ways through k, the same FMAs in the same order (results identical):
//  * T == V threads (what the host asks for): double buffered. While the FMAs of slice s
//    run on one pair of buffers, the global loads of slice s+1 are in flight into
//    registers; they go to the other pair afterwards: one barrier per slice.
//  * any other threadgroup size T: passes of the V virtual threads, the slices loaded with
//    a stride of T, scalar loads. Correct for every T (the tests run 1, 37, 300, ...).
// Barriers sit in loops whose trip counts are uniform across the threadgroup.
//
// Operand loads (AV, BV; matmul_args.h): FM_MM_QUAD_K / FM_MM_QUAD_MN read 16-byte quads
// along the operand's contiguous axis (the host asks for them only where that axis has
// stride 1, the other stride and the start are multiples of 4 floats and the contiguous
// length is a multiple of 4, so a quad is wholly inside or outside the operand);
// FM_MM_SCALAR reads any strides, walking whichever index is contiguous fastest.
//
// Tile shapes (docs/gpu_kernels.md; csrc/ops/matmul.cpp picks one):
//  * Apple GPUs: 64x64 (BK 16, 4x8 per thread, 128 threads) and 32x64 for few rows, MLX's
//    matmul family: an Apple GPU core has a smaller register file per thread than an NVIDIA
//    SM, and 32 accumulators per thread over 128 threads is what MLX's steel GEMM holds
//    (16 8x8 simdgroup_matrix fragments per SIMD group). Two buffers of 64x16 + 64x16
//    floats (18.7 KB) leave room for a second threadgroup within Apple's 32 KiB. The
//    simdgroup_matrix form (simdgroup_multiply_accumulate on 8x8 fragments loaded from
//    these same threadgroup tiles) is what Apple wants for peak; it is not used because
//    fastmetal's portable subset has no exact CPU emulation or CUDA mapping of it yet, and
//    no Mac runs here to measure the gain: the scalar-FMA tile is the portable baseline.
//  * discrete GPUs (CUDA): 128x128 (BK 16, 8x8, 256 threads), the classic SIMT SGEMM shape
//    (64 accumulators per thread, compiled with at most 128 registers, cmake/cuda.cmake, so
//    two 256-thread groups fit one multiprocessor), with PREFETCH: the next k step's
//    fragments are read from threadgroup memory while the current step's FMAs run. Its two
//    padded buffer pairs take 33 KB, over Apple's 32 KiB, so it is instantiated for CUDA
//    (and the CPU's tests) only (FM_INSTANTIATE_DISCRETE). 32x64 serves short or narrow
//    products (the most groups); 64x128 (128 threads) is built for the tuning hook.
//
// Grid (threadgroups): x = column tiles, y = row tiles, z = splits * batch.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "matmul_args.h"
#include "split_sum.h"
using namespace metal;

// p[i] where `in`, else 0, as a predicated load: the zero is in the register before the
// load issues, so nothing waits for the value until it is stored after the slice's FMAs
// (docs/gpu_kernels.md: a select after the load made ptxas wait right there).
FM_FUNC float mm_load(device const float* p, bool in, int32_t i) {
  float v = 0.0f;
  if (in) v = p[i];
  return v;
}

// p[i..i+3] as one 16-byte load where `in`, else zeros.
FM_FUNC float4 mm_load4(device const float* p, bool in, int32_t i) {
  float4 v = float4(0.0f);
  if (in) v = *((device const float4*)(p + i));
  return v;
}

// Coordinates of element e of a slice tile of ROWS rows (A's rows / B's columns) and depth
// BK: row-major along k (k_fast) or along the rows, whichever reads memory contiguously.
template <int ROWS, int BK>
FM_FUNC void mm_coords(bool k_fast, int32_t e, thread int32_t& r, thread int32_t& kk) {
  if (k_fast) {
    r = e / BK;
    kk = e - r * BK;
  } else {
    kk = e / ROWS;
    r = e - kk * ROWS;
  }
}

template <int BM, int BN, int BK, int TM, int TN, int AV, int BV, bool PREFETCH>
kernel void matmul_gemm(device const float* A [[buffer(0)]],
                        device const float* B [[buffer(1)]],
                        device float* C [[buffer(2)]],
                        constant MatmulArgs& p [[buffer(3)]],
                        uint3 tg_pos [[threadgroup_position_in_grid]],
                        uint32_t tid [[thread_index_in_threadgroup]],
                        uint3 tg_size [[threads_per_threadgroup]]) {
  constexpr int MT = BM / TM, NT = BN / TN;  // virtual threads along rows / columns
  constexpr int V = MT * NT;
  constexpr int AW = BM / 4 + 1, BW = BN / 4 + 1;  // float4 per staged row
  constexpr int LA = BM * BK / V, LB = BN * BK / V;  // tile elements per virtual thread
  constexpr int QA = AV == FM_MM_SCALAR ? 1 : LA / 4, QB = BV == FM_MM_SCALAR ? 1 : LB / 4;
  constexpr int SA = AV == FM_MM_SCALAR ? LA : 1, SB = BV == FM_MM_SCALAR ? LB : 1;
  static_assert(TM % 4 == 0 && TN % 4 == 0 && BM % TM == 0 && BN % TN == 0, "tile shape");
  static_assert(LA * V == BM * BK && LB * V == BN * BK && BK % 4 == 0, "loads divide evenly");
  static_assert((AV == FM_MM_SCALAR || LA % 4 == 0) && (BV == FM_MM_SCALAR || LB % 4 == 0),
                "quads divide evenly");
  // Quad coordinates that are the same for every load of a thread (see below) need these.
  static_assert(V % (BK / 4) == 0 && V % (BM / 4) == 0 && V % (BN / 4) == 0, "quad runs");

  // 2 buffers of BK rows of AW (BW) float4 (sizes spelled in template parameters: the MSL
  // gate checks them per instance).
  threadgroup float4 As[2 * BK * BM / 4 + 2 * BK];
  threadgroup float4 Bs[2 * BK * BN / 4 + 2 * BK];

  const int32_t M = p.M, N = p.N, K = p.K, batch = p.batch;
  const int32_t a_rs = p.a_rs, a_cs = p.a_cs, b_rs = p.b_rs, b_cs = p.b_cs;
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const int32_t row0 = int32_t(tg_pos.y) * BM, col0 = int32_t(tg_pos.x) * BN;
  const int32_t split = int32_t(tg_pos.z) / batch;
  int32_t bidx = int32_t(tg_pos.z) - split * batch, a_off0 = 0, b_off0 = 0;
  for (int32_t d = p.batch_dims - 1; d >= 0; --d) {
    const int32_t i = bidx % p.batch_shape[d];
    bidx /= p.batch_shape[d];
    a_off0 += i * p.a_bs[d];
    b_off0 += i * p.b_bs[d];
  }
  device const float* a = A + a_off0;
  device const float* bm = B + b_off0;
  device float* c = C + int32_t(tg_pos.z) * M * N;
  const int32_t k_begin = split * p.k_chunk;
  const int32_t k_end = min(K, k_begin + p.k_chunk);
  // Scalar loads walk the operand's contiguous index fastest.
  const bool a_k_fast = a_cs == 1 || a_rs != 1;
  const bool b_k_fast = b_rs == 1 && b_cs != 1;

  float acc[TM * TN];
  if (T == uint32_t(V)) {
    // ---- fast path: one virtual thread per thread, double buffered
    const int32_t tr = int32_t(tid) / NT, tc = int32_t(tid) - tr * NT;
    for (int i = 0; i < TM * TN; ++i) acc[i] = 0.0f;
    // This thread's loads of a slice: load j is tile element (or quad) tid + j * V. For
    // quads, V is a multiple of the quads per tile row, so one coordinate is the same for
    // every j and is kept once (fewer registers: the loop fits 128 without spilling).
    // a_off / b_off: the row (column) part of the address, -1 where outside the operand.
    int32_t a_r[QA > SA ? QA : SA], a_off[QA > SA ? QA : SA], a_kk[SA];
    int32_t b_r[QB > SB ? QB : SB], b_off[QB > SB ? QB : SB], b_kk[SB];
    int32_t a_kq = 0, b_kq = 0;  // the quads' common k (QUAD_K) or row (QUAD_MN) offset
    if (AV == FM_MM_QUAD_K) {  // quad j: row a_r[j], k a_kq..a_kq+3
      a_kq = (int32_t(tid) % (BK / 4)) * 4;
      for (int j = 0; j < QA; ++j) {
        a_r[j] = int32_t(tid) / (BK / 4) + j * (V / (BK / 4));
        a_off[j] = row0 + a_r[j] < M ? (row0 + a_r[j]) * a_rs : -1;
      }
    } else if (AV == FM_MM_QUAD_MN) {  // quad j: rows a_kq..a_kq+3, k a_r[j]
      a_kq = (int32_t(tid) % (BM / 4)) * 4;
      for (int j = 0; j < QA; ++j) a_r[j] = int32_t(tid) / (BM / 4) + j * (V / (BM / 4));
      a_off[0] = row0 + a_kq < M ? row0 + a_kq : -1;
    } else {
      for (int j = 0; j < SA; ++j) {
        mm_coords<BM, BK>(a_k_fast, int32_t(tid) + j * V, a_r[j], a_kk[j]);
        a_off[j] = row0 + a_r[j] < M ? (row0 + a_r[j]) * a_rs : -1;
      }
    }
    if (BV == FM_MM_QUAD_K) {  // quad j: column b_r[j], k b_kq..b_kq+3
      b_kq = (int32_t(tid) % (BK / 4)) * 4;
      for (int j = 0; j < QB; ++j) {
        b_r[j] = int32_t(tid) / (BK / 4) + j * (V / (BK / 4));
        b_off[j] = col0 + b_r[j] < N ? (col0 + b_r[j]) * b_cs : -1;
      }
    } else if (BV == FM_MM_QUAD_MN) {  // quad j: columns b_kq..b_kq+3, k b_r[j]
      b_kq = (int32_t(tid) % (BN / 4)) * 4;
      for (int j = 0; j < QB; ++j) b_r[j] = int32_t(tid) / (BN / 4) + j * (V / (BN / 4));
      b_off[0] = col0 + b_kq < N ? col0 + b_kq : -1;
    } else {
      for (int j = 0; j < SB; ++j) {
        mm_coords<BN, BK>(b_k_fast, int32_t(tid) + j * V, b_r[j], b_kk[j]);
        b_off[j] = col0 + b_r[j] < N ? (col0 + b_r[j]) * b_cs : -1;
      }
    }
    float ra[SA], rb[SB];
    float4 qa[QA], qb[QB];

    // Slice k0 into registers.
#define FM_MM_LOAD_SLICE(k0)                                                                 \
    if (AV == FM_MM_QUAD_K) {                                                                \
      for (int j = 0; j < QA; ++j)                                                           \
        qa[j] = mm_load4(a, a_off[j] >= 0 && (k0) + a_kq < k_end, a_off[j] + (k0) + a_kq);   \
    } else if (AV == FM_MM_QUAD_MN) {                                                        \
      for (int j = 0; j < QA; ++j)                                                           \
        qa[j] = mm_load4(a, a_off[0] >= 0 && (k0) + a_r[j] < k_end,                          \
                         a_off[0] + ((k0) + a_r[j]) * a_cs);                                 \
    } else {                                                                                 \
      for (int j = 0; j < SA; ++j)                                                           \
        ra[j] = mm_load(a, a_off[j] >= 0 && (k0) + a_kk[j] < k_end,                          \
                        a_off[j] + ((k0) + a_kk[j]) * a_cs);                                 \
    }                                                                                        \
    if (BV == FM_MM_QUAD_K) {                                                                \
      for (int j = 0; j < QB; ++j)                                                           \
        qb[j] = mm_load4(bm, b_off[j] >= 0 && (k0) + b_kq < k_end, b_off[j] + (k0) + b_kq);  \
    } else if (BV == FM_MM_QUAD_MN) {                                                        \
      for (int j = 0; j < QB; ++j)                                                           \
        qb[j] = mm_load4(bm, b_off[0] >= 0 && (k0) + b_r[j] < k_end,                         \
                         b_off[0] + ((k0) + b_r[j]) * b_rs);                                 \
    } else {                                                                                 \
      for (int j = 0; j < SB; ++j)                                                           \
        rb[j] = mm_load(bm, b_off[j] >= 0 && (k0) + b_kk[j] < k_end,                         \
                        b_off[j] + ((k0) + b_kk[j]) * b_rs);                                 \
    }
    // The registers into buffer `half` (quads along k are transposed by four stores).
#define FM_MM_STORE_SLICE(half)                                                              \
    if (AV == FM_MM_QUAD_K) {                                                                \
      for (int j = 0; j < QA; ++j)                                                           \
        for (int i = 0; i < 4; ++i)                                                          \
          As[((half) * BK + a_kq + i) * AW + (a_r[j] >> 2)][a_r[j] & 3] = qa[j][i];          \
    } else if (AV == FM_MM_QUAD_MN) {                                                        \
      for (int j = 0; j < QA; ++j) As[((half) * BK + a_r[j]) * AW + (a_kq >> 2)] = qa[j];    \
    } else {                                                                                 \
      for (int j = 0; j < SA; ++j)                                                           \
        As[((half) * BK + a_kk[j]) * AW + (a_r[j] >> 2)][a_r[j] & 3] = ra[j];                \
    }                                                                                        \
    if (BV == FM_MM_QUAD_K) {                                                                \
      for (int j = 0; j < QB; ++j)                                                           \
        for (int i = 0; i < 4; ++i)                                                          \
          Bs[((half) * BK + b_kq + i) * BW + (b_r[j] >> 2)][b_r[j] & 3] = qb[j][i];          \
    } else if (BV == FM_MM_QUAD_MN) {                                                        \
      for (int j = 0; j < QB; ++j) Bs[((half) * BK + b_r[j]) * BW + (b_kq >> 2)] = qb[j];    \
    } else {                                                                                 \
      for (int j = 0; j < SB; ++j)                                                           \
        Bs[((half) * BK + b_kk[j]) * BW + (b_r[j] >> 2)][b_r[j] & 3] = rb[j];                \
    }
    int32_t k0 = k_begin;
    FM_MM_LOAD_SLICE(k0)
    FM_MM_STORE_SLICE(0)
    threadgroup_barrier(mem_flags::mem_threadgroup);
    int32_t cur = 0;
    for (; k0 < k_end; k0 += BK) {
      const bool more = k0 + BK < k_end;
      const int32_t nk = k0 + BK;
      if (more) {
        FM_MM_LOAD_SLICE(nk)
      }
      // acc += A[k][rows] * B[k][columns], slice `cur`.
      if (PREFETCH) {
        const int32_t ao = cur * BK * AW + tr, bo = cur * BK * BW + tc;
        // The fragments of step kk + 1 are read from threadgroup memory while step kk's FMAs
        // run (two sets in registers, the slice unrolled), so no FMA waits on a read. Pays
        // from BK 16 with 8x8 a thread: on an H100, 4096^2 39.2 -> 42.3 TFLOP/s; at BK 8 it
        // lost (36.4 against 38.6), as did plain unrolling without it (BENCHMARKS.md).
        float4 av[2][TM / 4], bv[2][TN / 4];
        for (int i = 0; i < TM / 4; ++i) av[0][i] = As[ao + i * MT];
        for (int j = 0; j < TN / 4; ++j) bv[0][j] = Bs[bo + j * NT];
        FM_UNROLL
        for (int kk = 0; kk < BK; ++kk) {
          if (kk + 1 < BK) {
            for (int i = 0; i < TM / 4; ++i) av[(kk + 1) & 1][i] = As[ao + (kk + 1) * AW + i * MT];
            for (int j = 0; j < TN / 4; ++j) bv[(kk + 1) & 1][j] = Bs[bo + (kk + 1) * BW + j * NT];
          }
          for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j)
              acc[i * TN + j] = fma(av[kk & 1][i / 4][i % 4], bv[kk & 1][j / 4][j % 4], acc[i * TN + j]);
        }
      } else {
        // Left to nvcc, which unrolls two of the BK steps: unrolling all eight of the 128x128
        // tile at BK 8 (#pragma unroll) measured 4% slower on an H100 (BENCHMARKS.md).
        for (int kk = 0; kk < BK; ++kk) {
          float4 av[TM / 4], bv[TN / 4];
          for (int i = 0; i < TM / 4; ++i) av[i] = As[(cur * BK + kk) * AW + i * MT + tr];
          for (int j = 0; j < TN / 4; ++j) bv[j] = Bs[(cur * BK + kk) * BW + j * NT + tc];
          for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j)
              acc[i * TN + j] = fma(av[i / 4][i % 4], bv[j / 4][j % 4], acc[i * TN + j]);
        }
      }
      if (more) {
        FM_MM_STORE_SLICE(1 - cur)
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      cur = 1 - cur;
    }
#undef FM_MM_LOAD_SLICE
#undef FM_MM_STORE_SLICE
    // ---- epilogue: each run of four columns as one 16-byte store where C allows it
    for (int i = 0; i < TM; ++i) {
      const int32_t gm = row0 + ((i / 4) * MT + tr) * 4 + i % 4;
      if (gm >= M) continue;
      device float* crow = c + gm * N;
      for (int j4 = 0; j4 < TN / 4; ++j4) {
        const int32_t gn = col0 + (j4 * NT + tc) * 4;
        const int32_t base = i * TN + j4 * 4;
        if (p.c_quads != 0 && gn < N) {
          *((device float4*)(crow + gn)) =
              float4(acc[base], acc[base + 1], acc[base + 2], acc[base + 3]);
        } else {
          for (int jj = 0; jj < 4; ++jj)
            if (gn + jj < N) crow[gn + jj] = acc[base + jj];
        }
      }
    }
  } else {
    // ---- any threadgroup size: passes of virtual threads, the slices loaded with stride T
    for (uint32_t pass = 0; pass < uint32_t(V); pass += T) {
      const uint32_t v = pass + tid;
      const bool active = v < uint32_t(V);
      const int32_t tr = int32_t(v) / NT, tc = int32_t(v) - tr * NT;
      for (int i = 0; i < TM * TN; ++i) acc[i] = 0.0f;
      for (int32_t k0 = k_begin; k0 < k_end; k0 += BK) {
        for (uint32_t e = tid; e < uint32_t(BM * BK); e += T) {
          int32_t m, kk;
          mm_coords<BM, BK>(a_k_fast, int32_t(e), m, kk);
          const int32_t gm = row0 + m, gk = k0 + kk;
          As[kk * AW + (m >> 2)][m & 3] = mm_load(a, gm < M && gk < k_end, gm * a_rs + gk * a_cs);
        }
        for (uint32_t e = tid; e < uint32_t(BN * BK); e += T) {
          int32_t n, kk;
          mm_coords<BN, BK>(b_k_fast, int32_t(e), n, kk);
          const int32_t gn = col0 + n, gk = k0 + kk;
          Bs[kk * BW + (n >> 2)][n & 3] = mm_load(bm, gn < N && gk < k_end, gk * b_rs + gn * b_cs);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (active) {
          for (int kk = 0; kk < BK; ++kk) {  // as in the fast path
            float4 av[TM / 4], bv[TN / 4];
            for (int i = 0; i < TM / 4; ++i) av[i] = As[kk * AW + i * MT + tr];
            for (int j = 0; j < TN / 4; ++j) bv[j] = Bs[kk * BW + j * NT + tc];
            for (int i = 0; i < TM; ++i)
              for (int j = 0; j < TN; ++j)
                acc[i * TN + j] = fma(av[i / 4][i % 4], bv[j / 4][j % 4], acc[i * TN + j]);
          }
        }
        // Nobody overwrites the slices until everyone has used them.
        threadgroup_barrier(mem_flags::mem_threadgroup);
      }
      if (active) {
        for (int i = 0; i < TM; ++i) {
          const int32_t gm = row0 + ((i / 4) * MT + tr) * 4 + i % 4;
          if (gm >= M) continue;
          for (int j = 0; j < TN; ++j) {
            const int32_t gn = col0 + ((j / 4) * NT + tc) * 4 + j % 4;
            if (gn < N) c[gm * N + gn] = acc[i * TN + j];
          }
        }
      }
    }
  }
}

// C = the sum of the split-K slabs of the workspace, in split order (deterministic: no
// atomics). Thread i adds element i of every slab; n = batch * M * N.
kernel void matmul_sum_splits(device const float* ws [[buffer(0)]],
                              device float* C [[buffer(1)]],
                              constant MatmulArgs& p [[buffer(2)]],
                              uint32_t gid [[thread_position_in_grid]]) {
  const int32_t n = p.batch * p.M * p.N;
  if (int32_t(gid) < n) C[gid] = sum_slices(ws, uint32_t(n), uint32_t(p.splits), gid);
}

// float64 (FM_INSTANTIATE_DISCRETE: the CPU and CUDA; Apple GPUs have no double): a plain
// tiled GEMM in T. One threadgroup computes a BM x BN tile of C (grid as matmul_gemm's, no
// K split: z = batch), stepping through k in BK-deep slices of A and B staged in
// threadgroup memory (scalar loads through any strides, along whichever index of the
// operand is contiguous; zeros outside it); V = (BM/TM)(BN/TN) virtual threads each
// accumulate TM x TN outputs, rows i * BM/TM + tr and columns j * BN/TN + tc (consecutive
// threads: consecutive columns), with FMAs in k order. Any threadgroup size: the virtual
// threads run in passes of T (one pass when T == V, what the host asks for); every barrier
// sits in loops whose trip counts are uniform across the threadgroup.
template <typename T, int BM, int BN, int BK, int TM, int TN>
kernel void matmul_tiled(device const T* A [[buffer(0)]],
                         device const T* B [[buffer(1)]],
                         device T* C [[buffer(2)]],
                         constant MatmulArgs& p [[buffer(3)]],
                         uint3 tg_pos [[threadgroup_position_in_grid]],
                         uint32_t tid [[thread_index_in_threadgroup]],
                         uint3 tg_size [[threads_per_threadgroup]]) {
  constexpr int MT = BM / TM, NT = BN / TN;
  constexpr int V = MT * NT;
  static_assert(BM % TM == 0 && BN % TN == 0, "tile shape");
  threadgroup T As[BK * BM];  // As[k * BM + m]
  threadgroup T Bs[BK * BN];  // Bs[k * BN + n]
  const int32_t M = p.M, N = p.N, K = p.K;
  const int32_t a_rs = p.a_rs, a_cs = p.a_cs, b_rs = p.b_rs, b_cs = p.b_cs;
  const uint32_t n_threads = tg_size.x * tg_size.y * tg_size.z;
  const int32_t row0 = int32_t(tg_pos.y) * BM, col0 = int32_t(tg_pos.x) * BN;
  int32_t bidx = int32_t(tg_pos.z), a_off0 = 0, b_off0 = 0;
  for (int32_t d = p.batch_dims - 1; d >= 0; --d) {
    const int32_t i = bidx % p.batch_shape[d];
    bidx /= p.batch_shape[d];
    a_off0 += i * p.a_bs[d];
    b_off0 += i * p.b_bs[d];
  }
  device const T* a = A + a_off0;
  device const T* bm = B + b_off0;
  device T* c = C + int32_t(tg_pos.z) * M * N;
  const bool a_k_fast = a_cs == 1 && a_rs != 1;  // A row-major: walk k fastest
  const bool b_k_fast = b_rs == 1 && b_cs != 1;  // B column-major: likewise
  for (uint32_t v0 = 0; v0 < uint32_t(V); v0 += n_threads) {
    const int32_t v = int32_t(v0 + tid);
    const bool live = v < V;
    const int32_t tr = live ? v / NT : 0;
    const int32_t tc = live ? v - tr * NT : 0;
    T acc[TM * TN];
    for (int i = 0; i < TM * TN; ++i) acc[i] = T(0);
    for (int32_t k0 = 0; k0 < K; k0 += BK) {
      threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous slice is consumed
      for (uint32_t e = tid; e < uint32_t(BM * BK); e += n_threads) {
        const int32_t q = int32_t(e);
        const int32_t kk = a_k_fast ? q % BK : q / BM;
        const int32_t m = a_k_fast ? q / BK : q % BM;
        const int32_t gm = row0 + m, gk = k0 + kk;
        As[kk * BM + m] = gm < M && gk < K ? a[gm * a_rs + gk * a_cs] : T(0);
      }
      for (uint32_t e = tid; e < uint32_t(BN * BK); e += n_threads) {
        const int32_t q = int32_t(e);
        const int32_t kk = b_k_fast ? q % BK : q / BN;
        const int32_t n = b_k_fast ? q / BK : q % BN;
        const int32_t gn = col0 + n, gk = k0 + kk;
        Bs[kk * BN + n] = gn < N && gk < K ? bm[gk * b_rs + gn * b_cs] : T(0);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (live) {
        // Past K the slice holds zeros on both sides: fma(0, 0, acc) = acc.
        for (int kk = 0; kk < BK; ++kk) {
          T av[TM], bv[TN];
          for (int i = 0; i < TM; ++i) av[i] = As[kk * BM + i * MT + tr];
          for (int j = 0; j < TN; ++j) bv[j] = Bs[kk * BN + j * NT + tc];
          for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j) acc[i * TN + j] = fma(av[i], bv[j], acc[i * TN + j]);
        }
      }
    }
    if (live) {
      for (int i = 0; i < TM; ++i) {
        const int32_t gm = row0 + i * MT + tr;
        for (int j = 0; j < TN; ++j) {
          const int32_t gn = col0 + j * NT + tc;
          if (gm < M && gn < N) c[gm * N + gn] = acc[i * TN + j];
        }
      }
    }
  }
}

FM_INSTANTIATE_DISCRETE("matmul_float64", matmul_tiled, double, 64, 64, 16, 4, 4);

// Every tile with scalar loads and with the four quad layouts: suffix _<A><B>, k = quads
// along k (A row-major, B column-major), m / n = quads along A's rows / B's columns. The host
// takes scalar loads for both operands when either cannot take quads.
FM_INSTANTIATE_DISCRETE("matmul_128x128", matmul_gemm, 128, 128, 16, 8, 8, FM_MM_SCALAR, FM_MM_SCALAR, true);
FM_INSTANTIATE_DISCRETE("matmul_128x128_kn", matmul_gemm, 128, 128, 16, 8, 8, FM_MM_QUAD_K, FM_MM_QUAD_MN, true);
FM_INSTANTIATE_DISCRETE("matmul_128x128_kk", matmul_gemm, 128, 128, 16, 8, 8, FM_MM_QUAD_K, FM_MM_QUAD_K, true);
FM_INSTANTIATE_DISCRETE("matmul_128x128_mn", matmul_gemm, 128, 128, 16, 8, 8, FM_MM_QUAD_MN, FM_MM_QUAD_MN, true);
FM_INSTANTIATE_DISCRETE("matmul_128x128_mk", matmul_gemm, 128, 128, 16, 8, 8, FM_MM_QUAD_MN, FM_MM_QUAD_K, true);
FM_INSTANTIATE("matmul_64x128", matmul_gemm, 64, 128, 8, 8, 8, FM_MM_SCALAR, FM_MM_SCALAR, false);
FM_INSTANTIATE("matmul_64x128_kn", matmul_gemm, 64, 128, 8, 8, 8, FM_MM_QUAD_K, FM_MM_QUAD_MN, false);
FM_INSTANTIATE("matmul_64x128_kk", matmul_gemm, 64, 128, 8, 8, 8, FM_MM_QUAD_K, FM_MM_QUAD_K, false);
FM_INSTANTIATE("matmul_64x128_mn", matmul_gemm, 64, 128, 8, 8, 8, FM_MM_QUAD_MN, FM_MM_QUAD_MN, false);
FM_INSTANTIATE("matmul_64x128_mk", matmul_gemm, 64, 128, 8, 8, 8, FM_MM_QUAD_MN, FM_MM_QUAD_K, false);
FM_INSTANTIATE("matmul_64x64", matmul_gemm, 64, 64, 16, 4, 8, FM_MM_SCALAR, FM_MM_SCALAR, false);
FM_INSTANTIATE("matmul_64x64_kn", matmul_gemm, 64, 64, 16, 4, 8, FM_MM_QUAD_K, FM_MM_QUAD_MN, false);
FM_INSTANTIATE("matmul_64x64_kk", matmul_gemm, 64, 64, 16, 4, 8, FM_MM_QUAD_K, FM_MM_QUAD_K, false);
FM_INSTANTIATE("matmul_64x64_mn", matmul_gemm, 64, 64, 16, 4, 8, FM_MM_QUAD_MN, FM_MM_QUAD_MN, false);
FM_INSTANTIATE("matmul_64x64_mk", matmul_gemm, 64, 64, 16, 4, 8, FM_MM_QUAD_MN, FM_MM_QUAD_K, false);
FM_INSTANTIATE("matmul_32x64", matmul_gemm, 32, 64, 16, 4, 4, FM_MM_SCALAR, FM_MM_SCALAR, false);
FM_INSTANTIATE("matmul_32x64_kn", matmul_gemm, 32, 64, 16, 4, 4, FM_MM_QUAD_K, FM_MM_QUAD_MN, false);
FM_INSTANTIATE("matmul_32x64_kk", matmul_gemm, 32, 64, 16, 4, 4, FM_MM_QUAD_K, FM_MM_QUAD_K, false);
FM_INSTANTIATE("matmul_32x64_mn", matmul_gemm, 32, 64, 16, 4, 4, FM_MM_QUAD_MN, FM_MM_QUAD_MN, false);
FM_INSTANTIATE("matmul_32x64_mk", matmul_gemm, 32, 64, 16, 4, 4, FM_MM_QUAD_MN, FM_MM_QUAD_K, false);
