// Python entry points of the numerics ops. python/fastmetal/numerics.py parses and
// validates the public arguments (numpy.gradient's rules, stencil construction, Fourier
// coefficient scaling in float64) and calls these private functions; they check what they
// receive once more (no crash on any input), launch without the GIL and return a NumPy
// array (NumPy in) or a fastmetal.Array (Array in).
#include <pybind11/numpy.h>

#include <cmath>
#include <string>

#include "python/bindings.h"
#include "core/errors.h"
#include "ops/arguments.h"
#include "ops/numerics.h"
#include "numerics_args.h"
#include "python/pyarray.h"

namespace fm::python {
namespace {

using f64_array = py::array_t<double, py::array::c_style | py::array::forcecast>;
using i32_array = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;

// The dtype the kernels compute `obj` in: float64 data in double where the device has
// doubles (Backend::has_float64: cpu and cuda), else float32.
DType compute_dtype(py::handle obj, const std::string& op, const char* arg, Backend& backend) {
  return on_device(native_dtype_of(obj, op, arg), backend.has_float64()) == DType::float64
             ? DType::float64
             : DType::float32;
}

py::object stencil(const std::string& op, py::handle f, int axis, f64_array weights,
                   i32_array offsets, int n_left, int n_right, bool per_index) {
  Backend& backend = pick_backend(op, {{"f", f}});
  const bool fm_result = any_array({f});
  const DType dtype = compute_dtype(f, op, "f", backend);
  Array fa = to_array(f, backend, op, "f", dtype);
  const int nd = int(fa.shape.size());
  if (axis < 0 || axis >= nd)
    throw ValueError(message(op, "expected an axis in [0, ", nd, "), got ", axis));
  if (weights.ndim() != 2 || offsets.ndim() != 1 || weights.shape(0) != offsets.shape(0) ||
      weights.shape(1) < 1 || weights.shape(1) > FM_STENCIL_MAX_WIDTH)
    throw ValueError(message(op, "internal: malformed stencil table"));
  const std::int64_t n = fa.shape[axis];
  const std::int64_t rows = weights.shape(0);
  if (n_left < 0 || n_right < 0 || n_left + n_right > n ||
      (per_index ? rows != n : rows != n_left + 1 + n_right))
    throw ValueError(message(op, "internal: stencil table rows do not match"));
  StencilTable t;
  t.width = int(weights.shape(1));
  t.weights.assign(weights.data(), weights.data() + weights.size());
  t.offsets.assign(offsets.data(), offsets.data() + offsets.size());
  t.n_left = n_left;
  t.n_right = n_right;
  t.per_index = per_index;
  Array out = Array::empty(backend, fa.shape, dtype);
  {
    py::gil_scoped_release nogil;
    launch_stencil(fa, axis, t, out);
    backend.end_op();
  }
  return wrap_result(std::move(out), fm_result);
}

py::object fourier(py::handle x, f64_array coef, double c0, double period) {
  const std::string op = "fourier_series";
  if (!(period >= 1e-30 && period <= 1e30))
    throw ValueError(message(op, "expected a period between 1e-30 and 1e30, got ", period));
  if (coef.ndim() != 2 || coef.shape(1) != 2)
    throw ValueError(message(op, "internal: coefficients must be (K, 2)"));
  if (coef.shape(0) > (py::ssize_t(1) << 24))  // k is formed as an exact float32
    throw ValueError(message(op, "expected at most 2**24 terms, got ", coef.shape(0)));
  Backend& backend = pick_backend(op, {{"x", x}});
  const bool fm_result = any_array({x});
  // The kernel reads consecutive samples per thread.
  const DType dtype = compute_dtype(x, op, "x", backend);
  Array xa = to_contiguous_array(x, backend, op, "x", dtype);
  std::vector<double> cf(coef.data(), coef.data() + coef.size());
  FourierParams p;
  p.period = period;
  p.c0 = c0;
  Array out = Array::empty(backend, xa.shape, dtype);
  {
    py::gil_scoped_release nogil;
    launch_fourier(xa, cf, p, out);
    backend.end_op();
  }
  return wrap_result(std::move(out), fm_result);
}

}  // namespace

void bind_numerics(py::module_& m) {
  m.def(
      "_stencil",
      [](const std::string& op, py::handle f, int axis, f64_array weights, i32_array offsets,
         int n_left, int n_right, bool per_index) {
        return stencil(op, f, axis, weights, offsets, n_left, n_right, per_index);
      },
      py::arg("op"), py::arg("f"), py::arg("axis"), py::arg("weights"), py::arg("offsets"),
      py::arg("n_left"), py::arg("n_right"), py::arg("per_index"),
      "Private: apply a finite-difference stencil table along one axis (see numerics.py).");
  m.def("_fourier_series", &fourier, py::arg("x"), py::arg("coef"), py::arg("c0"),
        py::arg("period"),
        "Private: fused Fourier series of x with (K, 2) float64 coefficients (see numerics.py).");
}

}  // namespace fm::python
