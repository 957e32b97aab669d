// Argument blocks of the training kernels (metal/training.metal), shared by the host
// (csrc/ops/training.cpp) and the kernels. Fixed-width fields only, 8-byte fields first.
#pragma once

// max_pool2d over planes (N * C) of H x W, output OH x OW; padded taps are skipped (as -inf).
struct PoolArgs {
  int32_t planes;
  int32_t h, w, oh, ow;
  int32_t kh, kw, sh, sw, ph, pw;
  // max_pool2d_backward_cells: 1 where fastmetal.compile's fusion pass (csrc/ops/
  // capture_fusion.cpp) folded relu's gradient into it (x is relu's output): the gradient
  // reaches the winner only where it is > 0, relu_grad's rule. 0 from the host.
  int32_t relu_mask;
};

// Rows of a softmax: the reduced axis has n elements at stride `inner`; thread (o, x) owns the
// row starting at o * n * inner + x.
struct SoftmaxRowArgs {
  int32_t outer, n, inner, pad_;
};

// cross_entropy: `rows` rows of `classes` contiguous logits; grad = (softmax - onehot) * inv_rows.
struct CrossEntropyArgs {
  int32_t rows, classes;
  float inv_rows;
  int32_t pad_;
};
// cross_entropy_mean runs as one threadgroup of this many threads (a fixed count: the sum's
// order, so its bits, must not depend on the device's preferred group size).
enum : uint32_t { kCrossEntropyMeanThreads = 256u };

// dropout: element i keeps its value (times `scale`) where the 24 high bits of word i % 4 of
// Philox-4x32-10(counter = (i / 4, 0, 0, 0), key = (key0, key1)) are >= threshold.
struct DropoutArgs {
  uint32_t key0, key1;
  uint32_t threshold;  // ceil(p * 2^24)
  float scale;         // 1 / (1 - p) in float32, as PyTorch
  uint32_t n;          // elements
  uint32_t quads;      // 1: x and out start 16-byte aligned (whole quads as float4s)
};

// One optimizer update of n parameters, in place (formulas of torch.optim; see training.metal).
struct OptimArgs {
  uint32_t n;
  int32_t first;     // SGD: the momentum buffer is created from this step's gradient
  int32_t nesterov;  // SGD
  float lr, weight_decay;
  float momentum, dampening;               // SGD
  float beta1, beta2, eps;                 // Adam (eps also Adadelta)
  float step_size, sqrt_bias2;             // Adam: lr / (1 - beta1^t), sqrt(1 - beta2^t)
  float rho;                               // Adadelta
  float pad_;
};

// One launch updates up to FM_OPTIM_SLOTS tensors of an optimizer (a multi-tensor step, as
// torch's foreach optimizers): slot k binds buffers 4k..4k+3 (param, grad, state1, state2)
// and owns the threads [start[k], start[k + 1]); unused slots have start[k] = start[count]
// (empty). 3 slots: 12 buffers and this block fit CUDA's 16 launch arguments (Metal: 31).
#define FM_OPTIM_SLOTS 3
struct OptimMultiArgs {
  uint32_t count;                        // slots in use, 1..FM_OPTIM_SLOTS
  uint32_t start[FM_OPTIM_SLOTS + 1];    // start[count] = the launch's threads
  uint32_t pad_[3];
  OptimArgs slot[FM_OPTIM_SLOTS];        // each slot's hyper-parameters (its n unused)
};
