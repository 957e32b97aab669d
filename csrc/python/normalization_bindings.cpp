// Private Python entry points of the normalization and softmax ops (ops/normalization.h):
// _layer_norm, _rms_norm, _group_norm, _batch_norm, their _*_backward, _softmax,
// _softmax_backward and _logsumexp. A bindings file of its own rather than FM_PYTHON_OP:
// weight and bias may be None, data keeps float16, and batch_norm writes the caller's
// running statistics in place. The public functions wrap these (with their gradients).
//
// Data (input, grad_output) is float32 or float16 (other dtypes become float32; int64
// Arrays are refused); weight, bias and running statistics are used as float32, and the
// weight and bias gradients come back in the weight's dtype. Statistics are float32.
// NumPy in gives NumPy out, a fastmetal.Array in gives Arrays; the GIL is released while
// the kernels run.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "backend/python_hooks.h"
#include "core/errors.h"
#include "normalization_args.h"
#include "ops/convert.h"
#include "ops/normalization.h"
#include "python/pyarray.h"

namespace fm::python {
namespace {

// The data dtype: float16 stays, integer and bool Arrays are refused, everything else is
// float32.
DType data_dtype(py::handle x, const std::string& op, const char* arg) {
  return float_dtype_of(x, op, arg);
}

std::optional<Array> optional_vector(py::handle v, Backend& be, const std::string& op,
                                     const char* arg) {
  if (v.is_none()) return std::nullopt;
  float_dtype_of(v, op, arg);  // integer and bool Arrays are refused
  return to_contiguous_array(v, be, op, arg, DType::float32);
}

const Array* ptr(const std::optional<Array>& a) { return a ? &*a : nullptr; }

// The same elements of the same storage (any backend: compares the storage, not addresses).
bool same_memory(const Array& a, const Array& b) {
  return a.storage == b.storage && a.offset == b.offset && a.dtype == b.dtype &&
         a.shape == b.shape && a.strides == b.strides;
}

// The weight / bias gradient in the dtype the weight came in.
Array in_dtype_of(Array g, py::handle like, const std::string& op, const char* arg) {
  if (!like.is_none() && native_dtype_of(like, op, arg) == DType::float16)
    return convert(g, DType::float16);
  return g;
}

std::int64_t checked_axis(const std::string& op, std::int64_t axis, std::int64_t ndim) {
  if (axis < -ndim || axis >= ndim || (ndim == 0 && axis != 0 && axis != -1))
    throw ValueError(message(op, "expected dim in [", -ndim, ", ", ndim,
                             ") for an array of ", ndim, " dimensions, got ", axis));
  return axis < 0 ? axis + ndim : axis;
}

template <typename Fn>
auto run(Backend& be, Fn&& fn) {
  py::gil_scoped_release nogil;
  auto r = fn();
  be.end_op();
  return r;
}

py::tuple wrap_all(std::vector<Array> v, bool fm_result) {
  py::tuple t(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) t[i] = wrap_result(std::move(v[i]), fm_result);
  return t;
}

// ------------------------------------------------------------------- layer / rms norm
py::tuple layer_norm_py(py::handle x, std::int64_t norm_dims, py::handle weight,
                        py::handle bias, double eps, bool rms) {
  const std::string op = rms ? "rms_norm" : "layer_norm";
  Backend& be = pick_backend(op, {{"input", x}, {"weight", weight}, {"bias", bias}});
  Array xa = to_contiguous_array(x, be, op, "input", data_dtype(x, op, "input"));
  auto w = optional_vector(weight, be, op, "weight");
  auto b = optional_vector(bias, be, op, "bias");
  std::vector<Array> r =
      run(be, [&] { return layer_norm(xa, norm_dims, ptr(w), ptr(b), eps, rms); });
  if (rms) r.erase(r.begin() + 1);  // (y, rstd)
  return wrap_all(std::move(r), any_array({x, weight, bias}));
}

py::object layer_norm_backward_py(py::handle grad, py::handle x, std::int64_t norm_dims,
                                  py::handle weight, py::handle mean, py::handle rstd,
                                  bool affine, bool rms) {
  const std::string op = rms ? "rms_norm_backward" : "layer_norm_backward";
  Backend& be = pick_backend(op, {{"grad_output", grad}, {"input", x}, {"weight", weight},
                                  {"mean", mean}, {"rstd", rstd}});
  const DType t = data_dtype(x, op, "input");
  Array xa = to_contiguous_array(x, be, op, "input", t);
  Array ga = to_contiguous_array(grad, be, op, "grad_output", t);
  auto w = optional_vector(weight, be, op, "weight");
  Array rs = to_contiguous_array(rstd, be, op, "rstd", DType::float32);
  Array mn = rms ? Array() : to_contiguous_array(mean, be, op, "mean", DType::float32);
  std::vector<Array> r = run(be, [&] {
    if (rms) {
      // rms_norm saves no mean: zeros of rstd's shape (mean is 0 there).
      Array zeros = Array::empty(be, rs.shape, DType::float32, op.c_str());
      alignas(8) const char zero[8] = {};
      fill_from_element(zeros, zero);
      return layer_norm_backward(ga, xa, norm_dims, ptr(w), zeros, rs, true, affine);
    }
    return layer_norm_backward(ga, xa, norm_dims, ptr(w), mn, rs, false, affine);
  });
  const bool fm = any_array({grad, x, weight, mean, rstd});
  if (!affine) return wrap_result(std::move(r[0]), fm);
  r[1] = in_dtype_of(r[1], weight, op, "weight");
  r[2] = in_dtype_of(r[2], weight, op, "weight");
  if (rms) r.pop_back();  // (dx, dweight)
  return wrap_all(std::move(r), fm);
}

// ------------------------------------------------------------------- group norm
py::tuple group_norm_py(py::handle x, std::int64_t groups, py::handle weight, py::handle bias,
                        double eps) {
  const std::string op = "group_norm";
  Backend& be = pick_backend(op, {{"input", x}, {"weight", weight}, {"bias", bias}});
  Array xa = to_contiguous_array(x, be, op, "input", data_dtype(x, op, "input"));
  auto w = optional_vector(weight, be, op, "weight");
  auto b = optional_vector(bias, be, op, "bias");
  std::vector<Array> r = run(be, [&] { return group_norm(xa, groups, ptr(w), ptr(b), eps); });
  return wrap_all(std::move(r), any_array({x, weight, bias}));
}

py::object group_norm_backward_py(py::handle grad, py::handle x, std::int64_t groups,
                                  py::handle weight, py::handle mean, py::handle rstd,
                                  bool affine) {
  const std::string op = "group_norm_backward";
  Backend& be = pick_backend(op, {{"grad_output", grad}, {"input", x}, {"weight", weight},
                                  {"mean", mean}, {"rstd", rstd}});
  const DType t = data_dtype(x, op, "input");
  Array xa = to_contiguous_array(x, be, op, "input", t);
  Array ga = to_contiguous_array(grad, be, op, "grad_output", t);
  auto w = optional_vector(weight, be, op, "weight");
  Array mn = to_contiguous_array(mean, be, op, "mean", DType::float32);
  Array rs = to_contiguous_array(rstd, be, op, "rstd", DType::float32);
  std::vector<Array> r = run(
      be, [&] { return group_norm_backward(ga, xa, groups, ptr(w), mn, rs, affine); });
  const bool fm = any_array({grad, x, weight, mean, rstd});
  if (!affine) return wrap_result(std::move(r[0]), fm);
  r[1] = in_dtype_of(r[1], weight, op, "weight");
  r[2] = in_dtype_of(r[2], weight, op, "weight");
  return wrap_all(std::move(r), fm);
}

// ------------------------------------------------------------------- batch norm
py::tuple batch_norm_py(py::handle x, py::handle weight, py::handle bias, py::handle rmean,
                        py::handle rvar, bool training, double momentum, double eps) {
  const std::string op = "batch_norm";
  Backend& be = pick_backend(op, {{"input", x}, {"weight", weight}, {"bias", bias},
                                  {"running_mean", rmean}, {"running_var", rvar}});
  Array xa = to_contiguous_array(x, be, op, "input", data_dtype(x, op, "input"));
  auto w = optional_vector(weight, be, op, "weight");
  auto b = optional_vector(bias, be, op, "bias");
  // Updated in place while training: they must be fastmetal.Arrays (a NumPy array would be
  // a copy on devices that do not share host memory, and the update lost).
  const bool update = training && !rmean.is_none() && !rvar.is_none();
  std::optional<Array> rm_target, rv_target;
  if (update) {
    for (auto [name, obj] : {std::pair<const char*, py::handle>{"running_mean", rmean},
                             {"running_var", rvar}}) {
      if (!is_array(obj))
        throw TypeError(message(op, "expected ", name, " to be a fastmetal.Array (updated in "
                                "place while training), got ",
                                std::string(py::str(py::type::of(obj)))));
      const DType t = obj.cast<const Array&>().dtype;
      if (t != DType::float32 && t != DType::float16)
        throw TypeError(message(op, "expected ", name, " of dtype float32 or float16, got ",
                                dtype_name(t)));
    }
    rm_target = to_array(rmean, be, op, "running_mean");
    rv_target = to_array(rvar, be, op, "running_var");
  }
  auto rm = optional_vector(rmean, be, op, "running_mean");
  auto rv = optional_vector(rvar, be, op, "running_var");
  std::vector<Array> r = run(be, [&] {
    if (update) {
      prepare_write(*rm_target, op, "running_mean");
      prepare_write(*rv_target, op, "running_var");
    }
    // Writes the update into rm / rv: the caller's memory where its arrays are contiguous
    // float32, else float32 copies carried back below.
    std::vector<Array> out = batch_norm(xa, ptr(w), ptr(b), ptr(rm), ptr(rv), training,
                                        momentum, eps);
    if (update) {
      if (!same_memory(*rm, *rm_target)) launch_convert(*rm, *rm_target);
      if (!same_memory(*rv, *rv_target)) launch_convert(*rv, *rv_target);
    }
    return out;
  });
  return wrap_all(std::move(r), any_array({x, weight, bias, rmean, rvar}));
}

py::tuple batch_norm_backward_py(py::handle grad, py::handle x, py::handle weight,
                                 py::handle save_mean, py::handle save_rstd, bool training) {
  const std::string op = "batch_norm_backward";
  Backend& be = pick_backend(op, {{"grad_output", grad}, {"input", x}, {"weight", weight},
                                  {"save_mean", save_mean}, {"save_rstd", save_rstd}});
  const DType t = data_dtype(x, op, "input");
  Array xa = to_contiguous_array(x, be, op, "input", t);
  Array ga = to_contiguous_array(grad, be, op, "grad_output", t);
  auto w = optional_vector(weight, be, op, "weight");
  Array mn = to_contiguous_array(save_mean, be, op, "save_mean", DType::float32);
  Array rs = to_contiguous_array(save_rstd, be, op, "save_rstd", DType::float32);
  std::vector<Array> r =
      run(be, [&] { return batch_norm_backward(ga, xa, ptr(w), mn, rs, training); });
  r[1] = in_dtype_of(r[1], weight, op, "weight");
  r[2] = in_dtype_of(r[2], weight, op, "weight");
  return wrap_all(std::move(r), any_array({grad, x, weight, save_mean, save_rstd}));
}

// ------------------------------------------------------------------- softmax family
py::object softmax_py(py::handle x, std::int64_t axis, bool log) {
  const std::string op = log ? "log_softmax" : "softmax";
  Backend& be = pick_backend(op, {{"input", x}});
  Array xa = to_contiguous_array(x, be, op, "input", data_dtype(x, op, "input"));
  const bool scalar = xa.ndim() == 0;
  const std::int64_t ax = checked_axis(op, axis, xa.ndim());
  if (scalar) xa.shape = {1}, xa.strides = {1};
  Array out = run(be, [&] { return softmax(xa, ax, log ? kLogSoftmax : kSoftmax); });
  if (scalar) out.shape = {}, out.strides = {};
  return wrap_result(std::move(out), any_array({x}));
}

py::object softmax_backward_py(py::handle grad, py::handle y, std::int64_t axis, bool log) {
  const std::string op = log ? "log_softmax_backward" : "softmax_backward";
  Backend& be = pick_backend(op, {{"grad_output", grad}, {"output", y}});
  const DType t = data_dtype(y, op, "output");
  Array ya = to_contiguous_array(y, be, op, "output", t);
  Array ga = to_contiguous_array(grad, be, op, "grad_output", t);
  const bool scalar = ya.ndim() == 0;
  const std::int64_t ax = checked_axis(op, axis, ya.ndim());
  if (scalar) {
    ya.shape = {1}, ya.strides = {1};
    if (ga.ndim() == 0) ga.shape = {1}, ga.strides = {1};
  }
  Array dx = run(be, [&] { return softmax_backward(ga, ya, ax, log ? kLogSoftmax : kSoftmax); });
  if (scalar) dx.shape = {}, dx.strides = {};
  return wrap_result(std::move(dx), any_array({grad, y}));
}

py::object logsumexp_py(py::handle x, py::handle axis, bool keepdims) {
  const std::string op = "logsumexp";
  Backend& be = pick_backend(op, {{"x", x}});
  Array xa = to_array(x, be, op, "x", data_dtype(x, op, "x"));
  const std::int64_t nd = xa.ndim();
  std::vector<int> axes;
  auto add = [&](py::handle v) {
    auto i = int_arg(v);
    if (!i)
      throw TypeError(message(op, "expected axis to be None, an int or a tuple of ints, got ",
                              std::string(py::repr(axis))));
    if (*i < -nd || *i >= nd)
      throw ValueError(message(op, "expected axis in [", -nd, ", ", nd, ") for an array of ",
                               nd, " dimensions, got ", *i));
    axes.push_back(int(*i < 0 ? *i + nd : *i));
  };
  if (axis.is_none()) {
    for (int d = 0; d < nd; ++d) axes.push_back(d);
  } else if (py::isinstance<py::tuple>(axis) || py::isinstance<py::list>(axis)) {
    for (auto v : py::reinterpret_borrow<py::sequence>(axis)) add(v);
  } else {
    add(axis);
  }
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    throw ValueError(message(op, "expected distinct axes, got ", std::string(py::repr(axis))));
  Array out = run(be, [&] { return logsumexp(xa, axes, keepdims); });
  if (is_array(x)) return py::cast(std::move(out));
  py::array r = numpy_view(out);
  if (r.ndim() == 0) return r[py::tuple()];
  return std::move(r);
}

void bind_normalization(py::module_& m) {
  using namespace pybind11::literals;
  m.def("_layer_norm",
        [](py::handle x, std::int64_t nd, py::handle w, py::handle b, double eps) {
          return layer_norm_py(x, nd, w, b, eps, false);
        },
        "input"_a, "normalized_ndim"_a, "weight"_a = py::none(), "bias"_a = py::none(),
        "eps"_a = 1e-5,
        "Private: layer_norm over the last normalized_ndim axes -> (y, mean, rstd).");
  m.def("_rms_norm",
        [](py::handle x, std::int64_t nd, py::handle w, double eps) {
          return layer_norm_py(x, nd, w, py::none(), eps, true);
        },
        "input"_a, "normalized_ndim"_a, "weight"_a = py::none(), "eps"_a = 1e-6,
        "Private: rms_norm over the last normalized_ndim axes -> (y, rstd).");
  m.def("_layer_norm_backward",
        [](py::handle g, py::handle x, std::int64_t nd, py::handle w, py::handle mean,
           py::handle rstd, bool affine) {
          return layer_norm_backward_py(g, x, nd, w, mean, rstd, affine, false);
        },
        "grad_output"_a, "input"_a, "normalized_ndim"_a, "weight"_a, "mean"_a, "rstd"_a,
        "affine"_a = true,
        "Private: -> (dx, dweight, dbias), or dx alone where affine is False.");
  m.def("_rms_norm_backward",
        [](py::handle g, py::handle x, std::int64_t nd, py::handle w, py::handle rstd,
           bool affine) {
          return layer_norm_backward_py(g, x, nd, w, py::none(), rstd, affine, true);
        },
        "grad_output"_a, "input"_a, "normalized_ndim"_a, "weight"_a, "rstd"_a,
        "affine"_a = true, "Private: -> (dx, dweight), or dx alone where affine is False.");
  m.def("_group_norm", &group_norm_py, "input"_a, "num_groups"_a, "weight"_a = py::none(),
        "bias"_a = py::none(), "eps"_a = 1e-5, "Private: group_norm -> (y, mean, rstd).");
  m.def("_group_norm_backward", &group_norm_backward_py, "grad_output"_a, "input"_a,
        "num_groups"_a, "weight"_a, "mean"_a, "rstd"_a, "affine"_a = true,
        "Private: -> (dx, dweight, dbias), or dx alone where affine is False.");
  m.def("_batch_norm", &batch_norm_py, "input"_a, "weight"_a = py::none(),
        "bias"_a = py::none(), "running_mean"_a = py::none(), "running_var"_a = py::none(),
        "training"_a = false, "momentum"_a = 0.1, "eps"_a = 1e-5,
        "Private: batch_norm -> (y, save_mean, save_rstd); training updates running_mean "
        "and running_var in place.");
  m.def("_batch_norm_backward", &batch_norm_backward_py, "grad_output"_a, "input"_a,
        "weight"_a, "save_mean"_a, "save_rstd"_a, "training"_a,
        "Private: -> (dx, dweight, dbias).");
  m.def("_softmax", &softmax_py, "input"_a, "dim"_a, "log"_a = false,
        "Private: softmax (log=False) or log_softmax along dim.");
  m.def("_softmax_backward", &softmax_backward_py, "grad_output"_a, "output"_a, "dim"_a,
        "log"_a = false, "Private: the input gradient from the forward's output.");
  m.def("_logsumexp", &logsumexp_py, "x"_a, "axis"_a = py::none(), "keepdims"_a = false,
        "Private: log(sum(exp(x))) over axis (None: all), as scipy.special.logsumexp.");
}

const bool registered = register_python_hooks(&bind_normalization);

}  // namespace
}  // namespace fm::python
