// DLPack export of device (cuda) arrays: dlpack.cpp.
#pragma once
#include "pyarray.h"

namespace fm::python {

// __dlpack_device__: (1, 0) (kDLCPU) for host-visible memory, else (2, 0) (kDLCUDA, device 0:
// the one device the cuda backend uses).
py::tuple dlpack_device(const Array& a);

// __dlpack__(**kwargs) of a device array: a "dltensor" capsule sharing a's memory; `owner`
// (the Python Array) stays alive until the consumer releases the tensor. stream and
// max_version need nothing (the data is complete on return; the unversioned capsule is
// the kind every consumer accepts). Raises BufferError for what DLPack cannot carry
// (read-only data, negative strides), for copy=True and for another dl_device.
py::capsule dlpack_device_capsule(const Array& a, py::handle owner, const py::kwargs& kwargs);

}  // namespace fm::python
