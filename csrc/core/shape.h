// Shapes and strides: broadcasting and merging of dimensions, written once for all backends.
// Strides are in elements and may be negative or zero (broadcast).
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "small_vector.h"

namespace fm {

// Inline up to 6 dimensions (no allocation for the shapes ops actually see).
using Shape = SmallVector<std::int64_t, 6>;
using Strides = SmallVector<std::int64_t, 6>;

std::int64_t numel(const Shape& shape);
// True where an array of `shape` with `itemsize`-byte elements has a byte count that fits a
// signed 64-bit size (extents of 0 count as 1, as NumPy does: (0, 2**62, 2**62) is too big).
bool fits_in_memory(const Shape& shape, std::size_t itemsize);
Strides contiguous_strides(const Shape& shape);
bool is_contiguous(const Shape& shape, const Strides& strides);
std::string shape_str(const Shape& shape);  // "(3, 32, 32)"

// NumPy broadcasting of two shapes; throws ValueError naming `op` on mismatch.
Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& op);
// Strides that view an array of `shape` as `target` (zero strides on broadcast dims).
Strides broadcast_strides(const Shape& shape, const Strides& strides, const Shape& target);

// Merge dimensions that are contiguous with each other in *every* operand and drop
// size-1 dims, so kernels see as few dims as possible. Updates all stride sets in place.
void merge_dims(Shape& shape, Strides* const* strides, std::size_t count);
inline void merge_dims(Shape& shape, std::initializer_list<Strides*> strides) {
  merge_dims(shape, strides.begin(), strides.size());
}
inline void merge_dims(Shape& shape, const std::vector<Strides*>& strides) {
  merge_dims(shape, strides.data(), strides.size());
}

}  // namespace fm
