// Elementwise work across dtypes (metal/convert.metal, metal/int_math.metal,
// metal/select.metal): astype between every pair of dtypes on the device, copies of any
// dtype between any strides, comparisons giving bool, integer and bitwise arithmetic, where.
#pragma once
#include <string>

#include "core/array.h"

namespace fm {

// out[...] = x[...] converted to out.dtype; shapes equal, any strides; out must not
// partially overlap x.
void launch_convert(const Array& x, const Array& out);
// x as a new contiguous array of dtype `to` on its device (a copy even where dtypes agree).
Array convert(const Array& x, DType to);
// Every element of out (any strides) set to the one element at `element` (out's dtype).
// For memory the CPU cannot see: one element crosses to the device and the convert kernel
// broadcasts it, so a large fill neither copies its bytes from the host nor puts them in a
// capture's arena (a compiled step re-uploads its arena when an argument changes).
void fill_from_element(const Array& out, const void* element);
// Zeros into the contiguous array a: a memset where the CPU sees the memory (a capture
// records it as a host call), else fill_from_element.
void fill_zero(const Array& a);
// True for the six comparison names of the op table (less ... not_equal).
bool is_comparison(const std::string& op);
// The bool result of `op` on two arrays of one dtype (any), broadcast as NumPy, into out
// (bool, any strides, no partial overlap with x or y).
void launch_compare(const std::string& op, const Array& x, const Array& y, const Array& out);

// Integer arithmetic as NumPy's integer ufuncs (metal/int_math.metal), for int64, int32 and
// uint8: the binary op names that have an integer form (add, subtract, multiply,
// floor_divide, remainder, maximum, minimum, power, and the bitwise ops bitwise_and,
// bitwise_or, bitwise_xor, left_shift, right_shift) and the unary ones (negative, abs,
// square, bitwise_invert). bool has the bitwise ops but the shifts.
bool is_int_binary(const std::string& op);
bool is_int_unary(const std::string& op);
bool is_bitwise(const std::string& op);
// floor, ceil, trunc, round: the identity on integers (which keep their dtype, a copy).
bool is_rounding(const std::string& op);
// op(x, y) broadcast as NumPy, wrapping on overflow, into out (x, y and out of one integer
// or bool dtype, any strides, no partial overlap with x or y).
void launch_binary_int(const std::string& op, const Array& x, const Array& y, const Array& out);
void launch_unary_int(const std::string& op, const Array& x, const Array& out);
// condition ? x : y (metal/select.metal), broadcast as NumPy; x and y of one dtype (the
// result's); a condition that is not bool is converted first (nonzero and NaN are true).
Array where(const Array& cond, const Array& x, const Array& y);

}  // namespace fm
