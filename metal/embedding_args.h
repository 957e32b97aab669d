// Argument block of the embedding and one_hot kernels (metal/embedding.metal), shared with
// the host (csrc/ops/embedding.cpp). Fixed-width fields only, 8-byte fields first.
#pragma once

// Positions per block of the gradient's radix sort (one threadgroup's share).
#define FM_SORT_BLOCK 256
// Buckets per pass of the radix sort: 8 bits of the key.
#define FM_SORT_DIGITS 256

struct EmbeddingArgs {
  int64_t classes;      // one_hot: the classes per position
  int64_t limit;        // embedding: the weight's rows; an id outside [0, limit) is out of range
  int64_t fill;         // embedding_forward: the bits written for an out-of-range id (NaN)
  int32_t n;            // positions (ids)
  int32_t rows;         // rows of the weight (num_embeddings)
  int32_t dim;          // embedding_dim
  int32_t blocks;       // ceil(n / FM_SORT_BLOCK)
  int32_t shift;        // this pass's digit: (key >> shift) & (FM_SORT_DIGITS - 1)
  int32_t padding_idx;  // the row that gets no gradient, or -1
};
