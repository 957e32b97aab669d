#include "backend/capture.h"
#include "python/pyarray.h"

#include <cstring>
#include <limits>
#include <map>

#include "core/errors.h"
#include "ops/convert.h"

namespace fm::python {

namespace {

py::object& numpy_fn(const char* name) {
  // Leaked on purpose: Python objects must not be destroyed after the interpreter.
  static auto* cache = new std::map<std::string, py::object>();
  auto it = cache->find(name);
  if (it == cache->end())
    it = cache->emplace(name, py::module_::import("numpy").attr(name)).first;
  return it->second;
}

std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }


// The fastmetal dtype of NumPy data of this kind and size, if there is one.
std::optional<DType> dtype_of_kind(char kind, py::ssize_t size) {
  if (kind == 'f') {
    if (size == 4) return DType::float32;
    if (size == 2) return DType::float16;
    if (size == 8) return DType::float64;
  } else if (kind == 'i') {
    if (size == 8) return DType::int64;
    if (size == 4) return DType::int32;
  } else if (kind == 'u') {
    if (size == 1) return DType::uint8;
  } else if (kind == 'b') {
    return DType::bool_;
  }
  return std::nullopt;
}

// Native dtype of a NumPy array, or nullopt for real data fastmetal has no dtype of (int8,
// int16, uint16..uint64, longdouble), which converts as NumPy's promotion says: to int64
// where that holds every value (int8, int16, uint16, uint32), else float64 (uint64,
// longdouble). TypeError for complex, object, string, structured.
std::optional<DType> classify(const py::array& arr, const std::string& op, const char* arg) {
  const py::dtype dt = arr.dtype();
  const char kind = dt.kind();
  if (const auto t = dtype_of_kind(kind, dt.itemsize())) return t;
  if (kind == 'f' || kind == 'i' || kind == 'u') return std::nullopt;
  throw TypeError(message(op, "expected a real (float, integer or bool) array for ", arg,
                          ", got dtype ", std::string(py::str(dt))));
}

// The dtype NumPy data without a fastmetal dtype of its own becomes (see classify).
DType widened(const py::array& arr) {
  const char kind = arr.dtype().kind();
  const auto size = arr.itemsize();
  if ((kind == 'i' && size < 8) || (kind == 'u' && size < 8)) return DType::int64;
  return DType::float64;
}

Array wrap_numpy(Backend& backend, py::array arr) {
  const auto item = arr.itemsize();
  for (py::ssize_t d = 0; d < arr.ndim(); ++d)
    if (arr.strides(d) % item != 0) {
      arr = numpy_fn("ascontiguousarray")(arr);
      break;
    }
  Array a;
  a.dtype = *dtype_of_kind(arr.dtype().kind(), item);
  a.readonly = !arr.writeable();
  a.shape.assign(arr.shape(), arr.shape() + arr.ndim());
  a.strides.resize(a.shape.size());
  std::int64_t lo = 0, hi = 0;
  for (std::size_t d = 0; d < a.shape.size(); ++d) {
    a.strides[d] = arr.strides(py::ssize_t(d)) / item;
    const std::int64_t span = a.strides[d] * (a.shape[d] - 1);
    if (a.shape[d] > 0) (span < 0 ? lo : hi) += span;
  }
  if (a.size() == 0) {
    a.storage = backend.allocate(item);
    a.strides = contiguous_strides(a.shape);
    return a;
  }
  char* data = static_cast<char*>(const_cast<void*>(arr.data()));
  if (backend.host_visible()) {
    a.storage = backend.wrap_host(data + lo * item, std::size_t(hi - lo + 1) * item,
                                  keep_alive(arr));
    a.offset = -lo;
    return a;
  }
  // Device memory first: a size the device cannot hold fails here (MemoryError), before
  // NumPy materialises a host copy of it (a broadcast view may be far larger than its base).
  a.strides = contiguous_strides(a.shape);
  a.storage = backend.allocate(a.nbytes());
  py::array c = numpy_fn("ascontiguousarray")(arr);
  backend.copy_from_host(*a.storage, 0, c.data(), a.nbytes());
  return a;
}

// x * np.float32(0.5) is common NumPy code: its scalar is recognised by type, not converted
// to a NumPy array to learn its dtype and then again to copy it (fm.multiply on 1,024
// floats: 1.62 us with such a scalar, 0.92 with a Python float).
bool is_numpy_float32_scalar(py::handle obj) {
  static auto* np_float32 = new py::object(py::module_::import("numpy").attr("float32"));
  return Py_TYPE(obj.ptr()) == reinterpret_cast<PyTypeObject*>(np_float32->ptr());
}

[[noreturn]] void raise_overflow(py::handle obj, DType t, const std::string& op) {
  const std::string m = message(op, "expected a Python int within ", dtype_name(t), " for an ",
                                dtype_name(t), " array, got ", std::string(py::repr(obj)),
                                " (out of bounds for ", dtype_name(t), ")");
  PyErr_SetString(PyExc_OverflowError, m.c_str());  // NumPy's error type for this
  throw py::error_already_set();
}

// A Python scalar (bool, int, float, np.float32) as one element of dtype t, in `out`: ints
// must fit an integer dtype (OverflowError, as NumPy 2); floats truncate into integers.
void scalar_bytes(py::handle obj, DType t, const std::string& op, unsigned char* out) {
  const bool integral = PyLong_Check(obj.ptr());  // bool included
  if (t == DType::bool_) {
    const int truth = PyObject_IsTrue(obj.ptr());
    if (truth < 0) throw py::error_already_set();
    out[0] = truth ? 1 : 0;
    return;
  }
  if (is_integer(t)) {
    long long v = 0;
    if (integral) {
      int overflow = 0;
      v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
      if (overflow != 0) raise_overflow(obj, t, op);
      if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    } else {
      v = static_cast<long long>(obj.cast<double>());
    }
    if (t == DType::int64) {
      const std::int64_t i = v;
      std::memcpy(out, &i, 8);
    } else if (t == DType::int32) {
      if (integral && (v < INT32_MIN || v > INT32_MAX)) raise_overflow(obj, t, op);
      const std::int32_t i = std::int32_t(v);
      std::memcpy(out, &i, 4);
    } else {
      if (integral && (v < 0 || v > 255)) raise_overflow(obj, t, op);
      out[0] = static_cast<unsigned char>(v);
    }
    return;
  }
  const double v = obj.cast<double>();
  if (t == DType::float64) {
    std::memcpy(out, &v, 8);
  } else if (t == DType::float32) {
    const float f = float(v);
    std::memcpy(out, &f, 4);
  } else {
    const _Float16 h = _Float16(v);
    std::memcpy(out, &h, 2);
  }
}

}  // namespace

std::shared_ptr<void> keep_alive(py::object obj) {
  return std::shared_ptr<void>(obj.release().ptr(), [](void* p) {
    if (!Py_IsInitialized()) return;  // interpreter gone: nothing left to release into
    py::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(p));
  });
}

bool is_array(py::handle obj) {
  // The type object is looked up once: pybind11's isinstance<T> searches its type registry
  // on every call, and ops ask this several times per argument.
  static PyTypeObject* type = reinterpret_cast<PyTypeObject*>(py::type::of<Array>().ptr());
  return obj.ptr() != nullptr && PyObject_TypeCheck(obj.ptr(), type);
}

bool is_python_scalar(py::handle obj) {
  return PyFloat_CheckExact(obj.ptr()) || PyLong_CheckExact(obj.ptr()) || PyBool_Check(obj.ptr());
}

std::string not_an_array_message(py::handle obj, const py::error_already_set& e,
                                 const std::string& op, const char* arg) {
  const std::string got = "got " + type_name(obj);
  if (py::hasattr(obj, "requires_grad") && py::hasattr(obj, "detach")) {
    py::object rg = py::getattr(obj, "requires_grad", py::none());
    if (PyObject_IsTrue(rg.ptr()) == 1)
      return message(op, "expected an array-like of real numbers for ", arg, ", ", got,
                     " that requires grad; pass ", arg, ".detach() (fastmetal does not track "
                     "gradients)");
    PyErr_Clear();
  }
  std::string why = py::str(e.value());
  why = why.substr(0, why.find('\n'));
  std::string kind = py::str(e.type().attr("__name__"));
  return message(op, "expected an array-like of real numbers for ", arg, ", ", got, " (", kind,
                 ": ", why, ")");
}

bool any_array(const py::handle* objs, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i)
    if (objs[i] && is_array(objs[i])) return true;
  return false;
}

Backend& pick_backend(const std::string& op, const NamedArg* args, std::size_t count) {
  Backend* chosen = nullptr;
  const char* chosen_arg = nullptr;
  for (std::size_t i = 0; i < count; ++i) {
    const auto& [name, obj] = args[i];
    if (!obj || !is_array(obj)) continue;
    Backend& b = obj.cast<const Array&>().backend();
    if (chosen && chosen != &b)
      throw ValueError(message(op, "expected all arrays on one device, got ", chosen_arg, " on '",
                               chosen->name(), "' and ", name, " on '", b.name(), "'"));
    chosen = &b;
    chosen_arg = name;
  }
  return chosen ? *chosen : default_backend();
}

DType parse_dtype(py::handle dtype, const std::string& op, const char* arg) {
  py::dtype dt;
  try {
    dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(dtype));
  } catch (py::error_already_set&) {
    throw TypeError(message(op, "expected a dtype for ", arg, " ('float32', 'int64', 'bool', ",
                            "...), got ", std::string(py::repr(dtype))));
  }
  if (const auto t = dtype_of_kind(dt.kind(), dt.itemsize())) return *t;
  throw TypeError(message(op, "expected one of fastmetal's dtypes (bool, uint8, int32, int64, ",
                          "float16, float32, float64) for ", arg, ", got ",
                          std::string(py::str(dt))));
}

void check_dtype_on(Backend& backend, DType t, const std::string& op) {
  if (on_device(t, backend.has_float64()) != t)
    throw TypeError(message(op, "expected a dtype device '", backend.name(), "' has, got ",
                            dtype_name(t), " (Apple GPUs have no double: use float32 there, or ",
                            "device='cpu' for float64)"));
}

py::array to_native_numpy(py::handle obj, const std::string& op, const char* arg,
                          std::optional<DType> want) {
  py::array arr;
  bool python_data = false;  // lists and scalars: Python floats are float32 (PyTorch's rule)
  if (py::isinstance<py::array>(obj)) {
    arr = py::reinterpret_borrow<py::array>(obj);
  } else {
    try {
      arr = numpy_fn("asarray")(obj);
    } catch (py::error_already_set& e) {
      throw TypeError(not_an_array_message(obj, e, op, arg));
    }
    static auto* np_generic = new py::object(py::module_::import("numpy").attr("generic"));
    python_data = !py::isinstance(obj, *np_generic) || PyFloat_Check(obj.ptr());
  }
  std::optional<DType> native = classify(arr, op, arg);
  if (python_data && native == DType::float64) native = DType::float32;
  const DType target = want ? *want : native.value_or(widened(arr));
  if (dtype_of_kind(arr.dtype().kind(), arr.itemsize()) != target)
    arr = arr.attr("astype")(numpy_dtype(target));
  return arr;
}

DType native_dtype_of(py::handle obj, const std::string& op, const char* arg) {
  if (is_array(obj)) return obj.cast<const Array&>().dtype;
  if (is_numpy_float32_scalar(obj)) return DType::float32;
  if (PyFloat_Check(obj.ptr())) return DType::float32;  // Python floats (np.float64 too)
  if (PyBool_Check(obj.ptr())) return DType::bool_;
  if (PyLong_Check(obj.ptr())) return DType::int64;
  const py::array arr = py::isinstance<py::array>(obj) ? py::reinterpret_borrow<py::array>(obj)
                                                       : to_native_numpy(obj, op, arg);
  const auto t = classify(arr, op, arg);
  return t ? *t : widened(arr);
}

DType float_dtype_of(py::handle obj, const std::string& op, const char* arg) {
  if (is_array(obj)) {
    const DType t = obj.cast<const Array&>().dtype;
    if (!is_float(t)) throw int64_refused(op, arg, t);
    return t == DType::float16 ? t : DType::float32;
  }
  return native_dtype_of(obj, op, arg) == DType::float16 ? DType::float16 : DType::float32;
}

Array to_array(py::handle obj, Backend& backend, const std::string& op, const char* arg,
               std::optional<DType> want) {
  if (is_array(obj)) {
    const Array& a = obj.cast<const Array&>();
    if (&a.backend() != &backend)
      throw ValueError(message(op, "expected ", arg, " on device '", backend.name(), "', got '",
                               a.backend().name(), "'"));
    if (!want || *want == a.dtype) return a;
    if (!is_float(a.dtype) || !is_float(*want)) throw int64_refused(op, arg, a.dtype);
    return convert(a, *want);  // between float dtypes on the device
  }
  // A NumPy float32 scalar is copied as a Python scalar is (its value is exact as a double):
  // the 0-d float32 array it stands for, without a NumPy array in between.
  if (is_python_scalar(obj) ||
      (is_numpy_float32_scalar(obj) && (!want || *want == DType::float32))) {
    Array a;
    a.dtype = want ? *want : PyBool_Check(obj.ptr()) ? DType::bool_
                         : PyLong_CheckExact(obj.ptr()) ? DType::int64
                                                        : DType::float32;
    a.dtype = on_device(a.dtype, backend.has_float64());
    a.storage = backend.allocate(itemsize(a.dtype));
    alignas(8) unsigned char bytes[8] = {};
    scalar_bytes(obj, a.dtype, op, bytes);
    backend.copy_from_host(*a.storage, 0, bytes, itemsize(a.dtype));
    return a;
  }
  if (!want && py::isinstance<py::array>(obj) && !backend.has_float64()) {
    const auto arr = py::reinterpret_borrow<py::array>(obj);
    if (native_dtype_of(arr, op, arg) == DType::float64) want = DType::float32;
  }
  return wrap_numpy(backend, to_native_numpy(obj, op, arg, want));
}

Array to_contiguous_array(py::handle obj, Backend& backend, const std::string& op, const char* arg,
                          DType want) {
  Array a = to_array(obj, backend, op, arg, want);
  if (a.contiguous()) return a;
  return convert(a, a.dtype);  // gathered on the device
}

py::dtype numpy_dtype(DType t) {
  // Made once (leaked: Python objects must outlive nothing past the interpreter).
  static auto* dtypes = [] {
    auto* v = new std::vector<py::dtype>();
    for (int i = 0; i < kDTypes; ++i) v->push_back(py::dtype(dtype_name(DType(i))));
    return v;
  }();
  return (*dtypes)[std::size_t(t)];
}

void wait_for_host(const Array& a) {
  capture::on_host_read("a host read of an Array (buffer protocol, DLPack, NumPy view)");
  if (a.size() == 0) return;
  py::gil_scoped_release nogil;
  a.backend().wait_for_host(*a.storage);
}

py::array numpy_view(const Array& a, py::handle owner) {
  const std::size_t item = itemsize(a.dtype);
  std::vector<py::ssize_t> shape(a.shape.begin(), a.shape.end());
  if (!a.backend().host_visible()) {
    capture::on_host_read("a copy of an Array to the host (.numpy(), .item(), np.asarray)");
    py::array out(numpy_dtype(a.dtype), shape);
    if (a.size() == 0) return out;  // nothing to copy, whatever its strides
    if (!a.contiguous()) throw BackendError("[fastmetal] host copy of a strided device array");
    void* dst = out.mutable_data();
    py::gil_scoped_release nogil;  // the copy waits for the queued work that writes `a`
    a.backend().copy_to_host(*a.storage, a.byte_offset(), dst, a.nbytes());
    return out;
  }
  wait_for_host(a);
  std::vector<py::ssize_t> strides(a.strides.size());
  for (std::size_t d = 0; d < strides.size(); ++d) strides[d] = a.strides[d] * py::ssize_t(item);
  py::object base = owner ? py::reinterpret_borrow<py::object>(owner)
                          : py::capsule(new StoragePtr(a.storage), [](void* p) {
                              delete static_cast<StoragePtr*>(p);
                            });
  py::array view(numpy_dtype(a.dtype), shape, strides, a.host_data(), base);
  if (a.readonly) view.attr("setflags")(py::arg("write") = false);
  return view;
}

py::object wrap_result(Array result, bool as_fastmetal_array) {
  if (as_fastmetal_array) return py::cast(std::move(result));
  // A strided result (one laid out as its inputs were) is gathered on the device before the
  // host copy where NumPy cannot view device memory.
  if (!result.backend().host_visible() && !result.contiguous() && result.size() > 0)
    result = convert(result, result.dtype);
  return numpy_view(result);
}

std::optional<std::int64_t> int_arg(py::handle v) {
  static auto* np_bool = new py::object(py::module_::import("numpy").attr("bool_"));
  if (PyBool_Check(v.ptr()) || PyFloat_Check(v.ptr()) || py::isinstance(v, *np_bool))
    return std::nullopt;
  PyObject* i = PyNumber_Index(v.ptr());
  if (i == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i, &overflow);
  Py_DECREF(i);
  if (overflow != 0) return overflow > 0 ? std::numeric_limits<std::int64_t>::max()
                                         : std::numeric_limits<std::int64_t>::min();
  if (x == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return std::nullopt;
  }
  return std::int64_t(x);
}

}  // namespace fm::python

namespace fm::python {

Operand operand_of(py::handle obj, const std::string& op, const char* arg) {
  if (is_array(obj)) return operand(obj.cast<const Array&>().dtype);
  // Python scalars are weak; so is np.float64, a subclass of float (as PyTorch takes it).
  if (PyBool_Check(obj.ptr())) return Operand::python_bool;
  if (PyFloat_Check(obj.ptr())) return Operand::python_float;
  if (PyLong_CheckExact(obj.ptr())) return Operand::python_int;
  return operand(native_dtype_of(obj, op, arg));
}

std::optional<Shape> shape_without_converting(py::handle v) {
  if (is_array(v)) return v.cast<const Array&>().shape;
  if (py::isinstance<py::array>(v)) {
    const auto a = py::reinterpret_borrow<py::array>(v);
    return Shape(a.shape(), a.shape() + a.ndim());
  }
  return std::nullopt;
}

Array to_operand(py::handle obj, Backend& backend, const std::string& op, const char* arg,
                 DType want) {
  if (is_array(obj)) {
    const Array& a = obj.cast<const Array&>();
    if (a.dtype != want && &a.backend() == &backend) return convert(a, want);
  }
  return to_array(obj, backend, op, arg, want);
}

std::optional<std::int64_t> host_integer_min(py::handle v) {
  if (PyLong_Check(v.ptr())) {
    int overflow = 0;
    const long long i = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0) return std::nullopt;  // converting it reports that
    return std::int64_t(i);
  }
  if (py::isinstance<py::array>(v)) {
    const auto a = py::reinterpret_borrow<py::array>(v);
    const char k = a.dtype().kind();
    if (a.size() > 0 && (k == 'i' || k == 'u'))
      return a.attr("min")().cast<std::int64_t>();
  }
  return std::nullopt;
}

OutArg out_arg(py::handle out, Backend& backend, const std::string& op) {
  OutArg o;
  if (out.is_none()) return o;
  if (is_array(out)) {
    o.kind = OutArg::Kind::array;
    o.array = out.cast<const Array&>();
    if (&o.array.backend() != &backend)
      throw ValueError(message(op, "expected out on device '", backend.name(), "', got '",
                               o.array.backend().name(), "'"));
    return o;
  }
  if (!py::isinstance<py::array>(out))
    throw TypeError(message(op, "expected out to be a numpy.ndarray or fastmetal.Array, got ",
                            type_name(out)));
  const auto arr = py::reinterpret_borrow<py::array>(out);
  o.kind = OutArg::Kind::host;
  o.shape.assign(arr.shape(), arr.shape() + arr.ndim());
  o.writeable = arr.writeable();
  o.dtype.kind = arr.dtype().kind();
  o.dtype.itemsize = std::size_t(arr.itemsize());
  // str(dtype) runs Python code in NumPy: only for the kinds OutDType cannot name itself.
  if (std::string("fiubc").find(o.dtype.kind) == std::string::npos)
    o.dtype.other = py::str(arr.dtype());
  for (py::ssize_t d = 0; d < arr.ndim(); ++d)
    if (arr.strides(d) == 0 && arr.shape(d) > 1 && arr.size() > 0) o.broadcast = true;
  if (o.broadcast) o.strides = py::str(py::tuple(arr.attr("strides")));
  // Lent to the device in place where it can write it: host-visible memory of a fastmetal
  // dtype (strides that are not whole elements make to_array gather a copy instead).
  const std::optional<DType> native = dtype_of_kind(o.dtype.kind, arr.itemsize());
  const bool on_device_too = native && on_device(*native, backend.has_float64()) == *native;
  if (on_device_too && backend.host_visible() && o.writeable && !o.broadcast) {
    Array a = to_array(out, backend, op, "out", *native);
    if (a.size() == 0 || a.host_data() == static_cast<const char*>(arr.data())) {
      o.array = std::move(a);
      o.in_place = true;
    }
  }
  return o;
}

py::object out_result(Output& output, py::handle out, bool fm_result) {
  if (!output.has_out()) return wrap_result(output.take(), fm_result);
  if (output.host_copy())
    numpy_fn("copyto")(out, numpy_view(output.target()), py::arg("casting") = "unsafe");
  return py::reinterpret_borrow<py::object>(out);
}

}  // namespace fm::python
