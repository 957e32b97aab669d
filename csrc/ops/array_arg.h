// An Array as a kernel's buffer argument: its storage, bound from the byte offset of
// element [0, ..., 0] (the kernels index from there with the Array's strides).
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "core/array.h"

namespace fm {

inline KernelArg buf(const Array& a) { return KernelArg::buffer(a.storage, a.byte_offset()); }

// Whether a's element [0, ..., 0] is 16-byte aligned where the device reads it (host memory:
// the address; device memory: the offset into its allocation, which starts aligned), so a
// kernel may read it as float4s.
inline bool starts_aligned16(const Array& a) {
  const std::uintptr_t at = a.storage->host != nullptr
                                ? reinterpret_cast<std::uintptr_t>(a.host_data())
                                : std::uintptr_t(a.byte_offset());
  return at % 16 == 0;
}

}  // namespace fm
