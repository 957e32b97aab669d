// Advanced indexing on the device (metal/index.metal): gather and scatter along one axis
// with an int64 index array, and the positions of a mask's nonzero elements. Index bounds
// are checked by the caller (python/fastmetal/_indexing.py), as NumPy raises IndexError.
#pragma once
#include <cstdint>

#include "core/array.h"

namespace fm {

// x[..., idx, ...] (idx along `axis`; idx: int64, any shape S, indices in [-n, n)):
// a new contiguous array of shape x.shape[:axis] + S + x.shape[axis + 1:].
Array take(const Array& x, int axis, const Array& idx);
// x[..., idx, ...] = value, where value already has the shape of take's result (any
// strides, broadcast allowed).
void put(const Array& x, int axis, const Array& idx, const Array& value);
// The flat positions (int64, C order) of the `count` nonzero elements of a float32 mask.
Array mask_positions(const Array& mask, std::int64_t count);

}  // namespace fm
