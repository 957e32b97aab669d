// Launches of the training kernels (metal/training.metal) on fm::Arrays: max pooling,
// dropout, cross-entropy and optimizer updates; and gradient clipping (metal/grad_clip.metal).
// Arguments are validated before these are called (python/fastmetal/training.py and
// csrc/python/training_py.cpp); every Array here is contiguous and float32 (the clipping's
// gradients: float16, float32 or float64). Log-softmax and the ReLU backward are ops of their own in
// training.cpp, declared to Python there (FM_PYTHON_OP).
#pragma once
#include <cstdint>
#include <vector>

#include "core/array.h"
#include "grad_clip_args.h"
#include "training_args.h"

namespace fm {

// x: (planes, H, W) -> out: (planes, OH, OW) (a.planes ... a.pw filled by the caller).
void launch_max_pool2d(const Array& x, const PoolArgs& a, const Array& out);
void launch_max_pool2d_backward(const Array& grad_out, const Array& x, const PoolArgs& a,
                                const Array& grad_in);

// out = x * scale where kept, else 0 (also the backward, applied to the gradient).
void launch_dropout(const Array& x, const DropoutArgs& a, const Array& out);

// labels: a.rows contiguous int64 values (outside [0, classes): NaN, see the kernel).
void launch_cross_entropy(const Array& logits, const Array& labels, const CrossEntropyArgs& a,
                          const Array& loss, const Array& grad);

// One tensor of an optimizer's update: param and its state updated in place with args
// (args.n = its elements); state2 unused (may be null) for sgd.
struct OptimTensor {
  const Array* param;
  const Array* grad;
  const Array* state1;
  const Array* state2;
  OptimArgs args;
};

// kind: "sgd" (state1 = momentum buffer), "adam" (exp_avg, exp_avg_sq), "adadelta"
// (square_avg, acc_delta). Every tensor updated, FM_OPTIM_SLOTS of them per launch, in
// order (a multi-tensor step: one launch instead of one per parameter).
void launch_optimizer(const char* kind, const std::vector<OptimTensor>& tensors);

// Gradient clipping (metal/grad_clip.metal), several gradients per launch. grads: contiguous
// float16 / float32 / float64 Arrays on total's device (empty ones add nothing). Writes the
// total norm of them all (mode FM_GRAD_NORM_*; p and a.inv_p for FM_GRAD_NORM_POW) into the
// float32 0-d `total` and the factor min(a.max_norm / (total + 1e-6), 1) into the float32
// 1-element `scale`, without a host read (a.parts is filled here).
void launch_grad_norm(const std::vector<Array>& grads, float p, GradNormFinishArgs a,
                      const Array& total, const Array& scale);
// Every gradient times scale[0], in place (FM_GRAD_SLOTS per launch).
void launch_grad_scale(const std::vector<Array>& grads, const Array& scale);

}  // namespace fm
