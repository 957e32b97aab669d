// Elementwise work across dtypes (metal/convert.metal): astype between float32, float16
// and int64 on the device, copies of any dtype between any strides, comparisons of int64
// arrays (float32 masks), int64 arithmetic and where.
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
// The float32 mask (1.0 / 0.0) of `op` on two int64 arrays, broadcast as NumPy, into out
// (float32, any strides, no partial overlap with x or y).
void launch_compare_int64(const std::string& op, const Array& x, const Array& y,
                          const Array& out);

// int64 arithmetic as NumPy's int64 ufuncs (metal/int64_math.metal): the op names of the
// table that have an int64 form (add, subtract, multiply, floor_divide, remainder,
// maximum, minimum, power; negative, abs, square).
bool is_int64_arithmetic(const std::string& op);
bool is_int64_unary(const std::string& op);
// op(x, y) broadcast as NumPy, wrapping on overflow, into out (int64, any strides, no
// partial overlap with x or y).
void launch_binary_int64(const std::string& op, const Array& x, const Array& y, const Array& out);
void launch_unary_int64(const std::string& op, const Array& x, const Array& out);
// condition ? x : y (metal/select.metal), broadcast as NumPy; x and y of one dtype (the
// result's), the condition float32, float16 or int64 (nonzero and NaN are true).
Array where(const Array& cond, const Array& x, const Array& y);

}  // namespace fm
