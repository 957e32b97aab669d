// Elementwise ops on fm::Arrays: choose the kernel layout (contiguous, wide contiguous,
// scalar-broadcast, wide rows, or general strided) after merging dimensions, and launch it.
// The dtypes and out= are decided before this (ops/arguments.h); launch_unary/binary take
// float operands of out's dtype.
#pragma once
#include <string>

#include "core/array.h"

namespace fm {

// x: any strides, shape == out.shape. out: any strides, no partial overlap with x.
void launch_unary(const std::string& op, const Array& x, const Array& out);
// x, y broadcast to out.shape; out must not partially overlap x or y.
void launch_binary(const std::string& op, const Array& x, const Array& y, const Array& out);
// Any op of the table on operands in the dtype unary_dtype / binary_dtype chose
// (ops/arguments.h), into out of elementwise_result_dtype: the table's float kernels, the
// integer and bitwise ones (metal/int_math.metal), or comparisons and copies
// (metal/convert.metal).
void launch_unary_any(const std::string& op, const Array& x, const Array& out);
void launch_binary_any(const std::string& op, const Array& x, const Array& y, const Array& out);
// Tests: let every backend take the wide (16-byte chunk) kernels, *_w and binary_rw (they
// otherwise run on GPUs only), so that the CPU's emulation checks them too.
void set_wide_elementwise_everywhere(bool enabled);

}  // namespace fm
