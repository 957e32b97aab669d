// Argument block of the conv2d kernels, shared by the host (csrc/conv2d*.cpp, the CPU
// algorithms) and the MSL kernels, so the two cannot drift. Fixed-width fields only.
// Layout: input (N, C_in, H, W), weight (C_out, C_in/groups, kH, kW), output
// (N, C_out, H_out, W_out), all contiguous float32. pad_h / pad_w are the top / left
// padding; the bottom / right padding is whatever H_out / W_out imply (so "same" with an
// even kernel, which pads one more at the bottom/right as PyTorch does, needs no extra field).
#pragma once

// The `flags` word of the conv2d GEMM, direct and Winograd-output kernels. FM_CONV_BIAS: add
// bias[channel]. The other two, Winograd output transform only, are set only by
// fastmetal.compile's fusion pass (csrc/ops/capture_fusion.cpp), which folds the elementwise
// launch that followed into the kernel: FM_CONV_RELU applies relu to the result (fm_relu:
// what the relu launch computed), FM_CONV_RELU_MASK multiplies it by relu's gradient mask:
// the result where the `bias` buffer, which then holds relu's output of the output's shape,
// is > 0, else 0 (relu_grad's rule, the elementwise table's). Both give what the two
// launches gave, bit for bit. (The GEMM forward's relu is its `_relu` instances instead.)
#define FM_CONV_BIAS 1u
#define FM_CONV_RELU 2u
#define FM_CONV_RELU_MASK 4u

// Weight gradients of the Winograd paths: outputs (C_out x C_in pairs) per threadgroup of the
// last step, conv2d_winograd{,4}_weight_grad (metal/conv_winograd.metal).
#define FM_WINOGRAD_WGRAD_OUTPUTS 32
// Forward passes of the Winograd paths: tiles per threadgroup of the last step,
// conv2d_winograd{,4}_output.
#define FM_WINOGRAD_OUT_TILES 32

// Weight gradients of layers with few weights per output channel (C_in/groups * kH * kW at
// most FM_CONV_NARROW_COLS: first layers), conv2d_backward_weight_narrow: output channels
// per threadgroup (one a lane), runs of positions per chunk of K, and positions per run.
#define FM_CONV_NARROW_COLS 16
#define FM_CONV_NARROW_LANES 32
#define FM_CONV_NARROW_RUNS 4
#define FM_CONV_NARROW_RUN 16

struct Conv2dArgs {
  int32_t N, C_in, H, W;
  int32_t C_out, kH, kW, groups;
  int32_t H_out, W_out, stride_h, stride_w;
  int32_t pad_h, pad_w, dil_h, dil_w;
};
