#include "shape.h"

#include <array>
#include <sstream>
#include <vector>

#include "errors.h"

namespace fm {

std::int64_t numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

bool fits_in_memory(const Shape& shape, std::size_t itemsize) {
  std::int64_t bytes = std::int64_t(itemsize);
  for (auto d : shape)
    if (d < 0 || __builtin_mul_overflow(bytes, d > 0 ? d : 1, &bytes)) return false;
  return true;
}

Strides contiguous_strides(const Shape& shape) {
  Strides s(shape.size());
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i] > 0 ? shape[i] : 1;
  }
  return s;
}

bool is_contiguous(const Shape& shape, const Strides& strides) {
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != acc) return false;
    acc *= shape[i];
  }
  return true;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream s;
  s << "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) s << ",";
  s << ")";
  return s.str();
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& op) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw ValueError(message(op, "expected shapes that broadcast together, got x ",
                               shape_str(a), " and y ", shape_str(b)));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Strides broadcast_strides(const Shape& shape, const Strides& strides, const Shape& target) {
  Strides out(target.size(), 0);
  const std::size_t off = target.size() - shape.size();
  for (std::size_t i = 0; i < shape.size(); ++i)
    out[off + i] = shape[i] == 1 ? 0 : strides[i];
  return out;
}

void merge_dims(Shape& shape, Strides* const* strides, std::size_t count) {
  Shape ms;
  // Merged strides of each operand: inline for the usual few operands (no allocation).
  std::array<Strides, 4> inline_mst;
  std::vector<Strides> heap_mst(count > inline_mst.size() ? count : 0);
  Strides* mst = count > inline_mst.size() ? heap_mst.data() : inline_mst.data();
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    bool can_merge = !ms.empty();
    for (std::size_t k = 0; k < count && can_merge; ++k)
      can_merge = mst[k].back() == (*strides[k])[i] * shape[i];
    if (can_merge) {
      ms.back() *= shape[i];
      for (std::size_t k = 0; k < count; ++k) mst[k].back() = (*strides[k])[i];
    } else {
      ms.push_back(shape[i]);
      for (std::size_t k = 0; k < count; ++k) mst[k].push_back((*strides[k])[i]);
    }
  }
  shape = ms;
  for (std::size_t k = 0; k < count; ++k) *strides[k] = mst[k];
}

}  // namespace fm
