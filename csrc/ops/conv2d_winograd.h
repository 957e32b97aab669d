// conv2d's Winograd F(m x m, 3x3) path, m = 2 or 4 (metal/conv_winograd.metal;
// docs/gpu_kernels.md says why and where): when it applies, and its three launches per
// pass (the transforms, the (m+2)^2 GEMMs of conv2d_gemm.h, the last step).
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "core/array.h"
#include "ops/conv2d.h"

namespace fm::conv2d_winograd {

// Stride 1, dilation 1, 3x3, one group: the shapes F(m x m, 3x3) computes.
bool winograd_shape(const Conv2dArgs& a);

enum class ConvPass { forward, input_grad, weight_grad };
// The Winograd output tile m to use (2 or 4), or 0 for the implicit GEMM.
int winograd_choice(Backend& b, const Conv2dArgs& a, ConvPass pass);

// y = conv(x, w) (+ bias) for a Winograd shape `a` with F(m x m, 3x3); `flip`: w is the
// layer weight of the input gradient whose equivalent forward convolution `a` describes.
void winograd_forward(Backend& b, int m, const Conv2dArgs& a, const Array& x, const Array& w,
                      const KernelArg& bias_arg, std::uint32_t bias_flag, bool flip,
                      const Array& y);
// The input gradient of a stride-1 3x3 convolution as a forward convolution (of gy).
Conv2dArgs input_gradient_as_forward(const Conv2dArgs& a);
void winograd_backward_weight(Backend& b, int m, const Conv2dArgs& a, const Array& gy,
                              const Array& x, const Array& gw);

}  // namespace fm::conv2d_winograd
