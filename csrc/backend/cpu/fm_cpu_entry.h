// Helpers the generated CPU entries use to call a kernel: turn the untyped argument
// array into the kernel's parameter types and loop over thread positions. Everything
// here is a template the compiler inlines, so a grid-mode kernel becomes one plain loop.
#pragma once
#include "../kernel_params.h"
#include "cpu_kernel_abi.h"

// FM_CPU_ISA_IS_BASE(FM_CPU_ISA): 1 in the base ISA's copy of the entries, 0 in the others
// (whose names are no macro: #if reads them as 0). The float64 entries are compiled there only.
#define FM_CPU_ISA_IS_BASE_base 1
#define FM_CPU_ISA_IS_BASE_(isa) FM_CPU_ISA_IS_BASE_##isa
#define FM_CPU_ISA_IS_BASE(isa) FM_CPU_ISA_IS_BASE_(isa)

namespace fm::cpu {

using kernel_params::arg;
using kernel_params::builtin;

template <typename Fn>
inline void run_grid(const Launch& L, Fn&& f) {
  for (std::uint32_t z = L.lo.z; z < L.hi.z; ++z)
    for (std::uint32_t y = L.lo.y; y < L.hi.y; ++y)
      // Grid threads are independent (a kernel racing between them is wrong on a GPU too),
      // which `omp simd` states (-fopenmp-simd: no OpenMP runtime). It also lifts GCC's
      // limit on the PHI arguments its if-conversion takes (4 by default): GCC 13's jump
      // threading leaves more for the selects of pow and softplus, which otherwise stay
      // branches and keep the loop scalar.
#pragma omp simd
      for (std::uint32_t x = L.lo.x; x < L.hi.x; ++x) f(uvec3{x, y, z});
}

inline uvec3 group_position(const Launch& L, std::uint64_t g) {
  const std::uint64_t gx = L.num_groups.x, gy = L.num_groups.y;
  return uvec3{std::uint32_t(g % gx), std::uint32_t((g / gx) % gy), std::uint32_t(g / (gx * gy))};
}

template <typename Fn>
inline void run_groups(const Launch& L, Fn&& f) {
  ThreadIds t;
  t.grid_size = L.grid;
  t.group_size = L.group;
  t.num_groups = L.num_groups;
  t.simd_width = kSimdWidth;
  for (std::uint64_t g = L.group_begin; g < L.group_end; ++g) {
    t.group_pos = group_position(L, g);
    for (std::uint32_t lz = 0; lz < L.group.z; ++lz)
      for (std::uint32_t ly = 0; ly < L.group.y; ++ly)
        for (std::uint32_t lx = 0; lx < L.group.x; ++lx) {
          t.local_pos = uvec3{lx, ly, lz};
          t.grid_pos = uvec3{t.group_pos.x * L.group.x + lx, t.group_pos.y * L.group.y + ly,
                             t.group_pos.z * L.group.z + lz};
          if (t.grid_pos.x >= L.grid.x || t.grid_pos.y >= L.grid.y || t.grid_pos.z >= L.grid.z)
            continue;  // past the grid: such threads do not exist
          t.local_index = (lz * L.group.y + ly) * L.group.x + lx;
          t.simd_lane = t.local_index % kSimdWidth;
          t.simd_group = t.local_index / kSimdWidth;
          f(t);
        }
  }
}

template <typename Fn>
inline void run_emulated(const Launch& L, Fn&& f) {
  emulate_groups(L, std::function<void(const ThreadIds&)>(f));
}

}  // namespace fm::cpu
