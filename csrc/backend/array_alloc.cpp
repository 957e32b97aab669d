// Array::empty, declared with the core type (csrc/core/array.h) and defined here: allocating
// is the backend's job, and core/ stays below the backend interface.
#include "backend.h"
#include "core/array.h"
#include "core/errors.h"

namespace fm {

Array Array::empty(Backend& backend, const Shape& shape, DType dtype, const char* op) {
  if (!fits_in_memory(shape, itemsize(dtype)))
    throw ValueError(std::string("[fastmetal") + (op ? std::string(".") + op : "") +
                     "] expected an array of at most 2**63 - 1 bytes, got shape " +
                     shape_str(shape) + " of " + dtype_name(dtype) + " (" +
                     std::to_string(itemsize(dtype)) + " bytes each)");
  Array a;
  a.shape = shape;
  a.strides = contiguous_strides(shape);
  a.dtype = dtype;
  a.storage = backend.allocate(std::size_t(numel(shape)) * itemsize(dtype));
  return a;
}

}  // namespace fm
