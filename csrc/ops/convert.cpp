#include "ops/convert.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "backend/capture.h"
#include "convert_args.h"
#include "core/errors.h"
#include "ops/launch_pieces.h"
#include "ops/array_arg.h"

namespace fm {
namespace {

// One launch per < 2**32 elements of `shape` (C order); strides[k] addresses operand k
// (the last one is the output, written through the last buffer).
void launch_view(const std::string& kernel, std::vector<KernelArg> buffers, Shape shape,
                 std::vector<Strides> strides) {
  Backend& be = *buffers.back().storage->backend;
  std::vector<Strides*> ptrs;
  for (Strides& s : strides) ptrs.push_back(&s);
  merge_dims(shape, ptrs);
  if (shape.size() > FM_VIEW_MAX_DIMS)
    throw ValueError("[fastmetal] dtype conversions support at most " +
                     std::to_string(FM_VIEW_MAX_DIMS) + " non-mergeable dimensions, got " +
                     std::to_string(shape.size()));
  ViewArgs a{};
  a.ndim = std::int32_t(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    a.shape[d] = shape[d];
    for (std::size_t k = 0; k < strides.size() && k < 3; ++k) a.strides[k][d] = strides[k][d];
  }
  launch_in_pieces(be, kernel, buffers, a, numel(shape),
                   [](ViewArgs& args, std::int64_t base) { args.base = base; });
}


}  // namespace

void launch_convert(const Array& x, const Array& out) {
  if (out.size() == 0) return;
  const std::string kernel =
      std::string("convert_") + dtype_name(x.dtype) + "_" + dtype_name(out.dtype);
  // Operand slot 1 is unused by conversions: its strides stay zero.
  launch_view(kernel, {buf(x), buf(out)}, out.shape,
              {broadcast_strides(x.shape, x.strides, out.shape), Strides(out.shape.size(), 0),
               out.strides});
}

void fill_from_element(const Array& out, const void* element) {
  if (out.size() == 0) return;
  Backend& be = out.backend();
  Array one = Array::empty(be, {}, out.dtype, "fill");
  be.copy_from_host(*one.storage, one.byte_offset(), element, itemsize(out.dtype));
  launch_convert(one, out);
}

void fill_zero(const Array& a) {
  if (a.size() == 0) return;
  if (a.backend().host_visible()) {
    char* p = a.host_data();
    const std::size_t n = a.nbytes();
    capture::run_host([p, n] { std::memset(p, 0, n); }, {a.storage});
  } else {
    alignas(8) const char zero[8] = {};
    fill_from_element(a, zero);
  }
}

Array convert(const Array& x, DType to) {
  Array out = Array::empty(x.backend(), x.shape, to, "astype");
  launch_convert(x, out);
  return out;
}

bool is_comparison(const std::string& op) {
  return op == "less" || op == "less_equal" || op == "greater" || op == "greater_equal" ||
         op == "equal" || op == "not_equal";
}

void launch_compare(const std::string& op, const Array& x, const Array& y, const Array& out) {
  if (!is_comparison(op) || x.dtype != y.dtype || out.dtype != DType::bool_)
    throw TypeError(message(op, "expected a comparison of two arrays of one dtype into bool, got ",
                            dtype_name(x.dtype), " and ", dtype_name(y.dtype)));
  if (out.size() == 0) return;
  const Shape& shape = out.shape;
  launch_view(std::string("compare_") + op + "_" + dtype_name(x.dtype), {buf(x), buf(y), buf(out)},
              shape,
              {broadcast_strides(x.shape, x.strides, shape),
               broadcast_strides(y.shape, y.strides, shape), out.strides});
}

bool is_bitwise(const std::string& op) {
  return op == "bitwise_and" || op == "bitwise_or" || op == "bitwise_xor" ||
         op == "left_shift" || op == "right_shift";
}

bool is_int_binary(const std::string& op) {
  return op == "add" || op == "subtract" || op == "multiply" || op == "floor_divide" ||
         op == "remainder" || op == "maximum" || op == "minimum" || op == "power" || is_bitwise(op);
}

bool is_rounding(const std::string& op) {
  return op == "floor" || op == "ceil" || op == "trunc" || op == "round";
}

bool is_int_unary(const std::string& op) {
  return op == "negative" || op == "abs" || op == "square" || op == "bitwise_invert" ||
         op == "sign";
}

namespace {
bool int_kernel_exists(const std::string& op, DType t, bool binary) {
  if (t == DType::bool_)
    return binary ? (op == "bitwise_and" || op == "bitwise_or" || op == "bitwise_xor")
                  : op == "bitwise_invert";
  return is_integer(t) && (binary ? is_int_binary(op) : is_int_unary(op));
}
}  // namespace

void launch_binary_int(const std::string& op, const Array& x, const Array& y, const Array& out) {
  if (x.dtype != y.dtype || out.dtype != x.dtype || !int_kernel_exists(op, x.dtype, true))
    throw TypeError(message(op, "expected two ", dtype_name(out.dtype), " arrays for integer ",
                            "arithmetic, got ", dtype_name(x.dtype), " and ", dtype_name(y.dtype)));
  if (out.size() == 0) return;
  const Shape& shape = out.shape;
  launch_view(std::string(dtype_name(x.dtype)) + "_" + op, {buf(x), buf(y), buf(out)}, shape,
              {broadcast_strides(x.shape, x.strides, shape),
               broadcast_strides(y.shape, y.strides, shape), out.strides});
}

void launch_unary_int(const std::string& op, const Array& x, const Array& out) {
  if (out.dtype != x.dtype || !int_kernel_exists(op, x.dtype, false))
    throw TypeError(message(op, "expected an integer or bool array, got ", dtype_name(x.dtype)));
  if (out.size() == 0) return;
  launch_view(std::string(dtype_name(x.dtype)) + "_" + op, {buf(x), buf(out)}, x.shape,
              {broadcast_strides(x.shape, x.strides, out.shape), Strides(out.shape.size(), 0),
               out.strides});
}

Array where(const Array& cond_in, const Array& x, const Array& y) {
  if (x.dtype != y.dtype)
    throw TypeError(message("where", "expected x and y of one dtype, got ", dtype_name(x.dtype),
                            " and ", dtype_name(y.dtype)));
  const Shape shape = broadcast_shapes(broadcast_shapes(cond_in.shape, x.shape, "where"), y.shape,
                                       "where");
  Array out = Array::empty(x.backend(), shape, x.dtype, "where");
  if (out.size() == 0) return out;
  const Array cond = cond_in.dtype == DType::bool_ ? cond_in : convert(cond_in, DType::bool_);
  launch_convert(y, out);  // y everywhere (launch_convert broadcasts y to out's shape) ...
  // ... then x where the condition holds.
  launch_view(std::string("where_") + width_name(x.dtype), {buf(cond), buf(x), buf(out)}, shape,
              {broadcast_strides(cond.shape, cond.strides, shape),
               broadcast_strides(x.shape, x.strides, shape), out.strides});
  return out;
}

}  // namespace fm
