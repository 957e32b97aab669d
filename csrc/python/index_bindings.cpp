// Python entry points of advanced indexing (private: python/fastmetal/_indexing.py parses
// the keys, checks the bounds and calls these): gather, scatter, mask positions.
#include "ops/indexing.h"
#include "python/bindings.h"
#include "python/pyarray.h"

namespace fm::python {
namespace {

const Array& array_arg(py::handle obj, const char* op, const char* arg) {
  if (!is_array(obj))
    throw TypeError(message(op, "expected a fastmetal.Array for ", arg, ", got ",
                            std::string(py::repr(py::type::of(obj)))));
  return obj.cast<const Array&>();
}

int axis_arg(const Array& x, int axis, const char* op) {
  if (axis < 0 || axis >= int(x.ndim()))
    throw ValueError(message(op, "expected an axis in [0, ", x.ndim(), "), got ", axis));
  return axis;
}

}  // namespace

void bind_indexing(py::module_& m) {
  m.def("_take", [](py::handle x, int axis, py::handle idx) {
    const Array& xa = array_arg(x, "take", "x");
    Array ia = to_array(idx, xa.backend(), "take", "index", DType::int64);
    Array r;
    {
      py::gil_scoped_release nogil;
      r = take(xa, axis_arg(xa, axis, "take"), ia);
      xa.backend().end_op();
    }
    return r;
  }, py::arg("x"), py::arg("axis"), py::arg("index"));
  m.def("_put", [](py::handle x, int axis, py::handle idx, py::handle value) {
    const Array& xa = array_arg(x, "put", "x");
    prepare_write(xa, "put", "x");
    Array ia = to_array(idx, xa.backend(), "put", "index", DType::int64);
    const Array& va = array_arg(value, "put", "value");
    py::gil_scoped_release nogil;
    put(xa, axis_arg(xa, axis, "put"), ia, va);
    xa.backend().end_op();
  }, py::arg("x"), py::arg("axis"), py::arg("index"), py::arg("value"));
  m.def("_mask_positions", [](py::handle mask, std::int64_t count) {
    const Array& ma = array_arg(mask, "mask_positions", "mask");
    Array r;
    {
      py::gil_scoped_release nogil;
      r = mask_positions(ma, count);
      ma.backend().end_op();
    }
    return r;
  }, py::arg("mask"), py::arg("count"));
}

}  // namespace fm::python
