// Device-side helpers of the generated CUDA wrappers: Metal's builtins from CUDA's indices
// and typed kernel arguments (the CUDA counterpart of backend/cpu/fm_cpu_entry.h).
#pragma once
#define FM_ENTRY_FN __device__ __forceinline__
#include "../kernel_params.h"
#include "cuda_kernel_abi.h"

namespace fm::cudak {

struct ThreadIds {
  u3 grid_pos, grid_size, local_pos, group_pos, group_size, num_groups;
  unsigned int local_index, simd_lane, simd_group, simd_width;
  bool in_grid;
};

__device__ __forceinline__ ThreadIds thread_ids(const Dims& d) {
  ThreadIds t;
  t.local_pos = u3{threadIdx.x, threadIdx.y, threadIdx.z};
  t.group_size = u3{blockDim.x, blockDim.y, blockDim.z};
  t.group_pos = u3{blockIdx.x + d.block_offset.x, blockIdx.y + d.block_offset.y,
                   blockIdx.z + d.block_offset.z};
  t.grid_pos = u3{t.group_pos.x * blockDim.x + threadIdx.x, t.group_pos.y * blockDim.y + threadIdx.y,
                  t.group_pos.z * blockDim.z + threadIdx.z};
  t.grid_size = d.grid;
  t.num_groups = d.num_groups;
  t.local_index = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  t.simd_lane = t.local_index % 32u;
  t.simd_group = t.local_index / 32u;
  t.simd_width = 32u;
  t.in_grid = t.grid_pos.x < d.grid.x && t.grid_pos.y < d.grid.y && t.grid_pos.z < d.grid.z;
  return t;
}

using kernel_params::arg;
using kernel_params::builtin;

}  // namespace fm::cudak
