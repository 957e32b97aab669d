// Python entry points of the elementwise ops: validate, promote, place the output, launch
// without the GIL, and return what API.md promises (out, an Array, or a NumPy view).
#include "python/elementwise_bindings.h"

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

struct Output {
  py::object user;      // the out= object, or None
  Array target;         // where the kernel writes
  Array user_array;     // out= as an Array (when given)
  bool via_temp = false;  // kernel writes a temporary that is copied into out= afterwards
};

// Validates out= and decides where the kernel writes. The kernel writes straight into the
// user's memory unless its dtype differs or it partially overlaps an input, in which case
// a temporary is used (never corrupt an input mid-computation).
Output place_output(const std::string& op, py::handle out, Backend& backend, const Shape& shape,
                    DType dtype, std::initializer_list<const Array*> inputs) {
  Output o;
  o.user = py::reinterpret_borrow<py::object>(out);
  if (out.is_none()) {
    o.target = Array::empty(backend, shape, dtype);
    return o;
  }
  const bool fm_out = is_array(out);
  if (!fm_out && !py::isinstance<py::array>(out))
    throw TypeError(message(op, "expected out to be a numpy.ndarray or fastmetal.Array, got ",
                            std::string(py::str(py::type::handle_of(out).attr("__name__")))));
  Shape out_shape;
  bool float_dtype = false, native = false;
  if (fm_out) {
    const Array& a = out.cast<const Array&>();
    if (!is_float(a.dtype)) throw int64_refused(op, "out", a.dtype);
    prepare_write(a, op, "out");
    out_shape = a.shape;
    float_dtype = native = true;
    o.user_array = a;
  } else {
    py::array arr = py::reinterpret_borrow<py::array>(out);
    out_shape.assign(arr.shape(), arr.shape() + arr.ndim());
    for (py::ssize_t d = 0; d < arr.ndim(); ++d)
      if (arr.strides(d) == 0 && arr.shape(d) > 1 && arr.size() > 0)
        throw ValueError(message(op, "expected out without broadcast (zero-stride) dimensions, "
                                     "got a view with strides ",
                                 std::string(py::str(py::tuple(arr.attr("strides"))))));
    float_dtype = arr.dtype().kind() == 'f';
    native = float_dtype && (arr.itemsize() == 4 || arr.itemsize() == 2);
    if (!arr.writeable())
      throw ValueError(message(op, "expected a writeable out array, got a read-only one"));
  }
  if (out_shape != shape)
    throw ValueError(message(op, "expected out with the broadcast shape ", shape_str(shape),
                             ", got shape ", shape_str(out_shape)));
  if (!float_dtype)
    throw ValueError(message(op, "expected out with a floating dtype, got ",
                             std::string(py::str(py::reinterpret_borrow<py::array>(out).dtype()))));
  // On devices whose memory the CPU cannot see, a NumPy out= is filled from a temporary.
  if (native && (fm_out || backend.host_visible())) {
    o.user_array = to_array(out, backend, op, "out");
    // Strides that are not whole elements were gathered into a copy: write a temporary
    // and copy it into out= instead of into that copy.
    const bool shares_memory =
        fm_out || o.user_array.host_data() ==
                      static_cast<const char*>(py::reinterpret_borrow<py::array>(out).data());
    if (o.user_array.dtype == dtype && shares_memory) {
      bool clash = false;
      for (const Array* in : inputs) {
        Array view = *in;
        view.shape = shape;
        view.strides = broadcast_strides(in->shape, in->strides, shape);
        if (may_overlap(view, o.user_array) && !same_view(view, o.user_array)) clash = true;
      }
      if (!clash) {
        o.target = o.user_array;
        return o;
      }
    }
  }
  o.via_temp = true;
  o.target = Array::empty(backend, shape, dtype);
  return o;
}

py::object finish(Output& o, bool fm_result) {
  if (o.via_temp && is_array(o.user) && !o.user_array.backend().host_visible()) {
    // A device Array of another dtype: cast on the host, copy into its device memory.
    const Array& dst = o.user_array;
    if (!dst.contiguous())
      throw ValueError("[fastmetal] out= of another dtype must be contiguous on '" +
                       dst.backend().name() + "'");
    py::array cast = numpy_view(o.target).attr("astype")(numpy_dtype(dst.dtype));
    dst.backend().copy_from_host(*dst.storage, dst.byte_offset(), cast.data(), dst.nbytes());
  } else if (o.via_temp) {
    py::object dst = o.user;
    if (is_array(dst)) dst = numpy_view(o.user_array, dst);
    py::module_::import("numpy").attr("copyto")(dst, numpy_view(o.target),
                                                 py::arg("casting") = "unsafe");
  } else if (!o.user.is_none() && o.target.storage->copied_from != nullptr) {
    // out= could not be shared with the device: copy the result back into it.
    const Storage& st = *o.target.storage;
    st.backend->copy_to_host(st, 0, st.copied_from, st.nbytes);
  }
  if (!o.user.is_none()) return o.user;
  return wrap_result(std::move(o.target), fm_result);
}

// An int64 result `r` as the op returns it: r itself, or written into out= (an Array of
// r's shape, converted to its dtype on the device; a NumPy array, cast as NumPy's
// same_kind casting allows).
py::object int64_result(const std::string& op, Array r, py::handle out, bool fm_result) {
  if (out.is_none()) return wrap_result(std::move(r), fm_result);
  if (is_array(out)) {
    const Array& o = out.cast<const Array&>();
    prepare_write(o, op, "out");
    if (o.shape != r.shape)
      throw ValueError(message(op, "expected out with the broadcast shape ", shape_str(r.shape),
                               ", got shape ", shape_str(o.shape)));
    {
      py::gil_scoped_release nogil;
      launch_convert(r, o);  // r is a fresh array: no overlap with out
      o.backend().end_op();
    }
    return py::reinterpret_borrow<py::object>(out);
  }
  if (!py::isinstance<py::array>(out))
    throw TypeError(message(op, "expected out to be a numpy.ndarray or fastmetal.Array, got ",
                            std::string(py::str(py::type::handle_of(out).attr("__name__")))));
  py::module_::import("numpy").attr("copyto")(out, numpy_view(r), py::arg("casting") = "same_kind");
  return py::reinterpret_borrow<py::object>(out);
}

}  // namespace

py::object unary(const std::string& op, py::handle x, py::handle out) {
  Backend& backend = pick_backend(op, {{"x", x}, {"out", out}});
  const bool fm_result = any_array({x, out});
  Array xa = to_array(x, backend, op, "x");
  if (xa.dtype == DType::int64 && is_int64_unary(op)) {  // negative, abs, square: in int64
    Array r;
    run_maybe_without_gil(xa.size(), [&] {
      r = unary_int64(op, xa);
      backend.end_op();
    });
    return int64_result(op, std::move(r), out, fm_result);
  }
  // Other math on int64 (exp, sqrt, ...) runs in float32, as NumPy's runs in float64.
  if (xa.dtype == DType::int64 && op != "copy") {
    run_maybe_without_gil(xa.size(), [&] { xa = convert(xa, DType::float32); });
  }
  if (xa.dtype == DType::int64) {  // int64 copies (into a new array or an int64 Array)
    Array r;
    if (!out.is_none()) {
      if (!is_array(out) || out.cast<const Array&>().dtype != DType::int64)
        throw TypeError(message(op, "expected out to be an int64 fastmetal.Array for an int64 x, "
                                    "got ", std::string(py::repr(py::type::of(out)))));
      r = out.cast<const Array&>();
      prepare_write(r, op, "out");
      if (r.shape != xa.shape)
        throw ValueError(message(op, "expected out of shape ", shape_str(xa.shape), ", got shape ",
                                 shape_str(r.shape)));
    }
    // A value overlapping its target (a[1:] = a[:-1]) is read from a copy first.
    if (!out.is_none() && may_overlap(xa, r) && !same_view(xa, r)) xa = convert(xa, xa.dtype);
    run_maybe_without_gil(xa.size(), [&] {
      if (out.is_none()) r = convert(xa, xa.dtype);
      else launch_convert(xa, r);
      backend.end_op();
    });
    if (!out.is_none()) return py::reinterpret_borrow<py::object>(out);
    return wrap_result(std::move(r), fm_result);
  }
  Output o = place_output(op, out, backend, xa.shape, xa.dtype, {&xa});
  run_maybe_without_gil(o.target.size(), [&] {
    launch_unary(op, xa, o.target);
    backend.end_op();
  });
  return finish(o, fm_result);
}

// The shape of an array operand, read without converting it, or nothing for other kinds.
std::optional<Shape> shape_without_converting(py::handle v) {
  if (is_array(v)) return v.cast<const Array&>().shape;
  if (py::isinstance<py::array>(v)) {
    const auto a = py::reinterpret_borrow<py::array>(v);
    return Shape(a.shape(), a.shape() + a.ndim());
  }
  return std::nullopt;
}

bool is_int64_array(py::handle v) {
  return is_array(v) && v.cast<const Array&>().dtype == DType::int64;
}

// A NumPy integer or bool array, or a Python int / bool: compared exactly with int64 Arrays.
bool is_integer_operand(py::handle v) {
  if (PyLong_Check(v.ptr())) return true;  // bool too
  if (py::isinstance<py::array>(v)) {
    const char k = py::reinterpret_borrow<py::array>(v).dtype().kind();
    return k == 'i' || k == 'u' || k == 'b';
  }
  return py::isinstance(v, py::module_::import("numpy").attr("integer"));
}

// A comparison with an int64 Array operand: in int64 against integers (exact, as NumPy),
// else in float32 after converting the int64 operand on the device (exact for integers
// of magnitude up to 2**24; NumPy compares in float64). The result is a float32 mask.
py::object compare_with_int64(const std::string& op, py::handle x, py::handle y, py::handle out,
                              Backend& backend) {
  if (!out.is_none())
    throw TypeError(message(op, "expected no out= for a comparison of an int64 array, got ",
                            std::string(py::repr(py::type::of(out)))));
  const bool exact = (is_int64_array(x) || is_integer_operand(x)) &&
                     (is_int64_array(y) || is_integer_operand(y));
  auto operand = [&](py::handle v, const char* name) -> Array {
    if (exact) return to_array(v, backend, op, name, DType::int64);
    if (is_int64_array(v)) return convert(v.cast<const Array&>(), DType::float32);
    return to_array(v, backend, op, name, DType::float32);
  };
  Array xa = operand(x, "x"), ya = operand(y, "y");
  Array r;
  run_maybe_without_gil(std::max(xa.size(), ya.size()), [&] {
    if (exact) {
      r = compare_int64(op, xa, ya);
    } else {
      r = Array::empty(backend, broadcast_shapes(xa.shape, ya.shape, op), DType::float32,
                       op.c_str());
      launch_binary(op, xa, ya, r);
    }
    backend.end_op();
  });
  return py::cast(std::move(r));
}

// A Python int as an int64, or NumPy's OverflowError where it does not fit.
void check_python_int(const std::string& op, py::handle v) {
  if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr())) return;
  int overflow = 0;
  PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow != 0) {  // NumPy's error type for this
    const std::string m = message(op, "expected a Python int within int64 for an int64 array, ",
                                  "got ", std::string(py::repr(v)), " (out of bounds for int64)");
    PyErr_SetString(PyExc_OverflowError, m.c_str());
    throw py::error_already_set();
  }
}

// NumPy refuses negative integer exponents of integers (ValueError); those the host can see
// (a Python int or a NumPy array) are refused here, before any work.
void check_exponents(py::handle y) {
  bool negative = false;
  if (PyLong_Check(y.ptr())) negative = y.cast<long long>() < 0;
  else if (py::isinstance<py::array>(y) && py::reinterpret_borrow<py::array>(y).size() > 0)
    negative = py::reinterpret_borrow<py::array>(y).attr("min")().cast<long long>() < 0;
  if (negative)
    throw ValueError(message("power", "expected non-negative exponents for an int64 base, got a ",
                             "negative one (Integers to negative integer powers are not allowed)"));
}

// Arithmetic with an int64 Array operand, as NumPy's type promotion: against integers (int64
// Arrays, NumPy integer arrays, Python ints) in int64 (metal/int64_math.metal), except true
// division; against floats, and for `divide`, in float32 after converting the int64 Arrays on
// the device (NumPy: float64; fastmetal has no float64).
py::object arithmetic_with_int64(const std::string& op, py::handle x, py::handle y,
                                 py::handle out, Backend& backend, bool fm_result) {
  const bool integers = (is_int64_array(x) || is_integer_operand(x)) &&
                        (is_int64_array(y) || is_integer_operand(y));
  if (integers && is_int64_arithmetic(op)) {
    check_python_int(op, x);
    check_python_int(op, y);
    if (op == "power") check_exponents(y);
    Array xa = to_array(x, backend, op, "x", DType::int64);
    Array ya = to_array(y, backend, op, "y", DType::int64);
    Array r;
    run_maybe_without_gil(std::max(xa.size(), ya.size()), [&] {
      r = binary_int64(op, xa, ya);
      backend.end_op();
    });
    return int64_result(op, std::move(r), out, fm_result);
  }
  auto as_float = [&](py::handle v) -> py::object {
    if (!is_int64_array(v)) return py::reinterpret_borrow<py::object>(v);
    Array f;
    const Array& a = v.cast<const Array&>();
    run_maybe_without_gil(a.size(), [&] { f = convert(a, DType::float32); });
    return py::cast(std::move(f));
  };
  return binary(op, as_float(x), as_float(y), out);
}

py::object binary(const std::string& op, py::handle x, py::handle y, py::handle out) {
  Backend& backend = pick_backend(op, {{"x", x}, {"y", y}, {"out", out}});
  const bool fm_result = any_array({x, y, out});
  if (is_int64_array(x) || is_int64_array(y)) {
    if (is_comparison(op)) return compare_with_int64(op, x, y, out, backend);
    return arithmetic_with_int64(op, x, y, out, backend, fm_result);
  }
  // Python scalars are weakly typed (NEP 50): they take the array operand's dtype.
  const bool xs = is_python_scalar(x), ys = is_python_scalar(y);
  DType dtype = DType::float32;
  if (!xs && !ys)
    dtype = promote(native_dtype_of(x, op, "x"), native_dtype_of(y, op, "y"));
  else if (!xs)
    dtype = native_dtype_of(x, op, "x");
  else if (!ys)
    dtype = native_dtype_of(y, op, "y");
  // A result that cannot exist is refused before the inputs are converted: on a device
  // without host-visible memory converting copies, and a broadcast input may be huge.
  if (const auto sx = shape_without_converting(x))
    if (const auto sy = shape_without_converting(y)) {
      const Shape s = broadcast_shapes(*sx, *sy, op);
      if (!fits_in_memory(s, itemsize(dtype)))
        throw ValueError(message(op, "expected an array of at most 2**63 - 1 bytes, got shape ",
                                 shape_str(s)));
    }
  Array xa = to_array(x, backend, op, "x", dtype);
  Array ya = to_array(y, backend, op, "y", dtype);
  const Shape shape = broadcast_shapes(xa.shape, ya.shape, op);
  Output o = place_output(op, out, backend, shape, dtype, {&xa, &ya});
  run_maybe_without_gil(o.target.size(), [&] {
    launch_binary(op, xa, ya, o.target);
    backend.end_op();
  });
  return finish(o, fm_result);
}

// where(condition, x, y) as numpy.where with three arguments: the result dtype as NumPy's
// promotion of x and y (int64 when both are integers; else float, Python scalars taking the
// other's dtype, int64 Arrays converted to float32 on the device); the condition is used as
// it is where it is an Array (float masks, int64), else converted to a float32 mask.
py::object where_py(py::handle cond, py::handle x, py::handle y) {
  const std::string op = "where";
  Backend& backend = pick_backend(op, {{"condition", cond}, {"x", x}, {"y", y}});
  const bool fm_result = any_array({cond, x, y});
  const bool integers = (is_int64_array(x) || is_integer_operand(x)) &&
                        (is_int64_array(y) || is_integer_operand(y));
  DType dtype = DType::int64;
  if (!integers) {
    auto float_of = [&](py::handle v, const char* name) -> std::optional<DType> {
      if (is_python_scalar(v) || is_int64_array(v) || is_integer_operand(v)) return std::nullopt;
      return native_dtype_of(v, op, name);
    };
    const auto dx = float_of(x, "x"), dy = float_of(y, "y");
    dtype = dx && dy ? promote(*dx, *dy) : dx ? *dx : dy ? *dy : DType::float32;
  }
  auto operand = [&](py::handle v, const char* name) -> Array {
    if (dtype != DType::int64 && is_int64_array(v)) return convert(v.cast<const Array&>(), dtype);
    if (dtype == DType::int64) check_python_int(op, v);
    return to_array(v, backend, op, name, dtype);
  };
  Array c = is_array(cond) ? cond.cast<const Array&>()
                           : to_array(cond, backend, op, "condition", DType::float32);
  if (&c.backend() != &backend)
    throw ValueError(message(op, "expected condition on device '", backend.name(), "', got '",
                             c.backend().name(), "'"));
  Array xa = operand(x, "x"), ya = operand(y, "y");
  Array r;
  run_maybe_without_gil(std::max({c.size(), xa.size(), ya.size()}), [&] {
    r = where(c, xa, ya);
    backend.end_op();
  });
  return wrap_result(std::move(r), fm_result);
}

}  // namespace fm::python
