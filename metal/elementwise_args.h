// Argument block of the strided elementwise kernels, shared by the host (csrc/elementwise.cpp)
// and the kernels so the two cannot drift. Only fixed-width fields, laid out largest first,
// so MSL and C++ agree on every offset.
#pragma once

#define FM_MAX_DIMS 16

struct StridedArgs {
  int64_t strides[3][FM_MAX_DIMS];  // in elements: operand 0, operand 1, output
  int32_t shape[FM_MAX_DIMS];       // dims after merging; the grid covers the last two
  int32_t ndim;
  int32_t index32;  // nonzero: every offset of the launch fits in int32 (host-checked)
};
