// Binds every op declared with FM_PYTHON_OP (ops/python_op.h) as fastmetal._core.<name>: one
// binding for all of them, from the declared signature. fastmetal._core._python_ops() lists
// them for python/fastmetal/_ops.py.
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "backend/python_hooks.h"
#include "core/errors.h"
#include "ops/python_op.h"
#include "python/pyarray.h"

namespace fm::python {
namespace {

// A declaration, parsed: "name(a: Array, b: float)".
struct Signature {
  std::string name;
  std::vector<std::string> params;
};

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

const char* type_name(OpType t) {
  switch (t) {
    case OpType::array: return "Array";
    case OpType::number: return "float";
    case OpType::integer: return "int";
    case OpType::boolean: return "bool";
  }
  return "?";
}

// Parses the declaration and checks it against the C++ parameter types: a mismatch is a
// programming error, reported when the module loads (every test then fails at import).
Signature parse(const PythonOp& op) {
  const std::string s = op.signature;
  const auto open = s.find('('), close = s.rfind(')');
  auto bad = [&](const std::string& why) {
    return std::logic_error("[fastmetal] internal: FM_PYTHON_OP \"" + s + "\": " + why);
  };
  if (open == std::string::npos || close == std::string::npos || close < open)
    throw bad("expected name(param: Type, ...)");
  Signature sig{trimmed(s.substr(0, open)), {}};
  std::vector<std::string> declared;
  std::string inner = s.substr(open + 1, close - open - 1);
  for (std::size_t start = 0; !trimmed(inner).empty() && start <= inner.size();) {
    const auto comma = std::min(inner.find(',', start), inner.size());
    const std::string part = inner.substr(start, comma - start);
    const auto colon = part.find(':');
    if (colon == std::string::npos) throw bad("expected 'param: Type' for every parameter");
    sig.params.push_back(trimmed(part.substr(0, colon)));
    declared.push_back(trimmed(part.substr(colon + 1)));
    start = comma + 1;
  }
  if (declared.size() != op.types.size()) throw bad("the C++ function has another arity");
  for (std::size_t i = 0; i < declared.size(); ++i)
    if (declared[i] != type_name(op.types[i]))
      throw bad("parameter '" + sig.params[i] + "' is " + type_name(op.types[i]) + " in C++");
  return sig;
}

std::string repr_of(py::handle o) { return py::repr(o); }

OpValue scalar_value(OpType type, py::handle v, const std::string& op, const std::string& name) {
  static auto* np_bool = new py::object(py::module_::import("numpy").attr("bool_"));
  const bool is_bool = PyBool_Check(v.ptr()) || py::isinstance(v, *np_bool);
  if (type == OpType::boolean) {
    if (!is_bool)
      throw TypeError(message(op, "expected ", name, " to be True or False, got ", repr_of(v)));
    return OpValue(bool(PyObject_IsTrue(v.ptr())));
  }
  if (type == OpType::integer) {
    if (auto i = int_arg(v)) return OpValue(*i);
    throw TypeError(message(op, "expected ", name, " to be an int, got ", repr_of(v)));
  }
  const double x = is_bool || PyComplex_Check(v.ptr()) ? -1.0 : PyFloat_AsDouble(v.ptr());
  if (is_bool || PyComplex_Check(v.ptr()) || (x == -1.0 && PyErr_Occurred())) {
    PyErr_Clear();
    throw TypeError(message(op, "expected ", name, " to be a real number, got ", repr_of(v)));
  }
  return OpValue(x);
}

py::object call(const PythonOp& op, const Signature& sig, py::args args, py::kwargs kwargs) {
  // Errors name the public op (a private "_op" is called by the Python function "op").
  const std::string name = sig.name.substr(sig.name.rfind('_', 0) == 0 ? 1 : 0);
  const std::size_t n = sig.params.size();
  if (args.size() > n)
    throw TypeError(message(name, "expected at most ", n, " arguments, got ", args.size()));
  std::vector<py::handle> given(n);
  for (std::size_t i = 0; i < args.size(); ++i) given[i] = args[i];
  for (auto item : kwargs) {
    const std::string key = py::str(item.first);
    std::size_t i = 0;
    while (i < n && sig.params[i] != key) ++i;
    if (i == n) throw TypeError(message(name, "expected no argument '", key, "', got one"));
    if (given[i]) throw TypeError(message(name, "expected one value for '", key, "', got two"));
    given[i] = item.second;
  }
  std::vector<std::pair<const char*, py::handle>> arrays;
  std::vector<py::handle> array_objects;
  for (std::size_t i = 0; i < n; ++i) {
    if (!given[i]) throw TypeError(message(name, "expected an argument '", sig.params[i], "', got none"));
    if (op.types[i] == OpType::array) {
      arrays.emplace_back(sig.params[i].c_str(), given[i]);
      array_objects.push_back(given[i]);
    }
  }
  Backend& be = pick_backend(name, arrays);
  std::vector<OpValue> values;
  values.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const char* param = sig.params[i].c_str();
    if (op.types[i] != OpType::array) {
      values.push_back(scalar_value(op.types[i], given[i], name, sig.params[i]));
      continue;
    }
    const bool f64 = op.keeps_float64 && be.has_float64() &&
                     native_dtype_of(given[i], name, param) == DType::float64;
    values.push_back(OpValue(to_contiguous_array(given[i], be, name, param,
                                                 f64 ? DType::float64 : DType::float32)));
  }
  std::vector<Array> out;
  {
    py::gil_scoped_release nogil;
    out = op.call(values);
    be.end_op();  // waits only where the caller's own memory was used
  }
  const bool fm_result = any_array(array_objects);
  if (!op.returns_tuple) return wrap_result(std::move(out.at(0)), fm_result);
  py::tuple t(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) t[i] = wrap_result(std::move(out[i]), fm_result);
  return std::move(t);
}

void bind_declared_ops(py::module_& m) {
  std::vector<std::tuple<std::string, std::string, std::string>> listed;
  for (const PythonOp& op : python_ops()) {
    const Signature sig = parse(op);
    const std::string doc = std::string(op.signature) + "\n\n" + op.doc;
    m.def(sig.name.c_str(),
          [op, sig](py::args args, py::kwargs kwargs) { return call(op, sig, args, kwargs); },
          doc.c_str());
    listed.emplace_back(sig.name, op.signature, op.doc);
  }
  m.def("_python_ops", [listed] { return listed; },
        "(name, signature, doc) of every op declared with FM_PYTHON_OP.");
}

const bool registered = register_python_hooks(&bind_declared_ops);

}  // namespace
}  // namespace fm::python
