// Average pooling (fixed and adaptive windows) and nearest-neighbour resampling, forward and
// backward (metal/pooling.metal), with PyTorch's semantics. Inputs (N, C, H, W) or (C, H, W),
// contiguous float32; the private Python entries (_avg_pool2d, ...) are declared beside the
// definitions with FM_PYTHON_OP and wrapped by the public functions in Python.
#pragma once
#include <cstdint>

#include "core/array.h"

namespace fm {

Array avg_pool2d(const Array& x, std::int64_t kh, std::int64_t kw, std::int64_t sh,
                 std::int64_t sw, std::int64_t ph, std::int64_t pw);
// grad_output: avg_pool2d's output shape; h, w: the input's spatial size.
Array avg_pool2d_backward(const Array& grad_output, std::int64_t h, std::int64_t w,
                          std::int64_t kh, std::int64_t kw, std::int64_t sh, std::int64_t sw,
                          std::int64_t ph, std::int64_t pw);
Array adaptive_avg_pool2d(const Array& x, std::int64_t oh, std::int64_t ow);
Array adaptive_avg_pool2d_backward(const Array& grad_output, std::int64_t h, std::int64_t w);
// scale_h / scale_w: the scale factor the output size came from (PyTorch's `scales`), or 0
// where the size was given (then the rule's scale is in / out).
Array interpolate_nearest(const Array& x, std::int64_t oh, std::int64_t ow, double scale_h,
                          double scale_w);
Array interpolate_nearest_backward(const Array& grad_output, std::int64_t h, std::int64_t w,
                                   double scale_h, double scale_w);

}  // namespace fm
