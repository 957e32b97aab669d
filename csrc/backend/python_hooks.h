// Binders that add to fastmetal._core without module.cpp naming them: a backend's private
// hooks (its tuning switches, introspection for tests and benchmarks), so that the bindings
// name no backend, and the binding of the ops declared with FM_PYTHON_OP
// (python/op_bindings.cpp). Each registers its binder once, at load time:
//
//   static const bool registered = fm::register_python_hooks(&bind_my_hooks);
#pragma once
#include <pybind11/pybind11.h>

#include <vector>

namespace fm {

using PythonHooks = void (*)(pybind11::module_&);

inline std::vector<PythonHooks>& python_hooks() {
  static std::vector<PythonHooks> hooks;
  return hooks;
}
inline bool register_python_hooks(PythonHooks hooks) {
  python_hooks().push_back(hooks);
  return true;
}
// Called once by the module's initialisation.
inline void bind_python_hooks(pybind11::module_& m) {
  for (PythonHooks h : python_hooks()) h(m);
}

}  // namespace fm
