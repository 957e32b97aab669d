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
// An operand as the promotion tables see it (the rows and columns of the tables).
enum class Operand : std::uint8_t {
  float32,       // float32 data (Array, NumPy array or scalar); float64 data, computed as float32
  float16,       // float16 data
  int64,         // an int64 fastmetal.Array
  host_integer,  // NumPy integer or bool data: float32, except against an int64 Array
  python_int,    // a Python int or bool: weak, takes the other operand's dtype
  python_float,  // a Python float: weak
};
constexpr int kOperands = 6;

// The dtype an elementwise op computes in (its operands are converted to it). An op without
// an int64 kernel (metal/int64_math.metal, compare_*_int64) computes int64 in float32.
DType unary_dtype(const std::string& op, Operand x);
DType binary_dtype(const std::string& op, Operand x, Operand y);
// where(condition, x, y): the dtype of x and y (numpy.where's promotion, float32 at most).
DType where_dtype(Operand x, Operand y);
// The dtype an elementwise op computing in `compute` returns: int64 comparisons give
// float32 masks, everything else its computation dtype.
DType elementwise_result_dtype(const std::string& op, DType compute);

// Reductions: the dtype the input is computed in, and the result's (float16 in, float16
// out: computed in float32; int64 kept for sum, prod, max, min; argmax/argmin: int64).
// TypeError naming `arg` for an int64 input the reduction does not take.
struct ReduceDTypes {
  DType compute, result;
};
ReduceDTypes reduce_dtypes(const std::string& op, DType input, const char* arg);
// cumsum: in the input's dtype. matmul, linear and the other float32 ops: float32 (int64
// Arrays refused: to_array's int64_refused).
inline DType cumsum_dtype(DType input) { return input; }

// A result of `shape` and `dtype` that cannot exist (more than 2**63 - 1 bytes) is refused
// before any operand is converted (a broadcast operand may be huge when materialised).
void check_result_size(const std::string& op, const Shape& shape, DType dtype);

// int64 power refuses negative integer exponents, as NumPy (ValueError). `smallest` gives
// the smallest exponent the host can see (a Python int, a NumPy array), read only when
// needed; exponents in device memory are not inspected.
template <typename Smallest>
void check_exponents(const std::string& op, DType compute, Smallest&& smallest) {
  if (op != "power" || compute != DType::int64) return;
  if (const std::optional<std::int64_t> s = smallest(); s && *s < 0)
    throw ValueError(message(op, "expected non-negative exponents for an int64 base, got a ",
                             "negative one (Integers to negative integer powers are not allowed)"));
}

// The TypeError of an op that does not take int64 Arrays (argument `arg`).
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
