// Python entry points of conv2d: parse the Python arguments, validate
// everything (conv2d.cpp) before any conversion or launch, convert operands to contiguous
// float32 on the chosen device, compute without the GIL, return NumPy or fastmetal.Array.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <set>

#include "python/bindings.h"
#include "ops/conv2d.h"
#include "core/errors.h"
#include "python/pyarray.h"

namespace fm::python {
namespace {

std::string repr_of(py::handle o) { return py::repr(o); }

// An int (both axes) or a sequence of exactly two ints.
void parse_pair(py::handle v, const std::string& op, const char* name, const char* what,
                std::int64_t out[2]) {
  if (auto i = int_arg(v)) {
    out[0] = out[1] = *i;
    return;
  }
  const bool seq = (py::isinstance<py::tuple>(v) || py::isinstance<py::list>(v));
  if (!seq)
    throw TypeError(message(op, "expected ", name, " to be ", what, " int or a pair of ints, got ",
                            repr_of(v)));
  py::sequence s = py::reinterpret_borrow<py::sequence>(v);
  if (s.size() != 2)
    throw ValueError(message(op, "expected ", name, " to be an int or a pair of 2 ints, got ",
                             s.size(), " values: ", repr_of(v)));
  for (std::size_t d = 0; d < 2; ++d) {
    auto i = int_arg(s[d]);
    if (!i)
      throw TypeError(message(op, "expected ", name, " to be ", what,
                              " int or a pair of ints, got ", repr_of(v)));
    out[d] = *i;
  }
}

Conv2dSpec parse_spec(const std::string& op, py::handle stride, py::handle padding,
                      py::handle dilation, py::handle groups) {
  Conv2dSpec s;
  parse_pair(stride, op, "stride", "a positive", s.stride);
  parse_pair(dilation, op, "dilation", "a positive", s.dilation);
  if (py::isinstance<py::str>(padding)) {
    const std::string p = padding.cast<std::string>();
    if (p == "valid") {
      s.padding_mode = Conv2dPadding::valid;
    } else if (p == "same") {
      s.padding_mode = Conv2dPadding::same;
    } else {
      throw ValueError(message(op, "expected padding 'valid', 'same', an int or a pair of ints, "
                                   "got ",
                               repr_of(padding)));
    }
  } else {
    parse_pair(padding, op, "padding", "'valid', 'same', a non-negative", s.padding);
  }
  auto g = int_arg(groups);
  if (!g) throw TypeError(message(op, "expected groups to be a positive int, got ", repr_of(groups)));
  s.groups = *g;
  conv2d_check_spec(op, s);
  return s;
}

// An operand seen before any conversion: its shape, with its dtype checked.
struct Operand {
  py::object obj;  // a fastmetal.Array or a NumPy array
  Shape shape;
  bool fm = false;
};

Operand inspect(py::handle obj, const std::string& op, const char* arg) {
  Operand o;
  if (is_array(obj)) {
    o.obj = py::reinterpret_borrow<py::object>(obj);
    o.shape = obj.cast<const Array&>().shape;
    o.fm = true;
    return o;
  }
  py::array arr;
  if (py::isinstance<py::array>(obj)) {
    arr = py::reinterpret_borrow<py::array>(obj);
  } else {
    try {
      arr = py::module_::import("numpy").attr("asarray")(obj);
    } catch (py::error_already_set& e) {
      throw TypeError(not_an_array_message(obj, e, op, arg));
    }
  }
  native_dtype_of(arr, op, arg);  // TypeError for complex, object, string, ... dtypes
  o.obj = arr;
  o.shape.assign(arr.shape(), arr.shape() + arr.ndim());
  return o;
}

// Contiguous float32 on `b` (zero-copy for contiguous float32 NumPy arrays on host-visible
// devices; float16 / float64 / integer / bool are converted).
Array prepare(const Operand& o, Backend& b, const std::string& op, const char* arg) {
  return to_contiguous_array(o.obj, b, op, arg, DType::float32);
}

// needs: names out of {"input", "weight", "bias"} (a single name as a str is accepted).
void parse_needs(const std::string& op, py::handle needs, bool& want_x, bool& want_w,
                 bool& want_b) {
  std::vector<py::object> items;
  if (py::isinstance<py::str>(needs)) {
    items.push_back(py::reinterpret_borrow<py::object>(needs));
  } else {
    PyObject* it = PyObject_GetIter(needs.ptr());
    if (it == nullptr) {
      PyErr_Clear();
      throw TypeError(message(op, "expected needs to be a sequence of 'input', 'weight', "
                                  "'bias', got ",
                              repr_of(needs)));
    }
    py::iterator iter = py::reinterpret_steal<py::iterator>(it);
    for (auto item : iter) items.push_back(py::reinterpret_borrow<py::object>(item));
  }
  for (auto& item : items) {
    if (!py::isinstance<py::str>(item))
      throw TypeError(message(op, "expected needs entries to be 'input', 'weight' or 'bias', "
                                  "got ",
                              repr_of(item), " in ", repr_of(needs)));
    const std::string name = item.cast<std::string>();
    if (name == "input")
      want_x = true;
    else if (name == "weight")
      want_w = true;
    else if (name == "bias")
      want_b = true;
    else
      throw ValueError(message(op, "expected needs entries to be 'input', 'weight' or "
                                   "'bias', got ",
                               repr_of(item), " in ", repr_of(needs)));
  }
}

py::object conv2d_py(py::handle input, py::handle weight, py::handle bias, py::handle stride,
                     py::handle padding, py::handle dilation, py::handle groups) {
  const std::string op = "conv2d";
  Backend& b = pick_backend(op, {{"input", input}, {"weight", weight}, {"bias", bias}});
  const bool fm_result = any_array({input, weight, bias});
  const Conv2dSpec spec = parse_spec(op, stride, padding, dilation, groups);
  const Operand xo = inspect(input, op, "input"), wo = inspect(weight, op, "weight");
  std::optional<Operand> bo;
  if (!bias.is_none()) bo = inspect(bias, op, "bias");
  const Conv2dArgs a = conv2d_resolve(op, xo.shape, wo.shape, bo ? &bo->shape : nullptr, spec);

  const Array x = prepare(xo, b, op, "input"), w = prepare(wo, b, op, "weight");
  std::optional<Array> bb;
  if (bo) bb = prepare(*bo, b, op, "bias");
  Array y = Array::empty(b, conv2d_output_shape(a, xo.shape.size() == 4), DType::float32);
  {
    py::gil_scoped_release nogil;
    conv2d_forward(a, x, w, bb ? &*bb : nullptr, y);
    b.end_op();
  }
  return wrap_result(std::move(y), fm_result);
}

py::tuple conv2d_backward_py(py::handle grad_output, py::handle input, py::handle weight,
                             py::handle stride, py::handle padding, py::handle dilation,
                             py::handle groups, py::handle needs) {
  const std::string op = "conv2d_backward";
  Backend& b = pick_backend(
      op, {{"grad_output", grad_output}, {"input", input}, {"weight", weight}});
  const bool fm_result = any_array({grad_output, input, weight});
  const Conv2dSpec spec = parse_spec(op, stride, padding, dilation, groups);

  bool want_x = false, want_w = false, want_b = false;
  parse_needs(op, needs, want_x, want_w, want_b);

  const Operand go = inspect(grad_output, op, "grad_output");
  const Operand xo = inspect(input, op, "input"), wo = inspect(weight, op, "weight");
  const Conv2dArgs a = conv2d_resolve(op, xo.shape, wo.shape, nullptr, spec);
  const Shape out_shape = conv2d_output_shape(a, xo.shape.size() == 4);
  if (go.shape != out_shape)
    throw ValueError(message(op, "expected grad_output of shape ", shape_str(out_shape),
                             " (the conv2d output for input ", shape_str(xo.shape),
                             " and weight ", shape_str(wo.shape), "), got shape ",
                             shape_str(go.shape)));

  const Array gy = prepare(go, b, op, "grad_output");
  // Only what the asked-for gradients read is converted.
  std::optional<Array> x, w, gx, gw, gb;
  if (want_w) x = prepare(xo, b, op, "input");
  if (want_x) w = prepare(wo, b, op, "weight");
  if (want_x) gx = Array::empty(b, xo.shape, DType::float32);
  if (want_w) gw = Array::empty(b, wo.shape, DType::float32);
  if (want_b) gb = Array::empty(b, {a.C_out}, DType::float32);
  {
    py::gil_scoped_release nogil;
    if (want_x) conv2d_backward_input(a, gy, *w, *gx);
    const bool bias_done =
        want_w && conv2d_backward_weight(a, gy, *x, *gw, want_b ? &*gb : nullptr);
    if (want_b && !bias_done) conv2d_backward_bias(a, gy, *gb);
    b.end_op();
  }
  auto result = [&](std::optional<Array>& r) -> py::object {
    if (!r) return py::none();
    return wrap_result(std::move(*r), fm_result);
  };
  return py::make_tuple(result(gx), result(gw), result(gb));
}

// stride / padding / output_padding / dilation / groups of conv_transpose2d.
Conv2dSpec parse_transpose_spec(const std::string& op, py::handle stride, py::handle padding,
                                py::handle output_padding, py::handle groups,
                                py::handle dilation, std::int64_t out_pad[2]) {
  if (py::isinstance<py::str>(padding))
    throw TypeError(message(op, "expected padding to be a non-negative int or a pair of ints "
                                "(conv_transpose2d has no 'valid' or 'same'), got ",
                            repr_of(padding)));
  Conv2dSpec s;
  parse_pair(stride, op, "stride", "a positive", s.stride);
  parse_pair(dilation, op, "dilation", "a positive", s.dilation);
  parse_pair(padding, op, "padding", "a non-negative", s.padding);
  parse_pair(output_padding, op, "output_padding", "a non-negative", out_pad);
  auto g = int_arg(groups);
  if (!g) throw TypeError(message(op, "expected groups to be a positive int, got ", repr_of(groups)));
  s.groups = *g;
  conv_transpose2d_check_spec(op, s, out_pad);
  return s;
}

py::object conv_transpose2d_py(py::handle input, py::handle weight, py::handle bias,
                               py::handle stride, py::handle padding, py::handle output_padding,
                               py::handle groups, py::handle dilation) {
  const std::string op = "conv_transpose2d";
  Backend& b = pick_backend(op, {{"input", input}, {"weight", weight}, {"bias", bias}});
  const bool fm_result = any_array({input, weight, bias});
  std::int64_t out_pad[2];
  const Conv2dSpec spec =
      parse_transpose_spec(op, stride, padding, output_padding, groups, dilation, out_pad);
  const Operand xo = inspect(input, op, "input"), wo = inspect(weight, op, "weight");
  std::optional<Operand> bo;
  if (!bias.is_none()) bo = inspect(bias, op, "bias");
  const Conv2dArgs a =
      conv_transpose2d_resolve(op, xo.shape, wo.shape, bo ? &bo->shape : nullptr, spec, out_pad);
  const Array x = prepare(xo, b, op, "input"), w = prepare(wo, b, op, "weight");
  std::optional<Array> bb;
  if (bo) bb = prepare(*bo, b, op, "bias");
  Array y = Array::empty(b, conv_transpose2d_output_shape(a, xo.shape.size() == 4),
                         DType::float32);
  {
    py::gil_scoped_release nogil;
    conv_transpose2d_forward(a, x, w, bb ? &*bb : nullptr, y);
    b.end_op();
  }
  return wrap_result(std::move(y), fm_result);
}

py::tuple conv_transpose2d_backward_py(py::handle grad_output, py::handle input,
                                       py::handle weight, py::handle stride, py::handle padding,
                                       py::handle output_padding, py::handle groups,
                                       py::handle dilation, py::handle needs) {
  const std::string op = "conv_transpose2d_backward";
  Backend& b = pick_backend(
      op, {{"grad_output", grad_output}, {"input", input}, {"weight", weight}});
  const bool fm_result = any_array({grad_output, input, weight});
  std::int64_t out_pad[2];
  const Conv2dSpec spec =
      parse_transpose_spec(op, stride, padding, output_padding, groups, dilation, out_pad);
  bool want_x = false, want_w = false, want_b = false;
  parse_needs(op, needs, want_x, want_w, want_b);
  const Operand go = inspect(grad_output, op, "grad_output");
  const Operand xo = inspect(input, op, "input"), wo = inspect(weight, op, "weight");
  const Conv2dArgs a = conv_transpose2d_resolve(op, xo.shape, wo.shape, nullptr, spec, out_pad);
  const Shape out_shape = conv_transpose2d_output_shape(a, xo.shape.size() == 4);
  if (go.shape != out_shape)
    throw ValueError(message(op, "expected grad_output of shape ", shape_str(out_shape),
                             " (the conv_transpose2d output for input ", shape_str(xo.shape),
                             " and weight ", shape_str(wo.shape), "), got shape ",
                             shape_str(go.shape)));
  const Array gy = prepare(go, b, op, "grad_output");
  std::optional<Array> x, w, gx, gw, gb;
  if (want_w) x = prepare(xo, b, op, "input");
  if (want_x) w = prepare(wo, b, op, "weight");
  if (want_x) gx = Array::empty(b, xo.shape, DType::float32);
  if (want_w) gw = Array::empty(b, wo.shape, DType::float32);
  if (want_b) gb = Array::empty(b, {a.C_in}, DType::float32);
  {
    py::gil_scoped_release nogil;
    if (want_x) conv_transpose2d_backward_input(a, gy, *w, *gx);
    if (want_w) conv_transpose2d_backward_weight(a, gy, *x, *gw);
    if (want_b) conv_transpose2d_backward_bias(a, gy, *gb);
    b.end_op();
  }
  auto result = [&](std::optional<Array>& r) -> py::object {
    if (!r) return py::none();
    return wrap_result(std::move(*r), fm_result);
  };
  return py::make_tuple(result(gx), result(gw), result(gb));
}

}  // namespace

void bind_conv2d(py::module_& m) {
  m.def("conv2d", &conv2d_py, py::arg("input"), py::arg("weight"), py::arg("bias") = py::none(),
        py::arg("stride") = 1, py::arg("padding") = 0, py::arg("dilation") = 1,
        py::arg("groups") = 1);
  m.def("conv2d_backward", &conv2d_backward_py, py::arg("grad_output"), py::arg("input"),
        py::arg("weight"), py::arg("stride") = 1, py::arg("padding") = 0,
        py::arg("dilation") = 1, py::arg("groups") = 1,
        py::arg("needs") = py::make_tuple("input", "weight", "bias"));

  // Normalised hyper-parameters (nn.Conv2d validates its constructor arguments with this).
  m.def(
      "_conv2d_spec",
      [](py::handle stride, py::handle padding, py::handle dilation, py::handle groups,
         const std::string& op) {
        const Conv2dSpec s = parse_spec(op, stride, padding, dilation, groups);
        py::object pad;
        if (s.padding_mode == Conv2dPadding::valid)
          pad = py::str("valid");
        else if (s.padding_mode == Conv2dPadding::same)
          pad = py::str("same");
        else
          pad = py::make_tuple(s.padding[0], s.padding[1]);
        return py::make_tuple(py::make_tuple(s.stride[0], s.stride[1]), pad,
                              py::make_tuple(s.dilation[0], s.dilation[1]), s.groups);
      },
      py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("groups"),
      py::arg("op") = "conv2d");

  m.def("_conv_transpose2d", &conv_transpose2d_py, py::arg("input"), py::arg("weight"),
        py::arg("bias") = py::none(), py::arg("stride") = 1, py::arg("padding") = 0,
        py::arg("output_padding") = 0, py::arg("groups") = 1, py::arg("dilation") = 1,
        "Private: conv_transpose2d on conv2d's engine (see ops/conv.py).");
  m.def("_conv_transpose2d_backward", &conv_transpose2d_backward_py, py::arg("grad_output"),
        py::arg("input"), py::arg("weight"), py::arg("stride") = 1, py::arg("padding") = 0,
        py::arg("output_padding") = 0, py::arg("groups") = 1, py::arg("dilation") = 1,
        py::arg("needs") = py::make_tuple("input", "weight", "bias"),
        "Private: gradients of conv_transpose2d: (input, weight, bias), None where not needed.");
  m.def(
      "_conv_transpose2d_spec",
      [](py::handle stride, py::handle padding, py::handle output_padding, py::handle groups,
         py::handle dilation, const std::string& op) {
        std::int64_t out_pad[2];
        const Conv2dSpec s =
            parse_transpose_spec(op, stride, padding, output_padding, groups, dilation, out_pad);
        return py::make_tuple(py::make_tuple(s.stride[0], s.stride[1]),
                              py::make_tuple(s.padding[0], s.padding[1]),
                              py::make_tuple(out_pad[0], out_pad[1]), s.groups,
                              py::make_tuple(s.dilation[0], s.dilation[1]));
      },
      py::arg("stride"), py::arg("padding"), py::arg("output_padding"), py::arg("groups"),
      py::arg("dilation"), py::arg("op") = "conv_transpose2d");

  // Private switch: the threadgroup size of the kernels with barriers (0 = automatic).
  m.def("_set_conv_group_size", [](std::int64_t threads) {
    if (threads < 0 || threads > 4096)
      throw ValueError("[fastmetal._set_conv_group_size] expected 0..4096, got " +
                       std::to_string(threads));
    set_conv_group_size(std::uint32_t(threads));
  });
  m.def("_conv_group_size", [] { return conv_group_size(); });
}

}  // namespace fm::python
