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
// With gb (the bias gradient, C_out floats) it may compute that too, from the same pass
// over gy (a first layer's narrow kernel): returns whether it did.
bool conv2d_backward_weight(const Conv2dArgs& a, const Array& gy, const Array& x,
                            const Array& gw, const Array* gb = nullptr);
void conv2d_backward_bias(const Conv2dArgs& a, const Array& gy, const Array& gb);

// conv_transpose2d (torch.nn.functional.conv_transpose2d): input (N, C_in, H, W) or
// unbatched (C_in, H, W), weight (C_in, C_out/groups, kH, kW), optional bias (C_out,),
// output H_out = (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1.
// It is the input gradient of the conv2d whose input is the transposed output and whose
// output is the transposed input (same weight, stride, padding, dilation, groups), so it
// runs on conv2d's engine: its forward is that conv2d's input gradient, its input gradient
// that conv2d's forward, its weight gradient that conv2d's weight gradient with the roles of
// input and output gradient swapped.
//
// Checks the hyper-parameters (conv2d_check_spec, padding explicit only) and output_padding:
// non-negative and, per axis, smaller than the stride or the dilation (as PyTorch).
void conv_transpose2d_check_spec(const std::string& op, const Conv2dSpec& spec,
                                 const std::int64_t output_padding[2]);
// Validates the shapes and returns the argument block of that conv2d: its (C_in, H, W) are
// the transposed output's, its (C_out, H_out, W_out) the transposed input's.
Conv2dArgs conv_transpose2d_resolve(const std::string& op, const Shape& input,
                                    const Shape& weight, const Shape* bias,
                                    const Conv2dSpec& spec,
                                    const std::int64_t output_padding[2]);
// (N, C_out, H_out, W_out) of the transposed convolution (= the conv2d view's input).
Shape conv_transpose2d_output_shape(const Conv2dArgs& a, bool batched);
// x: the transposed input (N, C_in, H, W) = the conv2d view's output; y, gy: its output.
void conv_transpose2d_forward(const Conv2dArgs& a, const Array& x, const Array& w,
                              const Array* bias, const Array& y);
void conv_transpose2d_backward_input(const Conv2dArgs& a, const Array& gy, const Array& w,
                                     const Array& gx);
void conv_transpose2d_backward_weight(const Conv2dArgs& a, const Array& gy, const Array& x,
                                      const Array& gw);
void conv_transpose2d_backward_bias(const Conv2dArgs& a, const Array& gy, const Array& gb);

// Private switch for tests and benchmarks: threads per group for the kernels that use
// barriers; 0 = the backend's choice.
void set_conv_group_size(std::uint32_t threads);
std::uint32_t conv_group_size();

}  // namespace fm
