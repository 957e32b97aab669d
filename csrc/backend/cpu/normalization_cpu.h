// The CPU algorithms of the normalization and softmax ops (the cpu backend's native ops
// "row_norm_*", "batch_norm_*", "softmax_*", registered in normalization_cpu.cpp; same
// formulas as metal/normalization.metal), compiled per ISA in isa/normalization.cpp.
// Contiguous float32 in host memory; weight, bias and running statistics may be null where
// the flags say so. Deterministic: the bits do not depend on the thread count.
#pragma once
#include <cstdint>

#include "normalization_args.h"

namespace fm::cpu {

void row_norm_forward(const RowNormArgs& a, const float* x, const float* w, const float* b,
                      float* y, float* mean, float* rstd);
// dw, db: null, or the weight's length (groups * group_ch) each.
void row_norm_backward(const RowNormArgs& a, const float* g, const float* x, const float* w,
                       const float* mean, const float* rstd, float* dx, float* dw, float* db);
void batch_norm_forward(const BatchNormArgs& a, const float* x, const float* w, const float* b,
                        const float* rm, const float* rv, float* y, float* save_mean,
                        float* save_rstd, float* new_mean, float* new_var);
void batch_norm_backward(const BatchNormArgs& a, const float* g, const float* x, const float* w,
                         const float* mean, const float* rstd, float* dx, float* dw, float* db);
void softmax_forward(const SoftmaxArgs& a, const float* x, float* out);
void softmax_backward(const SoftmaxArgs& a, const float* g, const float* y, float* dx);

}  // namespace fm::cpu
