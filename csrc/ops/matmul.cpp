#include "matmul.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <cstdlib>
#include <iterator>

#include "backend/native_ops.h"
#include "core/errors.h"
#include "kernel_group.h"
#include "matmul_args.h"
#include "backend/env_config.h"
#include "ops/array_arg.h"
#include "ops/convert.h"
#include "ops/elementwise.h"
#include "ops/python_op.h"

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

// ---- the MSL GEMM's launch: tile, operand loads, split-K (docs/gpu_kernels.md says why)

struct GemmTile {
  const char* name;       // kernel name stem
  int rows, cols, depth;  // BM, BN, BK
  std::uint32_t threads;  // virtual threads: one per thread is the fast path
  int min_split_slices;   // the fewest slices a K split gets (choose_splits)
};
// 128x128: discrete GPUs only (34 KB of threadgroup memory); its splits are at least 64 deep,
// as they were when its slices were 8 deep (512^2: 8 splits, 1024^2: 4).
constexpr GemmTile kTiles[] = {
    {"matmul_128x128", 128, 128, 16, 256, 4},
    {"matmul_64x128", 64, 128, 8, 128, 8},
    {"matmul_64x64", 64, 64, 16, 128, 8},
    {"matmul_32x64", 32, 64, 16, 128, 8},
};
constexpr int kTile128x128 = 0, kTile64x64 = 2, kTile32x64 = 3;  // 64x128: the tuning hook's

// Threadgroups that keep a large GPU busy: an H100 has 132 multiprocessors, each holding
// two 256-thread groups of these tiles (or four of 128). Below it the host splits K.
constexpr i64 kFillGroups = 264;

i64 tile_count(const GemmTile& t, i64 M, i64 N, i64 batch) {
  return i64(ceil_div(M, t.rows)) * ceil_div(N, t.cols) * batch;
}

// Tuning and test hooks: FASTMETAL_MATMUL_TILE=128x128|64x128|64x64|32x64 forces a tile
// (128x128 not on Metal), FASTMETAL_MATMUL_SPLITS=n a number of K splits (clamped to the
// slices there are).
// (Both read in backend/env_config.cpp, where every FASTMETAL_* variable is parsed.)
int forced_tile() {
  const std::string tile = env::matmul_tile();
  if (tile.empty()) return -1;
  for (int i = 0; i < int(std::size(kTiles)); ++i)
    if ("matmul_" + tile == kTiles[i].name) return i;
  return -1;
}
i64 forced_splits() { return env::matmul_splits(); }

// Two families, as the backend states its preferred tiles (as conv2d's choose_tile):
// unified-memory devices (Apple's GPUs; the CPU runs these kernels only in tests) get MLX's
// matmul shapes, 64x64 (32x64 for at most 32 rows), 128 threads.
// Discrete GPUs get 128x128 where both sides exceed 64, K is at least 256 and there are at
// least 16 such tiles (split-K fills the GPU from there: 512^2 takes 8 splits, 1024^2 4),
// else 32x64, the most groups for a small or short product. Measured on an H100
// (`bench matmul --sweep`, BENCHMARKS.md): 1024^2 32.0 TFLOP/s on 128x128 with 4 splits
// against 29.2 on 64x128 with 2; MNIST's 64x9216 @ 9216x128 8.6 on 32x64 (66 splits)
// against 6.5-7.4 on the others; its input gradient (K = 128) 13.5 against 9.2, its weight
// gradient (K = 64) 16.7 against 13.0.
const GemmTile& choose_tile(Backend& be, i64 M, i64 N, i64 K, i64 batch) {
  const int forced = forced_tile();
  if (forced >= 0) return kTiles[forced];
  if (be.preferred_tiles() == Backend::TileFamily::unified_memory)
    return M <= 32 ? kTiles[kTile32x64] : kTiles[kTile64x64];
  if (M > 64 && N > 64 && K >= 256 && tile_count(kTiles[kTile128x128], M, N, batch) >= 16)
    return kTiles[kTile128x128];
  return kTiles[kTile32x64];
}

// K splits: a product of few tiles and a long K (linear 9216 -> 128 at batch 64: one 64x128
// tile looping over 9,216 terms) keeps a GPU nearly idle. Split K until there are about
// kFillGroups groups, each split at least t.min_split_slices slices deep; the splits write
// slabs of a workspace that matmul_sum_splits adds in a fixed order.
i64 choose_splits(const GemmTile& t, i64 M, i64 N, i64 K, i64 batch) {
  constexpr i64 kMaxSplits = 128;
  const i64 slices = (K + t.depth - 1) / t.depth;
  const i64 forced = forced_splits();
  if (forced > 0) return std::min(forced, slices);
  const i64 tiles = tile_count(t, M, N, batch);
  if (tiles * 2 > kFillGroups) return 1;
  return std::max<i64>(1, std::min({kFillGroups / tiles, slices / t.min_split_slices, kMaxSplits}));
}

// An operand's quad layout (matmul_args.h): quads along `fast` (stride 1, length % 4 == 0)
// where every other stride and the start are 16-byte aligned; 0 where none.
bool quads_along(const Array& x, i64 fast_stride, i64 fast_len, i64 other_stride,
                 const std::int32_t* batch_strides, int batch_dims) {
  if (fast_stride != 1 || fast_len % 4 != 0 || other_stride % 4 != 0 || !starts_aligned16(x)) return false;
  for (int d = 0; d < batch_dims; ++d)
    if (batch_strides[d] % 4 != 0) return false;
  return true;
}

// Launches C = A @ B (p filled, K > 0) through the MSL kernels.
void launch_gemm(Backend& be, MatmulArgs p, const Array& a, const Array& b, const Array& out) {
  const i64 M = p.M, N = p.N, K = p.K, batch = p.batch;
  const GemmTile& tile = choose_tile(be, M, N, K, batch);
  // Quads along k for A needs a_cs == 1 (K % 4 == 0), along its rows a_rs == 1 (M % 4 == 0);
  // for B along k b_rs == 1, along its columns b_cs == 1 (N % 4 == 0). Row-major first.
  const int bd = p.batch_dims;
  std::string layout;
  const char a_mode = quads_along(a, p.a_cs, K, p.a_rs, p.a_bs, bd)   ? 'k'
                      : quads_along(a, p.a_rs, M, p.a_cs, p.a_bs, bd) ? 'm'
                                                                      : 0;
  const char b_mode = quads_along(b, p.b_cs, N, p.b_rs, p.b_bs, bd)   ? 'n'
                      : quads_along(b, p.b_rs, K, p.b_cs, p.b_bs, bd) ? 'k'
                                                                      : 0;
  if (a_mode != 0 && b_mode != 0) layout = std::string("_") + a_mode + b_mode;
  const std::string kernel = tile.name + layout;

  i64 splits = choose_splits(tile, M, N, K, batch);
  const i64 slices = (K + tile.depth - 1) / tile.depth;
  const i64 chunk_slices = (slices + splits - 1) / splits;
  p.k_chunk = std::int32_t(chunk_slices * tile.depth);
  splits = (slices + chunk_slices - 1) / chunk_slices;  // no empty split
  p.splits = std::int32_t(splits);
  const i64 n_out = batch * M * N;
  if (!fits32(n_out * splits))
    splits = 1, p.splits = 1, p.k_chunk = std::int32_t(K);
  Array ws = splits > 1 ? Array::empty(be, {splits * n_out}, DType::float32) : out;
  p.c_quads = N % 4 == 0 && starts_aligned16(ws) ? 1 : 0;

  const std::uint32_t col_tiles = ceil_div(N, tile.cols);
  std::uint32_t t = kernel_group_size();
  if (t == 0) t = tile.threads;
  t = std::max<std::uint32_t>(1, std::min(t, be.max_group_size(kernel)));
  while (t > 1 && std::uint64_t(col_tiles) * t > std::numeric_limits<std::uint32_t>::max()) t /= 2;
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = col_tiles * t;
  d.grid[1] = ceil_div(M, tile.rows);
  d.grid[2] = std::uint32_t(batch * splits);
  d.cost = std::uint64_t(std::min<i64>(K, p.k_chunk)) * 16;
  be.launch(kernel, d,
            {KernelArg::buffer(a.storage, a.byte_offset()), KernelArg::buffer(b.storage, b.byte_offset()),
             KernelArg::buffer(ws.storage, ws.byte_offset()), KernelArg::inline_bytes(&p, sizeof p)});
  if (splits == 1) return;
  Dispatch s;
  s.group[0] = std::min<std::uint32_t>(256, be.max_group_size("matmul_sum_splits"));
  s.grid[0] = std::uint32_t(n_out);
  s.cost = std::uint64_t(splits);
  be.launch("matmul_sum_splits", s,
            {KernelArg::buffer(ws.storage, ws.byte_offset()),
             KernelArg::buffer(out.storage, out.byte_offset()), KernelArg::inline_bytes(&p, sizeof p)});
}

// float64: matmul_float64 (metal/matmul.metal: 64x64 tiles of 4x4 per thread, 256 threads;
// no K split), one threadgroup per tile of C and batch entry.
void launch_gemm_float64(Backend& be, const MatmulArgs& p, const Array& a, const Array& b,
                         const Array& out) {
  const std::string kernel = "matmul_float64";
  constexpr i64 kTile = 64;
  const std::uint32_t col_tiles = ceil_div(p.N, kTile);
  std::uint32_t t = kernel_group_size();
  if (t == 0) t = 256;
  t = std::max<std::uint32_t>(1, std::min(t, be.max_group_size(kernel)));
  while (t > 1 && std::uint64_t(col_tiles) * t > std::numeric_limits<std::uint32_t>::max()) t /= 2;
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = col_tiles * t;
  d.grid[1] = ceil_div(p.M, kTile);
  d.grid[2] = std::uint32_t(p.batch);
  d.cost = std::uint64_t(p.K) * 16;
  be.launch(kernel, d,
            {KernelArg::buffer(a.storage, a.byte_offset()), KernelArg::buffer(b.storage, b.byte_offset()),
             KernelArg::buffer(out.storage, out.byte_offset()), KernelArg::inline_bytes(&p, sizeof p)});
}

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

namespace {
// The MatmulArgs of out = a @ b, after matmul_into's checks; false where out is empty (no
// work).
bool matmul_args(const std::string& op, const Array& a, const Array& b, const Array& out,
                 MatmulArgs& p) {
  // float32, or float64 in double (the backends with matmul_float64: cpu and cuda).
  const DType t = out.dtype;
  if ((t != DType::float32 && t != DType::float64) || a.dtype != t || b.dtype != t)
    throw TypeError(message(op, "expected float32 or float64 operands and result of one dtype, got ",
                            dtype_name(a.dtype), ", ", dtype_name(b.dtype), " and ",
                            dtype_name(out.dtype)));
  const Promoted pa = promote(a.shape, a.strides, true);
  const Promoted pb = promote(b.shape, b.strides, false);
  const std::size_t na = pa.shape.size(), nb = pb.shape.size();
  const std::size_t nbatch = std::max(na, nb) - 2;
  p = MatmulArgs{};
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
  if (out.size() == 0) return false;
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
  return true;
}

using NativeMatmul = void(const MatmulArgs&, const Array&, const Array&, const Array&);
}  // namespace

void matmul_into(const std::string& op, const Array& a, const Array& b, const Array& out) {
  MatmulArgs p;
  if (!matmul_args(op, a, b, out, p)) return;
  const DType t = out.dtype;
  const i64 K = p.K;
  Backend& be = out.backend();
  // A backend's own GEMM (host-visible operands, read through p's strides; the operands'
  // dtype is out's, float32 or float64).
  if (auto fast = native<NativeMatmul>(be, "matmul")) {
    be.synchronize();
    fast(p, a, b, out);
    return;
  }
  if (K == 0) {  // no slices to stage: zeros (+0.0 in either dtype) without the GEMM
    alignas(8) const char zero[8] = {};
    fill_from_element(out, zero);
    return;
  }
  if (t == DType::float64) return launch_gemm_float64(be, p, a, b, out);
  launch_gemm(be, p, a, b, out);
}

void matmul_bias_into(const std::string& op, const Array& a, const Array& b, const Array& bias,
                      const Array& out) {
  Backend& be = out.backend();
  using NativeBias = void(const MatmulArgs&, const Array&, const Array&, const Array&,
                          const Array&);
  const auto fast = native<NativeBias>(be, "matmul_bias");
  MatmulArgs p;
  if (fast && out.contiguous() && bias.dtype == out.dtype && bias.ndim() == 1 &&
      out.ndim() >= 1 && bias.shape[0] == out.shape.back() && bias.contiguous()) {
    if (!matmul_args(op, a, b, out, p)) return;
    be.synchronize();
    fast(p, a, b, bias, out);
    return;
  }
  matmul_into(op, a, b, out);
  launch_binary("add", out, bias, out);
}

RepeatedMatmul::RepeatedMatmul(std::string op, const Array& a, const Array& b, const Array& out)
    : op_(std::move(op)), b_(b), a_shape_(a.shape), a_strides_(a.strides), out_shape_(out.shape) {
  Backend& be = out.backend();
  using Size = std::int64_t(const MatmulArgs&, DType);
  const auto size = native<Size>(be, "matmul_packed_size");
  if (!size || !out.contiguous() || !matmul_args(op_, a, b, out, p_)) return;
  const std::int64_t n = size(p_, out.dtype);
  if (n <= 0) return;
  packed_ = Array::empty(be, {n}, out.dtype, op_.c_str());
  using Pack = void(const MatmulArgs&, const Array&, const Array&);
  be.synchronize();
  native<Pack>(be, "matmul_pack_b")(p_, b_, packed_);
  use_packed_ = true;
}

void RepeatedMatmul::operator()(const Array& a, const Array& out) const {
  if (use_packed_ && a.shape == a_shape_ && a.strides == a_strides_ && a.dtype == b_.dtype &&
      out.shape == out_shape_ && out.contiguous() && out.dtype == b_.dtype) {
    Backend& be = out.backend();
    using Packed = void(const MatmulArgs&, const Array&, const Array&, const Array&);
    be.synchronize();
    native<Packed>(be, "matmul_packed")(p_, a, packed_, out);
    return;
  }
  matmul_into(op_, a, b_, out);
}

Array matmul(const std::string& op, const Array& a, const Array& b) {
  Array out = Array::empty(a.backend(), matmul_shape(op, a.shape, b.shape), a.dtype);
  matmul_into(op, a, b, out);
  return out;
}

// RepeatedMatmul's private Python entry, for its tests: out[s] = a[s] @ b (or @ b^T, a
// transposed view as the recurrent layers' W_hh^T) for every s, through one RepeatedMatmul.
Array matmul_repeated(const Array& a, const Array& b, bool transpose_b) {
  const char* op = "matmul_repeated";
  if (a.ndim() != 3 || b.ndim() != 2 || a.shape[2] != b.shape[transpose_b ? 1 : 0])
    throw ValueError(message(op, "expected a (S, M, K) and b (", transpose_b ? "N, K" : "K, N",
                             "), got ", shape_str(a.shape), " and ", shape_str(b.shape)));
  if (a.dtype != b.dtype)
    throw TypeError(message(op, "expected a and b of one dtype, got ", dtype_name(a.dtype),
                            " and ", dtype_name(b.dtype)));
  const i64 S = a.shape[0], M = a.shape[1];
  Array bv = b;
  if (transpose_b) {
    bv.shape = {b.shape[1], b.shape[0]};
    bv.strides = {b.strides[1], b.strides[0]};
  }
  const i64 N = bv.shape[1];
  Array out = Array::empty(a.backend(), {S, M, N}, a.dtype, op);
  if (S == 0) return out;
  auto slice = [](const Array& x, i64 s) {
    Array v = x;
    v.offset = x.offset + s * x.strides[0];
    v.shape = {x.shape[1], x.shape[2]};
    v.strides = {x.strides[1], x.strides[2]};
    return v;
  };
  const RepeatedMatmul product(op, slice(a, 0), bv, slice(out, 0));
  for (i64 s = 0; s < S; ++s) product(slice(a, s), slice(out, s));
  return out;
}
FM_PYTHON_OP_FLOAT64(matmul_repeated,
                     "_matmul_repeated(a: Array, b: Array, transpose_b: bool)",
                     "Private: tests/test_rnn.py checks RepeatedMatmul (ops/matmul.h), the "
                     "recurrent layers' per-step product, against matmul.");
}  // namespace fm
