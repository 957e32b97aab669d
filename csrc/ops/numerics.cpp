#include "ops/numerics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "core/errors.h"
#include "numerics_args.h"
#include "backend/native_ops.h"
#include "ops/array_arg.h"

namespace fm {
namespace {

constexpr std::int64_t kMaxU32 = std::numeric_limits<std::uint32_t>::max();
constexpr std::int64_t kMaxI32 = std::numeric_limits<std::int32_t>::max();

StoragePtr upload(Backend& be, const void* data, std::size_t nbytes) {
  StoragePtr s = be.allocate(std::max<std::size_t>(nbytes, 4));
  if (nbytes) be.copy_from_host(*s, 0, data, nbytes);
  return s;
}

// Terms between re-seeds of the rotation recurrence: its error grows about linearly with
// the number of steps, so this bounds it (~block * 1e-7); the seed costs ~25 flops.
constexpr std::int32_t kFourierBlock = 16;

// Samples per thread of the wide kernel variants where the backend prefers them (a CPU
// vectorises the loop over them; native op "<name>", signature std::int64_t()), else 1.
std::int64_t preferred_lanes(const Backend& be, const char* name) {
  auto lanes = native<std::int64_t()>(be, name);
  return lanes ? lanes() : 1;
}

}  // namespace

namespace {

// T: the compute type, float (float32) or double (float64: the *_float64 kernels, one lane a
// thread; the uniform interior weights travel in the weight buffer, not the argument block).
template <typename T>
void launch_stencil_as(const Array& f, int axis, const StencilTable& t, const Array& out) {
  constexpr bool f64 = std::is_same_v<T, double>;
  const std::string suffix = f64 ? "_float64" : "";
  const std::vector<T> weights(t.weights.begin(), t.weights.end());  // rounded once for float32
  Backend& be = out.backend();
  StencilArgs a{};
  Shape outer(f.shape.begin(), f.shape.begin() + axis);
  Strides outer_st(f.strides.begin(), f.strides.begin() + axis);
  Shape inner(f.shape.begin() + axis + 1, f.shape.end());
  Strides inner_st(f.strides.begin() + axis + 1, f.strides.end());
  merge_dims(outer, {&outer_st});
  merge_dims(inner, {&inner_st});
  if (outer.size() > FM_STENCIL_MAX_DIMS || inner.size() > FM_STENCIL_MAX_DIMS)
    throw ValueError("[fastmetal] stencil: too many non-mergeable dimensions");
  const std::int64_t n = f.shape[axis];
  const std::int64_t outer_total = numel(outer), inner_total = numel(inner);
  if (n > kMaxI32 || inner_total > kMaxI32 || outer_total > kMaxU32 ||
      n * inner_total > kMaxU32)
    throw ValueError("[fastmetal] stencil: array too large for one launch");
  for (std::size_t d = 0; d < outer.size(); ++d) {
    a.outer_shape[d] = std::int32_t(outer[d]);
    a.outer_strides[d] = outer_st[d];
  }
  for (std::size_t d = 0; d < inner.size(); ++d) {
    a.inner_shape[d] = std::int32_t(inner[d]);
    a.inner_strides[d] = inner_st[d];
  }
  a.n_outer = std::int32_t(outer.size());
  a.n_inner = std::int32_t(inner.size());
  a.axis_stride = f.strides[axis];
  a.n = std::int32_t(n);
  a.width = t.width;
  a.n_left = t.n_left;
  a.n_right = t.n_right;
  a.per_index = t.per_index ? 1 : 0;
  a.inner_total = std::int32_t(inner_total);
  a.axis_in_x = inner_total == 1 ? 1 : 0;

  // Interior: the stencil row of point n_left (all interior rows share its offset and, for
  // per-point tables, its width), trimmed of trailing zero padding and rounded up to a
  // compiled width. Every tap of every interior point must lie inside [0, n).
  const std::int64_t interior = std::max<std::int64_t>(0, n - t.n_left - t.n_right);
  const int row = t.n_left;  // per-point tables: row i is point i
  int used = t.width;
  std::string stem;
  StoragePtr wt;
  if (interior > 0) {
    if (t.per_index) {
      used = 3;
      for (std::int64_t i = t.n_left; i < n - t.n_right; ++i)
        if (t.offsets[i] != t.offsets[row]) throw ValueError("[fastmetal] internal: per-point stencil offsets differ");
    } else {
      while (used > 1 && weights[std::size_t(row) * t.width + used - 1] == T(0)) --used;
    }
    const int W = used <= 3 ? 3 : used <= 5 ? 5 : used <= 7 ? 7 : 9;
    a.off_interior = t.offsets[row];
    if (used > 9 || (t.per_index && t.width != 3) || t.n_left + a.off_interior < 0 ||
        a.off_interior + W > t.n_right + 1)
      throw ValueError("[fastmetal] internal: stencil table does not fit the interior kernels");
    if (t.per_index) {
      std::vector<T> tr(std::size_t(3 * n), T(0));  // transposed: contiguous in i per tap
      for (std::int64_t i = 0; i < n; ++i)
        for (int k = 0; k < 3; ++k) tr[std::size_t(k * n + i)] = weights[std::size_t(i * 3 + k)];
      wt = upload(be, tr.data(), tr.size() * sizeof(T));
      stem = "stencil_interior_3pp";
    } else if (f64) {
      std::vector<T> row_w(std::size_t(W), T(0));  // the uniform row, read from the buffer
      for (int k = 0; k < used; ++k) row_w[std::size_t(k)] = weights[std::size_t(row) * t.width + k];
      wt = upload(be, row_w.data(), row_w.size() * sizeof(T));
      stem = "stencil_interior_" + std::to_string(W);
    } else {
      for (int k = 0; k < used; ++k) a.w_interior[k] = float(weights[std::size_t(row) * t.width + k]);
      wt = upload(be, a.w_interior, sizeof(float));  // unused by the uniform kernels
      stem = "stencil_interior_" + std::to_string(W);
    }
  }

  auto dispatch = [&](std::int64_t points, const std::string& kernel) {
    Dispatch d;
    if (a.axis_in_x) {
      d.grid[0] = std::uint32_t(points);
      d.grid[1] = std::uint32_t(outer_total);
    } else {
      d.grid[0] = std::uint32_t(inner_total);
      d.grid[1] = std::uint32_t(points);
      d.grid[2] = std::uint32_t(outer_total);
    }
    d.group[0] = std::min<std::uint32_t>(be.preferred_group_size(kernel), d.grid[0]);
    return d;
  };
  const std::int64_t edges = std::min<std::int64_t>(n, t.n_left + t.n_right);
  if (edges > 0) {
    StoragePtr w = upload(be, weights.data(), weights.size() * sizeof(T));
    StoragePtr o = upload(be, t.offsets.data(), t.offsets.size() * sizeof(std::int32_t));
    const std::string kernel = "stencil_edges" + suffix;
    be.launch(kernel, dispatch(edges, kernel),
              {buf(f), KernelArg::buffer(w),
               KernelArg::buffer(o), buf(out),
               KernelArg::inline_bytes(&a, sizeof(a))});
  }
  if (interior <= 0) return;
  // Backends that prefer it (CPUs): 16 lanes along a stride-1 vector direction (the axis
  // itself, or the merged inner dim), launched over whole groups of 16, then the rest one
  // lane per thread.
  const bool wide16 = !f64 && preferred_lanes(be, "stencil_lanes") == 16;
  std::string wide;
  std::int64_t vec_extent = 0;
  if (wide16 && a.axis_in_x && a.axis_stride == 1) {
    wide = stem + "_l16_axis";
    vec_extent = interior;
  } else if (wide16 && !a.axis_in_x && a.n_inner == 1 && a.inner_strides[0] == 1) {
    wide = stem + "_l16_inner";
    vec_extent = inner_total;
  }
  auto run = [&](const std::string& kernel, std::int64_t lanes, std::int64_t first,
                 std::int64_t count) {
    StencilArgs b = a;
    b.v_first = std::int32_t(first);
    Dispatch d = dispatch(interior, kernel);
    d.grid[0] = std::uint32_t(count / lanes);
    d.group[0] = std::min<std::uint32_t>(d.group[0], d.grid[0]);
    be.launch(kernel, d,
              {buf(f), KernelArg::buffer(wt),
               buf(out),
               KernelArg::inline_bytes(&b, sizeof(b))});
  };
  const std::int64_t main_part = wide.empty() ? 0 : vec_extent / 16 * 16;
  if (main_part > 0) run(wide, 16, 0, main_part);
  const std::int64_t total = a.axis_in_x ? interior : inner_total;
  if (main_part < total) run(stem + "_l1" + suffix, 1, main_part, total - main_part);
}

}  // namespace

void launch_stencil(const Array& f, int axis, const StencilTable& t, const Array& out) {
  if (out.size() == 0) return;
  if (out.dtype == DType::float64) return launch_stencil_as<double>(f, axis, t, out);
  launch_stencil_as<float>(f, axis, t, out);
}

void launch_fourier(const Array& x, const std::vector<double>& coef, const FourierParams& p,
                    const Array& out) {
  const std::int64_t n = x.size();
  if (n == 0) return;
  Backend& be = out.backend();
  const bool f64 = out.dtype == DType::float64;
  FourierArgs a{};
  const double inv = 1.0 / p.period;
  a.inv_hi = float(inv);
  a.inv_lo = float(inv - double(a.inv_hi));
  a.c0 = float(p.c0);
  a.num_terms = std::int32_t(coef.size() / 2);
  a.block = kFourierBlock;
  StoragePtr c;
  if (f64) {
    // float64: 1/P as a double-double (its remainder 1 - inv P is exact by FMA), and c0, at
    // the head of the coefficient buffer (numerics.metal: num_params).
    std::vector<double> head = {inv, std::fma(-inv, p.period, 1.0) / p.period, p.c0, 0.0};
    head.insert(head.end(), coef.begin(), coef.end());
    c = upload(be, head.data(), head.size() * sizeof(double));
  } else {
    const std::vector<float> cf(coef.begin(), coef.end());
    c = upload(be, cf.data(), cf.size() * sizeof(float));
  }
  const std::size_t item = itemsize(out.dtype);

  // Samples per thread: the backend's choice (the CPU runs many so the loop over them
  // vectorises, 16 or 64 by instruction set; a GPU one). float64: one.
  const std::int64_t lanes = f64 ? 1 : preferred_lanes(be, "fourier_series_lanes");
  const std::string one = f64 ? "fourier_series_l1_float64" : "fourier_series_l1";
  const std::string wide = f64 ? one : "fourier_series_l" + std::to_string(lanes);
  const std::size_t xo = x.byte_offset(), oo = out.byte_offset();

  // Launch samples [lo, lo + count) (count a multiple of `l`) with the kernel of `l` lanes;
  // each thread sums every term for its `l` samples, which the cost hint tells the CPU backend.
  auto run = [&](const std::string& kernel, std::int64_t l, std::int64_t lo, std::int64_t count) {
    for (std::int64_t done = 0; done < count;) {
      const std::int64_t threads = std::min<std::int64_t>(kMaxU32 / 2, (count - done) / l);
      Dispatch d;
      d.grid[0] = std::uint32_t(threads);
      d.group[0] = std::min<std::uint32_t>(be.preferred_group_size(kernel), d.grid[0]);
      d.cost = std::uint64_t(l) * std::uint64_t(std::max<std::int32_t>(1, a.num_terms));
      const std::size_t byte = std::size_t(lo + done) * item;
      be.launch(kernel, d,
                {KernelArg::buffer(x.storage, xo + byte), KernelArg::buffer(c),
                 KernelArg::buffer(out.storage, oo + byte), KernelArg::inline_bytes(&a, sizeof(a))});
      done += threads * l;
    }
  };
  const std::int64_t main = n / lanes * lanes;
  if (main > 0) run(wide, lanes, 0, main);
  if (main < n) run(one, 1, main, n - main);
}

}  // namespace fm
