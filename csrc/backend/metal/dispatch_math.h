// The arithmetic of the Metal backend that needs no Metal, kept apart from the
// Objective-C++ so that Linux tests run it (tests/test_objc_gate.py).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace fm::metal {

// setBuffer:offset:atIndex: wants the offset aligned to the element type the kernel reads.
// fastmetal's arrays hold float32 or float16, so 4 bytes serves both; host memory that is
// not aligned so (a NumPy view at an odd byte offset) is copied, not wrapped.
constexpr std::uintptr_t kBufferOffsetAlignment = 4;
inline bool offset_bindable(std::uintptr_t offset) { return offset % kBufferOffsetAlignment == 0; }

// setBytes:length:atIndex: is for data smaller than 4 KiB; larger blocks go in a buffer.
constexpr std::size_t kSetBytesLimit = 4096;
inline bool fits_set_bytes(std::size_t n) { return n < kSetBytesLimit; }

// The whole pages holding [p, p + n): newBufferWithBytesNoCopy wants a page-aligned
// pointer and a length that is a multiple of the page size. ok is false where the span
// would wrap around the address space.
struct PageSpan {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  bool ok = false;
};

inline PageSpan page_span(std::uintptr_t p, std::size_t n, std::uintptr_t page) {
  PageSpan s;
  if (page == 0 || (page & (page - 1)) != 0) return s;  // a power of two
  if (p + n < p || p + n > UINTPTR_MAX - page) return s;
  s.begin = p & ~(page - 1);
  s.end = (p + n + page - 1) & ~(page - 1);
  s.ok = true;
  return s;
}

// Threads per threadgroup for a dispatch: as asked (0 counts as 1), no larger than the grid
// or the device's per-axis limit, and with at most max_total threads in all (halving the
// largest axis; fastmetal's kernels are correct for any threadgroup size).
inline void clamp_group(std::uint64_t group[3], const std::uint32_t grid[3],
                        const std::uint64_t axis_max[3], std::uint64_t max_total) {
  max_total = std::max<std::uint64_t>(1, max_total);
  for (int i = 0; i < 3; ++i)
    group[i] = std::max<std::uint64_t>(
        1, std::min({std::max<std::uint64_t>(1, group[i]), axis_max[i], std::uint64_t(grid[i])}));
  while (group[0] * group[1] * group[2] > max_total) {
    int big = 0;
    for (int i = 1; i < 3; ++i)
      if (group[i] > group[big]) big = i;
    group[big] = (group[big] + 1) / 2;
  }
}

}  // namespace fm::metal
