// conv2d: argument resolution, validation and dispatch, written once for every backend.
//
// Semantics are torch.nn.functional.conv2d's: input (N, C_in, H, W) or unbatched
// (C_in, H, W), weight (C_out, C_in/groups, kH, kW), optional bias (C_out,), stride /
// padding / dilation per axis, padding "valid" (= 0) or "same" (output size = input size;
// total padding dilation*(k-1), top/left total//2, bottom/right the rest; stride 1 only).
//
// Compute: float32, contiguous tensors. A backend's own conv2d runs where it has one
// (native ops "conv2d_forward", "conv2d_backward_input", ..., see backend/native_ops.h);
// elsewhere the MSL kernels of metal/conv2d.metal run (on the CPU through the generated
// entries: the GEMM kernels under the fiber emulator).
#pragma once
#include <cstdint>
#include <string>

#include "core/array.h"
#include "conv2d_args.h"

namespace fm {

enum class Conv2dPadding { explicit_, valid, same };

// The user's hyper-parameters, after parsing at the language boundary.
struct Conv2dSpec {
  std::int64_t stride[2] = {1, 1};
  std::int64_t dilation[2] = {1, 1};
  Conv2dPadding padding_mode = Conv2dPadding::explicit_;
  std::int64_t padding[2] = {0, 0};  // explicit_ only
  std::int64_t groups = 1;
};

// Checks the hyper-parameters alone (positive stride/dilation/groups, non-negative padding,
// "same" only with stride 1). ValueError naming `op` otherwise.
void conv2d_check_spec(const std::string& op, const Conv2dSpec& spec);

// Validates the shapes against each other and the spec (ranks, channels, groups, bias,
// output size >= 1, sizes the kernels can index) and returns the argument block. An
// unbatched (C, H, W) input resolves with N = 1. `bias` may be null. `spec` has passed
// conv2d_check_spec (the bindings check it once, as they parse it).
Conv2dArgs conv2d_resolve(const std::string& op, const Shape& input, const Shape& weight,
                          const Shape* bias, const Conv2dSpec& spec);
// (N, C_out, H_out, W_out), or (C_out, H_out, W_out) when `batched` is false.
Shape conv2d_output_shape(const Conv2dArgs& a, bool batched);

// The computations. Arrays: contiguous float32 on one backend, shapes as resolved; the
// outputs are allocated by the caller and overwritten. Enqueue work; callers synchronize.
// Called without the GIL.
void conv2d_forward(const Conv2dArgs& a, const Array& x, const Array& w, const Array* bias,
                    const Array& y);
void conv2d_backward_input(const Conv2dArgs& a, const Array& gy, const Array& w,
                           const Array& gx);
void conv2d_backward_weight(const Conv2dArgs& a, const Array& gy, const Array& x,
                            const Array& gw);
void conv2d_backward_bias(const Conv2dArgs& a, const Array& gy, const Array& gb);

// Private switch for tests and benchmarks: threads per group for the kernels that use
// barriers; 0 = the backend's choice.
void set_conv_group_size(std::uint32_t threads);
std::uint32_t conv_group_size();

}  // namespace fm
