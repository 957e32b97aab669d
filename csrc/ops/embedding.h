// The embedding lookup (a gather of weight rows), its gradient (a deterministic device-side
// scatter-add: metal/embedding.metal) and one_hot, with PyTorch's semantics. Ids are int64
// Arrays; the bindings (python/index_bindings.cpp) convert NumPy integer arrays.
#pragma once
#include <cstdint>

#include "core/array.h"
#include "embedding_args.h"

namespace fm {

// weight[ids]: ids.shape + (embedding_dim,), weight's dtype. IndexError-style ValueError
// where an id is outside [0, num_embeddings) (read on the host: one copy of the ids). While a
// step is recorded for replay (fastmetal.compile) the kernels check the ids too: a row of
// NaN for an out-of-range id (the backward adds nothing for it).
Array embedding(const Array& ids, const Array& weight);
// The gradient of `weight`: (num_embeddings, dim) float32, grad_output (ids.shape + (dim,))
// summed into the rows its ids name, padding_idx's row zero (padding_idx -1: none).
Array embedding_backward(const Array& grad_output, const Array& ids, std::int64_t num_embeddings,
                         std::int64_t padding_idx);
// ids.shape + (num_classes,) int64; num_classes -1: max(ids) + 1.
Array one_hot(const Array& ids, std::int64_t num_classes);

}  // namespace fm
