#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

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

// Batch strides (elements) of a contiguous operand whose batch dims are `b` (right-aligned
// against `nd` broadcast dims) and whose trailing block has `block` elements; 0 where the
// operand has size 1 (broadcast) or lacks the dim.
void batch_strides(const Shape& b, i64 block, std::size_t nd, i64* out) {
  i64 stride = block;
  for (std::size_t d = 0; d < nd; ++d) out[d] = 0;
  for (std::size_t t = 0; t < b.size(); ++t) {
    const std::size_t src = b.size() - 1 - t, dst = nd - 1 - t;
    out[dst] = b[src] == 1 ? 0 : stride;
    stride *= b[src];
  }
}

struct Plan {
  SdpaArgs a{};
  Shape batch;  // the broadcast batch shape (as the outputs have it)
};

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
    if (!x->contiguous() && x->size() != 0) throw ValueError(message(kOp, "internal: ", name, " is not contiguous"));
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

  // Strides per batch dim, then the dims of size 1 dropped and mergeable neighbours merged
  // (so any number of batch dims fits FM_SDPA_MAX_BATCH_DIMS as long as they merge).
  std::vector<i64> st[4];
  for (auto& s : st) s.assign(nd, 0);
  batch_strides(qb, L * E, nd, st[0].data());
  batch_strides(kb, S * E, nd, st[1].data());
  batch_strides(vb, S * Ev, nd, st[2].data());
  if (mask) batch_strides(mb, ms[ms.size() - 2] * ms[ms.size() - 1], nd, st[3].data());
  std::vector<i64> dims;
  std::vector<std::size_t> src;
  for (std::size_t d = 0; d < nd; ++d)
    if (batch[d] != 1) {
      if (!dims.empty()) {
        const std::size_t p = src.back();
        bool merge = true;
        for (auto& s : st) merge = merge && s[p] == s[d] * batch[d];
        if (merge) {
          dims.back() *= batch[d];
          for (auto& s : st) s[p] = s[d];
          continue;
        }
      }
      dims.push_back(batch[d]);
      src.push_back(d);
    }
  if (dims.size() > FM_SDPA_MAX_BATCH_DIMS)
    throw ValueError(message(kOp, "expected at most ", FM_SDPA_MAX_BATCH_DIMS,
                             " independent batch dims, got batch shape ", shape_str(batch)));

  Plan p;
  p.batch = batch;
  SdpaArgs& a = p.a;
  a.batch_dims = std::int32_t(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) {
    a.batch_shape[d] = std::int32_t(dims[d]);
    a.q_bs[d] = st[0][src[d]];
    a.k_bs[d] = st[1][src[d]];
    a.v_bs[d] = st[2][src[d]];
    a.m_bs[d] = st[3][src[d]];
  }
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

std::uint32_t ceil_div(i64 a, i64 b) { return std::uint32_t((a + b - 1) / b); }

const char* dtype_suffix(DType t) { return t == DType::float16 ? "_float16" : "_float32"; }

// Which MSL instance family serves these head dims (attention.metal's header).
bool wide_heads(const SdpaArgs& a) { return std::max(a.E, a.Ev) > 64; }

}  // namespace

std::vector<Array> sdpa_forward(const Array& q, const Array& k, const Array& v,
                                const Array* mask, const SdpaOptions& o) {
  const Plan p = make_plan(q, k, v, mask, o);
  const SdpaArgs& a = p.a;
  Backend& be = q.backend();
  Array out = Array::empty(be, with_tail(p.batch, {a.L, a.Ev}), q.dtype, kOp);
  Array lse = Array::empty(be, with_tail(p.batch, {a.L}), DType::float32, kOp);
  if (lse.size() == 0) return {out, lse};
  using NativeForward = void(const SdpaArgs&, const Array&, const Array&, const Array&,
                             const Array*, const Array&, const Array&);
  if (auto* fast = native<NativeForward>(be, "sdpa_forward")) {
    fast(a, q, k, v, mask, out, lse);
    return {out, lse};
  }
  const bool wide = wide_heads(a);
  const std::string name = std::string("sdpa_forward_d") + (wide ? "128" : "64") + dtype_suffix(q.dtype);
  const std::uint32_t nt = wide ? 64 : 128, bq = wide ? 16 : 32;
  Dispatch d;
  d.group[0] = nt;
  d.grid[0] = ceil_div(a.L, bq) * nt;
  d.grid[1] = std::uint32_t(a.nbatch);
  d.cost = std::uint64_t(a.S) * std::uint64_t(a.E + a.Ev) / 4 + 1;
  be.launch(name, d, {buf(q), buf(k), buf(v), buf(mask ? *mask : q), buf(out), buf(lse),
                      KernelArg::inline_bytes(&a, sizeof(a))});
  return {out, lse};
}

std::vector<Array> sdpa_backward(const Array& grad_out, const Array& q, const Array& k,
                                 const Array& v, const Array* mask, const Array& out,
                                 const Array& lse, const SdpaOptions& o) {
  const Plan p = make_plan(q, k, v, mask, o);
  const SdpaArgs& a = p.a;
  const Shape oshape = with_tail(p.batch, {a.L, a.Ev}), lshape = with_tail(p.batch, {a.L});
  for (const auto& [name, x] : {std::pair<const char*, const Array*>{"grad_output", &grad_out},
                                {"output", &out}}) {
    if (x->shape != oshape || x->dtype != q.dtype)
      throw ValueError(message(kOp, "expected ", name, " of shape ", shape_str(oshape), " and dtype ",
                               dtype_name(q.dtype), " (the forward's output), got ",
                               shape_str(x->shape), " ", dtype_name(x->dtype)));
    if (!x->contiguous() && x->size() != 0) throw ValueError(message(kOp, "internal: ", name, " is not contiguous"));
  }
  if (lse.shape != lshape || lse.dtype != DType::float32 || (!lse.contiguous() && lse.size() != 0))
    throw ValueError(message(kOp, "expected the forward's logsumexp of shape ", shape_str(lshape),
                             " (float32), got ", shape_str(lse.shape), " ", dtype_name(lse.dtype)));
  Backend& be = q.backend();
  Array dq = Array::empty(be, with_tail(p.batch, {a.L, a.E}), q.dtype, kOp);
  Array dk = Array::empty(be, with_tail(p.batch, {a.S, a.E}), q.dtype, kOp);
  Array dv = Array::empty(be, with_tail(p.batch, {a.S, a.Ev}), q.dtype, kOp);
  if (a.nbatch == 0) return {dq, dk, dv};
  using NativeBackward = void(const SdpaArgs&, const Array&, const Array&, const Array&,
                              const Array&, const Array*, const Array&, const Array&,
                              const Array&, const Array&, const Array&);
  if (auto* fast = native<NativeBackward>(be, "sdpa_backward")) {
    fast(a, grad_out, q, k, v, mask, out, lse, dq, dk, dv);
    return {dq, dk, dv};
  }
  const bool wide = wide_heads(a);
  const std::string suffix = std::string(wide ? "_d128" : "_d64") + dtype_suffix(q.dtype);
  const std::uint32_t bq = wide ? 8 : 16, bk = wide ? 16 : 32;
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
    d.grid[0] = ceil_div(a.S, bk) * 128;
    d.grid[1] = std::uint32_t(a.nbatch);
    d.cost = std::uint64_t(a.L) * std::uint64_t(a.E + a.Ev) / 8 + 1;
    be.launch("sdpa_backward_dkdv" + suffix, d,
              {buf(q), buf(k), buf(v), m, buf(grad_out), buf(lse), KernelArg::buffer(delta),
               buf(dk), buf(dv), args});
  }
  if (a.L > 0) {
    Dispatch d;
    d.group[0] = 128;
    d.grid[0] = ceil_div(a.L, bq) * 128;
    d.grid[1] = std::uint32_t(a.nbatch);
    d.cost = std::uint64_t(a.S) * std::uint64_t(a.E + a.Ev) / 8 + 1;
    be.launch("sdpa_backward_dq" + suffix, d,
              {buf(q), buf(k), buf(v), m, buf(grad_out), buf(lse), KernelArg::buffer(delta),
               buf(dq), args});
  }
  return {dq, dk, dv};
}

}  // namespace fm
