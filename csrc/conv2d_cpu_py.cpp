// Private hooks (names start with _) to test and time the CPU conv2d algorithms alone.
// Placeholder until they are written.
#include "bindings.h"

namespace fm::python {
void bind_conv2d_cpu(pybind11::module_&) {}
}  // namespace fm::python
