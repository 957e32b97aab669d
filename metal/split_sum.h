// The sum of a split-K product's slices (conv2d_sum_splits, matmul_sum_splits).
#pragma once
#include "fm_kernel.h"

// ws[0 * n + i] + ws[1 * n + i] + ... + ws[(splits - 1) * n + i], added in that order. The
// loads go out eight at a time before their adds: these kernels have few threads (MNIST's
// fc1: 8,192 outputs of 66 slices, a quarter of a warp per H100 multiprocessor) and a chain
// of one load per add waited out every load's latency in turn (5.8 us).
FM_FUNC float sum_slices(device const float* ws, uint32_t n, uint32_t splits, uint32_t i) {
  float s = 0.0f;
  uint32_t p = 0;
  for (; p + 8u <= splits; p += 8u) {
    float v[8];
    FM_UNROLL for (uint32_t j = 0; j < 8u; ++j) v[j] = ws[(p + j) * n + i];
    FM_UNROLL for (uint32_t j = 0; j < 8u; ++j) s += v[j];
  }
  for (; p < splits; ++p) s += ws[p * n + i];
  return s;
}
