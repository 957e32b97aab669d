// The CPU backend's own conv2d algorithms (ARCHITECTURE.md: ops whose GPU kernels need
// barriers get a plain C++ CPU algorithm). Same semantics as the MSL kernels in
// metal/conv2d.metal; tested against the same references.
//
// All tensors contiguous float32: x (N, C_in, H, W), w (C_out, C_in/groups, kH, kW),
// y / gy (N, C_out, H_out, W_out). Outputs are overwritten (not accumulated).
// Called without the GIL; multi-threaded on the CPU backend's pool.
#pragma once
#include <cstdint>

#include "conv2d_args.h"

namespace fm::cpu {

void conv2d_forward(const Conv2dArgs& a, const float* x, const float* w, const float* bias,
                    float* y);
void conv2d_backward_input(const Conv2dArgs& a, const float* gy, const float* w, float* gx);
void conv2d_backward_weight(const Conv2dArgs& a, const float* gy, const float* x, float* gw);
void conv2d_backward_bias(const Conv2dArgs& a, const float* gy, float* gb);

}  // namespace fm::cpu
