// An Array as a kernel's buffer argument: its storage, bound from the byte offset of
// element [0, ..., 0] (the kernels index from there with the Array's strides).
#pragma once
#include "backend/backend.h"
#include "core/array.h"

namespace fm {

inline KernelArg buf(const Array& a) { return KernelArg::buffer(a.storage, a.byte_offset()); }

}  // namespace fm
