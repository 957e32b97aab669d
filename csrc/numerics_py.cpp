// Python entry points of the numerical-differentiation ops (issue 3). Placeholder: bound
// names are added here as the ops are implemented.
#include "bindings.h"

namespace fm::python {
void bind_numerics(pybind11::module_&) {}
}  // namespace fm::python
