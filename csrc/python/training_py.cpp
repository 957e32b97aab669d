// Python entry points of the training kernels. python/fastmetal/training.py and optim.py
// validate the public arguments and call these private functions; they check once more what
// could crash a kernel (shapes, ranges), launch without the GIL and return a NumPy array
// (NumPy in) or a fastmetal.Array (Array in).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "python/bindings.h"
#include "backend/capture.h"
#include "core/errors.h"
#include "ops/convert.h"
#include "ops/training.h"
#include "python/pyarray.h"

namespace fm::python {
namespace {

constexpr std::int64_t kMaxI32 = std::numeric_limits<std::int32_t>::max();

template <typename Fn>
void run_op(Backend& be, Fn&& fn) {
  py::gil_scoped_release nogil;
  fn();
  be.end_op();
}

// (N, C, H, W) or (C, H, W) -> planes, H, W.
PoolArgs pool_args(const std::string& op, const Shape& s, int kh, int kw, int sh, int sw,
                   int ph, int pw) {
  if (s.size() != 3 && s.size() != 4)
    throw ValueError(message(op, "expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape ",
                             shape_str(s)));
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || ph < 0 || pw < 0 || 2 * ph > kh || 2 * pw > kw)
    throw ValueError(message(op, "internal: bad pooling parameters"));
  const std::int64_t h = s[s.size() - 2], w = s[s.size() - 1];
  const std::int64_t planes = numel(s) / std::max<std::int64_t>(1, h * w);
  const std::int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
  if (h + 2 * ph < kh || w + 2 * pw < kw || oh < 1 || ow < 1)
    throw ValueError(message(op, "expected the padded input (", h + 2 * ph, " x ", w + 2 * pw,
                             ") to be at least the kernel size (", kh, " x ", kw, "), got input shape ",
                             shape_str(s)));
  if (h * w > kMaxI32 || planes > kMaxI32)
    throw ValueError(message(op, "expected fewer than 2**31 planes and pixels, got shape ", shape_str(s)));
  PoolArgs a{};
  a.planes = std::int32_t(s.size() == 4 ? s[0] * s[1] : s[0]);
  a.h = std::int32_t(h);
  a.w = std::int32_t(w);
  a.oh = std::int32_t(oh);
  a.ow = std::int32_t(ow);
  a.kh = kh;
  a.kw = kw;
  a.sh = sh;
  a.sw = sw;
  a.ph = ph;
  a.pw = pw;
  return a;
}

Shape pooled_shape(const Shape& s, const PoolArgs& a) {
  Shape o = s;
  o[o.size() - 2] = a.oh;
  o[o.size() - 1] = a.ow;
  return o;
}

py::object max_pool2d(py::handle x, int kh, int kw, int sh, int sw, int ph, int pw) {
  const std::string op = "max_pool2d";
  Backend& be = pick_backend(op, {{"x", x}});
  Array xa = to_contiguous_array(x, be, op, "x", DType::float32);
  const PoolArgs a = pool_args(op, xa.shape, kh, kw, sh, sw, ph, pw);
  Array out = Array::empty(be, pooled_shape(xa.shape, a), DType::float32);
  run_op(be, [&] { launch_max_pool2d(xa, a, out); });
  return wrap_result(std::move(out), any_array({x}));
}

py::object max_pool2d_backward(py::handle grad_out, py::handle x, int kh, int kw, int sh, int sw,
                               int ph, int pw) {
  const std::string op = "max_pool2d_backward";
  Backend& be = pick_backend(op, {{"grad_output", grad_out}, {"x", x}});
  Array xa = to_contiguous_array(x, be, op, "x", DType::float32);
  const PoolArgs a = pool_args(op, xa.shape, kh, kw, sh, sw, ph, pw);
  Array ga = to_contiguous_array(grad_out, be, op, "grad_output", DType::float32);
  if (ga.shape != pooled_shape(xa.shape, a))
    throw ValueError(message(op, "expected grad_output of shape ", shape_str(pooled_shape(xa.shape, a)),
                             " (the output of max_pool2d), got ", shape_str(ga.shape)));
  Array gi = Array::empty(be, xa.shape, DType::float32);
  run_op(be, [&] { launch_max_pool2d_backward(ga, xa, a, gi); });
  return wrap_result(std::move(gi), any_array({grad_out, x}));
}

py::object dropout(py::handle x, std::uint32_t threshold, float scale, std::uint32_t key0,
                   std::uint32_t key1) {
  const std::string op = "dropout";
  Backend& be = pick_backend(op, {{"x", x}});
  Array xa = to_contiguous_array(x, be, op, "x", DType::float32);
  if (xa.size() > std::int64_t(std::numeric_limits<std::uint32_t>::max()) - 4)
    throw ValueError(message(op, "expected fewer than 2**32 - 4 elements, got ", xa.size()));
  DropoutArgs a{};
  a.key0 = key0;
  a.key1 = key1;
  a.threshold = threshold;
  a.scale = scale;
  a.n = std::uint32_t(xa.size());
  Array out = Array::empty(be, xa.shape, DType::float32);
  run_op(be, [&] { launch_dropout(xa, a, out); });
  return wrap_result(std::move(out), any_array({x}));
}

// Class labels: an int64 fastmetal.Array (read in place on its device) or NumPy integers.
// Their range is checked on the host (a ValueError), except for labels on a discrete GPU
// while a step is recorded for replay (fastmetal.compile): a replay runs no host code, so
// the kernel checks them too and gives a NaN loss (and NaN gradient row) for a label
// outside [0, C) instead of reading out of bounds.
Array label_array(py::handle labels, Backend& be, const std::string& op, std::int64_t rows,
                  std::int64_t classes) {
  Array lab;
  auto check = [&](const std::int64_t* lp, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i)
      if (lp[i] < 0 || lp[i] >= classes)
        throw IndexError(message(op, "expected labels in [0, ", classes, "), got ", lp[i]));
  };
  bool checked = false;
  if (is_array(labels)) {
    lab = labels.cast<const Array&>();
    if (lab.dtype != DType::int64)
      throw TypeError(message(op, "expected labels as integers (a NumPy array, a sequence or an "
                                  "int64 fastmetal.Array), got a ", dtype_name(lab.dtype),
                              " fastmetal.Array"));
    if (&lab.backend() != &be)
      throw ValueError(message(op, "expected labels on the logits' device '", be.name(),
                               "', got an Array on '", lab.backend().name(), "'"));
    if (!lab.contiguous()) lab = convert(lab, DType::int64);
  } else {
    py::array arr = py::module_::import("numpy").attr("asarray")(labels);
    const char kind = arr.dtype().kind();
    if (kind != 'i' && kind != 'u')
      throw TypeError(message(op, "expected labels with an integer dtype, got ",
                              std::string(py::str(arr.dtype()))));
    // Checked here, from the host's copy (no wait for the device).
    auto host = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    if (host.ndim() == 1 && host.shape(0) == rows) check(host.data(), rows);
    checked = true;
    lab = to_array(arr, be, op, "labels", DType::int64);
  }
  if (lab.ndim() != 1 || lab.shape[0] != rows)
    throw ValueError(message(op, "expected ", rows, " labels, got ", lab.ndim(), "-D labels of ",
                             lab.size(), " values"));
  if (checked) return lab;
  if (be.host_visible()) {
    be.wait_for_host(*lab.storage);
    check(reinterpret_cast<const std::int64_t*>(lab.host_data()), rows);
  } else if (capture::recording() == nullptr) {
    std::vector<std::int64_t> host(static_cast<std::size_t>(rows));
    {
      py::gil_scoped_release nogil;  // waits for the work that computes the labels
      be.copy_to_host(*lab.storage, lab.byte_offset(), host.data(), host.size() * sizeof(std::int64_t));
    }
    check(host.data(), rows);
  }
  return lab;
}

py::tuple cross_entropy(py::handle logits, py::handle labels) {
  const std::string op = "cross_entropy";
  Backend& be = pick_backend(op, {{"logits", logits}});
  Array la = to_contiguous_array(logits, be, op, "logits", DType::float32);
  if (la.shape.size() != 2 || la.shape[0] < 1 || la.shape[1] < 1)
    throw ValueError(message(op, "expected logits of shape (N, C) with N, C >= 1, got ",
                             shape_str(la.shape)));
  const std::int64_t rows = la.shape[0], classes = la.shape[1];
  if (rows > kMaxI32 || classes > kMaxI32)
    throw ValueError(message(op, "expected fewer than 2**31 rows and classes, got ", shape_str(la.shape)));
  const Array lab = label_array(labels, be, op, rows, classes);
  CrossEntropyArgs a{};
  a.rows = std::int32_t(rows);
  a.classes = std::int32_t(classes);
  a.inv_rows = float(1.0 / double(rows));
  Array loss = Array::empty(be, Shape{}, DType::float32);
  Array grad = Array::empty(be, la.shape, DType::float32);
  run_op(be, [&] { launch_cross_entropy(la, lab, a, loss, grad); });
  const bool fm_result = any_array({logits});
  return py::make_tuple(wrap_result(std::move(loss), fm_result),
                        wrap_result(std::move(grad), fm_result));
}

// A contiguous Array seen with another shape of the same size, sharing its memory on its
// device (Flatten on GPU arrays without a trip through the host).
py::object reshaped_view(py::handle obj, const std::vector<std::int64_t>& shape) {
  const std::string op = "nn.Flatten";
  if (!is_array(obj)) throw TypeError(message(op, "internal: expected a fastmetal.Array"));
  Array a = obj.cast<const Array&>();
  Shape s(shape.begin(), shape.end());
  for (auto d : s)
    if (d < 0) throw ValueError(message(op, "expected non-negative dimensions, got ", shape_str(s)));
  if (!a.contiguous() || numel(s) != a.size())
    throw ValueError(message(op, "internal: a view needs a contiguous array of the same size"));
  a.shape = s;
  a.strides = contiguous_strides(s);
  return py::cast(std::move(a));
}

// A parameter or state tensor updated in place: a fastmetal.Array, or a writeable C-contiguous
// float32 NumPy array (copied back where the device could not share its memory).
struct InPlace {
  py::handle obj;
  Array array;
  void* numpy_data = nullptr;
};

InPlace in_place(py::handle obj, Backend& be, const std::string& op, const char* arg,
                 std::int64_t size) {
  InPlace r;
  r.obj = obj;
  if (is_array(obj)) {
    r.array = obj.cast<const Array&>();
    prepare_write(r.array, op, arg);  // read-only memory stays read-only
    if (!r.array.contiguous() || r.array.dtype != DType::float32)
      throw ValueError(message(op, "expected ", arg, " to be a contiguous float32 array"));
  } else {
    if (!py::isinstance<py::array>(obj))
      throw TypeError(message(op, "expected ", arg, " to be a numpy.ndarray or fastmetal.Array, got ",
                              std::string(py::str(py::type::handle_of(obj).attr("__name__")))));
    py::array a = py::reinterpret_borrow<py::array>(obj);
    if (!a.dtype().is(py::dtype::of<float>()) || !(a.flags() & py::array::c_style) || !a.writeable())
      throw ValueError(message(op, "expected ", arg, " to be a writeable C-contiguous float32 array, got ",
                               std::string(py::str(a.dtype()))));
    r.numpy_data = a.mutable_data();
    r.array = to_array(obj, be, op, arg, DType::float32);
  }
  if (r.array.size() != size)
    throw ValueError(message(op, "expected ", arg, " with ", size, " elements, got ", r.array.size()));
  return r;
}

void copy_back(const InPlace& p) {
  if (p.numpy_data && p.array.host_data() != p.numpy_data)
    p.array.backend().copy_to_host(*p.array.storage, p.array.byte_offset(), p.numpy_data,
                                   p.array.nbytes());
}

// One multi-tensor update: params[i] with grads[i], states1[i], states2[i] (None for sgd)
// and hypers[i]; every tensor is checked before anything is launched.
void optimizer_steps(const std::string& kind, const py::list& params, const py::list& grads,
                     const py::list& states1, const py::list& states2, const py::list& hypers) {
  const std::string op = "nn.optim." + kind;
  if (kind != "sgd" && kind != "adam" && kind != "adadelta")
    throw ValueError(message(op, "internal: unknown optimizer"));
  const std::size_t count = params.size();
  if (grads.size() != count || states1.size() != count || states2.size() != count ||
      hypers.size() != count)
    throw ValueError(message(op, "internal: expected lists of one length"));
  if (count == 0) return;
  std::vector<NamedArg> named;
  for (std::size_t i = 0; i < count; ++i) {
    named.push_back({"param", params[i]});
    named.push_back({"grad", grads[i]});
  }
  Backend& be = pick_backend(op, named);
  const bool two = kind != "sgd";
  std::vector<InPlace> p(count), a(count), b(count);
  std::vector<Array> g(count);
  std::vector<OptimTensor> tensors(count);
  for (std::size_t i = 0; i < count; ++i) {
    py::handle param = params[i];
    p[i] = in_place(param, be, op, "param",
                    is_array(param) ? param.cast<const Array&>().size()
                                    : py::reinterpret_borrow<py::array>(param).size());
    const std::int64_t n = p[i].array.size();
    if (n > std::int64_t(std::numeric_limits<std::uint32_t>::max()))
      throw ValueError(message(op, "expected fewer than 2**32 elements per parameter, got ", n));
    g[i] = to_contiguous_array(grads[i], be, op, "grad", DType::float32);
    if (g[i].size() != n)
      throw ValueError(message(op, "expected a gradient with ", n, " elements, got ", g[i].size()));
    a[i] = in_place(states1[i], be, op, "state", n);
    if (two) b[i] = in_place(states2[i], be, op, "state", n);
    const py::dict hyper = hypers[i].cast<py::dict>();
    OptimArgs& args = tensors[i].args;
    args = OptimArgs{};
    args.n = std::uint32_t(n);
    auto get = [&](const char* k) { return hyper.contains(k) ? hyper[k].cast<double>() : 0.0; };
    args.first = get("first") != 0.0;
    args.nesterov = get("nesterov") != 0.0;
    args.lr = float(get("lr"));
    args.weight_decay = float(get("weight_decay"));
    args.momentum = float(get("momentum"));
    args.dampening = float(get("dampening"));
    args.beta1 = float(get("beta1"));
    args.beta2 = float(get("beta2"));
    args.eps = float(get("eps"));
    args.step_size = float(get("step_size"));
    args.sqrt_bias2 = float(get("sqrt_bias2"));
    args.rho = float(get("rho"));
  }
  for (std::size_t i = 0; i < count; ++i) {
    tensors[i].param = &p[i].array;
    tensors[i].grad = &g[i];
    tensors[i].state1 = &a[i].array;
    tensors[i].state2 = two ? &b[i].array : nullptr;
  }
  run_op(be, [&] { launch_optimizer(kind.c_str(), tensors); });
  for (std::size_t i = 0; i < count; ++i) {
    copy_back(p[i]);
    copy_back(a[i]);
    if (two) copy_back(b[i]);
  }
}

// The gradients of clip_grad_norm_: float16 / float32 / float64 fastmetal Arrays on one
// device (nn/utils.py checks the device first, for its message).
std::vector<Array> grad_arrays(const py::list& grads, const std::string& op) {
  std::vector<Array> out;
  out.reserve(grads.size());
  for (py::handle h : grads) {
    if (!is_array(h))
      throw TypeError(message(op, "expected every gradient to be a fastmetal.Array, got ",
                              std::string(py::str(py::type::handle_of(h).attr("__name__")))));
    const Array& g = h.cast<const Array&>();
    if (g.dtype != DType::float32 && g.dtype != DType::float16 && g.dtype != DType::float64)
      throw TypeError(message(op, "expected floating-point gradients (float16, float32 or "
                              "float64), got ", dtype_name(g.dtype)));
    if (!out.empty() && &g.backend() != &out[0].backend())
      throw ValueError(message(op, "expected gradients on one device, got ", out[0].backend().name(),
                               " and ", g.backend().name()));
    out.push_back(g);
  }
  return out;
}

// The total norm of the gradients (a 0-d float32 Array) and the clipping factor (a float32
// Array of one element), computed on their device: see nn/utils.py. A strided gradient is
// read through a contiguous copy.
py::tuple grad_norm(const py::list& grads, double norm_type, double max_norm) {
  const std::string op = "nn.utils.clip_grad_norm_";
  if (!(norm_type > 0.0))
    throw ValueError(message(op, "expected norm_type > 0 (or inf), got ", norm_type));
  std::vector<Array> g = grad_arrays(grads, op);
  if (g.empty()) throw ValueError(message(op, "internal: expected at least one gradient"));
  Backend& be = g[0].backend();
  GradNormFinishArgs a{};
  a.mode = std::isinf(norm_type) ? FM_GRAD_NORM_MAX
           : norm_type == 2.0    ? FM_GRAD_NORM_SQUARE
           : norm_type == 1.0    ? FM_GRAD_NORM_ABS
                                 : FM_GRAD_NORM_POW;
  a.inv_p = float(1.0 / norm_type);
  a.max_norm = float(max_norm);
  Array total = Array::empty(be, Shape{}, DType::float32);
  Array scale = Array::empty(be, Shape{1}, DType::float32);
  run_op(be, [&] {
    for (Array& x : g)
      if (!x.contiguous()) x = convert(x, x.dtype);
    launch_grad_norm(g, float(norm_type), a, total, scale);
  });
  return py::make_tuple(wrap_result(std::move(total), true), wrap_result(std::move(scale), true));
}

// Every contiguous gradient times scale[0] (grad_norm's factor), in place; returns the
// strided ones, left to the caller (an elementwise multiply writes them in place).
py::list grad_scale(const py::list& grads, py::handle scale) {
  const std::string op = "nn.utils.clip_grad_norm_";
  std::vector<Array> all = grad_arrays(grads, op);
  py::list strided;
  if (all.empty()) return strided;
  if (!is_array(scale) || scale.cast<const Array&>().dtype != DType::float32 ||
      scale.cast<const Array&>().size() != 1 ||
      &scale.cast<const Array&>().backend() != &all[0].backend())
    throw ValueError(message(op, "internal: expected the factor as one float32 element on the "
                             "gradients' device"));
  std::vector<Array> g;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!all[i].contiguous()) {
      strided.append(grads[i]);
      continue;
    }
    prepare_write(all[i], op, "grad");  // read-only memory stays read-only; bumps the version
    g.push_back(all[i]);
  }
  const Array s = scale.cast<const Array&>();
  Backend& be = all[0].backend();
  run_op(be, [&] { launch_grad_scale(g, s); });
  return strided;
}

}  // namespace

void bind_training(py::module_& m) {
  m.def("_max_pool2d", &max_pool2d, py::arg("x"), py::arg("kh"), py::arg("kw"), py::arg("sh"),
        py::arg("sw"), py::arg("ph"), py::arg("pw"), "Private: see training.py.");
  m.def("_max_pool2d_backward", &max_pool2d_backward, py::arg("grad_output"), py::arg("x"),
        py::arg("kh"), py::arg("kw"), py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"),
        "Private: see training.py.");
  m.def("_dropout", &dropout, py::arg("x"), py::arg("threshold"), py::arg("scale"),
        py::arg("key0"), py::arg("key1"), "Private: see training.py.");
  m.def("_cross_entropy", &cross_entropy, py::arg("logits"), py::arg("labels"),
        "Private: see training.py.");
  m.def("_reshaped_view", &reshaped_view, py::arg("x"), py::arg("shape"),
        "Private: a contiguous Array with another shape, sharing memory (see layers.py).");
  m.def("_optimizer_steps", &optimizer_steps, py::arg("kind"), py::arg("params"),
        py::arg("grads"), py::arg("states1"), py::arg("states2"), py::arg("hypers"),
        "Private: see optim.py.");
  m.def("_grad_norm", &grad_norm, py::arg("grads"), py::arg("norm_type"), py::arg("max_norm"),
        "Private: see ops/training.py (clip_grad_norm_).");
  m.def("_grad_scale", &grad_scale, py::arg("grads"), py::arg("scale"),
        "Private: see ops/training.py (clip_grad_norm_).");
}

}  // namespace fm::python
