// Argument block of the dtype conversion, copy and integer comparison kernels
// (metal/convert.metal), shared with the host (csrc/ops/convert.cpp). Each thread handles
// one element, found from its linear index in C order over `shape`; the three stride sets
// (in elements) address operand 0, operand 1 and the output. Largest fields first, so MSL
// and C++ agree on every offset.
#pragma once

#define FM_VIEW_MAX_DIMS 16

struct ViewArgs {
  int64_t strides[3][FM_VIEW_MAX_DIMS];
  int64_t shape[FM_VIEW_MAX_DIMS];
  int64_t base;  // linear index of this launch's first element (launches of < 2**32 threads)
  int32_t ndim;
  int32_t unused;
};
