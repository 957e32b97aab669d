// Argument blocks of the normalization and softmax kernels (metal/normalization.metal),
// shared by the host (csrc/ops/normalization.cpp, the CPU fast paths) and the kernels.
// Fixed-width fields only. Inputs are contiguous; statistics are float32 whatever the dtype.
#pragma once

// RowNormArgs::flags and BatchNormArgs::flags.
enum : uint32_t {
  kNormRms = 1u,       // rms_norm: no mean (mean = 0), rstd = 1 / sqrt(mean(x^2) + eps)
  kNormWeight = 2u,    // a weight is bound
  kNormBias = 4u,      // a bias is bound
  kNormTraining = 8u,  // batch_norm: batch statistics (else the running ones)
  kNormRunning = 16u,  // batch_norm, training: write the updated running statistics
};

// layer_norm / rms_norm / group_norm: `rows` rows of n contiguous elements, normalised each
// by its own mean and rstd. Element i of row r takes weight[(r % groups) * group_ch +
// i / spatial] (layer_norm: groups 1, group_ch n, spatial 1, so weight[i]; group_norm over
// (N, C, S): rows N * G of n = (C / G) * S, group_ch = C / G, spatial S, so weight[channel]).
struct RowNormArgs {
  uint32_t rows, n;
  uint32_t groups, group_ch, spatial;
  uint32_t flags;
  float eps;
};

// The weight and bias gradients of the row norms, over the input viewed as (outer, C, S):
// dweight[c] = sum over (a, s) of g * (x - mean[st]) * rstd[st], dbias[c] = sum of g, with
// st = a * groups + c / group_ch (layer_norm: outer = rows, C = n, S = 1, groups 1,
// group_ch n). The outer rows are cut into `chunks` chunks of `chunk_rows` (a function of
// the shape only): a first launch writes one partial per (chunk, c), a second adds the
// chunks in order, so the result's bits do not depend on the device's threads.
struct AffineGradArgs {
  uint32_t outer, C, S;
  uint32_t groups, group_ch;
  uint32_t chunks, chunk_rows;
  uint32_t flags;  // kNormRms: mean is 0
};

// batch_norm over (N, C, S): channel c's statistics are over the count = N * S elements
// x[(n * C + c) * S + s]. Running statistics are updated as PyTorch: (1 - momentum) * old +
// momentum * batch, with the unbiased variance (sum of squared deviations / (count - 1)).
struct BatchNormArgs {
  uint32_t N, C, S;
  uint32_t flags;
  float eps, momentum;
};

// softmax / log_softmax / logsumexp along an axis of n elements at stride `inner`:
// (outer, n, inner) contiguous. mode: 0 softmax, 1 log_softmax, 2 logsumexp (one value per
// (outer, inner), written contiguously).
struct SoftmaxArgs {
  uint32_t outer, n, inner;
  uint32_t mode;
};

enum : uint32_t { kSoftmax = 0u, kLogSoftmax = 1u, kLogSumExp = 2u };
