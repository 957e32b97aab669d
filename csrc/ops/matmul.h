// Matrix products (np.matmul semantics) on fm::Arrays: the tiled MSL GEMM of
// metal/matmul.metal, or a backend's own GEMM where it registers the native op "matmul"
// (backend/native_ops.h). Operands are read
// through their strides: transposed views (linear's weight.T) and broadcast batches cost
// no copy.
#pragma once
#include <string>

#include "core/array.h"

namespace fm {

// The shape np.matmul gives (1-D promotion and batch broadcasting), or ValueError worded
// "[fastmetal.<op>] expected ..., got ...".
Shape matmul_shape(const std::string& op, const Shape& a, const Shape& b);
// out = a @ b; out contiguous float32 with matmul_shape(a, b) (not overlapping a or b).
void matmul_into(const std::string& op, const Array& a, const Array& b, const Array& out);
Array matmul(const std::string& op, const Array& a, const Array& b);

}  // namespace fm
