// A 1-D launch over more threads than one 32-bit grid holds, for kernels that address
// element `base + thread index` with `base` in their inline argument block.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace fm {

// Launches `kernel` over n threads in pieces of at most 2**32 - 1: set_base(args, start)
// writes each piece's first element into `args`, which travels inline after `buffers`.
template <typename Args, typename SetBase>
void launch_in_pieces(Backend& be, const std::string& kernel, const std::vector<KernelArg>& buffers,
                      Args args, std::int64_t n, SetBase set_base) {
  constexpr std::int64_t kMaxGrid = std::numeric_limits<std::uint32_t>::max();
  const std::uint32_t group = be.preferred_group_size(kernel);
  for (std::int64_t done = 0; done < n; done += kMaxGrid) {
    set_base(args, done);
    Dispatch d;
    d.grid[0] = std::uint32_t(std::min(kMaxGrid, n - done));
    d.group[0] = group;
    std::vector<KernelArg> launch_args = buffers;
    launch_args.push_back(KernelArg::inline_bytes(&args, sizeof args));
    be.launch(kernel, d, launch_args);
  }
}

}  // namespace fm
