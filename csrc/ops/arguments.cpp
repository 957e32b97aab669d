#include "ops/arguments.h"

#include <array>

#include "backend/backend.h"
#include "backend/capture.h"
#include "ops/convert.h"

namespace fm {
namespace {

constexpr DType f32 = DType::float32, f16 = DType::float16, i64 = DType::int64;

// The promotion tables: row x, column y, in the order of enum Operand. Adding a dtype adds
// an Operand, a row and a column. Python scalars are weak (NEP 50): they take the other
// operand's dtype; NumPy integer data is float32 (the API's rule for host data), except
// against an int64 Array, where it is exact as NumPy's int64. fastmetal has no float64:
// where NumPy gives float64, float32.
using Table = std::array<std::array<DType, kOperands>, kOperands>;

// Arithmetic and comparisons (binary ops of the op table).
//                     float32 float16 int64 host_int py_int py_float
constexpr Table kBinary = {{{f32, f32, f32, f32, f32, f32},    // float32
                            {f32, f16, f32, f32, f16, f16},    // float16
                            {f32, f32, i64, i64, i64, f32},    // int64
                            {f32, f32, i64, f32, f32, f32},    // host_integer
                            {f32, f16, i64, f32, f32, f32},    // python_int
                            {f32, f16, f32, f32, f32, f32}}};  // python_float

// where(condition, x, y): integers (int64 Arrays, NumPy integers, Python ints) together
// stay int64; otherwise the float operands decide, integers taking their dtype.
//                     float32 float16 int64 host_int py_int py_float
constexpr Table kWhere = {{{f32, f32, f32, f32, f32, f32},    // float32
                           {f32, f16, f16, f16, f16, f16},    // float16
                           {f32, f16, i64, i64, i64, f32},    // int64
                           {f32, f16, i64, i64, i64, f32},    // host_integer
                           {f32, f16, i64, i64, i64, f32},    // python_int
                           {f32, f16, f32, f32, f32, f32}}};  // python_float

// Unary ops: the operand's dtype; host and Python integers as float32.
//                                       float32 float16 int64 host_int py_int py_float
constexpr std::array<DType, kOperands> kUnary = {f32, f16, i64, f32, f32, f32};

// Whether an elementwise op has int64 kernels; the others compute int64 operands in
// float32 (converted on the device), as NumPy's run in float64.
bool has_int64_kernel(const std::string& op, int arity) {
  if (arity == 1) return op == "copy" || is_int64_unary(op);
  return is_comparison(op) || is_int64_arithmetic(op);
}

DType without_int64(const std::string& op, int arity, DType t) {
  return t == i64 && !has_int64_kernel(op, arity) ? f32 : t;
}

// Same-kind casting (NumPy's rule for out=): floats into floats, integers into integers
// or floats; never into bool, unsigned or complex.
bool casts_to(DType result, char out_kind) {
  return out_kind == 'f' || (result == i64 && out_kind == 'i');
}

}  // namespace

DType unary_dtype(const std::string& op, Operand x) {
  return without_int64(op, 1, kUnary[int(x)]);
}

DType binary_dtype(const std::string& op, Operand x, Operand y) {
  return without_int64(op, 2, kBinary[int(x)][int(y)]);
}

DType where_dtype(Operand x, Operand y) { return kWhere[int(x)][int(y)]; }

DType elementwise_result_dtype(const std::string& op, DType compute) {
  return compute == i64 && is_comparison(op) ? f32 : compute;
}

ReduceDTypes reduce_dtypes(const std::string& op, DType input, const char* arg) {
  if (op == "argmax" || op == "argmin") {
    if (input == i64) throw int64_refused(op, arg, input);
    return {f32, i64};
  }
  if (input == i64) {
    if (op == "mean") return {i64, f32};
    if (op == "sum" || op == "prod" || op == "max" || op == "min") return {i64, i64};
    throw int64_refused(op, arg, input);
  }
  return {f32, input};  // float16: computed in float32, returned as float16
}

void check_result_size(const std::string& op, const Shape& shape, DType dtype) {
  if (!fits_in_memory(shape, itemsize(dtype)))
    throw ValueError(message(op, "expected an array of at most 2**63 - 1 bytes, got shape ",
                             shape_str(shape)));
}

TypeError int64_refused(const std::string& op, const char* arg, DType got) {
  return TypeError(message(op, "expected a float32 or float16 array for ", arg, ", got an ",
                           dtype_name(got), " fastmetal.Array (int64 Arrays support copies, "
                           "views, astype, comparisons, arithmetic, sum, prod, max, min, mean "
                           "and cumsum; convert with .astype('float32'))"));
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
  const char kind = fm_out ? (o.array.dtype == i64 ? 'i' : 'f') : o.dtype.kind;
  if (!casts_to(dtype, kind))
    throw ValueError(message(op, "expected out with ",
                             dtype == i64 ? "an integer or floating" : "a floating", " dtype, got ",
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
