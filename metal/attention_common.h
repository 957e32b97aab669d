// What the fused attention kernels share: attention_forward.metal (the forwards) and
// attention_backward.metal (the backwards) include this header for the operands' offsets,
// the masking, the dropout, the score and load helpers and the causal pairing of the tiled
// kernels. Its comment is the design both files follow; theirs describe their kernels.
//
// Fused scaled-dot-product attention, forward and backward (attention_args.h):
//   O = softmax(Q K^T * scale + mask) V   per batch index, with an optional boolean or additive
// mask, PyTorch's top-left causal mask and dropout on the attention weights. The L x S score
// matrix never reaches device memory: tiles of it live in registers and threadgroup memory, the
// softmax is the online one (running max m and sum l per row, the partial output rescaled by
// exp(m_old - m_new) when the max grows), and the forward saves lse = m + log(l) per row, so the
// backward recomputes P = exp(s - lse) tile by tile (FlashAttention-2). Memory is O(L + S) per
// batch index beyond the inputs and outputs.
//
// Every operand is read or written through its own batch and row strides (attention_args.h),
// rows contiguous: head-split views and outputs laid out like the inputs cost no copy.
//
// Written for Apple GPUs first: 32-wide simdgroups (NVIDIA's warps are as wide, and the CUDA
// shim maps simd_max / simd_sum to warp shuffles, threadgroup arrays to __shared__ and the
// barriers to __syncthreads / __syncwarp; the CPU emulator runs 32 lanes), at most 32 KiB of
// threadgroup memory per group (what the DMAX = 64 tiles nearly fill), float32
// accumulation (float16 inputs are widened when staged). Head dims up to 128; the instances
// are sized for DMAX = 64 (every head dim <= 64, the fast case) and DMAX = 128. Loops run to
// the actual head dims, tiles are zero-padded to a multiple of 4 columns so rows are read as
// float4.
//
// Causal, the tiled kernels give each group two tiles, t and the mirror one (equal work:
// sdpa_tile_passes).
//
// Masking: a masked-out score is -inf. A row whose every score is -inf (a boolean mask with no
// True in the row, -inf additive entries only, or S = 0) has l = 0: its output is 0 and its
// lse -inf, so its P is 0 in the backward (no gradient), as PyTorch 2.13 answers (its SDPA
// gives 0 for such rows, not the NaN of a plain softmax; checked on 2.13.0). Dropout:
// the kept probabilities are scaled by 1 / (1 - p) before they meet V; l sums the undropped
// ones; the mask is a pure function of the score's flat index (attention_args.h).
#pragma once
#include <metal_stdlib>
#include "fm_kernel.h"
#include "philox.h"
#include "attention_args.h"
using namespace metal;

// Element offset of batch index b in operand `which` (FM_SDPA_Q ...; attention_args.h).
FM_FUNC uint64_t sdpa_offset(constant SdpaArgs& a, int32_t b, int32_t which) {
  int64_t off = 0;
  int32_t rest = b;
  for (int32_t d = a.batch_dims - 1; d >= 0; --d) {
    const int32_t i = rest % a.batch_shape[d];
    rest /= a.batch_shape[d];
    off += int64_t(i) * a.bs[which][d];
  }
  return uint64_t(off);
}

// Element offset of batch index b in the mask.
FM_FUNC uint64_t sdpa_mask_offset(constant SdpaArgs& a, int32_t b) {
  int64_t off = 0;
  int32_t rest = b;
  for (int32_t d = a.batch_dims - 1; d >= 0; --d) {
    const int32_t i = rest % a.batch_shape[d];
    rest /= a.batch_shape[d];
    off += int64_t(i) * a.m_bs[d];
  }
  return uint64_t(off);
}

// Element offset of row i of operand `which` in batch index b (its columns follow).
FM_FUNC uint64_t sdpa_row(constant SdpaArgs& a, uint64_t batch_off, int32_t which, int32_t i) {
  return batch_off + uint64_t(i) * uint64_t(a.rs[which]);
}

// The scaled score s of (row i, key j) with the masks applied: -inf where the key is out of
// range, above the diagonal (causal) or masked out; the additive mask added. Rows past L are
// padding and never read the mask.
FM_FUNC float sdpa_masked(constant SdpaArgs& a, device const float* mask, uint64_t mo, int32_t i,
                          int32_t j, float s) {
  if (j >= a.S || i >= a.L || (a.causal != 0 && j > i)) return -INFINITY;
  if (a.mask_kind != FM_SDPA_MASK_NONE) {
    const float mv = mask[mo + uint64_t(int64_t(i) * a.m_rs + int64_t(j) * a.m_cs)];
    if (a.mask_kind == FM_SDPA_MASK_BOOL) return mv != 0.0f ? s : -INFINITY;
    return s + mv;
  }
  return s;
}

// The dropout factor of score (b, i, j): 0 (dropped) or drop_scale; 1 without dropout.
FM_FUNC float sdpa_keep(constant SdpaArgs& a, int32_t b, int32_t i, int32_t j) {
  if (a.threshold == 0u) return 1.0f;
  const uint64_t n = (uint64_t(b) * uint64_t(a.L) + uint64_t(i)) * uint64_t(a.S) + uint64_t(j);
  uint32_t r[4];
  philox4x32_10(uint32_t(n >> 2), uint32_t(n >> 34), 0u, 0u, a.key0, a.key1, r);
  return (r[uint32_t(n & 3u)] >> 8) >= a.threshold ? a.drop_scale : 0.0f;
}

// s + q . k over 4 columns, in one fixed order (the forward and both backward kernels form
// the same score bit for bit, so P = exp(s - lse) <= 1 in the backward).
FM_FUNC float sdpa_dot4(float4 q, float k0, float k1, float k2, float k3, float s) {
  s = fma(q.x, k0, s);
  s = fma(q.y, k1, s);
  s = fma(q.z, k2, s);
  return fma(q.w, k3, s);
}

// Component u of v (portable: no subscripts on vectors).
FM_FUNC float sdpa_comp(float4 v, int32_t u) {
  return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w;
}

// Four consecutive elements p[base + c .. + 3] widened to float, scaled, zero from column n on.
template <typename T>
FM_FUNC float4 sdpa_load4(device const T* p, uint64_t base, int32_t c, int32_t n, float scale) {
  return float4(c < n ? float(p[base + uint64_t(c)]) * scale : 0.0f,
                c + 1 < n ? float(p[base + uint64_t(c + 1)]) * scale : 0.0f,
                c + 2 < n ? float(p[base + uint64_t(c + 2)]) * scale : 0.0f,
                c + 3 < n ? float(p[base + uint64_t(c + 3)]) * scale : 0.0f);
}

// p[i .. i + 3] as one 16-byte load (float32: i and p 16-byte aligned, SdpaArgs::quads);
// float16 never takes this road (the host leaves quads 0), it reads the 4 elements.
FM_FUNC float4 sdpa_quad(device const float* p, uint64_t i) {
  return *((device const float4*)(p + i));
}
FM_FUNC float4 sdpa_quad(device const half* p, uint64_t i) {
  return float4(float(p[i]), float(p[i + 1]), float(p[i + 2]), float(p[i + 3]));
}

// sdpa_load4, with one 16-byte load where the host found every row aligned (quads: n % 4 == 0,
// so a quad that starts before n ends there; one from n on is zeros, as sdpa_load4 gives).
// The same values either way.
template <typename T>
FM_FUNC float4 sdpa_load4q(device const T* p, uint64_t base, int32_t c, int32_t n, float scale,
                           bool quads) {
  if (quads && c < n) return sdpa_quad(p, base + uint64_t(c)) * scale;
  return sdpa_load4(p, base, c, n, scale);
}

// Causal load balance of the tiled kernels: tile t of nt sees about t + 1 tiles of the other
// side (or nt - t), so with causal the grid has ceil(nt / 2) groups and group t takes tile t
// and tile nt - 1 - t in turn (one pass where they coincide); otherwise one tile each.
FM_FUNC int32_t sdpa_tile_passes(constant SdpaArgs& a, int32_t nt, int32_t t) {
  return a.causal != 0 && nt - 1 - t != t ? 2 : 1;
}
FM_FUNC int32_t sdpa_tile_pass(int32_t nt, int32_t t, int32_t pass) {
  return pass == 0 ? t : nt - 1 - t;
}
