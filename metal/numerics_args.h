// Argument blocks of the numerics kernels (metal/numerics.metal), shared by the host
// (csrc/numerics.cpp) and the kernels so the two cannot drift. Fixed-width fields only,
// 8-byte fields first, so MSL and C++ agree on every offset.
#pragma once

#define FM_STENCIL_MAX_DIMS 8   // merged dims on each side of the differentiated axis
#define FM_STENCIL_MAX_WIDTH 16  // points per stencil row

// out[i] = sum_t w[row(i)][t] * (f[clamp(i + off[row(i)] + t)] - f[i]) along one axis.
// Rows: per_index != 0 -> row(i) = i (one row per point, non-uniform spacing); else
// n_left rows for the first points, one interior row, n_right rows for the last points.
// Two launches share this block: stencil_edges (the first n_left and last n_right points,
// general rows) and stencil_interior_* (points n_left .. n - n_right - 1, where every point
// uses `width_interior` taps starting at i + off_interior: unclamped, vectorisable).
struct StencilArgs {
  int64_t outer_strides[FM_STENCIL_MAX_DIMS];  // input strides (elements) of the dims before the axis
  int64_t inner_strides[FM_STENCIL_MAX_DIMS];  // ... and after it
  int64_t axis_stride;
  int32_t outer_shape[FM_STENCIL_MAX_DIMS];
  int32_t inner_shape[FM_STENCIL_MAX_DIMS];
  int32_t n_outer;      // number of outer dims
  int32_t n_inner;      // number of inner dims
  int32_t n;            // points along the axis
  int32_t width;        // stencil row width (<= FM_STENCIL_MAX_WIDTH)
  int32_t n_left;
  int32_t n_right;
  int32_t per_index;
  int32_t inner_total;  // product of inner_shape: the output is (outer..., n, inner_total)
  int32_t axis_in_x;    // 1: grid (points, outer_total, 1); 0: grid (inner_total, points, outer_total)
  int32_t off_interior;  // first tap of an interior point, relative to it
  int32_t v_first;       // stencil_interior: first index along the vector direction
  int32_t pad_;
  float w_interior[FM_STENCIL_MAX_WIDTH];  // uniform interior weights (per_index == 0)
};

// Fourier series: out = c0 + sum_{k=1..K} A_k cos(2 pi k x / P) + B_k sin(2 pi k x / P),
// with (A_k, B_k) already scaled for the requested derivative by the host.
struct FourierArgs {
  float inv_hi;       // 1 / P = inv_hi + inv_lo (float-float from the host's double)
  float inv_lo;
  float c0;           // constant term (a0 / 2, or 0 for derivatives)
  float pad_;
  int32_t num_terms;  // K
  int32_t block;      // terms between re-seeds of the rotation recurrence
};
