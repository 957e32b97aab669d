#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "backend/env_config.h"
#include "backend/native_ops.h"
#include "core/errors.h"
#include "ops/array_arg.h"

namespace fm {
namespace {

using i64 = std::int64_t;
constexpr const char* kOp = "scaled_dot_product_attention";
constexpr i64 kMaxI32 = std::numeric_limits<std::int32_t>::max();

Shape leading(const Shape& s, std::size_t keep_last) {
  return Shape(s.begin(), s.end() - std::ptrdiff_t(keep_last));
}

Shape with_tail(const Shape& batch, std::initializer_list<i64> tail) {
  Shape s = batch;
  for (i64 t : tail) s.push_back(t);
  return s;
}

// Strides of an operand along the nd broadcast batch dims (its own dims right-aligned), 0
// where it has size 1 or lacks the dim.
std::vector<i64> batch_strides(const Array& x, std::size_t nd, std::size_t tail) {
  std::vector<i64> out(nd, 0);
  const std::size_t own = x.shape.size() - tail;
  for (std::size_t t = 0; t < own; ++t) {
    const std::size_t src = own - 1 - t, dst = nd - 1 - t;
    out[dst] = x.shape[src] == 1 ? 0 : x.strides[src];
  }
  return out;
}

// The mask's batch strides (contiguous, its shape padded to (..., Lm, Sm)).
std::vector<i64> mask_strides(const Shape& ms, std::size_t nd) {
  std::vector<i64> out(nd, 0);
  i64 stride = ms[ms.size() - 2] * ms[ms.size() - 1];
  for (std::size_t t = 0; t + 2 < ms.size(); ++t) {
    const std::size_t src = ms.size() - 3 - t, dst = nd - 1 - t;
    out[dst] = ms[src] == 1 ? 0 : stride;
    stride *= ms[src];
  }
  return out;
}

struct Plan {
  SdpaArgs a{};
  Shape batch;  // the broadcast batch shape (as the outputs have it)
  Shape mask_shape;
};

// Checks the operands and works out the broadcast batch shape and the scalar arguments; the
// strides are filled by set_strides once the outputs exist.
Plan make_plan(const Array& q, const Array& k, const Array& v, const Array* mask,
               const SdpaOptions& o) {
  for (const auto& [name, x] : {std::pair<const char*, const Array*>{"query", &q}, {"key", &k},
                                {"value", &v}}) {
    if (x->ndim() < 2)
      throw ValueError(message(kOp, "expected ", name, " with at least 2 dims (..., ",
                               name[0] == 'q' ? "L, E" : name[0] == 'k' ? "S, E" : "S, Ev",
                               "), got shape ", shape_str(x->shape)));
    if (x->dtype != DType::float32 && x->dtype != DType::float16)
      throw TypeError(message(kOp, "expected ", name, " of dtype float32 or float16, got ",
                              dtype_name(x->dtype)));
    if (x->dtype != q.dtype)
      throw TypeError(message(kOp, "expected query, key and value of one dtype, got query ",
                              dtype_name(q.dtype), ", ", name, " ", dtype_name(x->dtype)));
    if (!sdpa_layout_ok(*x)) throw ValueError(message(kOp, "internal: ", name, "'s layout"));
  }
  const i64 L = q.shape[q.ndim() - 2], E = q.shape[q.ndim() - 1];
  const i64 S = k.shape[k.ndim() - 2], Ek = k.shape[k.ndim() - 1];
  const i64 Sv = v.shape[v.ndim() - 2], Ev = v.shape[v.ndim() - 1];
  if (Ek != E)
    throw ValueError(message(kOp, "expected key's last dim to equal query's (E = ", E,
                             "), got query ", shape_str(q.shape), ", key ", shape_str(k.shape)));
  if (Sv != S)
    throw ValueError(message(kOp, "expected value's sequence length to equal key's (S = ", S,
                             "), got key ", shape_str(k.shape), ", value ", shape_str(v.shape)));
  if (E > FM_SDPA_MAX_HEAD_DIM || Ev > FM_SDPA_MAX_HEAD_DIM)
    throw ValueError(message(kOp, "expected head dims E in [0, ", FM_SDPA_MAX_HEAD_DIM,
                             "] and Ev in [0, ", FM_SDPA_MAX_HEAD_DIM, "], got E = ", E,
                             ", Ev = ", Ev));
  if (L > kMaxI32 || S > kMaxI32)
    throw ValueError(message(kOp, "expected fewer than 2**31 queries and keys, got L = ", L,
                             ", S = ", S));

  // The mask as (..., Lm, Sm): fewer than 2 dims are padded with leading 1s.
  Shape ms;
  if (mask) {
    if (mask->dtype != DType::float32 || (!mask->contiguous() && mask->size() != 0))
      throw ValueError(message(kOp, "internal: the mask must be contiguous float32"));
    ms = mask->shape;
    while (ms.size() < 2) ms.insert(ms.begin(), 1);
    const i64 Lm = ms[ms.size() - 2], Sm = ms[ms.size() - 1];
    if ((Lm != 1 && Lm != L) || (Sm != 1 && Sm != S))
      throw ValueError(message(kOp, "expected attn_mask broadcastable to (..., L, S) = (..., ", L,
                               ", ", S, "), got shape ", shape_str(mask->shape)));
  }

  // Broadcast batch shape.
  const Shape qb = leading(q.shape, 2), kb = leading(k.shape, 2), vb = leading(v.shape, 2);
  const Shape mb = mask ? leading(ms, 2) : Shape{};
  std::size_t nd = std::max({qb.size(), kb.size(), vb.size(), mb.size()});
  Shape batch(nd, 1);
  for (const Shape* b : {&qb, &kb, &vb, &mb}) {
    for (std::size_t t = 0; t < b->size(); ++t) {
      const i64 n = (*b)[b->size() - 1 - t];
      i64& out = batch[nd - 1 - t];
      if (n != 1 && out != 1 && n != out)
        throw ValueError(message(kOp, "expected batch dims that broadcast, got query ",
                                 shape_str(q.shape), ", key ", shape_str(k.shape), ", value ",
                                 shape_str(v.shape), mask ? ", attn_mask " : "",
                                 mask ? shape_str(mask->shape) : std::string()));
      if (n != 1) out = n;
    }
  }
  // PyTorch adds the mask to the scores in place of their shape: it may not add batch dims.
  if (mask) {
    Shape qkv(nd, 1);
    for (const Shape* b : {&qb, &kb, &vb})
      for (std::size_t t = 0; t < b->size(); ++t)
        if ((*b)[b->size() - 1 - t] != 1) qkv[nd - 1 - t] = (*b)[b->size() - 1 - t];
    if (qkv != batch || mb.size() > std::max({qb.size(), kb.size(), vb.size()}))
      throw ValueError(message(kOp, "expected attn_mask broadcastable to the attention's shape (",
                               shape_str(qkv).substr(1, shape_str(qkv).size() - 2),
                               qkv.empty() ? "" : ", ", L, ", ", S, "), got shape ",
                               shape_str(mask->shape)));
  }
  const i64 nbatch = numel(batch);
  if (nbatch > kMaxI32)
    throw ValueError(message(kOp, "expected fewer than 2**31 batch entries, got batch shape ",
                             shape_str(batch)));

  Plan p;
  p.batch = batch;
  p.mask_shape = ms;
  SdpaArgs& a = p.a;
  a.nbatch = std::int32_t(nbatch);
  a.L = std::int32_t(L);
  a.S = std::int32_t(S);
  a.E = std::int32_t(E);
  a.Ev = std::int32_t(Ev);
  a.mask_kind = mask ? o.mask_kind : FM_SDPA_MASK_NONE;
  if (mask && o.mask_kind != FM_SDPA_MASK_BOOL && o.mask_kind != FM_SDPA_MASK_ADD)
    throw ValueError(message(kOp, "internal: bad mask kind ", o.mask_kind));
  if (mask) {
    a.m_rs = ms[ms.size() - 2] == 1 ? 0 : ms[ms.size() - 1];
    a.m_cs = ms[ms.size() - 1] == 1 ? 0 : 1;
  }
  a.causal = o.causal ? 1 : 0;
  a.scale = float(o.scale < 0.0 ? 1.0 / std::sqrt(double(E)) : o.scale);
  a.threshold = o.threshold;
  a.drop_scale = o.drop_scale;
  a.key0 = o.key0;
  a.key1 = o.key1;
  return p;
}

// The batch and row strides of every operand present (operands[FM_SDPA_Q ..], nullptr where
// absent), with the batch dims of size 1 dropped and neighbours that every operand walks as
// one merged (so any number of batch dims fits FM_SDPA_MAX_BATCH_DIMS as long as they merge).
void set_strides(Plan& p, const Array* const* operands, const Array* mask) {
  const std::size_t nd = p.batch.size();
  std::vector<std::vector<i64>> st;
  for (int w = 0; w < FM_SDPA_OPERANDS; ++w)
    st.push_back(operands[w] ? batch_strides(*operands[w], nd, 2) : std::vector<i64>(nd, 0));
  st.push_back(mask ? mask_strides(p.mask_shape, nd) : std::vector<i64>(nd, 0));
  std::vector<i64> dims;
  std::vector<std::size_t> src;
  for (std::size_t d = 0; d < nd; ++d)
    if (p.batch[d] != 1) {
      if (!dims.empty()) {
        const std::size_t prev = src.back();
        bool merge = true;
        for (auto& s : st) merge = merge && s[prev] == s[d] * p.batch[d];
        if (merge) {
          dims.back() *= p.batch[d];
          for (auto& s : st) s[prev] = s[d];
          continue;
        }
      }
      dims.push_back(p.batch[d]);
      src.push_back(d);
    }
  if (dims.size() > FM_SDPA_MAX_BATCH_DIMS)
    throw ValueError(message(kOp, "expected at most ", FM_SDPA_MAX_BATCH_DIMS,
                             " independent batch dims, got batch shape ", shape_str(p.batch)));
  SdpaArgs& a = p.a;
  a.batch_dims = std::int32_t(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) {
    a.batch_shape[d] = std::int32_t(dims[d]);
    for (int w = 0; w < FM_SDPA_OPERANDS; ++w) a.bs[w][d] = st[std::size_t(w)][src[d]];
    a.m_bs[d] = st[FM_SDPA_OPERANDS][src[d]];
  }
  for (int w = 0; w < FM_SDPA_OPERANDS; ++w) {
    const Array* x = operands[w];
    a.rs[w] = x ? x->strides[x->ndim() - 2] : 0;
  }
}

// A new Array of shape batch + (rows, cols) whose memory follows `like`'s layout: its batch
// dims and rows ordered by like's strides (dims it broadcasts outermost), each row
// contiguous. Head-split inputs ((N, T, H, D) seen as (N, H, T, D)) so get outputs and
// gradients that a permute makes contiguous again, with no copy on either side.
Array empty_like_layout(Backend& be, const Shape& batch, i64 rows, i64 cols, const Array& like,
                        DType dtype) {
  const std::size_t nd = batch.size() + 1;  // batch dims and the rows
  std::vector<i64> key(nd, std::numeric_limits<i64>::max());
  const std::vector<i64> bst = batch_strides(like, batch.size(), 2);
  for (std::size_t d = 0; d < batch.size(); ++d)
    if (bst[d] != 0) key[d] = bst[d];
  key[nd - 1] = like.shape[like.ndim() - 2] == 1 ? 0 : like.strides[like.ndim() - 2];
  std::vector<std::size_t> order(nd);
  for (std::size_t d = 0; d < nd; ++d) order[d] = d;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t x, std::size_t y) { return key[x] > key[y]; });
  Shape full = with_tail(batch, {rows, cols});
  Shape mem(nd + 1, cols);
  for (std::size_t d = 0; d < nd; ++d) mem[d] = full[order[d]];
  Array out = Array::empty(be, mem, dtype, kOp);
  Strides logical(nd + 1, 1);
  for (std::size_t d = 0; d < nd; ++d) logical[order[d]] = out.strides[d];
  logical[nd] = 1;
  out.shape = full;
  out.strides = logical;
  return out;
}

std::uint32_t ceil_div(i64 a, i64 b) { return std::uint32_t((a + b - 1) / b); }

// Groups along x of a tiled kernel over n rows or keys in tiles of b: causal, each group takes
// two tiles, t and the mirror one (metal/attention_common.h's sdpa_tile_passes).
std::uint32_t tiled_groups(const SdpaArgs& a, i64 n, i64 b) {
  const std::uint32_t tiles = ceil_div(n, b);
  return a.causal != 0 ? (tiles + 1) / 2 : tiles;
}

const char* dtype_suffix(DType t) { return t == DType::float16 ? "_float16" : "_float32"; }

// Which MSL instance family serves these head dims (metal/attention_common.h's top comment).
bool wide_heads(const SdpaArgs& a) { return std::max(a.E, a.Ev) > 64; }

// Whether operand `which` (x, rows of `cols` elements) can be read in 16-byte quads: float32,
// cols % 4 == 0, every row and batch stride a multiple of 4 elements, the start 16-byte aligned.
bool quad_rows(const Array& x, const SdpaArgs& a, int which, i64 cols) {
  if (x.size() == 0 || x.dtype != DType::float32 || cols % 4 != 0 || a.rs[which] % 4 != 0)
    return false;
  for (int d = 0; d < a.batch_dims; ++d)
    if (a.bs[which][d] % 4 != 0) return false;
  return starts_aligned16(x);
}

}  // namespace

bool sdpa_layout_ok(const Array& x) {
  if (x.size() == 0) return true;
  for (std::size_t d = 0; d < x.shape.size(); ++d)
    if (x.strides[d] < 0 && x.shape[d] != 1) return false;
  return x.ndim() < 1 || x.shape[x.ndim() - 1] == 1 || x.strides[x.ndim() - 1] == 1;
}

std::vector<Array> sdpa_forward(const Array& q, const Array& k, const Array& v,
                                const Array* mask, const SdpaOptions& o) {
  Plan p = make_plan(q, k, v, mask, o);
  Backend& be = q.backend();
  Array out = empty_like_layout(be, p.batch, p.a.L, p.a.Ev, q, q.dtype);
  Array lse = Array::empty(be, with_tail(p.batch, {p.a.L}), DType::float32, kOp);
  const Array* ops[FM_SDPA_OPERANDS] = {&q, &k, &v, &out, nullptr, nullptr, nullptr, nullptr};
  set_strides(p, ops, mask);
  SdpaArgs& a = p.a;
  if (lse.size() == 0) return {out, lse};
  using NativeForward = void(const SdpaArgs&, const Array&, const Array&, const Array&,
                             const Array*, const Array&, const Array&);
  if (auto fast = native<NativeForward>(be, "sdpa_forward")) {
    fast(a, q, k, v, mask, out, lse);
    return {out, lse};
  }
  const bool wide = wide_heads(a);
  // Head dims <= 64: the register-blocked kernel unless FASTMETAL_SDPA_FORWARD=classic. Its
  // 40 KiB variants (metal/attention_forward.metal: K and V staged together, 2 barriers a key tile;
  // "prefetch" also loads the next tile during this one's P V) exist where the device has more
  // than Apple's 32 KiB (FM_INSTANTIATE_DISCRETE), only on request: on an H100 (2026-11-28
  // 00:40) the 32 KiB kernel was as fast or faster (4x8x1024 causal: 346 us; split 404,
  // prefetch 443; non-causal 502 / 502 / 511 us).
  const int variant = env::sdpa_forward();
  const bool tiled = !wide && variant != 0;
  a.quads = quad_rows(q, a, FM_SDPA_Q, a.E) && quad_rows(k, a, FM_SDPA_K, a.E) &&
            quad_rows(v, a, FM_SDPA_V, a.Ev);
  std::string name =
      std::string(tiled ? "sdpa_forward_tiled_d64" : wide ? "sdpa_forward_d128" : "sdpa_forward_d64") +
      dtype_suffix(q.dtype);
  if (tiled) {
    const char* big = variant == 2                   ? "sdpa_forward_split_d64"
                      : variant == 3 ? "sdpa_forward_prefetch_d64"
                                     : nullptr;
    if (big != nullptr && be.has_kernel(std::string(big) + dtype_suffix(q.dtype)))
      name = std::string(big) + dtype_suffix(q.dtype);
  }
  const std::uint32_t nt = wide ? 64 : 128, bq = tiled ? 64 : wide ? 16 : 32;
  Dispatch d;
  d.group[0] = nt;
  d.grid[0] = (tiled ? tiled_groups(a, a.L, bq) : ceil_div(a.L, bq)) * nt;
  d.grid[1] = std::uint32_t(a.nbatch);
  d.cost = std::uint64_t(a.S) * std::uint64_t(a.E + a.Ev) / 4 + 1;
  be.launch(name, d, {buf(q), buf(k), buf(v), buf(mask ? *mask : q), buf(out), buf(lse),
                      KernelArg::inline_bytes(&a, sizeof(a))});
  return {out, lse};
}

std::vector<Array> sdpa_backward(const Array& grad_out, const Array& q, const Array& k,
                                 const Array& v, const Array* mask, const Array& out,
                                 const Array& lse, const SdpaOptions& o) {
  Plan p = make_plan(q, k, v, mask, o);
  const Shape oshape = with_tail(p.batch, {p.a.L, p.a.Ev}), lshape = with_tail(p.batch, {p.a.L});
  for (const auto& [name, x] : {std::pair<const char*, const Array*>{"grad_output", &grad_out},
                                {"output", &out}}) {
    if (x->shape != oshape || x->dtype != q.dtype)
      throw ValueError(message(kOp, "expected ", name, " of shape ", shape_str(oshape), " and dtype ",
                               dtype_name(q.dtype), " (the forward's output), got ",
                               shape_str(x->shape), " ", dtype_name(x->dtype)));
    if (!sdpa_layout_ok(*x)) throw ValueError(message(kOp, "internal: ", name, "'s layout"));
  }
  if (lse.shape != lshape || lse.dtype != DType::float32 || (!lse.contiguous() && lse.size() != 0))
    throw ValueError(message(kOp, "expected the forward's logsumexp of shape ", shape_str(lshape),
                             " (float32), got ", shape_str(lse.shape), " ", dtype_name(lse.dtype)));
  Backend& be = q.backend();
  Array dq = empty_like_layout(be, p.batch, p.a.L, p.a.E, q, q.dtype);
  Array dk = empty_like_layout(be, p.batch, p.a.S, p.a.E, k, q.dtype);
  Array dv = empty_like_layout(be, p.batch, p.a.S, p.a.Ev, v, q.dtype);
  const Array* ops[FM_SDPA_OPERANDS] = {&q, &k, &v, &out, &grad_out, &dq, &dk, &dv};
  set_strides(p, ops, mask);
  SdpaArgs& a = p.a;
  if (a.nbatch == 0) return {dq, dk, dv};
  using NativeBackward = void(const SdpaArgs&, const Array&, const Array&, const Array&,
                              const Array&, const Array*, const Array&, const Array&,
                              const Array&, const Array&, const Array&);
  if (auto fast = native<NativeBackward>(be, "sdpa_backward")) {
    fast(a, grad_out, q, k, v, mask, out, lse, dq, dk, dv);
    return {dq, dk, dv};
  }
  const bool wide = wide_heads(a);
  // Head dims <= 64: the register-blocked kernels unless FASTMETAL_SDPA_BACKWARD=classic.
  const bool tiled = !wide && env::sdpa_backward() != 0;
  a.quads = quad_rows(q, a, FM_SDPA_Q, a.E) && quad_rows(k, a, FM_SDPA_K, a.E) &&
            quad_rows(v, a, FM_SDPA_V, a.Ev) && quad_rows(grad_out, a, FM_SDPA_G, a.Ev);
  const std::string suffix = std::string(wide ? "_d128" : "_d64") + dtype_suffix(q.dtype);
  const std::string variant = tiled ? "_tiled" : "";
  // Keys per dK/dV group, query rows per dQ group (metal/attention_backward.metal).
  const std::uint32_t bq = tiled ? 32 : wide ? 8 : 16, bk = tiled ? 64 : wide ? 16 : 32;
  const KernelArg args = KernelArg::inline_bytes(&a, sizeof(a));
  const KernelArg m = buf(mask ? *mask : q);
  StoragePtr delta = be.allocate(std::size_t(std::max<i64>(1, i64(a.nbatch) * a.L)) * sizeof(float));
  if (a.L > 0) {
    const std::string prep = std::string("sdpa_backward_prep") + dtype_suffix(q.dtype);
    Dispatch d;
    d.grid[0] = std::uint32_t(a.L);
    d.grid[1] = std::uint32_t(a.nbatch);
    d.group[0] = std::max<std::uint32_t>(1, std::min<std::uint32_t>(be.preferred_group_size(prep), d.grid[0]));
    d.cost = std::uint64_t(a.Ev) + 1;
    be.launch(prep, d, {buf(grad_out), buf(out), KernelArg::buffer(delta), args});
  }
  if (a.S > 0) {
    Dispatch d;
    d.group[0] = 128;
    d.grid[0] = (tiled ? tiled_groups(a, a.S, bk) : ceil_div(a.S, bk)) * 128;
    d.grid[1] = std::uint32_t(a.nbatch);
    d.cost = std::uint64_t(a.L) * std::uint64_t(a.E + a.Ev) / (tiled ? 2 : 8) + 1;
    // The causal tiled instance pairs its key tiles (tiled_groups); the other has no pass loop.
    const std::string pairs = tiled && a.causal != 0 ? "_causal" : "";
    be.launch("sdpa_backward_dkdv" + variant + pairs + suffix, d,
              {buf(q), buf(k), buf(v), m, buf(grad_out), buf(lse), KernelArg::buffer(delta),
               buf(dk), buf(dv), args});
  }
  if (a.L > 0) {
    Dispatch d;
    d.group[0] = 128;
    d.grid[0] = (tiled ? tiled_groups(a, a.L, bq) : ceil_div(a.L, bq)) * 128;
    d.grid[1] = std::uint32_t(a.nbatch);
    d.cost = std::uint64_t(a.S) * std::uint64_t(a.E + a.Ev) / (tiled ? 2 : 8) + 1;
    be.launch("sdpa_backward_dq" + variant + suffix, d,
              {buf(q), buf(k), buf(v), m, buf(grad_out), buf(lse), KernelArg::buffer(delta),
               buf(dq), args});
  }
  return {dq, dk, dv};
}

}  // namespace fm
