// Strided addressing for kernels that take a StridedArgs block (elementwise_args.h).
#pragma once
#include "fm_kernel.h"
#include "elementwise_args.h"

// Offset of the element at grid position gid: x walks the last dim, y the one before,
// z every dim before those (row-major).
FM_FUNC int64_t fm_strided_offset(uint3 gid, constant int32_t* shape, constant int64_t* strides,
                                 int32_t ndim) {
  int64_t off = int64_t(gid.x) * strides[ndim - 1];
  if (ndim > 1) off += int64_t(gid.y) * strides[ndim - 2];
  uint32_t z = gid.z;
  for (int32_t d = ndim - 3; d >= 0; --d) {
    const uint32_t extent = uint32_t(shape[d]);
    off += int64_t(z % extent) * strides[d];
    z /= extent;
  }
  return off;
}

// The same for arrays of exactly 3 dims (the host pads fewer with size-1 dims): no loop and
// no division, so the offset of a row is loop-invariant and the CPU compiler hoists it out of
// the x loop and vectorises along x.
FM_FUNC int64_t fm_offset3(uint3 gid, constant int64_t* strides) {
  return int64_t(gid.x) * strides[2] + int64_t(gid.y) * strides[1] + int64_t(gid.z) * strides[0];
}
