// Python entry points of conv2d (issue 4). Placeholder: bound names are added here as the
// ops are implemented.
#include "bindings.h"

namespace fm::python {
void bind_conv2d(pybind11::module_&) {}
}  // namespace fm::python
