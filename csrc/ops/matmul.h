// Matrix products (np.matmul semantics) on fm::Arrays: the tiled MSL GEMM of
// metal/matmul.metal, or a backend's own GEMM where it registers the native op "matmul"
// (backend/native_ops.h). Operands are read
// through their strides: transposed views (linear's weight.T) and broadcast batches cost
// no copy.
#pragma once
#include <string>

#include "core/array.h"
#include "matmul_args.h"

namespace fm {

// The shape np.matmul gives (1-D promotion and batch broadcasting), or ValueError worded
// "[fastmetal.<op>] expected ..., got ...".
Shape matmul_shape(const std::string& op, const Shape& a, const Shape& b);
// out = a @ b; out contiguous float32 with matmul_shape(a, b) (not overlapping a or b).
void matmul_into(const std::string& op, const Array& a, const Array& b, const Array& out);
Array matmul(const std::string& op, const Array& a, const Array& b);
// out = a @ b + bias (bias (N,), out's dtype, along out's last axis: linear's forward). The
// backend's GEMM adds it as it stores C where it can (native op "matmul_bias"), else
// matmul_into and an elementwise add: the same one rounding of the sum either way.
void matmul_bias_into(const std::string& op, const Array& a, const Array& b, const Array& bias,
                      const Array& out);

// out = a @ b for many a (and out) of the shapes and strides of the ones given here, with one
// b (a recurrent layer's h_{t-1} @ W_hh^T at every time step). Where the backend's GEMM packs
// b (native ops "matmul_packed_size", "matmul_pack_b", "matmul_packed"), b is packed once
// here and every product reuses it; elsewhere, and for other shapes, each is matmul_into.
// Results are matmul_into's, bit for bit. b must not be written while this object is used.
class RepeatedMatmul {
 public:
  RepeatedMatmul(std::string op, const Array& a, const Array& b, const Array& out);
  void operator()(const Array& a, const Array& out) const;

 private:
  std::string op_;
  Array b_, packed_;
  Shape a_shape_, out_shape_;
  Strides a_strides_;
  MatmulArgs p_{};
  bool use_packed_ = false;
};

}  // namespace fm
