#include "reduce.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "ops/convert.h"
#include "ops/elementwise.h"
#include "backend/native_ops.h"
#include "core/errors.h"
#include "kernel_group.h"
#include "reduce_args.h"
#include "ops/array_arg.h"

namespace fm {
namespace {

using i64 = std::int64_t;

// A backend's own reductions over contiguous float32 (outer, R, inner) in host memory
// (same semantics as metal/reduce.metal): "reduce_sum_rows" writes sum / divisor (sqrt if
// root) to out and/or out_f64; "reduce_sumsq_dev_rows" likewise for the squares of
// x - mean[o]; "reduce_max_rows" / "reduce_min_rows" the NaN-propagating extreme
// (mean, divisor, root unused).
using NativeRows = void(const float* x, i64 outer, i64 R, i64 inner, const double* mean,
                        double divisor, bool root, float* out, double* out_f64);
// "reduce_argmax_rows" / "reduce_argmin_rows": index along R, first NaN wins, ties first.
using NativeArgRows = void(const float* x, i64 outer, i64 R, i64 inner, i64* out);
// The same over float64, in double ("reduce_*_rows_float64"): results float64 (the sums'
// mean / divisor / root as above; max / min ignore them).
using NativeRows64 = void(const double* x, i64 outer, i64 R, i64 inner, const double* mean,
                          double divisor, bool root, double* out);
using NativeArgRows64 = void(const double* x, i64 outer, i64 R, i64 inner, i64* out);

struct Layout {
  Array src;  // contiguous
  i64 outer = 1, R = 1, inner = 1;
  Shape kept;  // shape of the result
};

// A contiguous copy of a strided view, on its device (floats: x * 1 through the elementwise
// kernels, exact for every float, NaN and -0 included; int64 and float16: the conversion
// kernels' copy).
Array gather(const Array& view) {
  if (view.dtype != DType::float32) return convert(view, view.dtype);  // int64, float16 (cumsum)
  Backend& b = view.backend();
  Array one = Array::empty(b, {}, view.dtype);
  const float v = 1.0f;
  b.copy_from_host(*one.storage, one.byte_offset(), &v, sizeof v);
  Array out = Array::empty(b, view.shape, view.dtype);
  launch_binary("multiply", view, one, out);
  return out;
}

Layout layout(const Array& x, const std::vector<int>& axes) {
  Layout l;
  const int nd = int(x.ndim());
  std::vector<bool> reduced(nd, false);
  for (int a : axes) reduced[a] = true;
  for (int d = 0; d < nd; ++d)
    if (!reduced[d]) l.kept.push_back(x.shape[d]);
  const bool adjacent = axes.empty() || axes.back() - axes.front() + 1 == int(axes.size());
  if (adjacent && x.contiguous()) {
    l.src = x;
    const int a0 = axes.empty() ? nd : axes.front(), a1 = axes.empty() ? nd : axes.back() + 1;
    for (int d = 0; d < a0; ++d) l.outer *= x.shape[d];
    for (int d = a0; d < a1; ++d) l.R *= x.shape[d];
    for (int d = a1; d < nd; ++d) l.inner *= x.shape[d];
    return l;
  }
  // Kept axes first, reduced axes last, then one contiguous copy.
  Array view = x;
  view.shape.clear();
  view.strides.clear();
  for (int pass = 0; pass < 2; ++pass)
    for (int d = 0; d < nd; ++d)
      if (reduced[d] == (pass == 1)) {
        view.shape.push_back(x.shape[d]);
        view.strides.push_back(x.strides[d]);
        (pass == 0 ? l.outer : l.R) *= x.shape[d];
      }
  l.src = view.size() == 0 ? Array::empty(x.backend(), view.shape, x.dtype) : gather(view);
  return l;
}

const char* numpy_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return "maximum";
    case ReduceOp::min: return "minimum";
    default: return reduce_op_name(op);
  }
}


// ReduceArgs::flags (metal/reduce.metal).
constexpr std::uint32_t kRootFlag = 1, kCombineFlag = 2, kPartialFlag = 4;

// The divisor of sum-like results, for the float32 kernels (divisor) and the float64 ones
// (divisor64: the double's bits, low word first).
void set_divisor(ReduceArgs& a, double divisor) {
  a.divisor = float(divisor);
  std::uint64_t bits;
  std::memcpy(&bits, &divisor, sizeof bits);
  a.divisor64[0] = std::uint32_t(bits);
  a.divisor64[1] = std::uint32_t(bits >> 32);
}

// A kernel's host name for x's dtype: float32's plain name, float64's with "_float64" (the
// *_float64 instances: cpu and cuda).
std::string typed(const char* kernel, DType t) {
  return t == DType::float64 ? std::string(kernel) + "_float64" : std::string(kernel);
}

// Threads per group: the test override, else the power of two covering R (32 to 256),
// within the pipeline's limit and 1024 (the kernels' slot count), few enough that the
// grid fits 32 bits.
std::uint32_t group_threads(Backend& b, const std::string& kernel, i64 R, i64 outputs) {
  std::uint32_t t = kernel_group_size();
  if (t == 0) {
    t = 32;
    while (t < 256 && i64(t) < R) t *= 2;
  }
  t = std::max<std::uint32_t>(1, std::min({t, b.max_group_size(kernel), 1024u}));
  while (t > 1 && std::uint64_t(outputs) * t > std::numeric_limits<std::uint32_t>::max()) t /= 2;
  return t;
}

// Launches `kernel` with one threadgroup per output and segment (args.split per output):
// buffers `before` the argument block, the block, then `after` (reduce.metal's slots).
void launch_reduce(Backend& b, const std::string& kernel, i64 outputs, const ReduceArgs& args,
                   std::vector<KernelArg> before, const std::vector<KernelArg>& after = {}) {
  const i64 groups = outputs * i64(args.split);
  const std::uint32_t t = group_threads(b, kernel, args.seg_len, groups);
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = std::uint32_t(groups * t);
  d.cost = std::uint64_t(std::max<i64>(1, i64(args.seg_len) / t));
  before.push_back(KernelArg::inline_bytes(&args, sizeof args));
  for (const KernelArg& k : after) before.push_back(k);
  b.launch(kernel, d, before);
}

// Segments per output row: few outputs with long rows get several threadgroups each (a
// full reduction on one group of a GPU runs on one of its cores), in segments of at least
// kSegment elements, at most kMaxSplit of them. A function of the problem's shape only
// (never of the device or the thread count), so the results' bits are too.
constexpr i64 kSegment = 4096, kMaxSplit = 1024, kSplitBelowOutputs = 256;
i64 segment_length(i64 outputs, i64 R) {
  if (outputs >= kSplitBelowOutputs || R < 2 * kSegment) return R;
  return std::max(kSegment, (R + kMaxSplit - 1) / kMaxSplit);
}

ReduceArgs kernel_args(const Layout& l, const std::string& op, bool may_split = false) {
  const i64 outputs = l.outer * l.inner;
  if (l.src.size() > i64(std::numeric_limits<std::int32_t>::max()) ||
      outputs > i64(std::numeric_limits<std::uint32_t>::max()))
    throw ValueError(message(op, "expected at most 2**31-1 elements on device '",
                             l.src.backend().name(), "', got ", l.src.size()));
  ReduceArgs a{};
  a.outer = std::uint32_t(l.outer);
  a.R = std::uint32_t(l.R);
  a.inner = std::uint32_t(l.inner);
  set_divisor(a, 1.0);
  a.flags = 0;
  const i64 seg = may_split ? segment_length(outputs, l.R) : l.R;
  a.seg_len = std::uint32_t(seg);
  a.split = seg == 0 ? 1 : std::uint32_t((l.R + seg - 1) / seg);  // the last segment is not empty
  a.parts = 0;
  return a;
}

// The arguments of the launch that combines `parts` partial results per output, stored
// contiguously (output-major).
ReduceArgs combine_args(i64 outputs, std::uint32_t parts) {
  ReduceArgs a{};
  a.outer = std::uint32_t(outputs);
  a.R = parts;
  a.inner = 1;
  set_divisor(a, 1.0);
  a.flags = kCombineFlag;
  a.split = 1;
  a.seg_len = parts;
  return a;
}

// A sum in one launch or two: `first(args, out, out_lo)` runs the reducing kernel, once with
// the finished result where a.split is 1, else into (hi, lo) partials per segment that
// reduce_sum's combine launch then finishes (divided by `divisor`, square-rooted if `root`).
template <typename First>
void sum_in_one_or_two(Backend& b, ReduceArgs a, i64 outputs, DType t, const Array& out,
                       double divisor, bool root, First first) {
  if (a.split == 1) {
    set_divisor(a, divisor);
    a.flags = root ? kRootFlag : 0u;
    first(a, out, out);
    return;
  }
  const Shape parts_shape = {outputs * i64(a.split)};
  Array hi = Array::empty(b, parts_shape, t);
  Array lo = Array::empty(b, parts_shape, t);
  a.flags = kPartialFlag;
  first(a, hi, lo);
  ReduceArgs c = combine_args(outputs, a.split);
  set_divisor(c, divisor);
  c.flags |= root ? kRootFlag : 0u;
  launch_reduce(b, typed("reduce_sum", t), outputs, c, {buf(hi), buf(lo), buf(out)}, {buf(out)});
}

// sum / mean (divisor) / std (root) of rows, or of squared deviations from `mean` (dev):
// one launch, or a split one plus the launch that combines its double-float partials.
// float32 columns (32 or more after the axis: a bias gradient) go to reduce_sum_cols, in
// chunks of FM_REDUCE_COL_ROWS rows (a function of the shape only), FM_REDUCE_COL_BLOCK
// columns a threadgroup.
void launch_sum_rows(const Layout& l, ReduceArgs a, const Array* mean, const Array& out,
                     double divisor, bool root) {
  Backend& b = l.src.backend();
  const i64 outputs = l.outer * l.inner;
  const DType t = l.src.dtype;
  const KernelArg m = mean ? buf(*mean) : buf(l.src);
  if (t == DType::float32 && l.inner >= FM_REDUCE_COL_BLOCK) {
    const std::string kernel = mean ? "reduce_sumsq_dev_cols" : "reduce_sum_cols";
    a.seg_len = std::uint32_t(std::min<i64>(std::max<i64>(l.R, 1), FM_REDUCE_COL_ROWS));
    a.split = std::uint32_t(std::max<i64>(1, (l.R + a.seg_len - 1) / a.seg_len));
    const i64 groups = l.outer * ((l.inner + FM_REDUCE_COL_BLOCK - 1) / FM_REDUCE_COL_BLOCK) *
                       i64(a.split);
    const std::uint32_t threads = FM_REDUCE_COL_BLOCK * FM_REDUCE_COL_LANES;
    Dispatch d;
    d.group[0] = group_threads(b, kernel, threads, groups);
    d.grid[0] = std::uint32_t(groups * d.group[0]);
    d.cost = std::uint64_t(std::max<i64>(1, i64(a.seg_len) * FM_REDUCE_COL_BLOCK / d.group[0]));
    sum_in_one_or_two(b, a, outputs, t, out, divisor, root,
                      [&](const ReduceArgs& r, const Array& o, const Array& o_lo) {
                        b.launch(kernel, d, {buf(l.src), m, buf(o),
                                             KernelArg::inline_bytes(&r, sizeof r), buf(o_lo)});
                      });
    return;
  }
  const std::string kernel = typed(mean ? "reduce_sumsq_dev" : "reduce_sum", t);
  sum_in_one_or_two(b, a, outputs, t, out, divisor, root,
                    [&](const ReduceArgs& r, const Array& o, const Array& o_lo) {
                      launch_reduce(b, kernel, outputs, r, {buf(l.src), m, buf(o)}, {buf(o_lo)});
                    });
}

// max / min of rows, split like launch_sum_rows (the partials are the segments' extremes).
void launch_extreme_rows(const Layout& l, const ReduceArgs& a, const std::string& kernel,
                         const Array& out) {
  Backend& b = l.src.backend();
  const i64 outputs = l.outer * l.inner;
  if (a.split == 1) {
    launch_reduce(b, kernel, outputs, a, {buf(l.src), buf(out)});
    return;
  }
  Array parts = Array::empty(b, {outputs * i64(a.split)}, l.src.dtype);
  launch_reduce(b, kernel, outputs, a, {buf(l.src), buf(parts)});
  ReduceArgs c = combine_args(outputs, a.split);
  c.flags = 0;  // the extremes of the extremes: the same kernel, unsplit
  launch_reduce(b, kernel, outputs, c, {buf(parts), buf(out)});
}

void check_not_empty(ReduceOp op, const Layout& l) {
  const bool has_identity = op == ReduceOp::sum || op == ReduceOp::mean || op == ReduceOp::var ||
                            op == ReduceOp::std || op == ReduceOp::prod;  // 0 or 1, or 0 / 0 = NaN
  if (!has_identity && l.R == 0) {  // as NumPy, even where no output
    if (op == ReduceOp::argmax || op == ReduceOp::argmin)
      throw ValueError(message(reduce_op_name(op), "expected a non-empty axis, got an empty ",
                               "sequence (attempt to get ", reduce_op_name(op),
                               " of an empty sequence)"));
    throw ValueError(message(reduce_op_name(op), "expected a non-empty axis, got a zero-size ",
                             "array to reduction operation ", numpy_name(op),
                             " which has no identity"));
  }
}

// sum (int64, wrapping) or mean (float32) of an int64 array; max, min and prod (int64,
// the product wrapping) by reduce_fold.
Array reduce_int64(ReduceOp op, const Array& x, const std::vector<int>& axes) {
  Layout l = layout(x, axes);
  check_not_empty(op, l);
  const bool mean = op == ReduceOp::mean;
  Array out = Array::empty(x.backend(), l.kept, mean ? DType::float32 : DType::int64);
  if (out.size() == 0) return out;
  ReduceArgs a = kernel_args(l, reduce_op_name(op));
  set_divisor(a, double(l.R));
  const std::string kernel = op == ReduceOp::sum ? "reduce_sum_int64"
                             : mean              ? "reduce_mean_int64"
                                                 : std::string("reduce_") + reduce_op_name(op) + "_int64";
  launch_reduce(x.backend(), kernel, out.size(), a, {buf(l.src), buf(out)});
  return out;
}

// Runs `op` with the backend's own row reductions of T (NativeRows / NativeRows64: `suffix`
// "" or "_float64"), where it has them, and returns whether it did. `call` adapts the two
// signatures: call(fn, x, outer, R, inner, mean, divisor, root, out, mean_out), mean_out (the
// means var/std need first) given only when out is not.
template <typename T, typename Fn, typename Call>
bool reduce_rows_natively(Backend& b, ReduceOp op, const Layout& l, const Array& out, double R,
                          double divisor, bool root, const std::string& suffix, Call call) {
  const bool is_sum = op == ReduceOp::sum || op == ReduceOp::mean;
  const bool is_dev = op == ReduceOp::var || op == ReduceOp::std;
  auto find = [&](const char* stem) { return native_pointer<Fn>(b, (stem + suffix).c_str()); };
  Fn* sum_rows = find("reduce_sum_rows");
  Fn* fast = is_sum ? sum_rows
             : is_dev ? (sum_rows ? find("reduce_sumsq_dev_rows") : nullptr)
             : op == ReduceOp::max ? find("reduce_max_rows")
             : op == ReduceOp::min ? find("reduce_min_rows")
                                   : nullptr;
  if (fast == nullptr) return false;
  b.synchronize();  // the gather, if any
  const T* src = reinterpret_cast<const T*>(l.src.host_data());
  T* dst = reinterpret_cast<T*>(out.host_data());
  const i64 outer = l.outer, rows = l.R, inner = l.inner, outputs = outer * inner;
  // Raw pointers into the two storages: a capture keeps those alive (capture::run_host).
  capture::run_host(
      [=] {
        if (is_dev) {
          std::vector<double> mean(static_cast<std::size_t>(outputs));
          call(sum_rows, src, outer, rows, inner, nullptr, R, false, nullptr, mean.data());
          call(fast, src, outer, rows, inner, mean.data(), divisor, root, dst, nullptr);
        } else {
          call(fast, src, outer, rows, inner, nullptr, divisor, false, dst, nullptr);
        }
      },
      {l.src.storage, out.storage});
  return true;
}

}  // namespace

ReduceOp parse_reduce_op(const std::string& n) {
  static const std::pair<const char*, ReduceOp> names[] = {
      {"sum", ReduceOp::sum},       {"mean", ReduceOp::mean},     {"var", ReduceOp::var},
      {"std", ReduceOp::std},       {"max", ReduceOp::max},       {"min", ReduceOp::min},
      {"argmax", ReduceOp::argmax}, {"argmin", ReduceOp::argmin}, {"prod", ReduceOp::prod}};
  for (auto& [s, op] : names)
    if (n == s) return op;
  throw ValueError(message("reduce", "expected one of sum, mean, var, std, max, min, argmax, ",
                           "argmin, prod, got '", n, "'"));
}

const char* reduce_op_name(ReduceOp op) {
  static const char* names[] = {"sum", "mean", "var", "std", "max", "min", "argmax", "argmin", "prod"};
  return names[int(op)];
}

Array reduce(ReduceOp op, const Array& x, const std::vector<int>& axes, double ddof) {
  const std::string name = reduce_op_name(op);
  if (x.dtype == DType::int64 && op != ReduceOp::var && op != ReduceOp::std &&
      op != ReduceOp::argmax && op != ReduceOp::argmin)
    return reduce_int64(op, x, axes);
  const bool f64 = x.dtype == DType::float64;  // in double (the *_float64 kernels)
  if (x.dtype != DType::float32 && !f64)
    throw TypeError(message(name, "expected a float32 or float64 array, got ", dtype_name(x.dtype)));
  Layout l = layout(x, axes);
  check_not_empty(op, l);
  Backend& b = x.backend();
  Array out = Array::empty(b, l.kept, x.dtype);
  const i64 outputs = l.outer * l.inner;
  if (outputs == 0) return out;
  const double R = double(l.R);
  double divisor = 1.0;
  if (op == ReduceOp::mean) divisor = R;
  if (op == ReduceOp::var || op == ReduceOp::std) divisor = std::max(0.0, R - ddof);
  const bool root = op == ReduceOp::std;

  // The backend's own row reductions (the CPU's), float32's or float64's.
  const bool native =
      f64 ? reduce_rows_natively<double, NativeRows64>(
                b, op, l, out, R, divisor, root, "_float64",
                [](NativeRows64* f, const double* src, i64 o, i64 r, i64 in, const double* mean,
                   double d, bool rt, double* dst, double* mean_out) {
                  f(src, o, r, in, mean, d, rt, mean_out ? mean_out : dst);  // means into the one out
                })
          : reduce_rows_natively<float, NativeRows>(
                b, op, l, out, R, divisor, root, "",
                [](NativeRows* f, const float* src, i64 o, i64 r, i64 in, const double* mean,
                   double d, bool rt, float* dst, double* mean_out) {
                  f(src, o, r, in, mean, d, rt, dst, mean_out);
                });
  if (native) return out;

  const ReduceArgs a = kernel_args(l, name, /*may_split=*/true);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean:
      launch_sum_rows(l, a, nullptr, out, divisor, false);
      break;
    case ReduceOp::var:
    case ReduceOp::std: {
      Array mean = Array::empty(b, l.kept, x.dtype);
      launch_sum_rows(l, a, nullptr, mean, R, false);
      launch_sum_rows(l, a, &mean, out, divisor, root);
      break;
    }
    case ReduceOp::max:
      launch_extreme_rows(l, a, typed("reduce_max", x.dtype), out);
      break;
    case ReduceOp::min:
      launch_extreme_rows(l, a, typed("reduce_min", x.dtype), out);
      break;
    case ReduceOp::prod:  // one threadgroup per output, never split
      launch_reduce(b, std::string("reduce_prod_") + dtype_name(x.dtype), outputs,
                    kernel_args(l, name), {buf(l.src), buf(out)});
      break;
    default:
      throw ValueError(message(name, "expected a value reduction"));
  }
  return out;
}

void sum_rows_into(const Array& x, i64 outer, i64 R, i64 inner, const Array& out) {
  Layout l;
  l.src = x;
  l.outer = outer;
  l.R = R;
  l.inner = inner;
  l.kept = {outer * inner};
  if (outer * inner == 0) return;
  Backend& b = x.backend();
  const bool native = reduce_rows_natively<float, NativeRows>(
      b, ReduceOp::sum, l, out, double(R), 1.0, false, "",
      [](NativeRows* f, const float* src, i64 o, i64 r, i64 in, const double* mean, double d,
         bool rt, float* dst, double* mean_out) { f(src, o, r, in, mean, d, rt, dst, mean_out); });
  if (!native) launch_sum_rows(l, kernel_args(l, "sum", /*may_split=*/true), nullptr, out, 1.0, false);
}

Array reduce_arg(ReduceOp op, const Array& x, int axis) {
  const std::string name = reduce_op_name(op);
  const bool f64 = x.dtype == DType::float64;
  if (x.dtype != DType::float32 && !f64)
    throw TypeError(message(name, "expected a float32 or float64 array, got ", dtype_name(x.dtype)));
  std::vector<int> axes;
  if (axis >= 0) {
    axes.push_back(axis);
  } else {
    for (int d = 0; d < int(x.ndim()); ++d) axes.push_back(d);
  }
  Layout l = layout(x, axes);
  check_not_empty(op, l);
  Backend& b = x.backend();
  Array out = Array::empty(b, l.kept, DType::int64);
  const i64 outputs = l.outer * l.inner;
  if (outputs == 0) return out;
  const int sign = op == ReduceOp::argmax ? 1 : -1;
  // The CPU's own row loops (float32 and float64, one signature each): run on the host and
  // recorded as host work while fm.compile traces.
  auto on_host = [&](auto* fast, auto element) {
    using T = decltype(element);
    if (fast == nullptr) return false;
    b.synchronize();
    const T* src = reinterpret_cast<const T*>(l.src.host_data());
    std::int64_t* dst = reinterpret_cast<std::int64_t*>(out.host_data());
    const i64 outer = l.outer, rows = l.R, inner = l.inner;
    capture::run_host([=] { fast(src, outer, rows, inner, dst); }, {l.src.storage, out.storage});
    return true;
  };
  const std::string rows_name = sign > 0 ? "reduce_argmax_rows" : "reduce_argmin_rows";
  if (f64 ? on_host(native_pointer<NativeArgRows64>(b, (rows_name + "_float64").c_str()), double{})
          : on_host(native_pointer<NativeArgRows>(b, rows_name.c_str()), float{}))
    return out;
  const std::string kernel = typed(sign > 0 ? "reduce_argmax" : "reduce_argmin", x.dtype);
  ReduceArgs a = kernel_args(l, name, /*may_split=*/true);
  if (a.split == 1) {
    launch_reduce(b, kernel, outputs, a, {buf(l.src), buf(out)}, {buf(out)});
    return out;
  }
  // Each segment's winner, then the winner among them (values read from the input again).
  Array cand = Array::empty(b, {outputs * i64(a.split)}, DType::int64);
  launch_reduce(b, kernel, outputs, a, {buf(l.src), buf(cand)}, {buf(cand)});
  ReduceArgs c = a;
  c.parts = a.split;
  c.split = 1;
  c.seg_len = std::uint32_t(l.R);
  c.flags = kCombineFlag;
  launch_reduce(b, kernel, outputs, c, {buf(l.src), buf(out)}, {buf(cand)});
  return out;
}

namespace {
// A scan (kernel "<op>_<dtype>" of metal/scan.metal) along `axis`, or of the flattened x.
Array scan(const Array& x, int axis, const std::string& op) {
  if (x.dtype != DType::float32 && x.dtype != DType::float16 && x.dtype != DType::int64 &&
      x.dtype != DType::float64)
    throw TypeError(message(op, "expected a float32, float64, float16 or int64 array, got ",
                            dtype_name(x.dtype)));
  Array flat = x;
  if (axis < 0) {  // NumPy: the flattened array
    flat = x.contiguous() ? x : gather(x);
    flat.shape = {x.size()};
    flat.strides = {1};
    axis = 0;
  }
  Layout l = layout(flat, {axis});
  Array out = Array::empty(x.backend(), flat.shape, x.dtype, op.c_str());
  const i64 lines = l.outer * l.inner;
  if (out.size() == 0) return out;
  if (lines > i64(std::numeric_limits<std::uint32_t>::max()) ||
      l.R > i64(std::numeric_limits<std::uint32_t>::max()))
    throw ValueError(message(op, "expected at most 2**32-1 lines of at most 2**32-1 ",
                             "elements, got ", lines, " lines of ", l.R));
  // layout() put the axis last where it had to gather: then the lines are rows (inner = 1)
  // of a (kept..., R) copy, and the result is written in that order and moved back below.
  const bool moved = !flat.contiguous();
  ReduceArgs a{};
  a.outer = std::uint32_t(l.outer);
  a.R = std::uint32_t(l.R);
  a.inner = std::uint32_t(l.inner);
  a.split = 1;
  a.seg_len = a.R;
  Array target = moved ? Array::empty(x.backend(), l.src.shape, x.dtype, op.c_str()) : out;
  Dispatch d;
  d.grid[0] = std::uint32_t(lines);
  d.group[0] = x.backend().preferred_group_size(op + "_" + dtype_name(x.dtype));
  d.cost = std::uint64_t(std::max<i64>(1, l.R));
  x.backend().launch(op + "_" + dtype_name(x.dtype), d,
                     {buf(l.src), buf(target), KernelArg::inline_bytes(&a, sizeof a)});
  if (moved) {
    // target is (kept axes..., axis) in C order: view it with the axis back in its place.
    Array view = target;
    const int nd = int(flat.ndim());
    Strides ts = contiguous_strides(target.shape);
    view.shape = flat.shape;
    view.strides.assign(nd, 0);
    int k = 0;
    for (int dd = 0; dd < nd; ++dd)
      if (dd != axis) view.strides[dd] = ts[k++];
    view.strides[axis] = ts[nd - 1];
    launch_convert(view, out);
  }
  return out;
}
}  // namespace

Array cumsum(const Array& x, int axis) { return scan(x, axis, "cumsum"); }
Array cumprod(const Array& x, int axis) { return scan(x, axis, "cumprod"); }

}  // namespace fm
