// Launches of the numerics kernels (metal/numerics.metal) on fm::Arrays. Arguments are
// validated before these are called (python/fastmetal/numerics.py and numerics_py.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "core/array.h"

namespace fm {

// One finite-difference stencil table applied along `axis` of f (float32, any strides; or
// float64 on backends with the *_float64 kernels, which compute in double).
// weights: rows x width (in double; rounded to float for float32), offsets: rows (first tap
// relative to the output point). Rows are per point (per_index, rows == n) or n_left edge
// rows, one interior row, n_right edge rows. out: f's dtype, contiguous, f's shape.
struct StencilTable {
  std::vector<double> weights;
  std::vector<std::int32_t> offsets;
  int width = 0;
  int n_left = 0, n_right = 0;
  bool per_index = false;
};
void launch_stencil(const Array& f, int axis, const StencilTable& table, const Array& out);

// Fourier series of x (float32, contiguous; or float64 as launch_stencil) into out (x's
// dtype, contiguous, x's shape). coef: (A_k, B_k) for k = 1..K interleaved, already scaled
// for the derivative order (rounded to float for float32).
struct FourierParams {
  double period = 0;  // > 0, finite
  double c0 = 0;      // constant term
};
void launch_fourier(const Array& x, const std::vector<double>& coef, const FourierParams& p,
                    const Array& out);

}  // namespace fm
