#include "array.h"

namespace fm {

std::pair<const char*, const char*> Array::host_extent() const {
  const std::int64_t item = std::int64_t(itemsize(dtype));
  std::int64_t lo = 0, hi = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::int64_t span = strides[i] * (shape[i] - 1) * item;
    (span < 0 ? lo : hi) += span;
  }
  const char* base = host_data();
  return {base + lo, base + hi + item - 1};
}

Array Array::empty(Backend& backend, const Shape& shape, DType dtype) {
  Array a;
  a.shape = shape;
  a.strides = contiguous_strides(shape);
  a.dtype = dtype;
  a.storage = backend.allocate(std::size_t(numel(shape)) * itemsize(dtype));
  return a;
}

bool may_overlap(const Array& a, const Array& b) {
  if (a.size() == 0 || b.size() == 0) return false;
  if (a.storage == b.storage) return true;
  if (a.storage->host == nullptr || b.storage->host == nullptr) return false;
  auto [alo, ahi] = a.host_extent();
  auto [blo, bhi] = b.host_extent();
  return alo <= bhi && blo <= ahi;
}

bool same_view(const Array& a, const Array& b) {
  return a.host_data() == b.host_data() && a.dtype == b.dtype && a.shape == b.shape &&
         a.strides == b.strides;
}

}  // namespace fm
