// Normalization and softmax ops (metal/normalization.metal): layer_norm / rms_norm,
// group_norm, batch_norm, softmax / log_softmax / logsumexp, and their backward passes.
//
// Data arrays are contiguous float32 or float16 (computed in float32, statistics saved as
// float32); weight, bias and running statistics are contiguous float32 of their length
// (csrc/python/normalization_bindings.cpp converts the caller's arrays). Each op validates
// shapes and raises ValueError "[fastmetal.<op>] expected ..., got ..." before any work.
// A backend's fast path (native op) is used where it has one: it takes float32 data, so
// float16 is converted around it.
#pragma once
#include <cstdint>
#include <vector>

#include "core/array.h"

namespace fm {

// layer_norm (rms = false) or rms_norm (rms = true) over the last `norm_dims` axes of x.
// weight, bias: nullptr or `prod(x.shape[-norm_dims:])` floats (rms: bias must be null).
// Returns {y, mean, rstd}, mean and rstd of shape x.shape[:-norm_dims] (mean is 0 for rms).
std::vector<Array> layer_norm(const Array& x, std::int64_t norm_dims, const Array* weight,
                              const Array* bias, double eps, bool rms);
// {dx, dweight, dbias} from the forward's saved mean and rstd; dweight / dbias only where
// `affine` (else empty Arrays), summed over the rows in an order fixed by the shape.
std::vector<Array> layer_norm_backward(const Array& grad, const Array& x, std::int64_t norm_dims,
                                       const Array* weight, const Array& mean,
                                       const Array& rstd, bool rms, bool affine);

// group_norm of x (N, C, *) with `groups` groups; weight, bias: nullptr or C floats.
// Returns {y, mean, rstd}, mean and rstd of shape (N, groups).
std::vector<Array> group_norm(const Array& x, std::int64_t groups, const Array* weight,
                              const Array* bias, double eps);
std::vector<Array> group_norm_backward(const Array& grad, const Array& x, std::int64_t groups,
                                       const Array* weight, const Array& mean,
                                       const Array& rstd, bool affine);

// batch_norm of x (N, C) or (N, C, *). training: batch statistics, and running_mean /
// running_var (when given: C floats) are written with the update, in place; else the running
// statistics normalise (both required). Returns {y, save_mean, save_rstd} (C floats each:
// the statistics used, for the backward).
std::vector<Array> batch_norm(const Array& x, const Array* weight, const Array* bias,
                              const Array* running_mean, const Array* running_var,
                              bool training, double momentum, double eps);
// {dx, dweight, dbias} (dweight, dbias: C floats). training: through the batch statistics;
// else y is affine in x.
std::vector<Array> batch_norm_backward(const Array& grad, const Array& x, const Array* weight,
                                       const Array& save_mean, const Array& save_rstd,
                                       bool training);

// mode: 0 softmax, 1 log_softmax along `axis` (already in [0, ndim)); x float32 / float16.
Array softmax(const Array& x, std::int64_t axis, std::uint32_t mode);
// From the forward's output y.
Array softmax_backward(const Array& grad, const Array& y, std::int64_t axis,
                       std::uint32_t mode);
// log(sum(exp(x))) over `axes` (sorted, distinct, in range; empty = no reduction is not
// allowed: the caller passes all axes for None), in x's dtype; keepdims as NumPy.
Array logsumexp(const Array& x, const std::vector<int>& axes, bool keepdims);

}  // namespace fm
