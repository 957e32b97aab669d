#include "matmul.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "backend/native_ops.h"
#include "core/errors.h"
#include "kernel_group.h"
#include "matmul_args.h"
#include "reduce.h"
#include "ops/array_arg.h"

namespace fm {
namespace {
using i64 = std::int64_t;

// Operands as (batch..., rows, cols) views after NumPy's 1-D promotion.
struct Promoted {
  Shape shape;
  Strides strides;
};

Promoted promote(const Shape& s, const Strides& st, bool left) {
  Promoted p{s, st};
  if (s.size() == 1) {
    if (left) {
      p.shape.insert(p.shape.begin(), 1);
      p.strides.insert(p.strides.begin(), 0);
    } else {
      p.shape.push_back(1);
      p.strides.push_back(0);
    }
  }
  return p;
}

bool fits32(i64 v) { return v >= std::numeric_limits<std::int32_t>::min() && v <= std::numeric_limits<std::int32_t>::max(); }

std::uint32_t ceil_div(i64 a, i64 b) { return std::uint32_t((a + b - 1) / b); }

}  // namespace

Shape matmul_shape(const std::string& op, const Shape& a, const Shape& b) {
  if (a.empty() || b.empty())
    throw ValueError(message(op, "expected operands of at least 1 dimension (use multiply for ",
                             "scalars), got shapes ", shape_str(a), " and ", shape_str(b)));
  const Promoted pa = promote(a, Strides(a.size(), 0), true);
  const Promoted pb = promote(b, Strides(b.size(), 0), false);
  const std::size_t na = pa.shape.size(), nb = pb.shape.size();
  if (pa.shape[na - 1] != pb.shape[nb - 2])
    throw ValueError(message(op, "expected the last axis of the first operand to match the ",
                             b.size() == 1 ? "only" : "second-to-last",
                             " axis of the second (matmul: (..., n, k) @ (..., k, m)), got shapes ",
                             shape_str(a), " and ", shape_str(b)));
  const std::size_t nbatch = std::max(na, nb) - 2;
  Shape out(nbatch);
  for (std::size_t i = 0; i < nbatch; ++i) {
    const i64 da = i + na >= nbatch + 2 ? pa.shape[i + na - 2 - nbatch] : 1;
    const i64 db = i + nb >= nbatch + 2 ? pb.shape[i + nb - 2 - nbatch] : 1;
    if (da != db && da != 1 && db != 1)
      throw ValueError(message(op, "expected batch dimensions that broadcast, got shapes ",
                               shape_str(a), " and ", shape_str(b)));
    out[i] = da == 1 ? db : da;
  }
  if (a.size() > 1) out.push_back(pa.shape[na - 2]);
  if (b.size() > 1) out.push_back(pb.shape[nb - 1]);
  return out;
}

void matmul_into(const std::string& op, const Array& a, const Array& b, const Array& out) {
  if (a.dtype != DType::float32 || b.dtype != DType::float32 || out.dtype != DType::float32)
    throw TypeError(message(op, "expected float32 operands"));
  const Promoted pa = promote(a.shape, a.strides, true);
  const Promoted pb = promote(b.shape, b.strides, false);
  const std::size_t na = pa.shape.size(), nb = pb.shape.size();
  const std::size_t nbatch = std::max(na, nb) - 2;
  MatmulArgs p{};
  p.M = std::int32_t(pa.shape[na - 2]);
  p.K = std::int32_t(pa.shape[na - 1]);
  p.N = std::int32_t(pb.shape[nb - 1]);
  i64 M = pa.shape[na - 2], K = pa.shape[na - 1], N = pb.shape[nb - 1];
  // Batch dims with both operands' strides (0 where broadcast), merged where contiguous.
  std::vector<i64> bshape, as, bs;
  for (std::size_t i = 0; i < nbatch; ++i) {
    const bool ha = i + na >= nbatch + 2, hb = i + nb >= nbatch + 2;
    const i64 da = ha ? pa.shape[i + na - 2 - nbatch] : 1;
    const i64 db = hb ? pb.shape[i + nb - 2 - nbatch] : 1;
    const i64 n = std::max(da, db);
    if (n == 1) continue;
    const i64 sa = da == 1 ? 0 : pa.strides[i + na - 2 - nbatch];
    const i64 sb = db == 1 ? 0 : pb.strides[i + nb - 2 - nbatch];
    if (!bshape.empty() && as.back() == sa * n && bs.back() == sb * n) {
      bshape.back() *= n;
      as.back() = sa;
      bs.back() = sb;
      continue;
    }
    bshape.push_back(n);
    as.push_back(sa);
    bs.push_back(sb);
  }
  i64 batch = 1;
  for (i64 n : bshape) batch *= n;
  if (bshape.size() > FM_MATMUL_MAX_BATCH_DIMS)
    throw ValueError(message(op, "expected at most ", FM_MATMUL_MAX_BATCH_DIMS,
                             " non-mergeable batch dimensions, got ", bshape.size()));
  // Element offsets must fit 32 bits (the kernels index with int32).
  auto extent = [](const Array& x) {
    i64 e = 0;
    for (std::size_t d = 0; d < x.shape.size(); ++d) e += (x.shape[d] - 1) * std::abs(x.strides[d]);
    return e;
  };
  if (out.size() == 0) return;
  if (!fits32(extent(a)) || !fits32(extent(b)) || !fits32(out.size()) || !fits32(M) ||
      !fits32(N) || !fits32(K) || !fits32(batch))
    throw ValueError(message(op, "expected operands of fewer than 2**31 elements, got shapes ",
                             shape_str(a.shape), " and ", shape_str(b.shape)));
  p.batch = std::int32_t(batch);
  p.a_rs = std::int32_t(pa.strides[na - 2]);
  p.a_cs = std::int32_t(pa.strides[na - 1]);
  p.b_rs = std::int32_t(pb.strides[nb - 2]);
  p.b_cs = std::int32_t(pb.strides[nb - 1]);
  p.batch_dims = std::int32_t(bshape.size());
  for (std::size_t d = 0; d < bshape.size(); ++d) {
    p.batch_shape[d] = std::int32_t(bshape[d]);
    p.a_bs[d] = std::int32_t(as[d]);
    p.b_bs[d] = std::int32_t(bs[d]);
  }

  Backend& be = out.backend();
  // A backend's own GEMM (host-visible operands, read through p's strides).
  using NativeMatmul = void(const MatmulArgs&, const Array&, const Array&, const Array&);
  if (auto* fast = native<NativeMatmul>(be, "matmul")) {
    be.synchronize();
    fast(p, a, b, out);
    return;
  }
  if (K == 0) {  // no slices to stage: the kernel would write zeros, but skip the launch
    std::vector<float> zeros(std::size_t(out.size()), 0.0f);
    be.copy_from_host(*out.storage, out.byte_offset(), zeros.data(), out.nbytes());
    return;
  }
  const bool small = M <= 32;
  const std::string kernel = small ? "matmul_32x64" : "matmul_64x64";
  const int tile_rows = small ? 32 : 64;
  const std::uint32_t col_tiles = ceil_div(N, 64);
  std::uint32_t t = kernel_group_size();
  if (t == 0) t = small ? 128 : 256;  // the tiles' virtual thread counts
  t = std::max<std::uint32_t>(1, std::min(t, be.max_group_size(kernel)));
  while (t > 1 && std::uint64_t(col_tiles) * t > std::numeric_limits<std::uint32_t>::max()) t /= 2;
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = col_tiles * t;
  d.grid[1] = ceil_div(M, tile_rows);
  d.grid[2] = std::uint32_t(batch);
  d.cost = std::uint64_t(K) * 16;
  be.launch(kernel, d,
            {buf(a), buf(b),
             buf(out), KernelArg::inline_bytes(&p, sizeof p)});
}

namespace {

// A 2-D product with few output tiles and a long K (linear 9216 -> 128 at batch 64: two
// 64x64 tiles, each looping over 9216 terms) keeps a GPU nearly idle. Split K into S slices,
// run them as one batched product of views (batch stride K/S along K, no copy) and sum the
// S partial products. Only for the MSL GEMM: a backend's own GEMM parallelises by itself.
std::optional<Array> split_k_product(const std::string& op, const Array& a, const Array& b) {
  Backend& be = a.backend();
  if (be.native_op("matmul") != nullptr || a.ndim() != 2 || b.ndim() != 2) return std::nullopt;
  const i64 M = a.shape[0], K = a.shape[1], N = b.shape[1];
  const i64 tiles = i64(ceil_div(M, M <= 32 ? 32 : 64)) * ceil_div(N, 64);
  constexpr i64 kMinSlice = 128, kTargetGroups = 256;
  if (K < 16 * kMinSlice || tiles * 4 > kTargetGroups || M == 0 || N == 0) return std::nullopt;
  i64 S = 1;
  for (i64 s = std::min(K / kMinSlice, kTargetGroups / tiles); s >= 2; --s)
    if (K % s == 0) {
      S = s;
      break;
    }
  if (S < 4) return std::nullopt;
  const i64 slice = K / S;
  Array av = a, bv = b;
  av.shape = {S, M, slice};
  av.strides = {slice * a.strides[1], a.strides[0], a.strides[1]};
  bv.shape = {S, slice, N};
  bv.strides = {slice * b.strides[0], b.strides[0], b.strides[1]};
  Array partial = Array::empty(be, {S, M, N}, DType::float32);
  matmul_into(op, av, bv, partial);
  return reduce(ReduceOp::sum, partial, {0}, 0);
}

}  // namespace

Array matmul(const std::string& op, const Array& a, const Array& b) {
  if (a.dtype == DType::float32 && b.dtype == DType::float32 && a.ndim() == 2 && b.ndim() == 2 &&
      a.shape[1] == b.shape[0])
    if (std::optional<Array> r = split_k_product(op, a, b)) return *r;
  Array out = Array::empty(a.backend(), matmul_shape(op, a.shape, b.shape), DType::float32);
  matmul_into(op, a, b, out);
  return out;
}

}  // namespace fm
