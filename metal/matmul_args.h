// Argument block of the matmul kernel (metal/matmul.metal), shared with the host
// (csrc/ops/matmul.cpp) and the CPU GEMM. C[b] = A[b] @ B[b] with A[b] (M x K), B[b] (K x N)
// read through element strides (so transposed and broadcast operands need no copy) and C
// contiguous (batch, M, N). Batch index b decomposes over batch_shape (last fastest);
// a_bs / b_bs are the operands' strides along those batch dimensions (0: broadcast).
#pragma once

#define FM_MATMUL_MAX_BATCH_DIMS 4

struct MatmulArgs {
  int32_t M, N, K, batch;
  int32_t a_rs, a_cs, b_rs, b_cs;  // A(m, k) = a[m * a_rs + k * a_cs], B(k, n) likewise
  int32_t batch_dims;
  int32_t batch_shape[FM_MATMUL_MAX_BATCH_DIMS];
  int32_t a_bs[FM_MATMUL_MAX_BATCH_DIMS];
  int32_t b_bs[FM_MATMUL_MAX_BATCH_DIMS];
};
