#include "ops/normalization.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "backend/native_ops.h"
#include "core/errors.h"
#include "normalization_args.h"
#include "ops/array_arg.h"
#include "ops/convert.h"
#include "ops/kernel_group.h"

namespace fm {
namespace {

using i64 = std::int64_t;
constexpr i64 kMaxElems = std::numeric_limits<std::int32_t>::max();

// A backend's own implementations (contiguous float32 Arrays; same results as the kernels
// to float32 rounding, deterministic for any thread count).
using NativeRowNormForward = void(const RowNormArgs&, const Array& x, const Array* w,
                                  const Array* b, const Array& y, const Array& mean,
                                  const Array& rstd);
using NativeRowNormBackward = void(const RowNormArgs&, const Array& g, const Array& x,
                                   const Array* w, const Array& mean, const Array& rstd,
                                   const Array& dx, const Array* dw, const Array* db);
using NativeBatchNormForward = void(const BatchNormArgs&, const Array& x, const Array* w,
                                    const Array* b, const Array* rm, const Array* rv,
                                    const Array& y, const Array& save_mean,
                                    const Array& save_rstd, const Array* new_rm,
                                    const Array* new_rv);
using NativeBatchNormBackward = void(const BatchNormArgs&, const Array& g, const Array& x,
                                     const Array* w, const Array& mean, const Array& rstd,
                                     const Array& dx, const Array& dw, const Array& db);
using NativeSoftmax = void(const SoftmaxArgs&, const Array& x, const Array& out);
using NativeSoftmaxBackward = void(const SoftmaxArgs&, const Array& g, const Array& y,
                                   const Array& dx);

std::string kernel_name(const char* stem, DType t) {
  return std::string(stem) + (t == DType::float16 ? "_float16" : "_float32");
}

void check_data(const char* op, const char* arg, const Array& a, bool contiguous = true) {
  if (a.dtype != DType::float32 && a.dtype != DType::float16)
    throw TypeError(message(op, "expected ", arg, " of dtype float32 or float16, got ",
                            dtype_name(a.dtype)));
  if (contiguous && a.size() > 0 && !a.contiguous())
    throw ValueError(message(op, "internal: expected a contiguous ", arg));
  if (a.size() > kMaxElems)
    throw ValueError(message(op, "expected at most 2**31-1 elements in ", arg, ", got ",
                             a.size()));
}

// A float32 vector of `n` elements (weight, bias, statistics), or none.
void check_vector(const char* op, const char* arg, const Array* a, i64 n) {
  if (a == nullptr) return;
  if (a->dtype != DType::float32 || !a->contiguous())
    throw ValueError(message(op, "internal: expected ", arg, " as contiguous float32"));
  if (a->size() != n)
    throw ValueError(message(op, "expected ", arg, " of ", n, " elements, got shape ",
                             shape_str(a->shape)));
}

void check_same(const char* op, const Array& grad, const Array& x) {
  if (grad.shape != x.shape)
    throw ValueError(message(op, "expected grad_output of the input's shape ",
                             shape_str(x.shape), ", got ", shape_str(grad.shape)));
  if (grad.dtype != x.dtype)
    throw TypeError(message(op, "expected grad_output of the input's dtype ",
                            dtype_name(x.dtype), ", got ", dtype_name(grad.dtype)));
}

// Threads per group for the one-group-per-row kernels: the test override, else a power of
// two from 32 giving each thread about four elements, within the pipeline's limit and the
// kernels' 1024, few enough that the grid fits 32 bits.
std::uint32_t group_threads(Backend& b, const std::string& kernel, i64 n, i64 groups) {
  std::uint32_t t = kernel_group_size();
  if (t == 0) {
    t = 32;
    while (t < 1024 && i64(t) * 4 < n) t *= 2;
  }
  t = std::max<std::uint32_t>(1, std::min({t, b.max_group_size(kernel), 1024u}));
  while (t > 1 && std::uint64_t(groups) * t > std::numeric_limits<std::uint32_t>::max()) t /= 2;
  return t;
}

// One threadgroup per row (or channel): `groups` of them over `n` elements each.
void launch_groups(Backend& b, const std::string& kernel, i64 groups, i64 n, int passes,
                   const std::vector<KernelArg>& args) {
  const std::uint32_t t = group_threads(b, kernel, n, groups);
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = std::uint32_t(groups * t);
  d.cost = std::uint64_t(std::max<i64>(1, n / t)) * std::uint64_t(passes);
  b.launch(kernel, d, args);
}

// A 2-D grid of one thread per (x, y), groups along x.
void launch_grid2(Backend& b, const std::string& kernel, i64 x, i64 y, i64 cost,
                  const std::vector<KernelArg>& args) {
  Dispatch d;
  d.grid[0] = std::uint32_t(x);
  d.grid[1] = std::uint32_t(y);
  d.group[0] = std::max<std::uint32_t>(
      1, std::min<std::uint32_t>(b.preferred_group_size(kernel), std::uint32_t(x)));
  d.cost = std::uint64_t(std::max<i64>(1, cost));
  b.launch(kernel, d, args);
}

KernelArg block(const void* p, std::size_t n) { return KernelArg::inline_bytes(p, n); }

Array f32(const Array& a) { return a.dtype == DType::float32 ? a : convert(a, DType::float32); }

// The row norms' shared forward: rows of n elements (RowNormArgs).
std::vector<Array> row_norm(const char* op, const Array& x, const Shape& stat_shape,
                            const RowNormArgs& a, const Array* w, const Array* b) {
  Backend& be = x.backend();
  Array y = Array::empty(be, x.shape, x.dtype, op);
  Array mean = Array::empty(be, stat_shape, DType::float32, op);
  Array rstd = Array::empty(be, stat_shape, DType::float32, op);
  if (a.rows == 0) return {y, mean, rstd};
  if (auto fast = native<NativeRowNormForward>(be, "row_norm_forward")) {
    if (x.dtype == DType::float32) {
      fast(a, x, w, b, y, mean, rstd);
    } else {
      Array y32 = Array::empty(be, x.shape, DType::float32, op);
      fast(a, f32(x), w, b, y32, mean, rstd);
      launch_convert(y32, y);
    }
    return {y, mean, rstd};
  }
  const std::string k = kernel_name("row_norm_forward", x.dtype);
  launch_groups(be, k, a.rows, a.n, 3,
                {buf(x), buf(w ? *w : x), buf(b ? *b : x), buf(y), buf(mean), buf(rstd),
                 block(&a, sizeof a)});
  return {y, mean, rstd};
}

// The weight and bias gradients of the row norms through the kernels (AffineGradArgs).
void affine_grad(const Array& g, const Array& x, const Array& mean, const Array& rstd,
                 AffineGradArgs a, const Array& dw, const Array& db) {
  Backend& be = x.backend();
  if (a.C == 0) return;
  // Chunks fixed by the shape (so the sums are the same bits on every device): about 64
  // elements per thread, enough threads to fill a GPU (LayerNorm's (4096 rows, 128)
  // gradient took 164 us on an H200 at 512 rows a thread: 1,024 threads), and at most 1,024
  // chunks, so the partial sums stay small.
  a.chunk_rows = std::max<std::uint32_t>(1, 64 / std::max<std::uint32_t>(1, a.S));
  a.chunk_rows = std::max<std::uint32_t>(a.chunk_rows, (a.outer + 1023) / 1024);
  a.chunks = std::max<std::uint32_t>(1, (a.outer + a.chunk_rows - 1) / a.chunk_rows);
  const Shape part_shape = {i64(a.chunks), i64(a.C)};
  Array pw = Array::empty(be, part_shape, DType::float32);
  Array pb = Array::empty(be, part_shape, DType::float32);
  launch_grid2(be, kernel_name("norm_affine_partial", x.dtype), a.C, a.chunks,
               i64(a.chunk_rows) * a.S * 2,
               {buf(g), buf(x), buf(mean), buf(rstd), buf(pw), buf(pb), block(&a, sizeof a)});
  launch_grid2(be, "norm_affine_finish", a.C, 1, a.chunks,
               {buf(pw), buf(pb), buf(dw), buf(db), block(&a, sizeof a)});
}

std::vector<Array> row_norm_backward(const char* op, const Array& g, const Array& x,
                                     const RowNormArgs& a, const AffineGradArgs& ag,
                                     const Array* w, const Array& mean, const Array& rstd,
                                     i64 features, bool affine) {
  Backend& be = x.backend();
  Array dx = Array::empty(be, x.shape, x.dtype, op);
  Array dw, db;
  if (affine) {
    dw = Array::empty(be, {features}, DType::float32, op);
    db = Array::empty(be, {features}, DType::float32, op);
  }
  if (auto fast = native<NativeRowNormBackward>(be, "row_norm_backward")) {
    if (x.dtype == DType::float32) {
      fast(a, g, x, w, mean, rstd, dx, affine ? &dw : nullptr, affine ? &db : nullptr);
    } else {
      Array dx32 = Array::empty(be, x.shape, DType::float32, op);
      fast(a, f32(g), f32(x), w, mean, rstd, dx32, affine ? &dw : nullptr,
           affine ? &db : nullptr);
      launch_convert(dx32, dx);
    }
    if (!affine) return {dx};
    return {dx, dw, db};
  }
  if (a.rows > 0 && a.n > 0)
    launch_groups(be, kernel_name("row_norm_backward", x.dtype), a.rows, a.n, 2,
                  {buf(g), buf(x), buf(w ? *w : x), buf(mean), buf(rstd), buf(dx),
                   block(&a, sizeof a)});
  if (!affine) return {dx};
  affine_grad(g, x, mean, rstd, ag, dw, db);
  return {dx, dw, db};
}

void check_eps(const char* op, double eps) {
  if (!(eps >= 0.0) || eps > 3.4e38)
    throw ValueError(message(op, "expected eps to be a finite number >= 0, got ", eps));
}

std::uint32_t u32(i64 v) { return std::uint32_t(v); }

}  // namespace

// ---------------------------------------------------------------------- layer / rms norm
namespace {
struct RowsOf {
  i64 rows, n;
  Shape stat_shape;
};
RowsOf rows_of(const char* op, const Array& x, i64 norm_dims) {
  if (norm_dims < 1 || norm_dims > x.ndim())
    throw ValueError(message(op, "expected normalized_shape of 1 to ", x.ndim(),
                             " dimensions (the input has shape ", shape_str(x.shape), "), got ",
                             norm_dims));
  RowsOf r{1, 1, {}};
  for (i64 d = 0; d < x.ndim(); ++d) {
    if (d < x.ndim() - norm_dims) {
      r.rows *= x.shape[d];
      r.stat_shape.push_back(x.shape[d]);
    } else {
      r.n *= x.shape[d];
    }
  }
  return r;
}
RowNormArgs layer_args(const RowsOf& r, double eps, bool rms, const Array* w, const Array* b) {
  RowNormArgs a{};
  a.rows = u32(r.rows);
  a.n = u32(r.n);
  a.groups = 1;
  a.group_ch = u32(r.n);
  a.spatial = 1;
  a.flags = (rms ? kNormRms : 0u) | (w ? kNormWeight : 0u) | (b ? kNormBias : 0u);
  a.eps = float(eps);
  return a;
}
}  // namespace

std::vector<Array> layer_norm(const Array& x, std::int64_t norm_dims, const Array* weight,
                              const Array* bias, double eps, bool rms) {
  const char* op = rms ? "rms_norm" : "layer_norm";
  check_data(op, "input", x);
  check_eps(op, eps);
  const RowsOf r = rows_of(op, x, norm_dims);
  check_vector(op, "weight", weight, r.n);
  check_vector(op, "bias", bias, r.n);
  if (rms && bias) throw ValueError(message(op, "internal: rms_norm has no bias"));
  return row_norm(op, x, r.stat_shape, layer_args(r, eps, rms, weight, bias), weight, bias);
}

std::vector<Array> layer_norm_backward(const Array& grad, const Array& x, std::int64_t norm_dims,
                                       const Array* weight, const Array& mean,
                                       const Array& rstd, bool rms, bool affine) {
  const char* op = rms ? "rms_norm_backward" : "layer_norm_backward";
  check_data(op, "input", x);
  check_same(op, grad, x);
  const RowsOf r = rows_of(op, x, norm_dims);
  check_vector(op, "weight", weight, r.n);
  check_vector(op, "mean", &mean, r.rows);
  check_vector(op, "rstd", &rstd, r.rows);
  const RowNormArgs a = layer_args(r, 0.0, rms, weight, nullptr);
  AffineGradArgs ag{};
  ag.outer = u32(r.rows);
  ag.C = u32(r.n);
  ag.S = 1;
  ag.groups = 1;
  ag.group_ch = std::max<std::uint32_t>(1, u32(r.n));
  ag.flags = rms ? kNormRms : 0u;
  return row_norm_backward(op, grad, x, a, ag, weight, mean, rstd, r.n, affine);
}

// ---------------------------------------------------------------------- group norm
namespace {
struct GroupShape {
  i64 N, C, S, G;
};
GroupShape group_shape(const char* op, const Array& x, i64 groups) {
  if (x.ndim() < 2)
    throw ValueError(message(op, "expected an input of at least 2 dimensions (N, C, *), got shape ",
                             shape_str(x.shape)));
  GroupShape s{x.shape[0], x.shape[1], 1, groups};
  for (i64 d = 2; d < x.ndim(); ++d) s.S *= x.shape[d];
  if (groups < 1 || s.C % groups != 0)
    throw ValueError(message(op, "expected num_groups >= 1 dividing the ", s.C,
                             " channels, got ", groups));
  return s;
}
RowNormArgs group_args(const GroupShape& s, double eps, const Array* w, const Array* b) {
  RowNormArgs a{};
  a.rows = u32(s.N * s.G);
  a.n = u32(s.C / s.G * s.S);
  a.groups = u32(s.G);
  a.group_ch = u32(s.C / s.G);
  a.spatial = u32(std::max<i64>(1, s.S));
  a.flags = (w ? kNormWeight : 0u) | (b ? kNormBias : 0u);
  a.eps = float(eps);
  return a;
}
}  // namespace

std::vector<Array> group_norm(const Array& x, std::int64_t groups, const Array* weight,
                              const Array* bias, double eps) {
  const char* op = "group_norm";
  check_data(op, "input", x);
  check_eps(op, eps);
  const GroupShape s = group_shape(op, x, groups);
  check_vector(op, "weight", weight, s.C);
  check_vector(op, "bias", bias, s.C);
  return row_norm(op, x, {s.N, s.G}, group_args(s, eps, weight, bias), weight, bias);
}

std::vector<Array> group_norm_backward(const Array& grad, const Array& x, std::int64_t groups,
                                       const Array* weight, const Array& mean,
                                       const Array& rstd, bool affine) {
  const char* op = "group_norm_backward";
  check_data(op, "input", x);
  check_same(op, grad, x);
  const GroupShape s = group_shape(op, x, groups);
  check_vector(op, "weight", weight, s.C);
  check_vector(op, "mean", &mean, s.N * s.G);
  check_vector(op, "rstd", &rstd, s.N * s.G);
  const RowNormArgs a = group_args(s, 0.0, weight, nullptr);
  AffineGradArgs ag{};
  ag.outer = u32(s.N);
  ag.C = u32(s.C);
  ag.S = u32(s.S);
  ag.groups = u32(s.G);
  ag.group_ch = u32(s.C / s.G);
  return row_norm_backward(op, grad, x, a, ag, weight, mean, rstd, s.C, affine);
}

// ---------------------------------------------------------------------- batch norm
namespace {
BatchNormArgs batch_args(const char* op, const Array& x) {
  if (x.ndim() < 2)
    throw ValueError(message(op, "expected an input of at least 2 dimensions (N, C, *), got shape ",
                             shape_str(x.shape)));
  BatchNormArgs a{};
  i64 S = 1;
  for (i64 d = 2; d < x.ndim(); ++d) S *= x.shape[d];
  a.N = u32(x.shape[0]);
  a.C = u32(x.shape[1]);
  a.S = u32(S);
  return a;
}
}  // namespace

std::vector<Array> batch_norm(const Array& x, const Array* weight, const Array* bias,
                              const Array* running_mean, const Array* running_var,
                              bool training, double momentum, double eps) {
  const char* op = "batch_norm";
  check_data(op, "input", x);
  check_eps(op, eps);
  BatchNormArgs a = batch_args(op, x);
  const i64 C = a.C, count = i64(a.N) * i64(a.S);
  check_vector(op, "weight", weight, C);
  check_vector(op, "bias", bias, C);
  check_vector(op, "running_mean", running_mean, C);
  check_vector(op, "running_var", running_var, C);
  if ((running_mean == nullptr) != (running_var == nullptr))
    throw ValueError(message(op, "expected running_mean and running_var both or neither, got ",
                             running_mean ? "running_mean only" : "running_var only"));
  if (!training && running_mean == nullptr)
    throw ValueError(message(op, "expected running_mean and running_var when training=False, "
                             "got None"));
  if (training && count <= 1)
    throw ValueError(message(op, "expected more than 1 value per channel when training, got "
                             "input shape ", shape_str(x.shape)));
  if (!(momentum == momentum))
    throw ValueError(message(op, "expected momentum to be a number, got nan"));
  const bool update = training && running_mean != nullptr;
  a.flags = (training ? kNormTraining : 0u) | (update ? kNormRunning : 0u) |
            (weight ? kNormWeight : 0u) | (bias ? kNormBias : 0u);
  a.eps = float(eps);
  a.momentum = float(momentum);
  Backend& be = x.backend();
  Array y = Array::empty(be, x.shape, x.dtype, op);
  Array save_mean = Array::empty(be, {C}, DType::float32, op);
  Array save_rstd = Array::empty(be, {C}, DType::float32, op);
  // The running statistics are updated in place, as PyTorch's (contiguous float32: checked
  // above): each channel's element is read before it is written, by the same thread.
  Array new_mean, new_var;
  if (update) {
    new_mean = *running_mean;
    new_var = *running_var;
  }
  if (C == 0) return {y, save_mean, save_rstd};
  if (auto fast = native<NativeBatchNormForward>(be, "batch_norm_forward")) {
    if (x.dtype == DType::float32) {
      fast(a, x, weight, bias, running_mean, running_var, y, save_mean, save_rstd,
           update ? &new_mean : nullptr, update ? &new_var : nullptr);
    } else {
      Array y32 = Array::empty(be, x.shape, DType::float32, op);
      fast(a, f32(x), weight, bias, running_mean, running_var, y32, save_mean, save_rstd,
           update ? &new_mean : nullptr, update ? &new_var : nullptr);
      launch_convert(y32, y);
    }
  } else {
    launch_groups(be, kernel_name("batch_norm_forward", x.dtype), C, count, 3,
                  {buf(x), buf(weight ? *weight : x), buf(bias ? *bias : x),
                   buf(running_mean ? *running_mean : x), buf(running_var ? *running_var : x),
                   buf(y), buf(save_mean), buf(save_rstd), buf(update ? new_mean : x),
                   buf(update ? new_var : x), block(&a, sizeof a)});
  }
  return {y, save_mean, save_rstd};
}

std::vector<Array> batch_norm_backward(const Array& grad, const Array& x, const Array* weight,
                                       const Array& save_mean, const Array& save_rstd,
                                       bool training) {
  const char* op = "batch_norm_backward";
  check_data(op, "input", x);
  check_same(op, grad, x);
  BatchNormArgs a = batch_args(op, x);
  const i64 C = a.C, count = i64(a.N) * i64(a.S);
  check_vector(op, "weight", weight, C);
  check_vector(op, "save_mean", &save_mean, C);
  check_vector(op, "save_rstd", &save_rstd, C);
  a.flags = (training ? kNormTraining : 0u) | (weight ? kNormWeight : 0u);
  Backend& be = x.backend();
  Array dx = Array::empty(be, x.shape, x.dtype, op);
  Array dw = Array::empty(be, {C}, DType::float32, op);
  Array db = Array::empty(be, {C}, DType::float32, op);
  if (C == 0) return {dx, dw, db};
  if (auto fast = native<NativeBatchNormBackward>(be, "batch_norm_backward")) {
    if (x.dtype == DType::float32) {
      fast(a, grad, x, weight, save_mean, save_rstd, dx, dw, db);
    } else {
      Array dx32 = Array::empty(be, x.shape, DType::float32, op);
      fast(a, f32(grad), f32(x), weight, save_mean, save_rstd, dx32, dw, db);
      launch_convert(dx32, dx);
    }
    return {dx, dw, db};
  }
  launch_groups(be, kernel_name("batch_norm_backward", x.dtype), C, count, 2,
                {buf(grad), buf(x), buf(weight ? *weight : x), buf(save_mean), buf(save_rstd),
                 buf(dx), buf(dw), buf(db), block(&a, sizeof a)});
  return {dx, dw, db};
}

// ---------------------------------------------------------------------- softmax family
namespace {
SoftmaxArgs softmax_args(const char* op, const Shape& s, i64 axis, std::uint32_t mode) {
  const i64 nd = i64(s.size());
  if (axis < 0 || axis >= nd)
    throw ValueError(message(op, "expected an axis in [0, ", nd, "), got ", axis));
  i64 outer = 1, inner = 1;
  for (i64 d = 0; d < axis; ++d) outer *= s[d];
  for (i64 d = axis + 1; d < nd; ++d) inner *= s[d];
  SoftmaxArgs a{};
  a.outer = u32(outer);
  a.n = u32(s[axis]);
  a.inner = u32(inner);
  a.mode = mode;
  return a;
}

// The forward kernels for (outer, n, inner), any mode; out has x's elements (softmax,
// log_softmax) or outer * inner (logsumexp).
void launch_softmax(const Array& x, const SoftmaxArgs& a, const Array& out) {
  Backend& be = x.backend();
  if (auto fast = native<NativeSoftmax>(be, "softmax_forward")) {
    if (x.dtype == DType::float32) return fast(a, x, out);
    Array o32 = Array::empty(be, out.shape, DType::float32);
    fast(a, f32(x), o32);
    return launch_convert(o32, out);
  }
  const std::vector<KernelArg> args = {buf(x), buf(out), block(&a, sizeof a)};
  if (a.inner == 1)
    launch_groups(be, kernel_name("softmax_rows", x.dtype), a.outer, a.n, 3, args);
  else
    launch_grid2(be, kernel_name("softmax_cols", x.dtype), a.inner, a.outer, i64(a.n) * 12,
                 args);
}
}  // namespace

Array softmax(const Array& x, std::int64_t axis, std::uint32_t mode) {
  const char* op = mode == kLogSoftmax ? "log_softmax" : "softmax";
  check_data(op, "input", x);
  if (mode != kSoftmax && mode != kLogSoftmax)
    throw ValueError(message(op, "internal: bad softmax mode ", mode));
  const SoftmaxArgs a = softmax_args(op, x.shape, axis, mode);
  Array out = Array::empty(x.backend(), x.shape, x.dtype, op);
  if (out.size() == 0) return out;
  launch_softmax(x, a, out);
  return out;
}

Array softmax_backward(const Array& grad, const Array& y, std::int64_t axis,
                       std::uint32_t mode) {
  const char* op = mode == kLogSoftmax ? "log_softmax_backward" : "softmax_backward";
  check_data(op, "output", y);
  check_same(op, grad, y);
  if (mode != kSoftmax && mode != kLogSoftmax)
    throw ValueError(message(op, "internal: bad softmax mode ", mode));
  const SoftmaxArgs a = softmax_args(op, y.shape, axis, mode);
  Backend& be = y.backend();
  Array dx = Array::empty(be, y.shape, y.dtype, op);
  if (dx.size() == 0) return dx;
  if (auto fast = native<NativeSoftmaxBackward>(be, "softmax_backward")) {
    if (y.dtype == DType::float32) {
      fast(a, grad, y, dx);
      return dx;
    }
    Array d32 = Array::empty(be, y.shape, DType::float32, op);
    fast(a, f32(grad), f32(y), d32);
    launch_convert(d32, dx);
    return dx;
  }
  const std::vector<KernelArg> args = {buf(grad), buf(y), buf(dx), block(&a, sizeof a)};
  if (a.inner == 1)
    launch_groups(be, kernel_name("softmax_backward_rows", y.dtype), a.outer, a.n, 2, args);
  else
    launch_grid2(be, kernel_name("softmax_backward_cols", y.dtype), a.inner, a.outer,
                 i64(a.n) * 8, args);
  return dx;
}

Array logsumexp(const Array& x, const std::vector<int>& axes, bool keepdims) {
  const char* op = "logsumexp";
  check_data(op, "input", x, false);
  const int nd = int(x.ndim());
  std::vector<bool> reduced(std::size_t(nd), false);
  for (int ax : axes) {
    if (ax < 0 || ax >= nd) throw ValueError(message(op, "internal: axis ", ax, " out of range"));
    reduced[std::size_t(ax)] = true;
  }
  Shape kept, keep_shape;
  for (int d = 0; d < nd; ++d) {
    if (!reduced[std::size_t(d)]) kept.push_back(x.shape[d]);
    keep_shape.push_back(reduced[std::size_t(d)] ? 1 : x.shape[d]);
  }
  Backend& be = x.backend();
  // The reduced axes as one: in place where they are adjacent, else moved last by a copy.
  const bool adjacent = (axes.empty() || axes.back() - axes.front() + 1 == int(axes.size())) &&
                        (x.size() == 0 || x.contiguous());
  Array src = x;
  i64 outer = 1, n = 1, inner = 1;
  if (adjacent) {
    const int a0 = axes.empty() ? nd : axes.front(), a1 = axes.empty() ? nd : axes.back() + 1;
    for (int d = 0; d < a0; ++d) outer *= x.shape[d];
    for (int d = a0; d < a1; ++d) n *= x.shape[d];
    for (int d = a1; d < nd; ++d) inner *= x.shape[d];
  } else {
    Array view = x;
    view.shape.clear();
    view.strides.clear();
    for (int pass = 0; pass < 2; ++pass)
      for (int d = 0; d < nd; ++d)
        if (reduced[std::size_t(d)] == (pass == 1)) {
          view.shape.push_back(x.shape[d]);
          view.strides.push_back(x.strides[d]);
          (pass == 0 ? outer : n) *= x.shape[d];
        }
    src = Array::empty(be, view.shape, x.dtype, op);
    launch_convert(view, src);
  }
  Array out = Array::empty(be, keepdims ? keep_shape : kept, x.dtype, op);
  if (out.size() == 0) return out;
  SoftmaxArgs a{};
  a.outer = u32(outer);
  a.n = u32(n);
  a.inner = u32(inner);
  a.mode = kLogSumExp;
  launch_softmax(src, a, out);
  return out;
}

}  // namespace fm
