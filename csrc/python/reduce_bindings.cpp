// Python entry points of the reductions and matrix products (fastmetal.sum ... argmin,
// matmul, linear, linear_backward): parse and validate the arguments, convert operands to
// float32 Arrays on the op's device, compute without the GIL, return NumPy or
// fastmetal.Array (python/fastmetal/reductions.py and linalg.py add the docstrings).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <utility>

#include "ops/arguments.h"
#include "ops/convert.h"
#include "ops/elementwise.h"
#include "core/errors.h"
#include "ops/matmul.h"
#include "ops/kernel_group.h"
#include "ops/reduce.h"
#include "python/pyarray.h"

namespace fm::python {
namespace {

int normalize_axis(const std::string& op, std::int64_t a, std::int64_t ndim) {
  if (a < -ndim || a >= ndim)
    throw ValueError(message(op, "expected axis in [", -ndim, ", ", ndim, ") for an array of ",
                             ndim, " dimensions, got ", a));
  return int(a < 0 ? a + ndim : a);
}

// axis=None | int | tuple of ints -> sorted unique axes (None: all).
std::vector<int> parse_axes(const std::string& op, py::handle axis, std::int64_t ndim,
                            bool tuple_ok) {
  std::vector<int> axes;
  if (axis.is_none()) {
    for (int d = 0; d < ndim; ++d) axes.push_back(d);
    return axes;
  }
  if (auto i = int_arg(axis)) return {normalize_axis(op, *i, ndim)};
  if (!tuple_ok || !(py::isinstance<py::tuple>(axis) || py::isinstance<py::list>(axis)))
    throw TypeError(message(op, "expected axis to be None, an int",
                            tuple_ok ? " or a tuple of ints" : "", ", got ",
                            std::string(py::repr(axis))));
  for (auto v : py::reinterpret_borrow<py::sequence>(axis)) {
    auto i = int_arg(v);
    if (!i)
      throw TypeError(message(op, "expected axis to be a tuple of ints, got ",
                              std::string(py::repr(axis))));
    axes.push_back(normalize_axis(op, *i, ndim));
  }
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    throw ValueError(message(op, "expected distinct axes, got ", std::string(py::repr(axis))));
  return axes;
}

Shape keepdims_shape(const Shape& in, const std::vector<int>& axes) {
  Shape s = in;
  for (int a : axes) s[a] = 1;
  return s;
}

// 0-d NumPy results become NumPy scalars, as NumPy's reductions return.
py::object numpy_result(py::array r) {
  if (r.ndim() == 0) return r[py::tuple()];
  return std::move(r);
}

// A result the op computed (a new Array): into out= where given (ops/arguments.h's road),
// else as NumPy (0-d: a NumPy scalar) or an Array.
py::object give(const std::string& op, Array r, py::handle out, bool as_array) {
  if (out.is_none()) {
    if (as_array) return py::cast(std::move(r));
    return numpy_result(numpy_view(r));
  }
  OutArg o = out_arg(out, r.backend(), op);
  Output output(op, o, r);
  {
    py::gil_scoped_release nogil;
    output.finish();
    r.backend().end_op();
  }
  return out_result(output, out, as_array);
}

// Reductions: the dtypes are ops/arguments.h's reduce_dtypes (float16 computed in float32
// and returned as float16; int64 Arrays summed in int64, refused where not taken).
py::object reduce_py(const std::string& name, py::handle x, py::handle axis, bool keepdims,
                     double ddof, py::handle out) {
  const ReduceOp op = parse_reduce_op(name);
  Backend& b = pick_backend(name, {{"a", x}, {"out", out}});
  const bool as_array = is_array(x);
  const bool arg = op == ReduceOp::argmax || op == ReduceOp::argmin;
  ReduceDTypes t = reduce_dtypes(name, on_device(native_dtype_of(x, name, "a"), b.has_float64()),
                                 "a");
  t.compute = on_device(t.compute, b.has_float64());
  Array a = to_operand(x, b, name, "a", t.compute);
  const std::vector<int> axes = parse_axes(name, axis, a.ndim(), !arg);
  Array r;
  {
    py::gil_scoped_release nogil;
    r = arg ? reduce_arg(op, a, axis.is_none() ? -1 : axes[0]) : reduce(op, a, axes, ddof);
    if (r.dtype != t.result) r = convert(r, t.result);
    b.end_op();
  }
  if (keepdims) {
    r.shape = keepdims_shape(a.shape, axes);
    r.strides = contiguous_strides(r.shape);
  }
  return give(name, std::move(r), out, as_array);
}

// cumsum(a, axis=None) and cumprod: in a's dtype (floats), int64 for integers and bool (as
// NumPy).
py::object scan_py(const std::string& name, py::handle x, py::handle axis, py::handle out) {
  Backend& b = pick_backend(name, {{"a", x}, {"out", out}});
  const DType dtype = cumsum_dtype(on_device(native_dtype_of(x, name, "a"), b.has_float64()));
  Array a = to_operand(x, b, name, "a", dtype);
  int ax = -1;
  if (!axis.is_none()) {
    auto i = int_arg(axis);
    if (!i) throw TypeError(message(name, "expected axis to be None or an int, got ",
                                    std::string(py::repr(axis))));
    ax = normalize_axis(name, *i, std::max<std::int64_t>(a.ndim(), 1));
    if (a.ndim() == 0) ax = -1;
  }
  Array r;
  {
    py::gil_scoped_release nogil;
    r = name == "cumprod" ? cumprod(a, ax) : cumsum(a, ax);
    b.end_op();
  }
  if (out.is_none()) return wrap_result(std::move(r), is_array(x));
  return give(name, std::move(r), out, is_array(x));
}

// A transposed 2-D view (no copy).
Array transposed(Array w) {
  std::swap(w.shape[0], w.shape[1]);
  std::swap(w.strides[0], w.strides[1]);
  return w;
}

// x (*, n) contiguous as a 2-D (prod(*), n) view.
Array as_rows(const Array& x) {
  Array v = x;
  const std::int64_t n = x.shape.empty() ? 1 : x.shape.back();
  v.shape = {n == 0 ? 0 : x.size() / std::max<std::int64_t>(n, 1), n};
  if (n == 0) {
    std::int64_t rows = 1;
    for (std::size_t d = 0; d + 1 < x.shape.size(); ++d) rows *= x.shape[d];
    v.shape[0] = rows;
  }
  v.strides = contiguous_strides(v.shape);
  return v;
}

// The dtype a product computes in (matmul's rule): float64 where an operand is float64 and
// the backend has the float64 GEMM (cpu, cuda), else float32.
DType product_dtype(const std::string& op, Backend& be,
                    std::initializer_list<std::pair<const char*, py::handle>> operands) {
  bool f64 = false;
  for (const auto& [name, h] : operands)
    f64 = f64 || (!h.is_none() && native_dtype_of(h, op, name) == DType::float64);
  return f64 && be.has_float64() ? DType::float64 : DType::float32;
}

void check_linear(const std::string& op, const Shape& x, const Shape& w, const char* xname) {
  if (w.size() != 2)
    throw ValueError(message(op, "expected a 2-D weight (out_features, in_features), got shape ",
                             shape_str(w)));
  if (x.empty() || x.back() != w[1])
    throw ValueError(message(op, "expected ", xname, " of shape (*, in_features) with in_features = ",
                             w[1], " (weight.shape[1]), got shape ", shape_str(x)));
}

py::object linear_py(py::handle x, py::handle w, py::handle bias) {
  const std::string op = "linear";
  Backend& b = pick_backend(op, {{"x", x}, {"weight", w}, {"bias", bias}});
  const bool as_array = any_array({x, w, bias});
  // The weight's dtype decides (as PyTorch's layers): float32 weights keep float32
  // products whatever x is, as they always did.
  const DType dtype = product_dtype(op, b, {{"weight", w}});
  Array xa = to_contiguous_array(x, b, op, "x", dtype);
  Array wa = to_array(w, b, op, "weight", dtype);
  check_linear(op, xa.shape, wa.shape, "x");
  std::optional<Array> ba;
  if (!bias.is_none()) {
    ba = to_array(bias, b, op, "bias", dtype);
    if (ba->shape != Shape{wa.shape[0]})
      throw ValueError(message(op, "expected bias of shape (", wa.shape[0],
                               ",) (out_features), got shape ", shape_str(ba->shape)));
  }
  Array y;
  {
    py::gil_scoped_release nogil;
    // One (rows, in) @ (in, out) product over all leading dims, not a batch of small ones
    // per leading index (2-4x slower on the CPU for a transformer's (B, T, E) inputs).
    const Array x2 = as_rows(xa), wt = transposed(wa);
    if (ba) {  // the bias added as the GEMM stores each tile where the backend can
      y = Array::empty(b, matmul_shape(op, x2.shape, wt.shape), x2.dtype, op.c_str());
      matmul_bias_into(op, x2, wt, *ba, y);
    } else {
      y = matmul(op, x2, wt);
    }
    b.end_op();
    Shape ys = xa.shape;
    ys.back() = wa.shape[0];
    y.shape = ys;  // a fresh contiguous result: the leading dims back as a view
    y.strides = contiguous_strides(ys);
  }
  return wrap_result(std::move(y), as_array);
}

py::tuple linear_backward_py(py::handle gy, py::handle x, py::handle w, py::handle needs) {
  const std::string op = "linear_backward";
  bool want_x = false, want_w = false, want_b = false;
  auto bad_needs = [&] {
    return ValueError(message(op, "expected needs to be a collection of 'input', 'weight', ",
                              "'bias', got ", std::string(py::repr(needs))));
  };
  if (py::isinstance<py::str>(needs)) throw bad_needs();
  try {
    for (auto n : py::iter(needs)) {
      if (!py::isinstance<py::str>(n)) throw bad_needs();
      const std::string s = n.cast<std::string>();
      if (s == "input") want_x = true;
      else if (s == "weight") want_w = true;
      else if (s == "bias") want_b = true;
      else throw bad_needs();
    }
  } catch (const py::error_already_set&) {
    throw bad_needs();
  }
  Backend& b = pick_backend(op, {{"grad_output", gy}, {"x", x}, {"weight", w}});
  const bool as_array = any_array({gy, x, w});
  const DType dtype = product_dtype(op, b, {{"weight", w}});  // as the forward
  Array ga = to_contiguous_array(gy, b, op, "grad_output", dtype);
  Array xa = to_contiguous_array(x, b, op, "x", dtype);
  Array wa = to_array(w, b, op, "weight", dtype);
  check_linear(op, xa.shape, wa.shape, "x");
  Shape want_gy = xa.shape;
  want_gy.back() = wa.shape[0];
  if (ga.shape != want_gy)
    throw ValueError(message(op, "expected grad_output of shape ", shape_str(want_gy),
                             " (x.shape[:-1] + (out_features,)), got shape ", shape_str(ga.shape)));
  std::optional<Array> gx, gw, gb;
  {
    py::gil_scoped_release nogil;
    const Array g2 = as_rows(ga), x2 = as_rows(xa);
    if (want_x) {
      gx = matmul(op, g2, wa);  // one product over all leading dims, as the forward's
      gx->shape = xa.shape;
      gx->strides = contiguous_strides(xa.shape);
    }
    if (want_w) gw = matmul(op, transposed(g2), x2);
    if (want_b) gb = reduce(ReduceOp::sum, g2, {0}, 0);
    b.end_op();
  }
  auto out = [&](std::optional<Array>& a) -> py::object {
    if (!a) return py::none();
    return wrap_result(std::move(*a), as_array);
  };
  return py::make_tuple(out(gx), out(gw), out(gb));
}

py::object matmul_py(py::handle a, py::handle b, py::handle out) {
  const std::string op = "matmul";
  Backend& be = pick_backend(op, {{"a", a}, {"b", b}, {"out", out}});
  const bool as_array = any_array({a, b});
  // A float64 operand (NumPy's promotion) makes the product float64, computed in double
  // where the backend has the float64 GEMM (cpu, cuda); else float32.
  const DType dtype = product_dtype(op, be, {{"a", a}, {"b", b}});
  Array aa = to_array(a, be, op, "a", dtype);
  Array ba = to_array(b, be, op, "b", dtype);
  const Shape shape = matmul_shape(op, aa.shape, ba.shape);
  OutArg o = out_arg(out, be, op);
  // Each output reads whole rows and columns: any overlap with an operand, a temporary.
  Output output(op, o, be, shape, dtype, {&aa, &ba}, Aliasing::none, true);
  {
    py::gil_scoped_release nogil;
    matmul_into(op, aa, ba, output.target());
    output.finish();
    be.end_op();
  }
  if (!output.has_out() && !as_array) return numpy_result(numpy_view(output.take()));
  return out_result(output, out, as_array);
}

// A result a Python composite computed (dot of N-D arrays, concatenate) into out=, by the
// same rules as every op's out=; returns out.
py::object store_out_py(const std::string& op, py::handle result, py::handle out) {
  Backend& b = pick_backend(op, {{"result", result}, {"out", out}});
  // A NumPy result keeps its dtype where fastmetal has it (int64 indices included).
  Array r = to_array(result, b, op, "result");
  return give(op, std::move(r), out, true);
}

}  // namespace

void bind_reductions(py::module_& m) {
  m.def("_reduce", &reduce_py, py::arg("op"), py::arg("a"), py::arg("axis") = py::none(),
        py::arg("keepdims") = false, py::arg("ddof") = 0.0, py::arg("out") = py::none());
  m.def("_cumsum", [](py::handle a, py::handle axis, py::handle out) {
          return scan_py("cumsum", a, axis, out);
        }, py::arg("a"), py::arg("axis") = py::none(), py::arg("out") = py::none());
  m.def("_cumprod", [](py::handle a, py::handle axis, py::handle out) {
          return scan_py("cumprod", a, axis, out);
        }, py::arg("a"), py::arg("axis") = py::none(), py::arg("out") = py::none());
  m.def("_store_out", &store_out_py, py::arg("op"), py::arg("result"), py::arg("out"));
  m.def("_matmul", &matmul_py, py::arg("a"), py::arg("b"), py::arg("out") = py::none());
  m.def("_linear", &linear_py, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("_linear_backward", &linear_backward_py, py::arg("grad_output"), py::arg("x"),
        py::arg("weight"), py::arg("needs"));
  // Tests: the reduction and matmul kernels' threadgroup size, on any device.
  m.def("_set_kernel_group_size", &set_kernel_group_size, py::arg("threads"));
  m.def("_kernel_group_size", &kernel_group_size);
}

}  // namespace fm::python
