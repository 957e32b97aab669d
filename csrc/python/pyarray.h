// The Python boundary shared by every op: turning Python objects into fm::Arrays on the
// right device (zero-copy where memory allows), and results back into NumPy arrays that
// view device memory or into fastmetal.Array objects.
//
// Rules (API.md): an Array keeps the dtype it is given where fastmetal has it (bool, uint8,
// int32, int64, float16, float32, float64; float64 only on devices with double); other real
// NumPy dtypes widen as NumPy promotes them; complex, object, string, structured -> TypeError. If any array
// argument is a fastmetal.Array the result is an Array on its device, else a NumPy array.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/array.h"
#include "core/errors.h"
#include "backend/backend.h"
#include "ops/arguments.h"

// Shapes and strides (fm::SmallVector) cross into Python as lists, as std::vector did.
namespace pybind11::detail {
template <typename T, std::size_t N>
struct type_caster<fm::SmallVector<T, N>> : list_caster<fm::SmallVector<T, N>, T> {};
}  // namespace pybind11::detail

namespace fm::python {
namespace py = pybind11;

// Owner handle that keeps a Python object alive from C++; takes the GIL to let go.
std::shared_ptr<void> keep_alive(py::object obj);

bool is_array(py::handle obj);          // a fastmetal.Array
bool is_python_scalar(py::handle obj);  // bool, int or float (weakly typed, NEP 50)
// An integer argument (a Python int or anything with __index__, NumPy integers included) as
// int64, saturated beyond its range so that the caller's range check rejects it with the
// right sign; nullopt for anything else, bools and floats included.
std::optional<std::int64_t> int_arg(py::handle v);
// TypeError text for an object NumPy could not turn into an array (error `e`): one line, the
// first line of that error, never a traceback; a tensor that requires grad is told to
// .detach().
std::string not_an_array_message(py::handle obj, const py::error_already_set& e,
                                 const std::string& op, const char* arg);

// The device an op runs on: that of its fastmetal.Array arguments (which must agree),
// else the default device.
using NamedArg = std::pair<const char*, py::handle>;
Backend& pick_backend(const std::string& op, const NamedArg* args, std::size_t count);
inline Backend& pick_backend(const std::string& op, std::initializer_list<NamedArg> args) {
  return pick_backend(op, args.begin(), args.size());
}
inline Backend& pick_backend(const std::string& op, const std::vector<NamedArg>& args) {
  return pick_backend(op, args.data(), args.size());
}
bool any_array(const py::handle* objs, std::size_t count);
inline bool any_array(std::initializer_list<py::handle> objs) {
  return any_array(objs.begin(), objs.size());
}
inline bool any_array(const std::vector<py::handle>& objs) {
  return any_array(objs.data(), objs.size());
}

// Dtype an array-like would have inside fastmetal (TypeError for unsupported dtypes).
DType native_dtype_of(py::handle obj, const std::string& op, const char* arg);
// The dtype a float-only op (conv2d, matmul, normalization, ...) computes an operand in:
// float16 stays, float32 and float64 are float32, NumPy integer and bool data float32;
// integer and bool fastmetal.Arrays are a TypeError (int64_refused).
DType float_dtype_of(py::handle obj, const std::string& op, const char* arg);
// A dtype= argument ("float32", np.float16, ...) -> DType; TypeError otherwise.
DType parse_dtype(py::handle dtype, const std::string& op, const char* arg);
// TypeError where `backend` has no such dtype (float64 on metal), saying what to do.
void check_dtype_on(Backend& backend, DType t, const std::string& op);

// obj (Array, ndarray, array-like or scalar) as an Array of dtype `want` on `backend`.
// Shares memory with obj where backend and dtype allow; else converts/copies.
Array to_array(py::handle obj, Backend& backend, const std::string& op, const char* arg,
               std::optional<DType> want = std::nullopt);
// The same, contiguous: strided views are gathered into a new allocation (kernels that
// walk rows themselves need this).
Array to_contiguous_array(py::handle obj, Backend& backend, const std::string& op, const char* arg,
                          DType want);
// A NumPy array with native dtype (float32/float16) from any array-like.
py::array to_native_numpy(py::handle obj, const std::string& op, const char* arg,
                          std::optional<DType> want = std::nullopt);

// Blocks (without the GIL) until no queued work uses a's memory, so the host may read or
// write it (backend.h, invariant 0). Every path that hands device memory to the host goes
// through this or copy_to_host.
void wait_for_host(const Array& a);
// A NumPy array viewing a host-visible Array (copy for other devices); its base keeps
// the storage alive. Complete on return: it waits for queued work on `a`.
py::array numpy_view(const Array& a, py::handle owner = py::handle());
py::object wrap_result(Array result, bool as_fastmetal_array);

py::dtype numpy_dtype(DType t);

// ---- arguments described for csrc/ops/arguments.h, which decides what they mean
// obj as an operand of the promotion tables (TypeError for what is not real numbers).
Operand operand_of(py::handle obj, const std::string& op, const char* arg);
// The shape of an array operand, read without converting it, or nothing for scalars and
// other objects.
std::optional<Shape> shape_without_converting(py::handle obj);
// obj as an Array of `want` on `backend`, as to_array, except that fastmetal.Arrays of
// another dtype (int64 included) are converted on the device.
Array to_operand(py::handle obj, Backend& backend, const std::string& op, const char* arg,
                 DType want);
// The smallest integer a Python int or NumPy integer array holds (nothing for others).
std::optional<std::int64_t> host_integer_min(py::handle obj);
// out= (None, a fastmetal.Array or a NumPy array; TypeError for anything else) described
// for an op on `backend`: a NumPy array is lent to the device in place where it can be.
OutArg out_arg(py::handle out, Backend& backend, const std::string& op);
// What an op with out= returns once its work is enqueued: out itself (the NumPy out=
// written through the host where output.host_copy()), else output.target() as NumPy or
// an Array (fm_result).
py::object out_result(Output& output, py::handle out, bool fm_result);

}  // namespace fm::python
