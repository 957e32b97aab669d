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

struct Layout {
  Array src;  // contiguous
  i64 outer = 1, R = 1, inner = 1;
  Shape kept;  // shape of the result
};

// A contiguous copy of a strided view, on its device (floats: x * 1 through the elementwise
// kernels, exact for every float, NaN and -0 included; int64: the copy kernel).
Array gather(const Array& view) {
  if (view.dtype == DType::int64) return convert(view, DType::int64);
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

KernelArg buf(const Array& a) { return KernelArg::buffer(a.storage, a.byte_offset()); }

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

void launch_reduce(const std::string& kernel, const Layout& l, const ReduceArgs& args,
                   std::vector<KernelArg> buffers) {
  Backend& b = l.src.backend();
  const i64 outputs = l.outer * l.inner;
  const std::uint32_t t = group_threads(b, kernel, l.R, outputs);
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = std::uint32_t(outputs * t);
  d.cost = std::uint64_t(std::max<i64>(1, l.R / t));
  buffers.push_back(KernelArg::inline_bytes(&args, sizeof args));
  b.launch(kernel, d, buffers);
}

ReduceArgs kernel_args(const Layout& l, const std::string& op) {
  const i64 outputs = l.outer * l.inner;
  if (l.src.size() > i64(std::numeric_limits<std::int32_t>::max()) ||
      outputs > i64(std::numeric_limits<std::uint32_t>::max()))
    throw ValueError(message(op, "expected at most 2**31-1 elements on device '",
                             l.src.backend().name(), "', got ", l.src.size()));
  ReduceArgs a{};
  a.outer = std::uint32_t(l.outer);
  a.R = std::uint32_t(l.R);
  a.inner = std::uint32_t(l.inner);
  a.divisor = 1.0f;
  a.flags = 0;
  return a;
}

void check_not_empty(ReduceOp op, const Layout& l) {
  const bool has_identity = op == ReduceOp::sum || op == ReduceOp::mean || op == ReduceOp::var ||
                            op == ReduceOp::std;  // 0, or 0 / 0 = NaN
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

// sum (int64, wrapping) or mean (float32) of an int64 array.
Array reduce_int64(ReduceOp op, const Array& x, const std::vector<int>& axes) {
  Layout l = layout(x, axes);
  const bool mean = op == ReduceOp::mean;
  Array out = Array::empty(x.backend(), l.kept, mean ? DType::float32 : DType::int64);
  if (out.size() == 0) return out;
  ReduceArgs a = kernel_args(l, reduce_op_name(op));
  a.divisor = float(l.R);
  launch_reduce(mean ? "reduce_mean_int64" : "reduce_sum_int64", l, a, {buf(l.src), buf(out)});
  return out;
}

}  // namespace

ReduceOp parse_reduce_op(const std::string& n) {
  static const std::pair<const char*, ReduceOp> names[] = {
      {"sum", ReduceOp::sum},       {"mean", ReduceOp::mean},     {"var", ReduceOp::var},
      {"std", ReduceOp::std},       {"max", ReduceOp::max},       {"min", ReduceOp::min},
      {"argmax", ReduceOp::argmax}, {"argmin", ReduceOp::argmin}};
  for (auto& [s, op] : names)
    if (n == s) return op;
  throw ValueError(message("reduce", "expected one of sum, mean, var, std, max, min, argmax, ",
                           "argmin, got '", n, "'"));
}

const char* reduce_op_name(ReduceOp op) {
  static const char* names[] = {"sum", "mean", "var", "std", "max", "min", "argmax", "argmin"};
  return names[int(op)];
}

Array reduce(ReduceOp op, const Array& x, const std::vector<int>& axes, double ddof) {
  const std::string name = reduce_op_name(op);
  if (x.dtype == DType::int64 && (op == ReduceOp::sum || op == ReduceOp::mean))
    return reduce_int64(op, x, axes);
  if (x.dtype != DType::float32)
    throw TypeError(message(name, "expected a float32 array, got ", dtype_name(x.dtype)));
  Layout l = layout(x, axes);
  check_not_empty(op, l);
  Backend& b = x.backend();
  Array out = Array::empty(b, l.kept, DType::float32);
  const i64 outputs = l.outer * l.inner;
  if (outputs == 0) return out;
  const double R = double(l.R);
  double divisor = 1.0;
  if (op == ReduceOp::mean) divisor = R;
  if (op == ReduceOp::var || op == ReduceOp::std) divisor = std::max(0.0, R - ddof);
  const bool root = op == ReduceOp::std;

  const bool is_sum = op == ReduceOp::sum || op == ReduceOp::mean;
  const bool is_dev = op == ReduceOp::var || op == ReduceOp::std;
  NativeRows* sum_rows = native<NativeRows>(b, "reduce_sum_rows");
  NativeRows* fast = is_sum ? sum_rows
                     : is_dev ? (sum_rows ? native<NativeRows>(b, "reduce_sumsq_dev_rows") : nullptr)
                     : op == ReduceOp::max ? native<NativeRows>(b, "reduce_max_rows")
                     : op == ReduceOp::min ? native<NativeRows>(b, "reduce_min_rows")
                                           : nullptr;
  if (fast != nullptr) {
    b.synchronize();  // the gather, if any
    const float* src = reinterpret_cast<const float*>(l.src.host_data());
    float* dst = reinterpret_cast<float*>(out.host_data());
    if (is_dev) {
      std::vector<double> mean(static_cast<std::size_t>(outputs));
      sum_rows(src, l.outer, l.R, l.inner, nullptr, R, false, nullptr, mean.data());
      fast(src, l.outer, l.R, l.inner, mean.data(), divisor, root, dst, nullptr);
    } else {
      fast(src, l.outer, l.R, l.inner, nullptr, divisor, false, dst, nullptr);
    }
    return out;
  }

  ReduceArgs a = kernel_args(l, name);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean:
      a.divisor = float(divisor);
      launch_reduce("reduce_sum", l, a, {buf(l.src), buf(l.src), buf(out)});
      break;
    case ReduceOp::var:
    case ReduceOp::std: {
      Array mean = Array::empty(b, l.kept, DType::float32);
      a.divisor = float(R);
      launch_reduce("reduce_sum", l, a, {buf(l.src), buf(l.src), buf(mean)});
      a.divisor = float(divisor);
      a.flags = root ? 1u : 0u;
      launch_reduce("reduce_sumsq_dev", l, a, {buf(l.src), buf(mean), buf(out)});
      break;
    }
    case ReduceOp::max:
      launch_reduce("reduce_max", l, a, {buf(l.src), buf(out)});
      break;
    case ReduceOp::min:
      launch_reduce("reduce_min", l, a, {buf(l.src), buf(out)});
      break;
    default:
      throw ValueError(message(name, "expected a value reduction"));
  }
  return out;
}

Array reduce_arg(ReduceOp op, const Array& x, int axis) {
  const std::string name = reduce_op_name(op);
  if (x.dtype != DType::float32)
    throw TypeError(message(name, "expected a float32 array, got ", dtype_name(x.dtype)));
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
  if (auto* fast = native<NativeArgRows>(b, sign > 0 ? "reduce_argmax_rows" : "reduce_argmin_rows")) {
    b.synchronize();
    fast(reinterpret_cast<const float*>(l.src.host_data()), l.outer, l.R, l.inner,
         reinterpret_cast<std::int64_t*>(out.host_data()));
    return out;
  }
  ReduceArgs a = kernel_args(l, name);
  launch_reduce(sign > 0 ? "reduce_argmax" : "reduce_argmin", l, a, {buf(l.src), buf(out)});
  return out;
}

}  // namespace fm
