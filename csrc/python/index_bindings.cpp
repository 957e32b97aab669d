// Python entry points of advanced indexing (private: python/fastmetal/_indexing.py parses
// the keys, checks the bounds and calls these): gather, scatter, mask positions; and of the
// integer-id ops (ops/embedding.py): embedding, its gradient, one_hot.
#include "ops/embedding.h"
#include "ops/indexing.h"
#include "python/bindings.h"
#include "ops/convert.h"
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

// Token ids: an int64 fastmetal.Array, or a NumPy integer array / ints (converted to int64).
Array ids_arg(py::handle obj, Backend& be, const char* op) {
  if (is_array(obj)) {
    const Array& a = obj.cast<const Array&>();
    if (!is_integer(a.dtype))
      throw TypeError(message(op, "expected input (the ids) to be an integer Array or integers, "
                                  "got a ", dtype_name(a.dtype),
                              " Array (fastmetal.asarray(ids, dtype='int64') makes one)"));
    return a.dtype == DType::int64 ? a : convert(a, DType::int64);
  }
  py::array arr;
  try {
    arr = py::module_::import("numpy").attr("asarray")(obj);
  } catch (py::error_already_set& e) {
    throw TypeError(not_an_array_message(obj, e, op, "input"));
  }
  const char kind = arr.dtype().kind();
  if (kind != 'i' && kind != 'u')
    throw TypeError(message(op, "expected input (the ids) to be integers, got dtype ",
                            std::string(py::str(arr.dtype()))));
  return to_array(arr, be, op, "input", DType::int64);
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
  m.def("_embedding", [](py::handle input, py::handle weight) {
    const char* op = "embedding";
    Backend& be = pick_backend(op, {{"input", input}, {"weight", weight}});
    const Array ids = ids_arg(input, be, op);
    const Array w = to_array(weight, be, op, "weight");
    Array r;
    {
      py::gil_scoped_release nogil;
      r = embedding(ids, w);
      be.end_op();
    }
    return wrap_result(std::move(r), any_array({input, weight}));
  }, py::arg("input"), py::arg("weight"), "Private: weight[input] (see ops/embedding.py).");
  m.def("_embedding_backward", [](py::handle grad_output, py::handle input,
                                  std::int64_t num_embeddings, std::int64_t padding_idx) {
    const char* op = "embedding_backward";
    Backend& be = pick_backend(op, {{"grad_output", grad_output}, {"input", input}});
    const Array ids = ids_arg(input, be, op);
    const Array g = to_contiguous_array(grad_output, be, op, "grad_output", DType::float32);
    Array r;
    {
      py::gil_scoped_release nogil;
      r = embedding_backward(g, ids, num_embeddings, padding_idx);
      be.end_op();
    }
    return wrap_result(std::move(r), any_array({grad_output, input}));
  }, py::arg("grad_output"), py::arg("input"), py::arg("num_embeddings"),
     py::arg("padding_idx") = -1,
     "Private: the weight gradient of embedding, a deterministic scatter-add (padding_idx -1: "
     "none).");
  m.def("_one_hot", [](py::handle input, std::int64_t num_classes) {
    const char* op = "one_hot";
    Backend& be = pick_backend(op, {{"input", input}});
    const Array ids = ids_arg(input, be, op);
    Array r;
    {
      py::gil_scoped_release nogil;
      r = one_hot(ids, num_classes);
      be.end_op();
    }
    return wrap_result(std::move(r), any_array({input}));
  }, py::arg("input"), py::arg("num_classes") = -1, "Private: see ops/embedding.py.");
}

}  // namespace fm::python
