#include "ops/pooling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/errors.h"
#include "ops/array_arg.h"
#include "ops/python_op.h"
#include "pooling_args.h"

namespace fm {
namespace {

constexpr std::int64_t kMaxI32 = std::numeric_limits<std::int32_t>::max();

std::string pair_str(std::int64_t a, std::int64_t b) {
  return "(" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

// A 3-D (C, H, W) or 4-D (N, C, H, W) shape: planes and the plane's size; `what` names the
// array in messages.
Resample2dArgs plane_args(const char* op, const Shape& s, const char* what) {
  if (s.size() != 3 && s.size() != 4)
    throw ValueError(message(op, "expected ", what, " to be 3-D (C, H, W) or 4-D (N, C, H, W), "
                             "got shape ", shape_str(s)));
  const std::int64_t h = s[s.size() - 2], w = s[s.size() - 1];
  std::int64_t planes = 1;
  for (std::size_t d = 0; d + 2 < s.size(); ++d) planes *= s[d];
  if (h > kMaxI32 || w > kMaxI32 || planes > kMaxI32 || numel(s) > (std::int64_t(1) << 62))
    throw ValueError(message(op, "expected fewer than 2**31 planes, rows and columns, got ",
                             what, " shape ", shape_str(s)));
  Resample2dArgs a{};
  a.planes = std::int32_t(planes);
  a.h = std::int32_t(h);
  a.w = std::int32_t(w);
  return a;
}

void check_sizes(const char* op, std::int64_t h, std::int64_t w, std::int64_t oh,
                 std::int64_t ow, const char* what_in, const char* what_out) {
  if (h < 1 || w < 1 || h > kMaxI32 || w > kMaxI32)
    throw ValueError(message(op, "expected ", what_in, " of at least 1 x 1 (below 2**31), got ",
                             pair_str(h, w)));
  if (oh < 1 || ow < 1 || oh > kMaxI32 || ow > kMaxI32)
    throw ValueError(message(op, "expected ", what_out, " of at least 1 x 1 (below 2**31), got ",
                             pair_str(oh, ow)));
}

Shape with_plane(const Shape& s, std::int64_t h, std::int64_t w) {
  Shape o = s;
  o[o.size() - 2] = h;
  o[o.size() - 1] = w;
  return o;
}

void launch(const std::string& kernel, const Resample2dArgs& a, const Array& in, const Array& out,
            std::int64_t gx, std::int64_t gy, std::uint64_t cost) {
  if (out.size() == 0) return;
  Backend& be = out.backend();
  Dispatch d;
  d.grid[0] = std::uint32_t(gx);
  d.grid[1] = std::uint32_t(gy);
  d.grid[2] = std::uint32_t(a.planes);
  d.group[0] = std::max<std::uint32_t>(
      1, std::min<std::uint32_t>(be.preferred_group_size(kernel), std::uint32_t(gx)));
  d.cost = std::max<std::uint64_t>(1, cost);
  be.launch(kernel, d, {buf(in), buf(out), KernelArg::inline_bytes(&a, sizeof a)});
}

// avg_pool2d's window (PyTorch's checks: positive kernel and stride, padding at most half
// the kernel) and output size (floor mode).
void pool_window(const char* op, Resample2dArgs& a, std::int64_t kh, std::int64_t kw,
                 std::int64_t sh, std::int64_t sw, std::int64_t ph, std::int64_t pw) {
  if (kh < 1 || kw < 1 || kh > kMaxI32 || kw > kMaxI32)
    throw ValueError(message(op, "expected kernel_size to be positive, got ", pair_str(kh, kw)));
  if (sh < 1 || sw < 1 || sh > kMaxI32 || sw > kMaxI32)
    throw ValueError(message(op, "expected stride to be positive, got ", pair_str(sh, sw)));
  if (ph < 0 || pw < 0 || 2 * ph > kh || 2 * pw > kw)
    throw ValueError(message(op, "expected padding to be non-negative and at most half of the "
                             "kernel size ", pair_str(kh, kw), ", got ", pair_str(ph, pw)));
  const std::int64_t oh = (a.h + 2 * ph - kh) / sh + 1, ow = (a.w + 2 * pw - kw) / sw + 1;
  if (a.h < 1 || a.w < 1 || a.h + 2 * ph < kh || a.w + 2 * pw < kw)
    throw ValueError(message(op, "expected the padded input (", a.h + 2 * ph, " x ",
                             a.w + 2 * pw, ") to be at least the kernel size ", pair_str(kh, kw)));
  a.oh = std::int32_t(oh);
  a.ow = std::int32_t(ow);
  a.kh = std::int32_t(kh);
  a.kw = std::int32_t(kw);
  a.sh = std::int32_t(sh);
  a.sw = std::int32_t(sw);
  a.ph = std::int32_t(ph);
  a.pw = std::int32_t(pw);
  a.divisor = std::int32_t(std::min<std::int64_t>(kh * kw, kMaxI32));
}

// PyTorch's nearest rule per axis (upsample_nearest2d): same size, twice the size, else a
// float32 scale: 1 / scale_factor where one was given, in / out otherwise.
void nearest_axis(const char* op, std::int64_t in, std::int64_t out, double scale_factor,
                  std::int32_t& mode, float& scale, const char* axis) {
  if (!(scale_factor >= 0.0) || std::isinf(scale_factor))
    throw ValueError(message(op, "expected a finite non-negative scale for the ", axis,
                             " axis (0 = none), got ", scale_factor));
  if (out == in) {
    mode = FM_NEAREST_SAME;
  } else if (out == 2 * in) {
    mode = FM_NEAREST_HALF;
  } else {
    mode = FM_NEAREST_SCALED;
  }
  scale = scale_factor > 0.0 ? float(1.0 / scale_factor) : float(in) / float(out);
}

}  // namespace

Array avg_pool2d(const Array& x, std::int64_t kh, std::int64_t kw, std::int64_t sh,
                 std::int64_t sw, std::int64_t ph, std::int64_t pw) {
  const char* op = "avg_pool2d";
  Resample2dArgs a = plane_args(op, x.shape, "input");
  pool_window(op, a, kh, kw, sh, sw, ph, pw);
  Array out = Array::empty(x.backend(), with_plane(x.shape, a.oh, a.ow), DType::float32, op);
  launch("avg_pool2d_forward", a, x, out, a.ow, a.oh, std::uint64_t(kh * kw));
  return out;
}
FM_PYTHON_OP(avg_pool2d,
             "_avg_pool2d(x: Array, kh: int, kw: int, sh: int, sw: int, ph: int, pw: int)",
             "Private: see ops/pooling.py.");

Array avg_pool2d_backward(const Array& grad_output, std::int64_t h, std::int64_t w,
                          std::int64_t kh, std::int64_t kw, std::int64_t sh, std::int64_t sw,
                          std::int64_t ph, std::int64_t pw) {
  const char* op = "avg_pool2d_backward";
  Resample2dArgs a = plane_args(op, grad_output.shape, "grad_output");
  check_sizes(op, h, w, 1, 1, "an input size", "an output size");
  a.h = std::int32_t(h);
  a.w = std::int32_t(w);
  pool_window(op, a, kh, kw, sh, sw, ph, pw);
  const Shape in_shape = with_plane(grad_output.shape, h, w);
  if (grad_output.shape != with_plane(in_shape, a.oh, a.ow))
    throw ValueError(message(op, "expected grad_output of shape ",
                             shape_str(with_plane(in_shape, a.oh, a.ow)),
                             " (avg_pool2d's output for input size ", pair_str(h, w), "), got ",
                             shape_str(grad_output.shape)));
  Array gi = Array::empty(grad_output.backend(), in_shape, DType::float32, op);
  const std::uint64_t windows = std::uint64_t(((kh + sh - 1) / sh) * ((kw + sw - 1) / sw));
  launch("avg_pool2d_backward", a, grad_output, gi, w, h, windows);
  return gi;
}
FM_PYTHON_OP(avg_pool2d_backward,
             "_avg_pool2d_backward(grad_output: Array, h: int, w: int, kh: int, kw: int, sh: int, "
             "sw: int, ph: int, pw: int)",
             "Private: see ops/pooling.py.");

Array adaptive_avg_pool2d(const Array& x, std::int64_t oh, std::int64_t ow) {
  const char* op = "adaptive_avg_pool2d";
  Resample2dArgs a = plane_args(op, x.shape, "input");
  check_sizes(op, a.h, a.w, oh, ow, "an input", "output_size");
  a.oh = std::int32_t(oh);
  a.ow = std::int32_t(ow);
  Array out = Array::empty(x.backend(), with_plane(x.shape, oh, ow), DType::float32, op);
  const std::uint64_t window = std::uint64_t((a.h + oh - 1) / oh + 1) * ((a.w + ow - 1) / ow + 1);
  launch("adaptive_avg_pool2d_forward", a, x, out, ow, oh, window);
  return out;
}
FM_PYTHON_OP(adaptive_avg_pool2d, "_adaptive_avg_pool2d(x: Array, oh: int, ow: int)",
             "Private: see ops/pooling.py.");

Array adaptive_avg_pool2d_backward(const Array& grad_output, std::int64_t h, std::int64_t w) {
  const char* op = "adaptive_avg_pool2d_backward";
  Resample2dArgs a = plane_args(op, grad_output.shape, "grad_output");
  check_sizes(op, h, w, a.h, a.w, "an input size", "grad_output");
  a.oh = a.h;
  a.ow = a.w;
  a.h = std::int32_t(h);
  a.w = std::int32_t(w);
  Array gi = Array::empty(grad_output.backend(), with_plane(grad_output.shape, h, w),
                          DType::float32, op);
  const std::uint64_t outs = std::uint64_t((a.oh + h - 1) / h + 1) * ((a.ow + w - 1) / w + 1);
  launch("adaptive_avg_pool2d_backward", a, grad_output, gi, w, h, outs);
  return gi;
}
FM_PYTHON_OP(adaptive_avg_pool2d_backward,
             "_adaptive_avg_pool2d_backward(grad_output: Array, h: int, w: int)",
             "Private: see ops/pooling.py.");

Array interpolate_nearest(const Array& x, std::int64_t oh, std::int64_t ow, double scale_h,
                          double scale_w) {
  const char* op = "interpolate";
  Resample2dArgs a = plane_args(op, x.shape, "input");
  check_sizes(op, a.h, a.w, oh, ow, "an input", "an output size");
  a.oh = std::int32_t(oh);
  a.ow = std::int32_t(ow);
  nearest_axis(op, a.h, oh, scale_h, a.mode_h, a.scale_h, "height");
  nearest_axis(op, a.w, ow, scale_w, a.mode_w, a.scale_w, "width");
  Array out = Array::empty(x.backend(), with_plane(x.shape, oh, ow), DType::float32, op);
  launch("interpolate_nearest_forward", a, x, out, ow, oh, 1);
  return out;
}
FM_PYTHON_OP(interpolate_nearest,
             "_interpolate_nearest(x: Array, oh: int, ow: int, scale_h: float, scale_w: float)",
             "Private: see ops/pooling.py.");

Array interpolate_nearest_backward(const Array& grad_output, std::int64_t h, std::int64_t w,
                                   double scale_h, double scale_w) {
  const char* op = "interpolate_backward";
  Resample2dArgs a = plane_args(op, grad_output.shape, "grad_output");
  check_sizes(op, h, w, a.h, a.w, "an input size", "grad_output");
  a.oh = a.h;
  a.ow = a.w;
  a.h = std::int32_t(h);
  a.w = std::int32_t(w);
  nearest_axis(op, h, a.oh, scale_h, a.mode_h, a.scale_h, "height");
  nearest_axis(op, w, a.ow, scale_w, a.mode_w, a.scale_w, "width");
  Array gi = Array::empty(grad_output.backend(), with_plane(grad_output.shape, h, w),
                          DType::float32, op);
  const std::uint64_t outs = std::uint64_t((a.oh + h - 1) / h) * ((a.ow + w - 1) / w) + 32;
  launch("interpolate_nearest_backward", a, grad_output, gi, w, h, outs);
  return gi;
}
FM_PYTHON_OP(interpolate_nearest_backward,
             "_interpolate_nearest_backward(grad_output: Array, h: int, w: int, scale_h: float, "
             "scale_w: float)",
             "Private: see ops/pooling.py.");

}  // namespace fm
