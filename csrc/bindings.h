// Each area of the library binds its own Python entry points; module.cpp calls these.
#pragma once
#include <pybind11/pybind11.h>

namespace fm::python {
void bind_numerics(pybind11::module_& m);  // numerics_py.cpp: gradient, derivative, fourier_series
void bind_conv2d(pybind11::module_& m);    // conv2d_py.cpp: conv2d forward / backward
void bind_conv2d_cpu(pybind11::module_& m);
void bind_reductions(pybind11::module_& m);  // python/reduce_bindings.cpp: reductions, matmul, linear  // conv2d_cpu_py.cpp: private hooks to test/time the CPU algorithms
}  // namespace fm::python
