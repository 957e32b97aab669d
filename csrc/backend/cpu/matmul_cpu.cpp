// The cpu backend's matrix product (native op "matmul", asked for by ops/matmul.cpp): a
// blocked GEMM with packed operands (the conv2d engine's register blocking) on strided,
// batched operands, dispatched to the per-ISA copies in isa/matmul_gemm.cpp; float64 by the
// double GEMM below.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/array.h"
#include "isa_dispatch.h"
#include "matmul_args.h"
#include "native_ops.h"
#include "thread_pool.h"

namespace fm::cpu {

FM_CPU_DECLARE(void matmul_gemm(const MatmulArgs& p, const float* A, const float* B, float* C,
                                const float* bias))
FM_CPU_DECLARE(std::int64_t matmul_packed_size(const MatmulArgs& p))
FM_CPU_DECLARE(void matmul_pack_b(const MatmulArgs& p, const float* B, float* packed))
FM_CPU_DECLARE(void matmul_packed(const MatmulArgs& p, const float* A, const float* packed,
                                  float* C))

namespace {
using i64 = std::int64_t;

// C[b] = A[b] @ B[b] in double, C contiguous (batch, M, N), A and B through p's strides.
// Per batch entry B is packed row-major (K x N, contiguous), then tasks of kRows rows of C
// each pack their A rows and run over column blocks of kCols: every k step loads a B row
// segment once for the kRows rows (register/L1 reuse) and the j loop vectorises. Each
// output is a sum in k order (one product per k, added in turn), whatever the thread count.
constexpr i64 kRows = 4, kCols = 256;

void gemm_f64(const MatmulArgs& p, const double* A, const double* B, double* C) {
  const i64 M = p.M, N = p.N, K = p.K;
  std::vector<double> bp(std::size_t(K * N));
  for (i64 bidx = 0; bidx < p.batch; ++bidx) {
    i64 rest = bidx, a_off = 0, b_off = 0;
    for (int d = p.batch_dims - 1; d >= 0; --d) {
      const i64 i = rest % p.batch_shape[d];
      rest /= p.batch_shape[d];
      a_off += i * p.a_bs[d];
      b_off += i * p.b_bs[d];
    }
    const double* a = A + a_off;
    const double* b = B + b_off;
    double* c = C + bidx * M * N;
    for (i64 k = 0; k < K; ++k)
      for (i64 j = 0; j < N; ++j) bp[std::size_t(k * N + j)] = b[k * p.b_rs + j * p.b_cs];
    const i64 tasks = (M + kRows - 1) / kRows;
    ThreadPool::instance().parallel_for(tasks, [&](i64 t) {
      const i64 r0 = t * kRows, rows = std::min(kRows, M - r0);
      std::vector<double> ar(std::size_t(kRows * K), 0.0);  // the rows of A, contiguous in k
      for (i64 r = 0; r < rows; ++r)
        for (i64 k = 0; k < K; ++k) ar[std::size_t(r * K + k)] = a[(r0 + r) * p.a_rs + k * p.a_cs];
      double acc[kRows][kCols];
      for (i64 j0 = 0; j0 < N; j0 += kCols) {
        const i64 cols = std::min(kCols, N - j0);
        for (i64 r = 0; r < kRows; ++r)
          for (i64 j = 0; j < cols; ++j) acc[r][j] = 0.0;
        for (i64 k = 0; k < K; ++k) {
          const double* brow = bp.data() + k * N + j0;
          const double a0 = ar[std::size_t(0 * K + k)];
          const double a1 = rows > 1 ? ar[std::size_t(1 * K + k)] : 0.0;
          const double a2 = rows > 2 ? ar[std::size_t(2 * K + k)] : 0.0;
          const double a3 = rows > 3 ? ar[std::size_t(3 * K + k)] : 0.0;
          for (i64 j = 0; j < cols; ++j) {
            const double bv = brow[j];
            acc[0][j] += a0 * bv;
            acc[1][j] += a1 * bv;
            acc[2][j] += a2 * bv;
            acc[3][j] += a3 * bv;
          }
        }
        for (i64 r = 0; r < rows; ++r)
          std::copy(acc[r], acc[r] + cols, c + (r0 + r) * N + j0);
      }
    });
  }
}

void matmul_native(const MatmulArgs& p, const Array& a, const Array& b, const Array& out) {
  if (out.dtype == DType::float64) {
    gemm_f64(p, reinterpret_cast<const double*>(a.host_data()),
             reinterpret_cast<const double*>(b.host_data()), reinterpret_cast<double*>(out.host_data()));
    return;
  }
  FM_CPU_DISPATCH(matmul_gemm, p, reinterpret_cast<const float*>(a.host_data()),
                  reinterpret_cast<const float*>(b.host_data()),
                  reinterpret_cast<float*>(out.host_data()), nullptr);
}

// out = a @ b + bias (N values, contiguous, out's dtype): float32 adds the bias to each tile
// of C as the GEMM finishes it, not in another pass over C; float64 adds it after.
void matmul_bias_native(const MatmulArgs& p, const Array& a, const Array& b, const Array& bias,
                        const Array& out) {
  if (out.dtype == DType::float64) {
    matmul_native(p, a, b, out);
    double* c = reinterpret_cast<double*>(out.host_data());
    const double* bv = reinterpret_cast<const double*>(bias.host_data());
    for (i64 r = 0; r < i64(p.batch) * p.M; ++r)
      for (i64 j = 0; j < p.N; ++j) c[r * p.N + j] = c[r * p.N + j] + bv[j];
    return;
  }
  FM_CPU_DISPATCH(matmul_gemm, p, reinterpret_cast<const float*>(a.host_data()),
                  reinterpret_cast<const float*>(b.host_data()),
                  reinterpret_cast<float*>(out.host_data()),
                  reinterpret_cast<const float*>(bias.host_data()));
}

// B packed once for many products (ops/matmul.h's RepeatedMatmul; isa/matmul_gemm.cpp):
// float32 only (the double GEMM packs B per product).
std::int64_t packed_size_native(const MatmulArgs& p, DType t) {
  return t == DType::float32 ? FM_CPU_DISPATCH(matmul_packed_size, p) : 0;
}
void pack_b_native(const MatmulArgs& p, const Array& b, const Array& packed) {
  FM_CPU_DISPATCH(matmul_pack_b, p, reinterpret_cast<const float*>(b.host_data()),
                  reinterpret_cast<float*>(packed.host_data()));
}
void packed_native(const MatmulArgs& p, const Array& a, const Array& packed, const Array& out) {
  FM_CPU_DISPATCH(matmul_packed, p, reinterpret_cast<const float*>(a.host_data()),
                  reinterpret_cast<const float*>(packed.host_data()),
                  reinterpret_cast<float*>(out.host_data()));
}

}  // namespace

FM_CPU_NATIVE("matmul", &matmul_native, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("matmul_bias", &matmul_bias_native, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("matmul_packed_size", &packed_size_native, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("matmul_pack_b", &pack_b_native, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("matmul_packed", &packed_native, &native_reduce_matmul_enabled());

}  // namespace fm::cpu
