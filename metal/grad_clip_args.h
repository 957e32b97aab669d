// Argument blocks of the gradient-clipping kernels (metal/grad_clip.metal), shared by the
// host (csrc/ops/training.cpp, the CPU's csrc/backend/cpu/grad_clip_cpu.cpp) and the
// kernels. Fixed-width fields only.
#pragma once

// The partition that makes the norm deterministic: a gradient is cut into chunks of
// FM_GRAD_CHUNK elements (the last one shorter); lane l of a chunk sums its elements
// l, l + FM_GRAD_LANES, ... in that order, the lanes are combined by a fixed pairwise tree,
// and the chunks' partials again by lanes and the same tree. Nothing depends on the
// device, the threadgroup size or the CPU's thread count.
#define FM_GRAD_CHUNK 4096
#define FM_GRAD_LANES 256

// Up to FM_GRAD_SLOTS gradients per launch: 14 gradient buffers, one more buffer and the
// argument block fit CUDA's 16 launch arguments (Metal: 31).
#define FM_GRAD_SLOTS 14

// What a chunk sums: |g|^2 (p = 2), |g| (p = 1), |g|^p (any other p), or the largest |g|
// (p = inf; NaN wins).
#define FM_GRAD_NORM_SQUARE 0u
#define FM_GRAD_NORM_ABS 1u
#define FM_GRAD_NORM_POW 2u
#define FM_GRAD_NORM_MAX 3u

// grad_norm_parts: slot k reads its n[k] elements and owns the launch's chunks
// [chunk_start[k], chunk_start[k + 1]); its first chunk's partial goes to pair
// part_at[k] of the parts buffer (parts[2j], parts[2j + 1]: a sum as hi + lo, or a max
// and 0). Unused slots have chunk_start[k] = chunk_start[count].
struct GradNormPartsArgs {
  uint32_t count;  // slots in use, 1..FM_GRAD_SLOTS
  uint32_t mode;   // FM_GRAD_NORM_*
  float p;         // FM_GRAD_NORM_POW's exponent
  uint32_t pad_;
  uint32_t chunk_start[FM_GRAD_SLOTS + 1];
  uint32_t n[FM_GRAD_SLOTS];
  uint32_t part_at[FM_GRAD_SLOTS];
  uint32_t pad2_;
};

// grad_norm_finish: the `parts` pairs combined into the total norm (the root taken: sqrt for
// p = 2, pow(., inv_p) for FM_GRAD_NORM_POW) and the clipping factor
// min(max_norm / (total + 1e-6), 1) (NaN where the total is NaN).
struct GradNormFinishArgs {
  uint32_t parts;
  uint32_t mode;
  float inv_p;
  float max_norm;
};

// grad_scale_multi: every element of the slots' gradients times the factor in scale[0] (in
// the gradient's dtype: float16 gradients multiply by the factor rounded to float16);
// slot k owns the threads [start[k], start[k + 1]).
struct GradScaleArgs {
  uint32_t count;
  uint32_t start[FM_GRAD_SLOTS + 1];
};
