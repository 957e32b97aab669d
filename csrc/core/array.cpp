#include "array.h"

#include "errors.h"

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

void prepare_write(const Array& a, const std::string& op, const char* arg) {
  if (a.readonly)
    throw ValueError(message(op, "expected a writeable ", arg, ", got a read-only array (it views "
                                 "memory that is not writeable, e.g. bytes or a read-only "
                                 "NumPy array; pass a copy)"));
  for (std::size_t d = 0; d < a.shape.size(); ++d)
    if (a.strides[d] == 0 && a.shape[d] > 1 && a.size() > 0)
      throw ValueError(message(op, "expected ", arg, " without broadcast (zero-stride) "
                                   "dimensions, got shape ", shape_str(a.shape), " with strides ",
                               shape_str(a.strides), " (in elements)"));
  if (a.storage) a.storage->version.fetch_add(1, std::memory_order_relaxed);
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
