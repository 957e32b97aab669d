// The CPU kernel ABI: types shared by the CPU backend and the generated kernel entries
// (cpu_entries_*.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "../kernel_table.h"

namespace fm::cpu {

struct uvec3 {
  std::uint32_t x = 0, y = 0, z = 0;
};

// How a kernel runs on the CPU (decided by tools/gen/gen_kernels.py from its source):
//   grid      uses only thread_position_in_grid: a plain, vectorisable loop
//   groups    uses threadgroup builtins but no barriers: loops per threadgroup
//   emulated  uses barriers or simdgroup functions: simulated threads (emulator.cpp)
enum class Mode { grid, groups, emulated };

struct Launch {
  uvec3 grid;        // threads in the whole dispatch
  uvec3 group;       // threads per threadgroup
  uvec3 num_groups;  // ceil(grid / group)
  uvec3 lo, hi;      // grid mode: the box of thread positions this call covers
  std::uint64_t group_begin = 0, group_end = 0;  // groups/emulated: flattened group range
};

struct ThreadIds {
  uvec3 grid_pos, grid_size, local_pos, group_pos, group_size, num_groups;
  std::uint32_t local_index = 0, simd_lane = 0, simd_group = 0, simd_width = 32;
};

constexpr std::uint32_t kSimdWidth = 32;  // Apple GPUs' and NVIDIA's SIMD width

using Entry = void (*)(const Launch&, void* const*);
struct KernelInfo {
  Entry fn;
  Mode mode;
  // Bit i: [[buffer(i)]] is device memory the kernel may write (not declared const).
  std::uint32_t writes;
};

using KernelTable = ::fm::KernelTable<KernelInfo>;

// Runs `thread` for every simulated thread of the launch's groups, switching between
// them at barriers in a random order (emulator.cpp).
void emulate_groups(const Launch& launch, const std::function<void(const ThreadIds&)>& thread);

// The ISA-specific tables (kernels.cpp): the best one this processor runs.
const KernelTable& kernel_table();
const char* kernel_isa();

}  // namespace fm::cpu
