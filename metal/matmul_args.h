// Argument block of the matmul kernels (metal/matmul.metal), shared with the host
// (csrc/ops/matmul.cpp) and the CPU GEMM. C[b] = A[b] @ B[b] with A[b] (M x K), B[b] (K x N)
// read through element strides (so transposed and broadcast operands need no copy) and C
// contiguous (batch, M, N). Batch index b decomposes over batch_shape (last fastest);
// a_bs / b_bs are the operands' strides along those batch dimensions (0: broadcast).
//
// Split-K (GPU kernels only; the CPU GEMM ignores the last three fields): threadgroup z =
// split * batch + b computes the k range [split * k_chunk, (split + 1) * k_chunk) of batch
// b into slab (split * batch + b) of C (splits > 1: a workspace, summed in a fixed order by
// matmul_sum_splits). c_quads: C's rows may be written as 16-byte quads (N % 4 == 0 and C
// 16-byte aligned).
#pragma once

#define FM_MATMUL_MAX_BATCH_DIMS 4

// How a tile loads an operand (the kernels' template parameters AV / BV; the host picks):
#define FM_MM_SCALAR 0     // one float at a time, any strides
#define FM_MM_QUAD_K 1     // 16-byte quads of 4 consecutive k (A: a_cs == 1; B: b_rs == 1)
#define FM_MM_QUAD_MN 2    // quads of 4 consecutive rows of A (a_rs == 1) / columns of B (b_cs == 1)

struct MatmulArgs {
  int32_t M, N, K, batch;
  int32_t a_rs, a_cs, b_rs, b_cs;  // A(m, k) = a[m * a_rs + k * a_cs], B(k, n) likewise
  int32_t batch_dims;
  int32_t batch_shape[FM_MATMUL_MAX_BATCH_DIMS];
  int32_t a_bs[FM_MATMUL_MAX_BATCH_DIMS];
  int32_t b_bs[FM_MATMUL_MAX_BATCH_DIMS];
  int32_t splits, k_chunk, c_quads;
};
