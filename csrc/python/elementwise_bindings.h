#pragma once
#include <pybind11/pybind11.h>

#include <string>

namespace fm::python {
namespace py = pybind11;
// `op` is a name from metal/elementwise_ops.tbl; out is None, an ndarray or an Array.
py::object unary(const std::string& op, py::handle x, py::handle out);
py::object binary(const std::string& op, py::handle x, py::handle y, py::handle out);
py::object where_py(py::handle cond, py::handle x, py::handle y);
}  // namespace fm::python
