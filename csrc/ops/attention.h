// Fused scaled-dot-product attention (metal/attention_forward.metal, attention_backward.metal,
// attention_common.h; attention_args.h): the forward saves the per-row logsumexp, the backward
// recomputes the scores tile by tile. No L x S matrix is ever allocated. A backend may serve
// both through its native ops "sdpa_forward" and "sdpa_backward" (same arguments, same
// results).
#pragma once
#include <cstdint>
#include <vector>

#include "attention_args.h"
#include "core/array.h"

namespace fm {

struct SdpaOptions {
  int mask_kind = FM_SDPA_MASK_NONE;  // FM_SDPA_MASK_*; the mask is a float32 Array
  bool causal = false;
  double scale = -1.0;                // < 0: 1 / sqrt(E)
  std::uint32_t threshold = 0;        // dropout (as fastmetal.dropout's key): 0 = none
  float drop_scale = 1.0f;
  std::uint32_t key0 = 0, key1 = 0;
};

// Whether the kernels read x as it is: rows contiguous (last stride 1), no negative stride.
// Other layouts are copied first (the bindings do it).
bool sdpa_layout_ok(const Array& x);

// q (..., L, E), k (..., S, E), v (..., S, Ev): sdpa_layout_ok, all float32 or all float16, batch
// dims broadcast against each other and the mask's (..., Lm, Sm) with Lm in {1, L}, Sm in
// {1, S}. Returns {out (batch..., L, Ev) of q's dtype, laid out in memory as q is, lse
// (batch..., L) float32 contiguous} over the broadcast batch shape.
std::vector<Array> sdpa_forward(const Array& q, const Array& k, const Array& v,
                                const Array* mask, const SdpaOptions& o);

// The gradients of out with respect to q, k and v given grad_out (out's shape and dtype) and
// the forward's out and lse: {dq, dk, dv}, each over the full broadcast batch shape
// (batch..., L | S, E | Ev) in q's dtype, each laid out as its input is; a caller whose k or v
// was broadcast sums dk or dv over the broadcast dims.
std::vector<Array> sdpa_backward(const Array& grad_out, const Array& q, const Array& k,
                                 const Array& v, const Array* mask, const Array& out,
                                 const Array& lse, const SdpaOptions& o);

}  // namespace fm
