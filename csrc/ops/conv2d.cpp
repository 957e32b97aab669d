#include "ops/conv2d.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <vector>

#include "backend/env_config.h"
#include "backend/native_ops.h"
#include "core/errors.h"
#include "ops/array_arg.h"
#include "ops/conv2d_gemm.h"
#include "ops/conv2d_shared.h"
#include "ops/conv2d_winograd.h"
#include "ops/reduce.h"
#include "ops/convert.h"

namespace fm {
namespace {

using conv2d_shared::direct_dispatch;
using conv2d_shared::kMaxIndex;
using conv2d_shared::pair_str;
using namespace conv2d_gemm;        // tiles, splits, launches (conv2d_gemm.h)
using namespace conv2d_winograd;    // F(m x m, 3x3) (conv2d_winograd.h)

// A backend's own conv2d (native_ops.h), asked for by these names; without one the MSL
// kernels below run.
using NativeForward = void(const Conv2dArgs&, const Array& x, const Array& w, const Array* bias,
                           const Array& y);
using NativeBackwardInput = void(const Conv2dArgs&, const Array& gy, const Array& w,
                                 const Array& gx);
using NativeBackwardWeight = void(const Conv2dArgs&, const Array& gy, const Array& x,
                                  const Array& gw);
using NativeBackwardBias = void(const Conv2dArgs&, const Array& gy, const Array& gb);

}  // namespace

// ---------------------------------------------------------------- validation

void conv2d_check_spec(const std::string& op, const Conv2dSpec& s) {
  if (s.stride[0] < 1 || s.stride[1] < 1 || s.stride[0] > kMaxIndex || s.stride[1] > kMaxIndex)
    throw ValueError(message(op, "expected stride to be positive (at most 2**31-1), got ",
                             pair_str(s.stride[0], s.stride[1])));
  if (s.dilation[0] < 1 || s.dilation[1] < 1 || s.dilation[0] > kMaxIndex ||
      s.dilation[1] > kMaxIndex)
    throw ValueError(message(op, "expected dilation to be positive (at most 2**31-1), got ",
                             pair_str(s.dilation[0], s.dilation[1])));
  if (s.padding_mode == Conv2dPadding::explicit_ &&
      (s.padding[0] < 0 || s.padding[1] < 0 || s.padding[0] > kMaxIndex ||
       s.padding[1] > kMaxIndex))
    throw ValueError(message(op, "expected padding to be non-negative (at most 2**31-1), got ",
                             pair_str(s.padding[0], s.padding[1])));
  if (s.groups < 1 || s.groups > kMaxIndex)
    throw ValueError(message(op, "expected groups to be a positive int, got ", s.groups));
  if (s.padding_mode == Conv2dPadding::same && (s.stride[0] != 1 || s.stride[1] != 1))
    throw ValueError(message(op,
                             "expected stride 1 with padding='same' (as PyTorch, 'same' is not "
                             "supported for strided convolutions), got stride ",
                             pair_str(s.stride[0], s.stride[1])));
}

Conv2dArgs conv2d_resolve(const std::string& op, const Shape& input, const Shape& weight,
                          const Shape* bias, const Conv2dSpec& s) {
  if (input.size() != 4 && input.size() != 3)
    throw ValueError(message(op,
                             "expected a 4-D input (N, C, H, W) or a 3-D unbatched input "
                             "(C, H, W), got shape ",
                             shape_str(input)));
  if (weight.size() != 4)
    throw ValueError(message(op, "expected a 4-D weight (C_out, C_in/groups, kH, kW), got shape ",
                             shape_str(weight)));
  const bool batched = input.size() == 4;
  const std::int64_t N = batched ? input[0] : 1;
  const std::int64_t C = input[batched ? 1 : 0], H = input[batched ? 2 : 1],
                     W = input[batched ? 3 : 2];
  const std::int64_t C_out = weight[0], cin_g = weight[1], kH = weight[2], kW = weight[3];
  const std::int64_t G = s.groups;
  if (C_out < 1 || cin_g < 1 || kH < 1 || kW < 1)
    throw ValueError(message(op,
                             "expected a weight (C_out, C_in/groups, kH, kW) with every "
                             "dimension at least 1, got shape ",
                             shape_str(weight)));
  if (C < 1)
    throw ValueError(message(op, "expected an input with at least 1 channel, got shape ",
                             shape_str(input)));
  if (C % G != 0)
    throw ValueError(message(op, "expected the input channels (C_in = ", C,
                             ") to be divisible by groups = ", G, ", got input shape ",
                             shape_str(input)));
  if (C_out % G != 0)
    throw ValueError(message(op, "expected the weight's output channels (weight.shape[0] = ",
                             C_out, ") to be divisible by groups = ", G, ", got weight shape ",
                             shape_str(weight)));
  if (cin_g * G != C)
    throw ValueError(message(op, "expected an input with weight.shape[1] * groups = ", cin_g,
                             " * ", G, " = ", cin_g * G, " channels, got ", C,
                             " channels (input shape ", shape_str(input), ", weight shape ",
                             shape_str(weight), ")"));
  if (H < 1 || W < 1)
    throw ValueError(message(op, "expected an input with non-zero height and width, got shape ",
                             shape_str(input)));
  if (bias != nullptr && (bias->size() != 1 || (*bias)[0] != C_out))
    throw ValueError(message(op, "expected a bias of shape (C_out,) = (", C_out,
                             ",), got shape ", shape_str(*bias)));

  // Padding per axis: top/left, and the total.
  std::int64_t pad_top[2], pad_total[2];
  const std::int64_t k[2] = {kH, kW}, in[2] = {H, W};
  for (int d = 0; d < 2; ++d) {
    const std::int64_t span = s.dilation[d] * (k[d] - 1);  // dilated kernel extent - 1
    if (span > kMaxIndex)
      throw ValueError(message(op, "expected a dilated kernel that fits 32-bit indices, got "
                                   "kernel ", pair_str(kH, kW), " with dilation ",
                               pair_str(s.dilation[0], s.dilation[1])));
    switch (s.padding_mode) {
      case Conv2dPadding::explicit_:
        pad_top[d] = s.padding[d];
        pad_total[d] = 2 * s.padding[d];
        break;
      case Conv2dPadding::valid:
        pad_top[d] = pad_total[d] = 0;
        break;
      case Conv2dPadding::same:
        pad_total[d] = span;
        pad_top[d] = span / 2;
        break;
    }
  }
  for (int d = 0; d < 2; ++d) {  // after the loop above: the message prints both axes
    if (in[d] + pad_total[d] > kMaxIndex)
      throw ValueError(message(op, "expected the padded input to fit 32-bit indices, got input ",
                               "shape ", shape_str(input), " with padding ",
                               pair_str(pad_total[0] / 2, pad_total[1] / 2)));
  }
  std::int64_t out[2];
  for (int d = 0; d < 2; ++d) {
    const std::int64_t room = in[d] + pad_total[d] - s.dilation[d] * (k[d] - 1) - 1;
    if (room < 0) {
      throw ValueError(message(
          op, "expected the padded input (", H + pad_total[0], " x ", W + pad_total[1],
          ") to be at least as large as the dilated kernel (", s.dilation[0] * (kH - 1) + 1,
          " x ", s.dilation[1] * (kW - 1) + 1, "), got input shape ", shape_str(input),
          ", weight shape ", shape_str(weight), ", dilation ",
          pair_str(s.dilation[0], s.dilation[1])));
    }
    out[d] = room / s.stride[d] + 1;
  }
  const Shape out_shape = {N, C_out, out[0], out[1]};
  for (const Shape* t : {&input, &weight, &out_shape})
    if (numel(*t) > kMaxIndex)
      throw ValueError(message(op, "expected tensors of fewer than 2**31 elements (the kernels "
                                   "index with 32 bits), got shape ",
                               shape_str(*t)));

  Conv2dArgs a{};
  a.N = std::int32_t(N);
  a.C_in = std::int32_t(C);
  a.H = std::int32_t(H);
  a.W = std::int32_t(W);
  a.C_out = std::int32_t(C_out);
  a.kH = std::int32_t(kH);
  a.kW = std::int32_t(kW);
  a.groups = std::int32_t(G);
  a.H_out = std::int32_t(out[0]);
  a.W_out = std::int32_t(out[1]);
  a.stride_h = std::int32_t(s.stride[0]);
  a.stride_w = std::int32_t(s.stride[1]);
  a.pad_h = std::int32_t(pad_top[0]);
  a.pad_w = std::int32_t(pad_top[1]);
  a.dil_h = std::int32_t(s.dilation[0]);
  a.dil_w = std::int32_t(s.dilation[1]);
  return a;
}

Shape conv2d_output_shape(const Conv2dArgs& a, bool batched) {
  if (batched) return {a.N, a.C_out, a.H_out, a.W_out};
  return {a.C_out, a.H_out, a.W_out};
}

// ---------------------------------------------------------------- compute

void conv2d_forward(const Conv2dArgs& a, const Array& x, const Array& w, const Array* bias,
                    const Array& y) {
  if (y.size() == 0) return;
  Backend& b = y.backend();
  if (auto fast = native<NativeForward>(b, "conv2d_forward")) return fast(a, x, w, bias, y);
  const std::uint32_t flags = bias ? FM_CONV_BIAS : 0u;
  // Without a bias the kernel never reads buffer(2); bind any valid buffer there.
  const KernelArg bias_arg = bias ? buf(*bias) : buf(w);
  const std::int64_t cout_g = a.C_out / a.groups;
  if (cout_g <= 4) {
    // Few output channels per group (depthwise): a GEMM tile would be mostly idle rows.
    // (Not for a short K: MNIST conv1 took 28.2 us here on an H100, one load at a time per
    // thread, against the 32x64 GEMM's 11.1 us.)
    const std::string k = "conv2d_forward_direct";
    b.launch(k, direct_dispatch(b, k, std::int64_t(a.H_out) * a.W_out, a.C_out, a.N),
             {buf(x), buf(w), bias_arg, buf(y), bytes(&a, sizeof a), bytes(&flags, sizeof flags)});
    return;
  }
  if (const int m = winograd_choice(b, a, ConvPass::forward))
    return winograd_forward(b, m, a, x, w, bias_arg, flags, false, y);
  const std::int64_t cols = std::int64_t(a.N) * a.H_out * a.W_out;
  launch_gemm(b, "conv2d_forward", choose_tile(b, cout_g, cols, a.groups), a, cout_g, cols, 1,
              {buf(w), buf(x), bias_arg, buf(y)}, flags, a.groups);
}

void conv2d_backward_input(const Conv2dArgs& a, const Array& gy, const Array& w,
                           const Array& gx) {
  if (gx.size() == 0) return;
  Backend& b = gx.backend();
  if (auto fast = native<NativeBackwardInput>(b, "conv2d_backward_input"))
    return fast(a, gy, w, gx);
  const std::int64_t cin_g = a.C_in / a.groups;
  if (cin_g <= 4) {
    const std::string k = "conv2d_backward_input_direct";
    b.launch(k, direct_dispatch(b, k, std::int64_t(a.H) * a.W, a.C_in, a.N),
             {buf(gy), buf(w), buf(gx), bytes(&a, sizeof a)});
    return;
  }
  if (a.N > 0 && winograd_shape(a)) {
    const Conv2dArgs e = input_gradient_as_forward(a);
    if (const int m = winograd_choice(b, e, ConvPass::input_grad))
      return winograd_forward(b, m, e, gy, w, buf(w), 0, true, gx);
  }
  const std::int64_t cols = std::int64_t(a.N) * a.H * a.W;
  const GemmTile& tile = choose_tile(b, cin_g, cols, a.groups);
  const std::int64_t splits = input_grad_splits(b, a, tile, tile_count(tile, cin_g, cols, a.groups),
                                                gx.size());
  launch_split_gemm(b, "conv2d_backward_input", tile, a, cin_g, cols, splits, w, gy, gx);
}

bool conv2d_backward_weight(const Conv2dArgs& a, const Array& gy, const Array& x,
                            const Array& gw, const Array* gb) {
  if (a.N == 0) {
    fill_zero(gw);
    return false;
  }
  Backend& b = gw.backend();
  if (auto fast = native<NativeBackwardWeight>(b, "conv2d_backward_weight")) {
    fast(a, gy, x, gw);
    return false;
  }
  const std::int64_t cout_g = a.C_out / a.groups, cin_g = a.C_in / a.groups;
  if (cout_g * cin_g <= 4) {
    // Depthwise: a few weights per group, each a long dot product -> one group per weight.
    launch_reduce(b, "conv2d_backward_weight_reduce", a, gw.size(), gy, x, gw);
    return false;
  }
  const std::int64_t cols = cin_g * a.kH * a.kW;
  // (FASTMETAL_CONV_TILE, the tile tuning hook, forces the GEMM: an A/B switch.)
  if (cols <= FM_CONV_NARROW_COLS && forced_tile() < 0) {
    narrow_backward_weight(b, a, cols, gy, x, gw, gb);
    return gb != nullptr;
  }
  if (const int m = winograd_choice(b, a, ConvPass::weight_grad)) {
    winograd_backward_weight(b, m, a, gy, x, gw);
    return false;
  }
  const std::int64_t depth = std::int64_t(a.N) * a.H_out * a.W_out;
  // Split-K fills the GPU whatever the tile count, so discrete GPUs take the 128x128 tile
  // wherever the product has more than 64 rows (measured on an H100, ResNet-50's 1x1
  // 256 -> 1024 at 14x14: 25.1 TFLOP/s against 17.0 on 64x128, 17 splits), and split
  // until there is at least one wave of the tile's groups (MNIST conv2, 3 tiles of 64x128:
  // 128 splits 0.085 ms, 88 splits, half a wave, 0.093 ms; tools/sweeps/conv_wgrad_sweep.py on an
  // H100, BENCHMARKS.md). Other devices keep kFillGroups groups (not measured there).
  const bool discrete = forced_tile() < 0 && discrete_shapes(b);
  const GemmTile& tile = discrete && cout_g > 64 ? kTiles[kTile128x128]
                                                 : choose_tile(b, cout_g, cols, a.groups);
  const std::int64_t splits = split_count(tile, tile_count(tile, cout_g, cols, a.groups), depth,
                                          gw.size(), discrete ? wave_groups(tile) : kFillGroups,
                                          Fill::at_least);
  launch_split_gemm(b, "conv2d_backward_weight", tile, a, cout_g, cols, splits, gy, x, gw);
  return false;
}

void conv2d_backward_bias(const Conv2dArgs& a, const Array& gy, const Array& gb) {
  if (a.N == 0) return fill_zero(gb);
  Backend& b = gb.backend();
  if (auto fast = native<NativeBackwardBias>(b, "conv2d_backward_bias")) return fast(a, gy, gb);
  const std::int64_t hw = std::int64_t(a.H_out) * a.W_out;
  if (a.N == 1) return sum_rows_into(gy, a.C_out, hw, 1, gb);  // one image: already rows
  // One pass of per-channel chunk sums (metal/conv2d.metal's conv2d_bias_grad_chunks), then
  // each channel's chunks as one row of reduce.metal's compensated sum.
  const std::string k = "conv2d_bias_grad_chunks";
  const std::uint32_t t = group_threads(b, k, 1, 128);
  const std::int64_t per = std::int64_t(t) * 8;
  const std::int64_t chunks = (std::int64_t(a.N) * hw + per - 1) / per;
  Array ws = Array::empty(b, {a.C_out, chunks}, DType::float32);
  const std::uint32_t per32 = std::uint32_t(per);
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = std::uint32_t(chunks * t);
  d.grid[1] = std::uint32_t(a.C_out);
  b.launch(k, d, {buf(gy), buf(ws), bytes(&a, sizeof a), bytes(&per32, sizeof per32)});
  sum_rows_into(ws, a.C_out, chunks, 1, gb);
}

}  // namespace fm
