#include "ops/arguments.h"

#include <array>

#include "backend/backend.h"
#include "backend/capture.h"
#include "ops/convert.h"

namespace fm {
namespace {

constexpr DType f32 = DType::float32, f64 = DType::float64,
                i64 = DType::int64, b8 = DType::bool_;

// Kinds in the order promotion joins them: bool < unsigned < signed < float.
int kind_rank(DType t) {
  switch (dtype_kind(t)) {
    case 'b': return 0;
    case 'u': return 1;
    case 'i': return 2;
    default: return 3;
  }
}

// The weak scalars: the dtype a Python scalar of this kind takes alone.
DType scalar_default(Operand s) {
  return s == Operand::python_bool ? b8 : s == Operand::python_int ? i64 : f32;
}
bool is_weak(Operand x) { return int(x) >= kDTypes; }

// Ops that compute in the float kernels only (the op table); integers and bool take float32.
bool float_only(const std::string& op, int arity) {
  if (op == "copy" || is_comparison(op)) return false;
  return arity == 1 ? !is_int_unary(op) : !is_int_binary(op);
}

// A bool operand in arithmetic: + and maximum are "or", * and minimum "and" (NumPy's bool
// ufuncs, as the bitwise kernels compute them); - and unary minus are refused as NumPy does.
bool bool_has(const std::string& op) {
  return op == "add" || op == "multiply" || op == "maximum" || op == "minimum" ||
         op == "bitwise_and" || op == "bitwise_or" || op == "bitwise_xor" ||
         op == "bitwise_invert" || op == "copy";
}

DType compute_dtype(const std::string& op, int arity, DType t) {
  if (is_comparison(op) || op == "copy") return t;
  if (is_bitwise(op) || op == "bitwise_invert") {
    if (is_float(t))
      throw TypeError(message(op, "expected integer or bool operands, got ", dtype_name(t),
                              " (bitwise ops are defined for integers and bool only)"));
    if (t == b8 && (op == "left_shift" || op == "right_shift")) return i64;
    return t;
  }
  if (t == b8) {
    if (op == "subtract" || op == "negative")
      throw TypeError(message(op, "expected numbers, got bool operands (", op,
                              " of bools is not supported; use logical_xor or logical_not, or "
                              ".astype() to a number first)"));
    if (bool_has(op)) return b8;
  }
  // Rounding an integer changes nothing: it keeps its dtype (the Array API's rule).
  if (is_integer(t) && is_rounding(op)) return t;
  if (!is_float(t) && float_only(op, arity)) return f32;
  if (t == b8) return i64;  // floor_divide, remainder, power, abs, square of bools
  return t;
}

// Same-kind casting (NumPy's rule for out=): into the same or a higher kind (bool <
// unsigned < signed < float); never into complex.
bool casts_to(DType result, char out_kind) {
  const std::string order = "buif";
  const auto to = order.find(out_kind);
  return to != std::string::npos && int(to) >= kind_rank(result);
}

}  // namespace

DType promote(DType x, DType y) {
  if (x == y) return x;
  const int kx = kind_rank(x), ky = kind_rank(y);
  if (kx != ky) {
    // Across kinds the higher kind wins; uint8 with a signed integer: the signed one (int32
    // and int64 both hold every uint8).
    return kx > ky ? x : y;
  }
  if (kx == 3) return (x == f64 || y == f64) ? f64 : f32;  // float16 with float32: float32
  return i64 == x || i64 == y ? i64 : DType::int32;        // int32 with int64: int64
}

DType promote(Operand x, Operand y) {
  const bool wx = is_weak(x), wy = is_weak(y);
  if (wx && wy) return promote(scalar_default(x), scalar_default(y));
  if (wx || wy) {
    const DType strong = DType(int(wx ? y : x));
    const Operand weak = wx ? x : y;
    // The array's dtype, unless the scalar's kind is higher: an int with bool gives int64,
    // a float with an integer or bool gives float32.
    if (weak == Operand::python_float && !is_float(strong)) return f32;
    if (weak == Operand::python_int && strong == b8) return i64;
    return strong;
  }
  return promote(DType(int(x)), DType(int(y)));
}

DType unary_dtype(const std::string& op, Operand x) {
  return compute_dtype(op, 1, is_weak(x) ? scalar_default(x) : DType(int(x)));
}

DType binary_dtype(const std::string& op, Operand x, Operand y) {
  return compute_dtype(op, 2, promote(x, y));
}

DType where_dtype(Operand x, Operand y) { return promote(x, y); }

DType elementwise_result_dtype(const std::string& op, DType compute) {
  return is_comparison(op) ? b8 : compute;
}

DType on_device(DType t, bool has_float64) { return t == f64 && !has_float64 ? f32 : t; }

ReduceDTypes reduce_dtypes(const std::string& op, DType input, const char* arg) {
  if (input == f64) return {f64, op == "argmax" || op == "argmin" ? i64 : f64};
  // integers and bool in double (exact below 2**53; on_device makes it float32 on metal)
  if (op == "argmax" || op == "argmin") return {is_float(input) ? f32 : f64, i64};
  if (!is_float(input)) {
    if (op == "sum" || op == "prod") return {i64, i64};
    if (op == "max" || op == "min") return {i64, input};
    if (op == "mean") return {i64, f32};  // summed exactly, divided into float32
    return {f32, f32};  // var, std: computed in float32, as PyTorch's default float
  }
  return {f32, input};  // float16: computed in float32, returned as float16
}

void check_result_size(const std::string& op, const Shape& shape, DType dtype) {
  if (!fits_in_memory(shape, itemsize(dtype)))
    throw ValueError(message(op, "expected an array of at most 2**63 - 1 bytes, got shape ",
                             shape_str(shape)));
}

TypeError int64_refused(const std::string& op, const char* arg, DType got) {
  return TypeError(message(op, "expected a floating-point array for ", arg, ", got a ",
                           dtype_name(got), " fastmetal.Array (", op, " computes in float32 or "
                           "float16; convert with .astype('float32'))"));
}

// ----------------------------------------------------------------------------- out=
std::string OutDType::name() const {
  const std::string bits = std::to_string(8 * itemsize);
  switch (kind) {
    case 'f': return "float" + bits;
    case 'i': return "int" + bits;
    case 'u': return "uint" + bits;
    case 'c': return "complex" + bits;
    case 'b': return "bool";
    default: return other;
  }
}

void Output::validate(const std::string& op, const Shape& shape, DType dtype) {
  OutArg& o = *out_;
  if (o.kind == OutArg::Kind::array) {
    prepare_write(o.array, op, "out");  // read-only, broadcast; counts the write
  } else {
    if (!o.writeable)
      throw ValueError(message(op, "expected a writeable out array, got a read-only one"));
    if (o.broadcast)
      throw ValueError(message(op, "expected out without broadcast (zero-stride) dimensions, "
                                   "got a view with strides ", o.strides));
    if (o.in_place) prepare_write(o.array, op, "out");
  }
  const bool fm_out = o.kind == OutArg::Kind::array;
  const Shape& got = fm_out ? o.array.shape : o.shape;
  if (got != shape)
    throw ValueError(message(op, "expected out of shape ", shape_str(shape), ", got shape ",
                             shape_str(got)));
  const char kind = fm_out ? dtype_kind(o.array.dtype) : o.dtype.kind;
  if (!casts_to(dtype, kind))
    throw ValueError(message(op, "expected out with ",
                             dtype_kind(dtype) == 'f'   ? "a floating"
                             : dtype_kind(dtype) == 'b' ? "a bool or numeric"
                                                        : "an integer or floating",
                             " dtype, got ",
                             fm_out ? std::string(dtype_name(o.array.dtype)) : o.dtype.name(),
                             " (the result is ", dtype_name(dtype), ")"));
}

Output::Output(const std::string& op, OutArg& out, Backend& backend, const Shape& shape,
               DType dtype, std::initializer_list<const Array*> inputs, Aliasing aliasing,
               bool contiguous)
    : out_(&out) {
  if (out.kind == OutArg::Kind::none) {
    target_ = Array::empty(backend, shape, dtype, op.c_str());
    return;
  }
  validate(op, shape, dtype);
  const bool writable_here = out.kind == OutArg::Kind::array || out.in_place;
  if (writable_here && out.array.dtype == dtype && (!contiguous || out.array.contiguous())) {
    bool clash = false;
    for (const Array* in : inputs) {
      if (!may_overlap(*in, out.array)) continue;
      if (aliasing == Aliasing::none) {
        clash = true;
        break;
      }
      Array view = *in;  // the input as the op reads it: broadcast to the result's shape
      view.shape = shape;
      view.strides = broadcast_strides(in->shape, in->strides, shape);
      if (!same_view(view, out.array)) {
        clash = true;
        break;
      }
    }
    if (!clash) {
      target_ = out.array;
      return;
    }
  }
  via_temp_ = true;
  target_ = Array::empty(backend, shape, dtype, op.c_str());
}

Output::Output(const std::string& op, OutArg& out, const Array& result)
    : out_(&out), target_(result) {
  if (out.kind == OutArg::Kind::none) return;
  validate(op, result.shape, result.dtype);
  via_temp_ = true;
  // Results are new arrays; one that views out= itself is there already, one that overlaps
  // it otherwise is copied before out= is written.
  if ((out.kind == OutArg::Kind::array || out.in_place) && may_overlap(result, out.array)) {
    if (same_view(result, out.array)) via_temp_ = false;
    else target_ = convert(result, result.dtype);
  }
}

void Output::finish() {
  OutArg& o = *out_;
  if (o.kind == OutArg::Kind::none) return;
  const bool writable_here = o.kind == OutArg::Kind::array || o.in_place;
  if (via_temp_) {
    if (!writable_here) {
      host_copy_ = true;  // the Python boundary writes the NumPy out= from target()
      return;
    }
    launch_convert(target_, o.array);  // target_ does not overlap out=
  }
  // A NumPy out= the device could not share was lent to it as a copy: copy it back.
  if (o.kind == OutArg::Kind::host && o.in_place) {
    const Storage& st = *o.array.storage;
    if (st.copied_from != nullptr) {
      capture::on_host_read("a NumPy out= on a device that cannot share host memory");
      st.backend->copy_to_host(st, 0, st.copied_from, st.nbytes);
    }
  }
}

}  // namespace fm
