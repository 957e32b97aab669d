// A kernel-level op's private Python entry point, declared once beside its definition by its
// Python signature and docstring:
//
//   Array log_softmax(const Array& x, std::int64_t axis) { ... }
//   FM_PYTHON_OP(log_softmax, "_log_softmax(x: Array, axis: int)", "Private: ...");
//
// python/op_bindings.cpp binds every declared op as fastmetal._core.<name> (arguments by
// position or keyword, the op's device, the GIL released around the call, NumPy in -> NumPy
// out, a fastmetal.Array in -> Array out). Every name is private (a leading underscore:
// tools/gen/gen_stubs.py stops the build otherwise): the public function is the Python
// declaration in python/fastmetal/ops/<family>.py that wraps it with its gradient
// (fastmetal.autograd.declare.op), the one road to a public op.
//
// Parameter types (Python: C++): Array: const Array& (any array-like, converted to a
// contiguous float32 Array on the op's device: that of its fastmetal.Array arguments,
// else the default device); float: double; int: std::int64_t; bool: bool. The C++
// signature must match the declared one (checked when the module loads). Returns: an Array,
// or a std::vector<Array> (a tuple in Python). FM_PYTHON_OP_FLOAT64 declares an op whose
// Arrays keep float64 where the op's device has double (float64 in, computed in double); it
// checks the dtypes it is given. The op validates its arguments (ValueError /
// TypeError worded "[fastmetal.<name>] expected ..., got ...") and enqueues its work; the
// binding waits for it.
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/array.h"

namespace fm {

using OpValue = std::variant<Array, double, std::int64_t, bool>;
enum class OpType { array, number, integer, boolean };

struct PythonOp {
  const char* signature;      // "name(param: Type, ...)", as declared
  const char* doc;
  std::vector<OpType> types;  // of the C++ parameters
  bool returns_tuple = false;
  bool keeps_float64 = false;  // FM_PYTHON_OP_FLOAT64: float64 Arrays stay float64
  std::vector<Array> (*call)(std::vector<OpValue>& args) = nullptr;
};

// Every declared op, filled while the module loads.
inline std::vector<PythonOp>& python_ops() {
  static std::vector<PythonOp> ops;
  return ops;
}

namespace python_op_detail {

template <typename T>
struct op_type;
template <>
struct op_type<Array> : std::integral_constant<OpType, OpType::array> {};
template <>
struct op_type<double> : std::integral_constant<OpType, OpType::number> {};
template <>
struct op_type<std::int64_t> : std::integral_constant<OpType, OpType::integer> {};
template <>
struct op_type<bool> : std::integral_constant<OpType, OpType::boolean> {};

inline std::vector<Array> results(Array a) { return {std::move(a)}; }
inline std::vector<Array> results(std::vector<Array> v) { return v; }

template <auto Fn, typename... P, std::size_t... I>
std::vector<Array> call(std::vector<OpValue>& v, std::index_sequence<I...>) {
  return results(Fn(std::get<std::decay_t<P>>(v[I])...));
}

template <auto Fn, typename R, typename... P>
PythonOp make(R (*)(P...), const char* signature, const char* doc) {
  static_assert(std::is_same_v<R, Array> || std::is_same_v<R, std::vector<Array>>,
                "an FM_PYTHON_OP returns an Array or a std::vector<Array>");
  PythonOp op;
  op.signature = signature;
  op.doc = doc;
  op.types = {op_type<std::decay_t<P>>::value...};
  op.returns_tuple = std::is_same_v<R, std::vector<Array>>;
  op.call = [](std::vector<OpValue>& v) {
    return call<Fn, P...>(v, std::index_sequence_for<P...>{});
  };
  return op;
}

}  // namespace python_op_detail

// Returns true, so that a declaration can initialise a static bool.
template <auto Fn>
bool register_python_op(const char* signature, const char* doc, bool keeps_float64 = false) {
  python_ops().push_back(python_op_detail::make<Fn>(Fn, signature, doc));
  python_ops().back().keeps_float64 = keeps_float64;
  return true;
}

}  // namespace fm

#define FM_PYTHON_OP(fn, signature, doc) \
  static const bool fm_python_op_##fn = ::fm::register_python_op<&fn>(signature, doc)
#define FM_PYTHON_OP_FLOAT64(fn, signature, doc) \
  static const bool fm_python_op_##fn = ::fm::register_python_op<&fn>(signature, doc, true)
