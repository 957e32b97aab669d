// conv_transpose2d (torch.nn.functional.conv_transpose2d) on the conv engine: its forward is
// conv2d's input gradient, its input gradient conv2d's forward, its weight gradient conv2d's
// weight gradient with the roles of input and output swapped (ops/conv2d.h).
#include <string>

#include "core/errors.h"
#include "ops/array_arg.h"
#include "ops/conv2d.h"
#include "ops/conv2d_shared.h"

namespace fm {

using conv2d_shared::direct_dispatch;
using conv2d_shared::kMaxIndex;
using conv2d_shared::pair_str;

void conv_transpose2d_check_spec(const std::string& op, const Conv2dSpec& s,
                                 const std::int64_t op_[2]) {
  conv2d_check_spec(op, s);
  if (s.padding_mode != Conv2dPadding::explicit_)
    throw ValueError(message(op, "expected padding to be a non-negative int or a pair of them "
                                 "(conv_transpose2d has no 'valid' or 'same'), got a string"));
  if (op_[0] < 0 || op_[1] < 0 || op_[0] > kMaxIndex || op_[1] > kMaxIndex)
    throw ValueError(message(op, "expected output_padding to be non-negative, got ",
                             pair_str(op_[0], op_[1])));
  for (int d = 0; d < 2; ++d)
    if (op_[d] >= s.stride[d] && op_[d] >= s.dilation[d])
      throw ValueError(message(op, "expected output_padding smaller than the stride or the "
                                   "dilation on each axis (as PyTorch), got output_padding ",
                               pair_str(op_[0], op_[1]), " with stride ",
                               pair_str(s.stride[0], s.stride[1]), " and dilation ",
                               pair_str(s.dilation[0], s.dilation[1])));
}

Conv2dArgs conv_transpose2d_resolve(const std::string& op, const Shape& input,
                                    const Shape& weight, const Shape* bias,
                                    const Conv2dSpec& s, const std::int64_t op_[2]) {
  if (input.size() != 4 && input.size() != 3)
    throw ValueError(message(op,
                             "expected a 4-D input (N, C_in, H, W) or a 3-D unbatched input "
                             "(C_in, H, W), got shape ",
                             shape_str(input)));
  if (weight.size() != 4)
    throw ValueError(message(op, "expected a 4-D weight (C_in, C_out/groups, kH, kW), got shape ",
                             shape_str(weight)));
  const bool batched = input.size() == 4;
  const std::int64_t N = batched ? input[0] : 1;
  const std::int64_t C = input[batched ? 1 : 0], H = input[batched ? 2 : 1],
                     W = input[batched ? 3 : 2];
  const std::int64_t G = s.groups;
  const std::int64_t C_in = weight[0], cout_g = weight[1], kH = weight[2], kW = weight[3];
  if (C_in < 1 || cout_g < 1 || kH < 1 || kW < 1)
    throw ValueError(message(op,
                             "expected a weight (C_in, C_out/groups, kH, kW) with every "
                             "dimension at least 1, got shape ",
                             shape_str(weight)));
  if (C != C_in)
    throw ValueError(message(op, "expected an input with weight.shape[0] = ", C_in,
                             " channels, got ", C, " channels (input shape ", shape_str(input),
                             ", weight shape ", shape_str(weight), ")"));
  if (C_in % G != 0)
    throw ValueError(message(op, "expected the input channels (C_in = ", C_in,
                             ") to be divisible by groups = ", G, ", got weight shape ",
                             shape_str(weight)));
  if (H < 1 || W < 1)
    throw ValueError(message(op, "expected an input with non-zero height and width, got shape ",
                             shape_str(input)));
  const std::int64_t C_out = cout_g * G;
  if (bias != nullptr && (bias->size() != 1 || (*bias)[0] != C_out))
    throw ValueError(message(op, "expected a bias of shape (C_out,) = (", C_out,
                             ",), got shape ", shape_str(*bias)));
  const std::int64_t in[2] = {H, W}, k[2] = {kH, kW};
  std::int64_t out[2];
  for (int d = 0; d < 2; ++d) {
    // int64 arithmetic: every term is below 2**31, so no overflow.
    if (s.dilation[d] * (k[d] - 1) > kMaxIndex || (in[d] - 1) * s.stride[d] > kMaxIndex)
      throw ValueError(message(op, "expected an output that fits 32-bit indices, got input ",
                               shape_str(input), ", weight ", shape_str(weight), ", stride ",
                               pair_str(s.stride[0], s.stride[1]), ", dilation ",
                               pair_str(s.dilation[0], s.dilation[1])));
    out[d] = (in[d] - 1) * s.stride[d] - 2 * s.padding[d] + s.dilation[d] * (k[d] - 1) +
             op_[d] + 1;
  }
  if (out[0] < 1 || out[1] < 1)
    throw ValueError(message(op, "expected a positive output size, got ",
                             pair_str(out[0], out[1]), " for input shape ", shape_str(input),
                             ", weight shape ", shape_str(weight), ", stride ",
                             pair_str(s.stride[0], s.stride[1]), ", padding ",
                             pair_str(s.padding[0], s.padding[1]), ", output_padding ",
                             pair_str(op_[0], op_[1]), ", dilation ",
                             pair_str(s.dilation[0], s.dilation[1])));
  const Shape out_shape = {N, C_out, out[0], out[1]};
  for (int d = 0; d < 2; ++d)  // the conv2d view pads our output by `padding`
    if (out[d] + 2 * s.padding[d] > kMaxIndex)
      throw ValueError(message(op, "expected the padded output to fit 32-bit indices, got "
                                   "output size ", pair_str(out[0], out[1]), " with padding ",
                               pair_str(s.padding[0], s.padding[1])));
  for (const Shape* t : {&input, &weight, &out_shape})
    if (numel(*t) > kMaxIndex)
      throw ValueError(message(op, "expected tensors of fewer than 2**31 elements (the kernels "
                                   "index with 32 bits), got shape ",
                               shape_str(*t)));
  // The conv2d whose input gradient this is: input = our output, output = our input.
  Conv2dArgs a{};
  a.N = std::int32_t(N);
  a.C_in = std::int32_t(C_out);
  a.H = std::int32_t(out[0]);
  a.W = std::int32_t(out[1]);
  a.C_out = std::int32_t(C_in);
  a.kH = std::int32_t(kH);
  a.kW = std::int32_t(kW);
  a.groups = std::int32_t(G);
  a.H_out = std::int32_t(H);
  a.W_out = std::int32_t(W);
  a.stride_h = std::int32_t(s.stride[0]);
  a.stride_w = std::int32_t(s.stride[1]);
  a.pad_h = std::int32_t(s.padding[0]);
  a.pad_w = std::int32_t(s.padding[1]);
  a.dil_h = std::int32_t(s.dilation[0]);
  a.dil_w = std::int32_t(s.dilation[1]);
  return a;
}

Shape conv_transpose2d_output_shape(const Conv2dArgs& a, bool batched) {
  if (batched) return {a.N, a.C_in, a.H, a.W};
  return {a.C_in, a.H, a.W};
}

void conv_transpose2d_forward(const Conv2dArgs& a, const Array& x, const Array& w,
                              const Array* bias, const Array& y) {
  if (y.size() == 0) return;
  conv2d_backward_input(a, x, w, y);
  if (bias == nullptr) return;
  Backend& b = y.backend();
  const std::string k = "conv_transpose2d_add_bias";
  b.launch(k, direct_dispatch(b, k, std::int64_t(a.H) * a.W, a.C_in, a.N),
           {buf(*bias), buf(y), KernelArg::inline_bytes(&a, sizeof a)});
}

void conv_transpose2d_backward_input(const Conv2dArgs& a, const Array& gy, const Array& w,
                                     const Array& gx) {
  conv2d_forward(a, gy, w, nullptr, gx);
}

void conv_transpose2d_backward_weight(const Conv2dArgs& a, const Array& gy, const Array& x,
                                      const Array& gw) {
  // conv2d's weight gradient pairs its output gradient (our input) with its input (our gy).
  conv2d_backward_weight(a, x, gy, gw);
}

void conv_transpose2d_backward_bias(const Conv2dArgs& a, const Array& gy, const Array& gb) {
  // conv2d's bias sum over an output of (N, C_out, H_out, W_out) = our gy.
  Conv2dArgs e = a;
  e.C_out = a.C_in;
  e.H_out = a.H;
  e.W_out = a.W;
  e.C_in = a.C_out;
  e.H = a.H_out;
  e.W = a.W_out;
  conv2d_backward_bias(e, gy, gb);
}

}  // namespace fm
