// Each area of the library binds its own Python entry points; module.cpp calls these.
#pragma once
#include <pybind11/pybind11.h>

namespace fm::python {
void bind_numerics(pybind11::module_& m);  // numerics_bindings.cpp: gradient, derivative, fourier_series
void bind_conv2d(pybind11::module_& m);    // conv2d_bindings.cpp: conv2d forward / backward
void bind_reductions(pybind11::module_& m);  // reduce_bindings.cpp: reductions, matmul, linear
void bind_training(pybind11::module_& m);  // training_py.cpp: pooling, dropout, losses, optimizers
void bind_indexing(pybind11::module_& m);  // index_bindings.cpp: take, put, mask positions
void bind_attention(pybind11::module_& m);  // attention_bindings.cpp: fused attention
void bind_capture(pybind11::module_& m);  // capture_bindings.cpp: fastmetal.compile's recorder
}  // namespace fm::python
