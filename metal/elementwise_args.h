// Argument block of the strided elementwise kernels, shared by the host (csrc/elementwise.cpp)
// and the kernels so the two cannot drift. Only fixed-width fields, laid out largest first,
// so MSL and C++ agree on every offset.
#pragma once

#define FM_MAX_DIMS 16

// Wide kernels (*_w, *_rw) move 16-byte chunks: 4 float or 8 half elements, one vector
// access each. A *_w thread loads FM_WIDE_CHUNKS chunks of each operand at a time, a *_rw
// thread the same chunk of FM_WIDE_ROWS rows: several independent loads in flight.
#define FM_WIDE_BYTES 16
#define FM_WIDE_CHUNKS 4
#define FM_WIDE_ROWS 4

struct StridedArgs {
  int64_t strides[3][FM_MAX_DIMS];  // in elements: operand 0, operand 1, output
  int32_t shape[FM_MAX_DIMS];       // dims after merging; the grid covers the last two
  int32_t ndim;
  int32_t index32;  // nonzero: every offset of the launch fits in int32 (host-checked)
};

// Argument block of the *_rw kernels: a 2-D launch over rows of whole 16-byte chunks.
struct ChunkRowArgs {
  int64_t row_stride[3];  // in chunks: operand 0, operand 1, output (0: a broadcast row)
  uint32_t rows;
  uint32_t pad_;
};
