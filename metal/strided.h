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

// 32-bit versions, for launches whose offsets all fit in int32 (StridedArgs::index32):
// Apple GPUs have no 64-bit integer multiplier, so 64-bit index math costs several
// instructions per element there. Only Metal uses them (FM_NARROW_INDEX); the CPU and CUDA
// keep the one 64-bit path, with no extra branch in their loops.
#ifndef FM_NARROW_INDEX
#if defined(__METAL_VERSION__)
#define FM_NARROW_INDEX 1
#else
#define FM_NARROW_INDEX 0
#endif
#endif

FM_FUNC int32_t fm_strided_offset32(uint3 gid, constant int32_t* shape, constant int64_t* strides,
                                   int32_t ndim) {
  int32_t off = int32_t(gid.x) * int32_t(strides[ndim - 1]);
  if (ndim > 1) off += int32_t(gid.y) * int32_t(strides[ndim - 2]);
  uint32_t z = gid.z;
  for (int32_t d = ndim - 3; d >= 0; --d) {
    const uint32_t extent = uint32_t(shape[d]);
    off += int32_t(z % extent) * int32_t(strides[d]);
    z /= extent;
  }
  return off;
}

FM_FUNC int32_t fm_offset3_32(uint3 gid, constant int64_t* strides) {
  return int32_t(gid.x) * int32_t(strides[2]) + int32_t(gid.y) * int32_t(strides[1]) +
         int32_t(gid.z) * int32_t(strides[0]);
}

// Offset of operand k (0, 1; 2 = the output) in the *_g and *_s / *_r layouts.
FM_FUNC int64_t fm_offset_g(uint3 gid, constant StridedArgs& a, int k) {
  if (FM_NARROW_INDEX && a.index32 != 0) return fm_strided_offset32(gid, a.shape, a.strides[k], a.ndim);
  return fm_strided_offset(gid, a.shape, a.strides[k], a.ndim);
}
FM_FUNC int64_t fm_offset_s(uint3 gid, constant StridedArgs& a, int k) {
  if (FM_NARROW_INDEX && a.index32 != 0) return fm_offset3_32(gid, a.strides[k]);
  return fm_offset3(gid, a.strides[k]);
}
