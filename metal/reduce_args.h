// Argument block of the reduction kernels (metal/reduce.metal), shared with the host
// (csrc/ops/reduce.cpp). The input is contiguous float32 viewed as (outer, R, inner): each
// output o = (ob, oi) reduces the R elements x[(ob * R + r) * inner + oi]. Outputs are
// contiguous, outer * inner of them.
#pragma once

struct ReduceArgs {
  uint32_t outer, R, inner;
  // sum-like results are divided by this (1 for sum, R for mean, R - ddof for var/std).
  float divisor;
  uint32_t flags;  // bit 0: take the square root of the result (std)
};
