// Argument block of the fused attention kernels (metal/attention_forward.metal and
// attention_backward.metal), shared with the host (csrc/ops/attention.cpp) and the CPU fast
// path (csrc/backend/cpu/isa/attention.cpp).
//
// softmax(Q K^T * scale + mask) V per batch index b of the broadcast batch shape: Q (L, E),
// K (S, E), V (S, Ev). Every operand X (the inputs, the output O, the backward's dO, dQ, dK,
// dV) is addressed by element strides: row i of batch index b starts at
// sum_d idx_d * x_bs[d] + i * x_rs (x_bs[d] = 0 where X is broadcast along d), its columns
// are contiguous. So head-split views such as (N, T, H, D) seen as (N, H, T, D) need no copy,
// and the outputs can be laid out as the inputs are. b decomposes over batch_shape, last
// dimension fastest. lse and the backward's delta are contiguous (nbatch, L).
//
// The mask is float32; element (b, i, j) at its batch offset + i * m_rs + j * m_cs (0 where
// broadcast). mask_kind: none, boolean (0 masks the score out, anything else keeps it, as
// PyTorch's True = takes part) or additive (added to the scaled score).
//
// Dropout (threshold > 0): score (b, i, j) has flat index n = (b * L + i) * S + j in the
// (nbatch, L, S) attention matrix and is kept where the high 24 bits of word n % 4 of
// Philox-4x32-10(counter = (n / 4 mod 2^32, n / 2^34, 0, 0), key = (key0, key1)) are
// >= threshold: the mask fastmetal.dropout would draw for that matrix (its counter is
// (n / 4, 0, 0, 0) below 2^34 elements), so every device keeps the same scores.
#pragma once

#define FM_SDPA_MAX_BATCH_DIMS 6
#define FM_SDPA_MAX_HEAD_DIM 128

#define FM_SDPA_MASK_NONE 0
#define FM_SDPA_MASK_BOOL 1
#define FM_SDPA_MASK_ADD 2

// The operands' strides, indexed by these.
#define FM_SDPA_Q 0
#define FM_SDPA_K 1
#define FM_SDPA_V 2
#define FM_SDPA_O 3   // the output (written by the forward)
#define FM_SDPA_G 4   // dO (read by the backward)
#define FM_SDPA_DQ 5
#define FM_SDPA_DK 6
#define FM_SDPA_DV 7
#define FM_SDPA_OPERANDS 8

struct SdpaArgs {
  int64_t bs[FM_SDPA_OPERANDS][FM_SDPA_MAX_BATCH_DIMS];  // batch strides per operand
  int64_t rs[FM_SDPA_OPERANDS];                          // row strides per operand
  int64_t m_bs[FM_SDPA_MAX_BATCH_DIMS];
  int64_t m_rs, m_cs;                       // mask row / column strides (0 or its own)
  int32_t batch_shape[FM_SDPA_MAX_BATCH_DIMS];
  int32_t batch_dims, nbatch;
  int32_t L, S, E, Ev;
  int32_t mask_kind, causal;                // causal: key j takes part in row i iff j <= i
  float scale;                              // applied to Q K^T before the mask
  uint32_t threshold;                       // dropout: ceil(p * 2^24); 0 = no dropout
  float drop_scale;                         // 1 / (1 - p) in float32, as fastmetal.dropout
  uint32_t key0, key1;
  // 1 where Q, K, V and (backward) dO are float32 with E and Ev multiples of 4 and every row
  // and batch stride and start 16-byte aligned: the tiled kernels stage rows as float4 loads.
  int32_t quads;
};
