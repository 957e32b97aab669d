#include "ops/indexing.h"

#include <algorithm>
#include <limits>

#include "core/errors.h"
#include "index_args.h"
#include "ops/convert.h"
#include "ops/launch_pieces.h"
#include "ops/array_arg.h"

namespace fm {
namespace {



// The arguments for element e of (S..., rest...) = the result with the indexed axis moved
// first: operand 0 is x without the axis (zero strides over S), 1 the value, 2 the output.
TakeArgs take_args(const Array& x, int axis, const Array& idx, const Strides& value_strides,
                   const Strides& out_strides, const char* op) {
  TakeArgs a{};
  Shape shape = idx.shape;
  Strides xs(idx.shape.size(), 0);
  for (int d = 0; d < int(x.ndim()); ++d)
    if (d != axis) {
      shape.push_back(x.shape[d]);
      xs.push_back(x.strides[d]);
    }
  if (shape.size() > FM_VIEW_MAX_DIMS)
    throw ValueError(message(op, "expected at most ", FM_VIEW_MAX_DIMS,
                             " dimensions in an advanced-indexing result, got ", shape.size()));
  // Result dims in NumPy order (x.shape[:axis], S, rest) -> (S, x.shape[:axis], rest).
  auto moved = [&](const Strides& s) {
    Strides m(s.begin() + axis, s.begin() + axis + std::ptrdiff_t(idx.ndim()));
    m.insert(m.end(), s.begin(), s.begin() + axis);
    m.insert(m.end(), s.begin() + axis + std::ptrdiff_t(idx.ndim()), s.end());
    return m;
  };
  const Strides vs = value_strides.empty() ? Strides(shape.size(), 0) : moved(value_strides);
  const Strides os = out_strides.empty() ? Strides(shape.size(), 0) : moved(out_strides);
  a.view.ndim = std::int32_t(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    a.view.shape[d] = shape[d];
    a.view.strides[0][d] = xs[d];
    a.view.strides[1][d] = vs[d];
    a.view.strides[2][d] = os[d];
  }
  a.rest = 1;
  for (std::size_t d = idx.shape.size(); d < shape.size(); ++d) a.rest *= shape[d];
  a.axis_len = x.shape[axis];
  a.axis_stride = x.strides[axis];
  return a;
}

void launch_take_args(Backend& be, const std::string& kernel, const std::vector<KernelArg>& bufs,
                      TakeArgs a, std::int64_t n) {
  launch_in_pieces(be, kernel, bufs, a, n,
                   [](TakeArgs& args, std::int64_t base) { args.view.base = base; });
}

Shape result_shape(const Array& x, int axis, const Array& idx) {
  Shape s(x.shape.begin(), x.shape.begin() + axis);
  s.insert(s.end(), idx.shape.begin(), idx.shape.end());
  s.insert(s.end(), x.shape.begin() + axis + 1, x.shape.end());
  return s;
}

Array contiguous_index(const Array& idx) {
  if (idx.dtype != DType::int64)
    throw TypeError(message("take", "expected an int64 index array, got ", dtype_name(idx.dtype)));
  return idx.contiguous() ? idx : convert(idx, DType::int64);
}

}  // namespace

Array take(const Array& x, int axis, const Array& idx_in) {
  const Array idx = contiguous_index(idx_in);
  Array out = Array::empty(x.backend(), result_shape(x, axis, idx), x.dtype, "take");
  if (out.size() == 0) return out;
  const TakeArgs a = take_args(x, axis, idx, {}, out.strides, "take");
  launch_take_args(x.backend(), std::string("take_") + width_name(x.dtype),
                   {buf(x), buf(idx), buf(out)}, a, out.size());
  return out;
}

void put(const Array& x, int axis, const Array& idx_in, const Array& value) {
  const Array idx = contiguous_index(idx_in);
  const Shape shape = result_shape(x, axis, idx);
  if (value.shape != shape || value.dtype != x.dtype)
    throw ValueError(message("put", "expected a value of shape ", shape_str(shape), " and dtype ",
                             dtype_name(x.dtype), ", got shape ", shape_str(value.shape)));
  const std::int64_t n = numel(shape);
  if (n == 0) return;
  // A value that overlaps x is read from a copy (no element may change before it is read).
  const Array v = may_overlap(value, x) ? convert(value, value.dtype) : value;
  const TakeArgs a = take_args(x, axis, idx, v.strides, {}, "put");
  launch_take_args(x.backend(), std::string("put_") + width_name(x.dtype), {buf(x), buf(idx), buf(v)},
                   a, n);
}

Array mask_positions(const Array& mask_in, std::int64_t count) {
  const Array mask = mask_in.dtype == DType::float32 && mask_in.contiguous()
                         ? mask_in
                         : convert(mask_in, DType::float32);
  Backend& be = mask.backend();
  Array out = Array::empty(be, {count}, DType::int64, "mask");
  if (count == 0 || mask.size() == 0) return out;
  TakeArgs a{};
  a.rest = mask.size();
  Dispatch d;
  const std::uint32_t t = std::min<std::uint32_t>(1024, be.max_group_size("mask_positions"));
  d.group[0] = t;
  d.grid[0] = t;
  d.cost = std::uint64_t(std::max<std::int64_t>(1, mask.size() / t));
  be.launch("mask_positions", d, {buf(mask), buf(out), KernelArg::inline_bytes(&a, sizeof a)});
  return out;
}

}  // namespace fm
