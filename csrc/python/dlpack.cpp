// DLPack export of arrays in device memory (cuda): a "dltensor" capsule that shares the
// Array's storage, so torch.from_dlpack / cupy.from_dlpack see fastmetal's data without a
// copy. Host-visible arrays export through their NumPy view instead (module.cpp).
#include "dlpack.h"

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace fm::python {
namespace {

// The DLPack ABI (dlpack.h, v0.8; unversioned capsules): the layout is the standard's.
struct DLDevice {
  std::int32_t device_type;  // dlpack_device
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;  // 0 = kDLInt, 1 = kDLUInt, 2 = kDLFloat, 6 = kDLBool
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

constexpr const char* kCapsuleName = "dltensor";

// What the tensor keeps alive: the Python Array object (and so its storage), and the shape
// and strides the DLTensor points into.
struct Export {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape, strides;
  PyObject* owner = nullptr;
};

// Called by the consumer when it is done with the tensor, from any thread, with or without
// the GIL.
void delete_export(DLManagedTensor* t) {
  auto* e = static_cast<Export*>(t->manager_ctx);
  py::gil_scoped_acquire gil;
  Py_XDECREF(e->owner);
  delete e;
}

// A capsule that nobody consumed (still named "dltensor") owns its tensor.
void delete_unconsumed(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;  // consumed: renamed "used_dltensor"
  auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (t != nullptr && t->deleter != nullptr) t->deleter(t);
}

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::float32: return {2, 32, 1};
    case DType::float16: return {2, 16, 1};
    case DType::float64: return {2, 64, 1};
    case DType::int32: return {0, 32, 1};
    case DType::uint8: return {1, 8, 1};   // kDLUInt
    case DType::bool_: return {6, 8, 1};   // kDLBool
    default: return {0, 64, 1};  // int64
  }
}

}  // namespace

py::tuple dlpack_device(const Array& a) {
  const Backend::DLPackDevice d = a.backend().dlpack_device();
  return py::make_tuple(d.type, d.id);
}

py::capsule dlpack_device_capsule(const Array& a, py::handle owner, const py::kwargs& kwargs) {
  static_assert(sizeof(DLTensor) == 48 && sizeof(DLManagedTensor) == 64, "DLPack ABI layout");
  py::object copy = py::none(), dl_device = py::none();
  if (kwargs.contains("copy")) copy = kwargs["copy"];
  if (kwargs.contains("dl_device")) dl_device = kwargs["dl_device"];
  const py::tuple device = dlpack_device(a);
  if (!dl_device.is_none() && !dl_device.equal(device))
    throw py::buffer_error("fastmetal.Array.__dlpack__: the array is on DLPack device " +
                           std::string(py::repr(device)) + ", got dl_device=" +
                           std::string(py::repr(dl_device)));
  if (!copy.is_none() && copy.cast<bool>())
    throw py::buffer_error("fastmetal.Array.__dlpack__: copy=True is not supported (the export "
                           "shares the array's memory); copy the array first");
  if (a.readonly)
    throw py::buffer_error("fastmetal.Array.__dlpack__: the array is read-only, and DLPack "
                           "cannot say so; copy it first");
  for (auto s : a.strides)
    if (s < 0)
      throw py::buffer_error("fastmetal.Array.__dlpack__: negative strides cannot be exported; "
                             "copy the array first");
  // The consumer may read on any stream: the data is complete before it gets the pointer.
  wait_for_host(a);
  auto* e = new Export;
  e->shape.assign(a.shape.begin(), a.shape.end());
  e->strides.assign(a.strides.begin(), a.strides.end());
  DLTensor& t = e->managed.dl_tensor;
  t.data = a.device_data();
  t.device = {device[0].cast<std::int32_t>(), device[1].cast<std::int32_t>()};
  t.ndim = std::int32_t(a.shape.size());
  t.dtype = dl_dtype(a.dtype);
  t.shape = e->shape.data();
  t.strides = e->strides.data();
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = delete_export;
  e->owner = owner.ptr();
  Py_XINCREF(e->owner);
  PyObject* capsule = PyCapsule_New(&e->managed, kCapsuleName, delete_unconsumed);
  if (capsule == nullptr) {
    delete_export(&e->managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace fm::python
