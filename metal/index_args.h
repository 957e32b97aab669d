// Argument block of the gather / scatter kernels (metal/index.metal), shared with the host
// (csrc/ops/indexing.cpp). The indexed axis of the array is moved first: element e of the
// result, in C order over (index positions, remaining dims), reads (take) or writes (put)
// the array at view_offset(strides[0], e) + idx[e / rest] * axis_stride, where operand 0's
// strides are zero over the index positions; operand 1 is put's value (broadcast strides),
// operand 2 take's output.
#pragma once
#include "convert_args.h"

struct TakeArgs {
  ViewArgs view;
  int64_t rest;  // elements per index position (the product of the remaining dims)
  int64_t axis_len, axis_stride;
};
