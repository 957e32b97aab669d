// What an op's arguments mean, decided here once for every op: the dtype it computes in
// (the tables of arguments.cpp), how Python scalars take part (weakly typed, NEP 50), and
// out= (its shape and dtype, overlap with the inputs, a NumPy array, the copy back). The
// Python boundary (csrc/python) only describes its arguments in these terms and converts
// them to the dtypes chosen here.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "core/array.h"
#include "core/errors.h"

namespace fm {

// ----------------------------------------------------------------------------- dtypes
// An operand as promotion sees it: an Array's or NumPy array's dtype (strong: the first
// seven, in DType's order), or a Python scalar (weak, NEP 50: it takes the other operand's
// dtype where that dtype can hold its kind). NumPy scalars are strong, but np.float64,
// which is a Python float, is weak as one (as PyTorch treats it).
enum class Operand : std::uint8_t {
  float32, float16, int64, bool_, uint8, int32, float64,  // DType's order
  python_bool, python_int, python_float,
};
inline Operand operand(DType t) { return Operand(int(t)); }

// The Array API standard's promotion of two dtypes; across kinds (which the standard leaves
// to the library), as PyTorch: bool joins any, an integer joins a float as that float.
DType promote(DType x, DType y);
// The dtype two operands promote to (weak scalars as above; two Python scalars: bool,
// int64 or float32).
DType promote(Operand x, Operand y);

// The dtype an elementwise op computes in (its operands are converted to it): the promoted
// dtype where the op has a kernel for it; integers and bool in float32 for the ops that
// only compute in float (sin, divide, ...). TypeError for bool where NumPy refuses it
// (subtract, negative) and for bitwise ops of floats.
DType unary_dtype(const std::string& op, Operand x);
DType binary_dtype(const std::string& op, Operand x, Operand y);
// where(condition, x, y): the dtype of x and y (promoted as above).
DType where_dtype(Operand x, Operand y);
// The dtype an elementwise op computing in `compute` returns: comparisons give bool,
// everything else its computation dtype.
DType elementwise_result_dtype(const std::string& op, DType compute);
// A dtype the backend has: float64 is float32 where the device has no double (metal).
DType on_device(DType t, bool has_float64);

// Reductions: the dtype the input is computed in, and the result's (float16 in, float16
// out: computed in float32; integers and bool sum, prod and cumsum in int64, keep their
// dtype in max and min, and give float32 means; argmax/argmin: int64).
// TypeError naming `arg` for an input the reduction does not take.
struct ReduceDTypes {
  DType compute, result;
};
ReduceDTypes reduce_dtypes(const std::string& op, DType input, const char* arg);
// cumsum: int64 for integers and bool (as NumPy), else the input's dtype.
inline DType cumsum_dtype(DType input) { return is_float(input) ? input : DType::int64; }

// A result of `shape` and `dtype` that cannot exist (more than 2**63 - 1 bytes) is refused
// before any operand is converted (a broadcast operand may be huge when materialised).
void check_result_size(const std::string& op, const Shape& shape, DType dtype);

// int64 power refuses negative integer exponents, as NumPy (ValueError). `smallest` gives
// the smallest exponent the host can see (a Python int, a NumPy array), read only when
// needed; exponents in device memory are not inspected.
template <typename Smallest>
void check_exponents(const std::string& op, DType compute, Smallest&& smallest) {
  if (op != "power" || !is_integer(compute)) return;
  if (const std::optional<std::int64_t> s = smallest(); s && *s < 0)
    throw ValueError(message(op, "expected non-negative exponents for an ", dtype_name(compute),
                             " base, got a ",
                             "negative one (Integers to negative integer powers are not allowed)"));
}

// The TypeError of an op that computes in float only, given an integer or bool Array
// (argument `arg`).
TypeError int64_refused(const std::string& op, const char* arg, DType got);

// ----------------------------------------------------------------------------- out=
// A dtype out= may have: fastmetal's own, or any NumPy dtype (written through the host).
struct OutDType {
  char kind = 'f';           // NumPy's dtype.kind: 'f', 'i', 'u', 'b', 'c', ...
  std::size_t itemsize = 4;
  std::string other;         // the name of a kind not in "fiubc" ("object", ...), for messages
  std::string name() const;  // "float64", "int32", "bool", ...
};

// out= as the Python boundary found it (no decisions taken).
struct OutArg {
  enum class Kind : std::uint8_t { none, array, host };
  Kind kind = Kind::none;
  // array: the fastmetal.Array. host (a NumPy array): where `in_place`, its memory as an
  // Array on the op's device (writes into it land in out); else unset.
  Array array;
  bool in_place = false;
  Shape shape;  // host only: an Array's is its own
  OutDType dtype;  // host only: an Array's is its own
  bool writeable = true;
  std::string strides;  // host: its byte strides as Python prints them (for messages)
  bool broadcast = false;  // host: a zero-stride dimension of length > 1
};

// How an op may share memory between out= and its inputs.
enum class Aliasing : std::uint8_t {
  // Each output element is computed from the input elements at its own index (elementwise
  // ops): out may BE an input (same view); any other overlap goes through a temporary.
  same_view_ok,
  // Any overlap with an input goes through a temporary (matmul: outputs read whole rows).
  none,
};

// Where an op writes its result: out= itself, or a temporary copied into out= afterwards.
// Constructed with the GIL held (before the op's launches); finish() after them, without
// Python; then, where host_copy(), the Python boundary copies target() into the NumPy
// out= through the host (out= of a dtype or layout the device cannot write).
class Output {
 public:
  // Validates out= against the result (ValueError naming out: read-only, broadcast,
  // shape, a dtype the result does not cast to under NumPy's same_kind rule) and picks the
  // target: out= where it is an Array (or NumPy memory the device writes in place) of the
  // result's dtype (and contiguous, where the op needs it) not overlapping an input as
  // `aliasing` forbids; else a new Array.
  Output(const std::string& op, OutArg& out, Backend& backend, const Shape& shape, DType dtype,
         std::initializer_list<const Array*> inputs = {},
         Aliasing aliasing = Aliasing::same_view_ok, bool contiguous = false);
  // The result the op computed itself (a reduction's, a composite's): validated as above,
  // then copied into out= by finish().
  Output(const std::string& op, OutArg& out, const Array& result);

  const Array& target() const { return target_; }
  Array take() { return std::move(target_); }  // the result, where there is no out=
  bool has_out() const { return out_->kind != OutArg::Kind::none; }
  // Copies the temporary into out= on the device (converting its dtype), or memory that a
  // NumPy out= lent the device as a copy back into it. Enqueues; call end_op() after.
  void finish();
  bool host_copy() const { return host_copy_; }

 private:
  void validate(const std::string& op, const Shape& shape, DType dtype);
  OutArg* out_;
  Array target_;
  bool via_temp_ = false;
  bool host_copy_ = false;
};

}  // namespace fm
