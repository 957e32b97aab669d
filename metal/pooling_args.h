// Argument block of the average-pooling and resampling kernels (metal/pooling.metal),
// shared with the host (csrc/ops/pooling.cpp). Fixed-width fields only. Planes (N * C) of
// h x w in, oh x ow out, contiguous float32.
#pragma once

struct Resample2dArgs {
  int32_t planes, h, w, oh, ow;
  int32_t kh, kw, sh, sw, ph, pw;  // avg_pool2d's window
  int32_t divisor;                 // avg_pool2d: kh * kw (floor mode, padding counted)
  int32_t mode_h, mode_w;          // nearest, per axis: FM_NEAREST_*
  float scale_h, scale_w;          // nearest, FM_NEAREST_SCALED: source = floor(dst * scale)
};

// PyTorch's nearest rule (upsample_nearest2d): the same size maps i -> i, twice the size
// i -> i >> 1, anything else i -> min(floor(i * scale), in - 1) with a float32 scale.
#define FM_NEAREST_SCALED 0
#define FM_NEAREST_SAME 1
#define FM_NEAREST_HALF 2
