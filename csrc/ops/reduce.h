// Reductions over axes of an fm::Array (NumPy semantics): sum, mean, var, std, max, min,
// argmax, argmin, prod; and cumsum (a scan along one axis). Validation of axes happens at the Python boundary
// (csrc/python/reduce_bindings.cpp); here axes are normalised, sorted and unique.
//
// The input is brought into an (outer, R, inner) layout (reduce_args.h): directly where it
// is contiguous and the reduced axes are adjacent, else gathered with the reduced axes
// last. A backend's own algorithms run where it registers the native ops "reduce_*_rows"
// (backend/native_ops.h), elsewhere the MSL kernels of metal/reduce.metal.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/array.h"

namespace fm {

enum class ReduceOp { sum, mean, var, std, max, min, argmax, argmin, prod };

// "sum" -> ReduceOp::sum ...; ValueError for unknown names.
ReduceOp parse_reduce_op(const std::string& name);
const char* reduce_op_name(ReduceOp op);

// The float32 result, contiguous, with the shape of the kept axes (in order).
// `op` is not argmax / argmin. ddof: var / std only. int64 input: sum (an int64 result,
// wrapping on overflow as NumPy), mean (float32), max, min and prod (int64) only.
Array reduce(ReduceOp op, const Array& x, const std::vector<int>& axes, double ddof);
// argmax / argmin over one axis (or all axes, flattened, when axis < 0): a contiguous int64
// array of indices on x's device, with the shape of the kept axes (in order).
Array reduce_arg(ReduceOp op, const Array& x, int axis);
// The cumulative sum along `axis` (all axes, flattened, when axis < 0), as NumPy's cumsum:
// a new contiguous array of x's dtype (float32, float64, float16 or int64).
Array cumsum(const Array& x, int axis);
// The cumulative product, the same way (NumPy's cumprod; int64 wraps on overflow).
Array cumprod(const Array& x, int axis);
// out[o * inner + i] = the sum over r < R of x[(o * R + r) * inner + i], x a contiguous
// float32 (outer, R, inner) array, out a contiguous float32 array of outer * inner elements
// written in place: reduce(sum)'s kernels, splits and native rows, for an op that sums into
// a buffer of its own (conv2d's bias gradient).
void sum_rows_into(const Array& x, std::int64_t outer, std::int64_t R, std::int64_t inner,
                   const Array& out);

}  // namespace fm
