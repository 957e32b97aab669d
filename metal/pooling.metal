// Average pooling (fixed and adaptive windows) and nearest-neighbour resampling, forward and
// backward, with PyTorch's semantics (avg_pool2d with ceil_mode=False and
// count_include_pad=True, adaptive_avg_pool2d, interpolate(mode="nearest")). One thread per
// output element (forward) or per input element (backward: it gathers the output gradients
// of every window or output that reads it, in row-major output order, so there are no
// atomics and the sum's order is fixed). No barriers: the CPU runs these as plain loops.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "pooling_args.h"
using namespace metal;

// ---------------------------------------------------------------------------- avg_pool2d
// Grid: (OW, OH, planes). The window is clipped to the image (padding adds zeros); the
// divisor counts the padding (count_include_pad) and is kh * kw in floor mode.
kernel void avg_pool2d_forward(device const float* x [[buffer(0)]],
                               device float* out [[buffer(1)]],
                               constant Resample2dArgs& a [[buffer(2)]],
                               uint3 gid [[thread_position_in_grid]]) {
  const int32_t ox = int32_t(gid.x), oy = int32_t(gid.y);
  if (ox >= a.ow || oy >= a.oh) return;
  const uint64_t p = gid.z;
  device const float* plane = x + p * uint64_t(a.h) * uint64_t(a.w);
  const int32_t y0 = oy * a.sh - a.ph, x0 = ox * a.sw - a.pw;
  const int32_t ya = max(y0, 0), yb = min(y0 + a.kh, a.h);
  const int32_t xa = max(x0, 0), xb = min(x0 + a.kw, a.w);
  float sum = 0.0f;
  for (int32_t y = ya; y < yb; ++y)
    for (int32_t xx = xa; xx < xb; ++xx) sum += plane[y * a.w + xx];
  out[(p * uint64_t(a.oh) + uint64_t(oy)) * uint64_t(a.ow) + uint64_t(ox)] =
      sum / float(a.divisor);
}

// Grid: (W, H, planes). Windows oy with oy * sh - ph <= iy < oy * sh - ph + kh.
kernel void avg_pool2d_backward(device const float* grad_out [[buffer(0)]],
                                device float* grad_in [[buffer(1)]],
                                constant Resample2dArgs& a [[buffer(2)]],
                                uint3 gid [[thread_position_in_grid]]) {
  const int32_t ix = int32_t(gid.x), iy = int32_t(gid.y);
  if (ix >= a.w || iy >= a.h) return;
  const uint64_t p = gid.z;
  device const float* g = grad_out + p * uint64_t(a.oh) * uint64_t(a.ow);
  const int32_t oy0 = max(0, (iy + a.ph - a.kh + a.sh) / a.sh);
  const int32_t oy1 = min(a.oh - 1, (iy + a.ph) / a.sh);
  const int32_t ox0 = max(0, (ix + a.pw - a.kw + a.sw) / a.sw);
  const int32_t ox1 = min(a.ow - 1, (ix + a.pw) / a.sw);
  const float div = float(a.divisor);
  float acc = 0.0f;
  for (int32_t oy = oy0; oy <= oy1; ++oy)
    for (int32_t ox = ox0; ox <= ox1; ++ox) acc += g[oy * a.ow + ox] / div;
  grad_in[(p * uint64_t(a.h) + uint64_t(iy)) * uint64_t(a.w) + uint64_t(ix)] = acc;
}

// ---------------------------------------------------------------------------- adaptive
// Output o of `out` over `in` reads [floor(o * in / out), ceil((o + 1) * in / out)).
FM_FUNC int32_t adaptive_start(int32_t o, int32_t in, int32_t out) {
  return int32_t((int64_t(o) * int64_t(in)) / int64_t(out));
}
FM_FUNC int32_t adaptive_end(int32_t o, int32_t in, int32_t out) {
  return int32_t(((int64_t(o) + 1) * int64_t(in) + int64_t(out) - 1) / int64_t(out));
}

// Grid: (OW, OH, planes).
kernel void adaptive_avg_pool2d_forward(device const float* x [[buffer(0)]],
                                        device float* out [[buffer(1)]],
                                        constant Resample2dArgs& a [[buffer(2)]],
                                        uint3 gid [[thread_position_in_grid]]) {
  const int32_t ox = int32_t(gid.x), oy = int32_t(gid.y);
  if (ox >= a.ow || oy >= a.oh) return;
  const uint64_t p = gid.z;
  device const float* plane = x + p * uint64_t(a.h) * uint64_t(a.w);
  const int32_t ya = adaptive_start(oy, a.h, a.oh), yb = adaptive_end(oy, a.h, a.oh);
  const int32_t xa = adaptive_start(ox, a.w, a.ow), xb = adaptive_end(ox, a.w, a.ow);
  float sum = 0.0f;
  for (int32_t y = ya; y < yb; ++y)
    for (int32_t xx = xa; xx < xb; ++xx) sum += plane[y * a.w + xx];
  out[(p * uint64_t(a.oh) + uint64_t(oy)) * uint64_t(a.ow) + uint64_t(ox)] =
      sum / float((yb - ya) * (xb - xa));
}

// Grid: (W, H, planes). The outputs whose window holds i are o in
// [floor(i * out / in), ceil((i + 1) * out / in)), each checked against its window (the
// bounds are exact, the check keeps it so at any size). Each adds g / kh / kw (PyTorch's order
// of the two divisions).
kernel void adaptive_avg_pool2d_backward(device const float* grad_out [[buffer(0)]],
                                         device float* grad_in [[buffer(1)]],
                                         constant Resample2dArgs& a [[buffer(2)]],
                                         uint3 gid [[thread_position_in_grid]]) {
  const int32_t ix = int32_t(gid.x), iy = int32_t(gid.y);
  if (ix >= a.w || iy >= a.h) return;
  const uint64_t p = gid.z;
  device const float* g = grad_out + p * uint64_t(a.oh) * uint64_t(a.ow);
  const int32_t oy0 = adaptive_start(iy, a.oh, a.h), oy1 = min(a.oh, adaptive_end(iy, a.oh, a.h));
  const int32_t ox0 = adaptive_start(ix, a.ow, a.w), ox1 = min(a.ow, adaptive_end(ix, a.ow, a.w));
  float acc = 0.0f;
  for (int32_t oy = oy0; oy < oy1; ++oy) {
    const int32_t ya = adaptive_start(oy, a.h, a.oh), yb = adaptive_end(oy, a.h, a.oh);
    if (iy < ya || iy >= yb) continue;
    for (int32_t ox = ox0; ox < ox1; ++ox) {
      const int32_t xa = adaptive_start(ox, a.w, a.ow), xb = adaptive_end(ox, a.w, a.ow);
      if (ix < xa || ix >= xb) continue;
      acc += g[oy * a.ow + ox] / float(yb - ya) / float(xb - xa);
    }
  }
  grad_in[(p * uint64_t(a.h) + uint64_t(iy)) * uint64_t(a.w) + uint64_t(ix)] = acc;
}

// ---------------------------------------------------------------------------- nearest
FM_FUNC int32_t nearest_source(int32_t o, int32_t in, int32_t mode, float scale) {
  if (mode == FM_NEAREST_SAME) return o;
  if (mode == FM_NEAREST_HALF) return o >> 1;
  const float s = floor(float(o) * scale);
  return min(int32_t(s), in - 1);
}

// The first output whose source is >= i (sources grow with the output index).
FM_FUNC int32_t nearest_first(int32_t i, int32_t in, int32_t out, int32_t mode, float scale) {
  int32_t lo = 0, hi = out;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (nearest_source(mid, in, mode, scale) < i)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Grid: (OW, OH, planes).
kernel void interpolate_nearest_forward(device const float* x [[buffer(0)]],
                                        device float* out [[buffer(1)]],
                                        constant Resample2dArgs& a [[buffer(2)]],
                                        uint3 gid [[thread_position_in_grid]]) {
  const int32_t ox = int32_t(gid.x), oy = int32_t(gid.y);
  if (ox >= a.ow || oy >= a.oh) return;
  const uint64_t p = gid.z;
  const int32_t sy = nearest_source(oy, a.h, a.mode_h, a.scale_h);
  const int32_t sx = nearest_source(ox, a.w, a.mode_w, a.scale_w);
  out[(p * uint64_t(a.oh) + uint64_t(oy)) * uint64_t(a.ow) + uint64_t(ox)] =
      x[(p * uint64_t(a.h) + uint64_t(sy)) * uint64_t(a.w) + uint64_t(sx)];
}

// Grid: (W, H, planes). The outputs reading input (iy, ix) are a rectangle of consecutive
// rows and columns; summed in row-major order (PyTorch's order of accumulation).
kernel void interpolate_nearest_backward(device const float* grad_out [[buffer(0)]],
                                         device float* grad_in [[buffer(1)]],
                                         constant Resample2dArgs& a [[buffer(2)]],
                                         uint3 gid [[thread_position_in_grid]]) {
  const int32_t ix = int32_t(gid.x), iy = int32_t(gid.y);
  if (ix >= a.w || iy >= a.h) return;
  const uint64_t p = gid.z;
  device const float* g = grad_out + p * uint64_t(a.oh) * uint64_t(a.ow);
  const int32_t oy0 = nearest_first(iy, a.h, a.oh, a.mode_h, a.scale_h);
  const int32_t ox0 = nearest_first(ix, a.w, a.ow, a.mode_w, a.scale_w);
  int32_t ox1 = ox0;
  while (ox1 < a.ow && nearest_source(ox1, a.w, a.mode_w, a.scale_w) == ix) ++ox1;
  float acc = 0.0f;
  for (int32_t oy = oy0; oy < a.oh && nearest_source(oy, a.h, a.mode_h, a.scale_h) == iy; ++oy)
    for (int32_t ox = ox0; ox < ox1; ++ox) acc += g[oy * a.ow + ox];
  grad_in[(p * uint64_t(a.h) + uint64_t(iy)) * uint64_t(a.w) + uint64_t(ix)] = acc;
}
