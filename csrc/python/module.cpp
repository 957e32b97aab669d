// The pybind11 module fastmetal._core. Bindings only: the logic lives in the portable
// core (array, shape, elementwise, ...) and in pyarray.cpp / *_py.cpp at the boundary.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "backend/capture.h"
#include "core/array.h"
#include "python/bindings.h"
#include "backend/python_hooks.h"
#include "python/elementwise_bindings.h"
#include "ops/convert.h"
#include "ops/elementwise.h"
#include "core/errors.h"
#include "python/dlpack.h"
#include "python/pyarray.h"
#include "backend/env_config.h"

namespace py = pybind11;
using namespace fm;
using namespace fm::python;

namespace {

Shape parse_shape(py::handle shape, const std::string& op) {
  auto bad = [&] {
    return TypeError(message(op, "expected shape as an int or a sequence of ints, got ",
                             std::string(py::repr(shape))));
  };
  auto as_int = [&](py::handle d) {
    if (PyBool_Check(d.ptr()) || PyFloat_Check(d.ptr())) throw bad();
    PyObject* i = PyNumber_Index(d.ptr());
    if (i == nullptr) {
      PyErr_Clear();
      throw bad();
    }
    const long long v = PyLong_AsLongLong(i);
    Py_DECREF(i);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      throw bad();
    }
    return std::int64_t(v);
  };
  Shape s;
  if (PyLong_Check(shape.ptr())) {
    s.push_back(as_int(shape));
  } else {
    if (!PySequence_Check(shape.ptr()) || PyUnicode_Check(shape.ptr())) throw bad();
    for (auto d : py::reinterpret_borrow<py::sequence>(shape)) s.push_back(as_int(d));
  }
  for (auto d : s)
    if (d < 0)
      throw ValueError(message(op, "expected non-negative dimensions, got shape ", shape_str(s)));
  return s;
}

Backend& backend_arg(py::handle device) {
  return device.is_none() ? default_backend() : get_backend(device.cast<std::string>());
}

py::object filled(py::handle shape, py::handle dtype, py::handle device, const char* op,
                  int value) {
  const Shape s = parse_shape(shape, op);
  const DType t = parse_dtype(dtype, op, "dtype");
  Backend& b = backend_arg(device);
  check_dtype_on(b, t, op);
  Array a = Array::empty(b, s, t, op);
  if (value >= 0 && a.size() > 0) {
    const auto fill = [value, t](char* p, std::size_t nbytes, std::size_t size) {
      if (value == 0) {
        std::memset(p, 0, nbytes);
        return;
      }
      switch (t) {
        case DType::float32: std::fill_n(reinterpret_cast<float*>(p), size, 1.0f); break;
        case DType::float16: std::fill_n(reinterpret_cast<_Float16*>(p), size, _Float16(1.0f)); break;
        case DType::float64: std::fill_n(reinterpret_cast<double*>(p), size, 1.0); break;
        case DType::int64: std::fill_n(reinterpret_cast<std::int64_t*>(p), size, std::int64_t(1)); break;
        case DType::int32: std::fill_n(reinterpret_cast<std::int32_t*>(p), size, std::int32_t(1)); break;
        default: std::fill_n(reinterpret_cast<std::uint8_t*>(p), size, std::uint8_t(1)); break;  // bool, uint8
      }
    };
    if (a.storage->host) {  // in place where the CPU sees the memory; a capture records it
      char* p = a.host_data();
      const std::size_t nbytes = a.nbytes(), size = std::size_t(a.size());
      capture::run_host([fill, p, nbytes, size] { fill(p, nbytes, size); }, {a.storage});
    } else {  // one element, broadcast on the device
      alignas(8) char element[8];
      fill(element, itemsize(t), 1);
      fill_from_element(a, element);
    }
  }
  return py::cast(std::move(a));
}

py::tuple shape_tuple(const Array& a) {
  py::tuple t(a.shape.size());
  for (std::size_t i = 0; i < a.shape.size(); ++i) t[i] = a.shape[i];
  return t;
}

// A view of a's storage; the Python side (fastmetal/_array.py) computes offset/shape/strides
// for indexing, reshape and transpose, and this checks them so that no view can address
// memory outside its storage, whatever Python passes.
Array make_view(const Array& a, std::int64_t offset, const Shape& shape, const Strides& strides) {
  const char* op = "Array._view";
  if (shape.size() != strides.size())
    throw ValueError(message(op, "expected as many strides as dimensions, got ", shape.size(),
                             " dimensions and ", strides.size(), " strides"));
  const std::int64_t item = std::int64_t(itemsize(a.dtype));
  const std::int64_t capacity = std::int64_t(a.storage->nbytes) / item;  // elements
  std::int64_t lo = offset, hi = offset, count = 1;
  bool empty = false;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0)
      throw ValueError(message(op, "expected non-negative dimensions, got shape ", shape_str(shape)));
    if (shape[d] == 0) empty = true;
  }
  for (std::size_t d = 0; d < shape.size() && !empty; ++d) {
    std::int64_t span = 0;
    if (__builtin_mul_overflow(strides[d], shape[d] - 1, &span) ||
        __builtin_mul_overflow(count, shape[d], &count) ||
        __builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi))
      throw ValueError(message(op, "expected a view inside the storage, got shape ",
                               shape_str(shape), " strides ", shape_str(strides),
                               " (offset arithmetic overflows)"));
  }
  const bool inside = empty ? (offset >= 0 && offset <= capacity) : (lo >= 0 && hi < capacity);
  if (!inside)
    throw ValueError(message(op, "expected a view inside the storage of ", capacity,
                             " elements, got offset ", offset, " shape ", shape_str(shape),
                             " strides ", shape_str(strides)));
  Array v = a;  // shares the storage and keeps every flag of `a`
  v.offset = offset;
  v.shape = shape;
  v.strides = strides;
  return v;
}

// PEP 3118 format of a dtype ("q": int64 on every platform, which NumPy reads as int64).
const char* buffer_format(DType t) {
  switch (t) {
    case DType::float32: return "f";
    case DType::float16: return "e";
    case DType::float64: return "d";
    case DType::int32: return "i";
    case DType::uint8: return "B";
    case DType::bool_: return "?";
    default: return "q";
  }
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "fastmetal's compiled core. Use the public package `fastmetal` instead.";

  // IndexOutOfRange: an IndexError (PyTorch's class for an id or label out of range) that
  // is also a ValueError (what fastmetal raised for it before), as NumPy's AxisError.
  static PyObject* index_out_of_range = [] {
    py::tuple bases = py::make_tuple(py::handle(PyExc_IndexError), py::handle(PyExc_ValueError));
    return PyErr_NewExceptionWithDoc(
        "fastmetal._core.IndexOutOfRange",
        "An id or class label outside its range: an IndexError (as PyTorch's) and a ValueError.",
        bases.ptr(), nullptr);
  }();
  m.attr("IndexOutOfRange") = py::handle(index_out_of_range);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const fm::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const fm::IndexError& e) {
      PyErr_SetString(index_out_of_range, e.what());
    } catch (const fm::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const fm::BackendError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  // dynamic_attr: autograd keeps its per-Array state (requires_grad, grad, the node that made
  // it) on the Python object.
  py::class_<Array>(m, "Array", py::buffer_protocol(), py::dynamic_attr(), py::module_local(false),
                    "An array in fastmetal device memory. On host-visible devices (cpu, metal) "
                    "it exports the buffer protocol: np.asarray(a) shares its memory.")
      .def_buffer([](Array& a) -> py::buffer_info {
        if (!a.backend().host_visible())
          throw py::buffer_error("fastmetal.Array on '" + a.backend().name() +
                                 "' is not host-visible; use .numpy() to copy it");
        wait_for_host(a);  // the exporter reads or writes the memory as soon as we return
        std::vector<py::ssize_t> strides;
        for (auto s : a.strides) strides.push_back(s * py::ssize_t(itemsize(a.dtype)));
        return py::buffer_info(a.host_data(), py::ssize_t(itemsize(a.dtype)),
                               buffer_format(a.dtype), py::ssize_t(a.ndim()),
                               std::vector<py::ssize_t>(a.shape.begin(), a.shape.end()),
                               strides, a.readonly);
      })
      .def_property_readonly("shape", &shape_tuple)
      .def_property_readonly("dtype", [](const Array& a) { return numpy_dtype(a.dtype); })
      .def_property_readonly("ndim", &Array::ndim)
      .def_property_readonly("size", &Array::size)
      .def_property_readonly("nbytes", &Array::nbytes)
      .def_property_readonly("device", [](const Array& a) { return a.backend().name(); })
      .def("numpy", [](py::object self) { return numpy_view(self.cast<const Array&>(), self); },
           "A NumPy array of the data: a view sharing memory on host-visible devices, "
           "else a copy.")
      .def("__len__",
           [](const Array& a) {
             if (a.shape.empty()) throw py::type_error("len() of a 0-d fastmetal.Array");
             return a.shape[0];
           })
      .def("__dlpack__",
           [](py::object self, py::kwargs kwargs) -> py::object {
             const Array& a = self.cast<const Array&>();
             if (a.backend().host_visible()) return numpy_view(a, self).attr("__dlpack__")(**kwargs);
             return dlpack_device_capsule(a, self, kwargs);
           })
      .def_property_readonly(
          "__cuda_array_interface__",
          [](const Array& a) -> py::dict {
            if (!a.backend().cuda_array_interface())
              throw py::attribute_error("__cuda_array_interface__ exists on cuda arrays only");
            // No "stream" key (None): the data is complete when the consumer gets it.
            wait_for_host(a);
            py::list strides;
            for (auto s : a.strides) strides.append(s * std::int64_t(itemsize(a.dtype)));
            py::dict d;
            d["shape"] = shape_tuple(a);
            d["typestr"] = std::string(py::str(numpy_dtype(a.dtype).attr("str")));
            d["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(a.device_data()), false);
            d["strides"] = py::tuple(strides);
            d["version"] = 3;
            return d;
          })
      .def("__dlpack_device__", &dlpack_device)
      .def_property_readonly(
          "_version", [](const Array& a) -> std::uint64_t { return a.storage ? a.storage->version.load(std::memory_order_relaxed) : 0; },
          "Writes so far into this Array's storage (any view of it): autograd's check that a "
          "saved tensor was not modified in place.")
      .def_property_readonly("_readonly", [](const Array& a) { return a.readonly; },
                             "True where writes are refused (views of read-only memory).")
      .def_property_readonly("_offset", [](const Array& a) { return a.offset; },
                             "Element index of [0, ..., 0] inside the storage.")
      .def_property_readonly(
          "_strides",
          [](const Array& a) { return py::tuple(py::cast(a.strides)); },
          "Strides in elements (negative and zero allowed).")
      .def("_alias", [](const Array& a) { return a; },
           "A new Array object over the same elements (shape, strides, storage, flags): what "
           "autograd saves and detach() returns, with none of the Python object's attributes.")
      .def("_view", &make_view, py::arg("offset"), py::arg("shape"), py::arg("strides"),
           "A new Array on the same storage (no copy): element offset, shape and strides in "
           "elements. Every addressed element must lie inside the storage. Flags of the "
           "source Array (and its storage) carry over, so views of read-only data stay read-only.");
  // The rest of Array's surface (operators, methods, __array__, __repr__, NumPy dispatch,
  // autograd's attributes) is Python's: python/fastmetal/array/surface.py, in one place.

  m.def("devices", &available_devices, "Available backends, best first; 'cpu' is always there.");
  m.def("default_device", &fm::default_device, "The device ops use when no Array says otherwise.");
  m.def("set_default_device", &fm::set_default_device, py::arg("name"),
        "Set the default device; ValueError listing what is available if `name` is not.");
  m.def(
      "synchronize",
      [](py::object device) {
        Backend& b = backend_arg(device);
        py::gil_scoped_release nogil;
        b.synchronize();
      },
      py::arg("device") = py::none(), "Wait until all queued work on the device has finished.");

  m.def(
      "asarray",
      [](py::object obj, py::object dtype, py::object device) -> py::object {
        std::optional<DType> want;
        if (!dtype.is_none()) want = parse_dtype(dtype, "asarray", "dtype");
        Backend* b = nullptr;
        if (!device.is_none())
          b = &get_backend(device.cast<std::string>());
        else if (is_array(obj))
          b = &obj.cast<const Array&>().backend();
        else
          b = &default_backend();
        if (want) check_dtype_on(*b, *want, "asarray");
        if (is_array(obj)) {
          const Array& a = obj.cast<const Array&>();
          if (&a.backend() == b && (!want || *want == a.dtype)) return obj;
          if (&a.backend() == b) {  // another dtype, same device: convert there
            Array r;
            {
              py::gil_scoped_release nogil;
              r = convert(a, *want);
              b->end_op();
            }
            return py::cast(std::move(r));
          }
          if (!want) want = on_device(a.dtype, b->has_float64());  // keep it across devices
          obj = numpy_view(a, obj);   // move across devices via the host
        }
        return py::cast(to_array(obj, *b, "asarray", "obj", want));
      },
      py::arg("obj"), py::arg("dtype") = py::none(), py::arg("device") = py::none());
  m.def(
      "empty",
      [](py::object shape, py::object dtype, py::object device) {
        return filled(shape, dtype, device, "empty", -1);
      },
      py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = py::none());
  m.def(
      "zeros",
      [](py::object shape, py::object dtype, py::object device) {
        return filled(shape, dtype, device, "zeros", 0);
      },
      py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = py::none());
  m.def(
      "ones",
      [](py::object shape, py::object dtype, py::object device) {
        return filled(shape, dtype, device, "ones", 1);
      },
      py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = py::none());

  m.def("_set_wide_elementwise", &fm::set_wide_elementwise_everywhere, py::arg("enabled"));
  m.def("unary", &fm::python::unary, py::arg("op"), py::arg("x"), py::arg("out") = py::none());
  m.def("binary", &fm::python::binary, py::arg("op"), py::arg("x"), py::arg("y"),
        py::arg("out") = py::none());
  m.def(
      "_promote",
      [](const std::string& x, const std::string& y) {
        // ops/arguments.cpp's promotion, for fastmetal.result_type: dtype names, or
        // "python_bool" / "python_int" / "python_float" for weak Python scalars.
        auto parse = [](const std::string& name) {
          static const char* weak[] = {"python_bool", "python_int", "python_float"};
          for (int i = 0; i < fm::kDTypes; ++i)
            if (name == fm::dtype_name(fm::DType(i))) return fm::Operand(i);
          for (int i = 0; i < 3; ++i)
            if (name == weak[i]) return fm::Operand(fm::kDTypes + i);
          throw fm::ValueError("[fastmetal.result_type] unknown dtype " + name);
        };
        return std::string(fm::dtype_name(fm::promote(parse(x), parse(y))));
      },
      py::arg("x"), py::arg("y"), "Private: the dtype two operands promote to.");
  m.def("_where", &fm::python::where_py, py::arg("condition"), py::arg("x"), py::arg("y"));

  fm::python::bind_numerics(m);
  fm::python::bind_conv2d(m);
  fm::python::bind_training(m);
  fm::bind_python_hooks(m);  // each backend's private hooks (backend/<name>/python_hooks.cpp)
  fm::python::bind_reductions(m);
  fm::python::bind_indexing(m);
  fm::python::bind_attention(m);
  fm::python::bind_capture(m);

  // Introspection for tests and `python -m fastmetal`.
  m.def("_config_problems", &fm::env::config_problems,
        "FASTMETAL_* environment variables that were not understood, one line each.");
  m.def("_device_problems", &fm::device_problems,
        "Why each backend that is not in devices() is missing (not built, no usable GPU), "
        "one line each, starting with the backend's name.");
  m.def(
      "_queue_handle",
      [](const std::string& device) {
        return reinterpret_cast<std::uintptr_t>(get_backend(device).queue_handle());
      },
      "Private: the device's queue (a cudaStream_t on cuda) as an int, 0 where it has none: "
      "fastmetal.distributed orders NCCL's work after it without waiting on the host.");
  m.def(
      "_host_waits", [](const std::string& device) { return get_backend(device).host_waits(); },
      py::arg("device"),
      "How many times the host has waited for `device` (synchronize, copies to the host, "
      "reads of device memory): a debug counter; ops on device Arrays add none.");
  m.def(
      "_launch_kernel_named",
      [](const std::string& device, const std::string& kernel) {
        Backend& b = get_backend(device);
        py::gil_scoped_release nogil;
        b.launch(kernel, Dispatch{}, {});
        b.end_op();
      },
      py::arg("device"), py::arg("kernel"),
      "Launches `kernel` on one thread with no arguments: for tests of how launch errors "
      "surface (an unknown name raises RuntimeError).");
  m.def(
      "_device_capabilities",
      [](const std::string& device) {
        const Backend& b = get_backend(device);
        const Backend::DLPackDevice dl = b.dlpack_device();
        py::dict d;
        d["host_visible"] = b.host_visible();
        d["discrete_gpu"] = b.discrete_gpu();
        d["dlpack_device"] = py::make_tuple(dl.type, dl.id);
        d["cuda_array_interface"] = b.cuda_array_interface();
        d["float64"] = b.has_float64();
        d["gpu"] = !b.serial_grid();  // an accelerator: not the host's own cores
        return d;
      },
      py::arg("device"),
      "What `device` is, by capability (so Python names no backend): host_visible (NumPy "
      "views share its memory), discrete_gpu, dlpack_device, cuda_array_interface, float64, "
      "gpu (an accelerator, not the host's cores: fastmetal.accelerator).");
  m.def("_has_kernel", [](const std::string& device, const std::string& name) {
    return get_backend(device).has_kernel(name);
  });
  // Whether `device`'s backend has its own routine for the op `name` (ops.losses asks for
  // "cross_entropy": a backend's fused path that suits any number of classes).
  m.def("_has_native_op", [](const std::string& device, const std::string& name) {
    return get_backend(device).native_op(name.c_str()) != nullptr;
  });
}
