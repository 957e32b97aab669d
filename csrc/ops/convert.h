// Elementwise work across dtypes (metal/convert.metal): astype between float32, float16
// and int64 on the device, copies of any dtype between any strides, and comparisons of
// int64 arrays (float32 masks).
#pragma once
#include <string>

#include "core/array.h"

namespace fm {

// out[...] = x[...] converted to out.dtype; shapes equal, any strides; out must not
// partially overlap x.
void launch_convert(const Array& x, const Array& out);
// x as a new contiguous array of dtype `to` on its device (a copy even where dtypes agree).
Array convert(const Array& x, DType to);
// True for the six comparison names of the op table (less ... not_equal).
bool is_comparison(const std::string& op);
// The float32 mask (1.0 / 0.0) of `op` on two int64 arrays, broadcast as NumPy.
Array compare_int64(const std::string& op, const Array& x, const Array& y);

}  // namespace fm
