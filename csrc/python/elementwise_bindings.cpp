// Python entry points of the elementwise ops: describe the arguments, convert them to the
// dtypes ops/arguments.h decides, launch without the GIL, and return what API.md promises
// (out, an Array, or a NumPy view).
#include "python/elementwise_bindings.h"

#include "ops/arguments.h"
#include "ops/convert.h"
#include "ops/elementwise.h"
#include "core/errors.h"
#include "python/pyarray.h"

namespace fm::python {
namespace {

// Below this many elements the work takes less time than releasing and re-taking the GIL
// (as NumPy, which also keeps the GIL for small arrays).
constexpr std::int64_t kReleaseGilAbove = 1 << 14;

template <typename Fn>
void run_maybe_without_gil(std::int64_t elements, Fn&& fn) {
  if (elements > kReleaseGilAbove) {
    py::gil_scoped_release nogil;
    fn();
  } else {
    fn();
  }
}

}  // namespace

py::object unary(const std::string& op, py::handle x, py::handle out) {
  Backend& backend = pick_backend(op, {{"x", x}, {"out", out}});
  const bool fm_result = any_array({x, out});
  const DType dtype = on_device(unary_dtype(op, operand_of(x, op, "x")), backend.has_float64());
  OutArg o = out_arg(out, backend, op);
  Array xa = to_operand(x, backend, op, "x", dtype);
  Output output(op, o, backend, xa.shape, elementwise_result_dtype(op, dtype), {&xa});
  run_maybe_without_gil(xa.size(), [&] {
    launch_unary_any(op, xa, output.target());
    output.finish();
    backend.end_op();
  });
  return out_result(output, out, fm_result);
}

py::object binary(const std::string& op, py::handle x, py::handle y, py::handle out) {
  Backend& backend = pick_backend(op, {{"x", x}, {"y", y}, {"out", out}});
  const bool fm_result = any_array({x, y, out});
  const DType dtype = on_device(binary_dtype(op, operand_of(x, op, "x"), operand_of(y, op, "y")),
                                backend.has_float64());
  if (const auto sx = shape_without_converting(x))
    if (const auto sy = shape_without_converting(y))
      check_result_size(op, broadcast_shapes(*sx, *sy, op), dtype);
  OutArg o = out_arg(out, backend, op);
  Array xa = to_operand(x, backend, op, "x", dtype);
  Array ya = to_operand(y, backend, op, "y", dtype);
  check_exponents(op, dtype, [&] { return host_integer_min(y); });
  const Shape shape = broadcast_shapes(xa.shape, ya.shape, op);
  Output output(op, o, backend, shape, elementwise_result_dtype(op, dtype), {&xa, &ya});
  run_maybe_without_gil(output.target().size(), [&] {
    launch_binary_any(op, xa, ya, output.target());
    output.finish();
    backend.end_op();
  });
  return out_result(output, out, fm_result);
}

// where(condition, x, y) as numpy.where with three arguments (dtype: ops/arguments.h's
// where_dtype); the condition is bool (any other dtype: nonzero is true).
py::object where_py(py::handle cond, py::handle x, py::handle y) {
  const std::string op = "where";
  Backend& backend = pick_backend(op, {{"condition", cond}, {"x", x}, {"y", y}});
  const bool fm_result = any_array({cond, x, y});
  const DType dtype = on_device(where_dtype(operand_of(x, op, "x"), operand_of(y, op, "y")),
                                backend.has_float64());
  Array c = is_array(cond) ? cond.cast<const Array&>()
                           : to_array(cond, backend, op, "condition", DType::bool_);
  if (&c.backend() != &backend)
    throw ValueError(message(op, "expected condition on device '", backend.name(), "', got '",
                             c.backend().name(), "'"));
  Array xa = to_operand(x, backend, op, "x", dtype), ya = to_operand(y, backend, op, "y", dtype);
  Array r;
  run_maybe_without_gil(std::max({c.size(), xa.size(), ya.size()}), [&] {
    r = where(c, xa, ya);
    backend.end_op();
  });
  return wrap_result(std::move(r), fm_result);
}

}  // namespace fm::python
