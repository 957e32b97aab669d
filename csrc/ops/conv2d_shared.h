// What conv2d.cpp and conv_transpose2d.cpp share: index limits, the pair format of their
// messages and the one-thread-per-element dispatch of the direct kernels.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "backend/backend.h"

namespace fm::conv2d_shared {

inline constexpr std::int64_t kMaxIndex = std::numeric_limits<std::int32_t>::max();

inline std::string pair_str(std::int64_t a, std::int64_t b) {
  return "(" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

// One thread per element of a (count, channels, N) grid.
inline Dispatch direct_dispatch(Backend& b, const std::string& kernel, std::int64_t plane,
                                std::int64_t channels, std::int64_t n) {
  Dispatch d;
  d.grid[0] = std::uint32_t(plane);
  d.grid[1] = std::uint32_t(channels);
  d.grid[2] = std::uint32_t(n);
  d.group[0] = std::uint32_t(std::min<std::int64_t>(b.preferred_group_size(kernel), plane));
  return d;
}

}  // namespace fm::conv2d_shared
