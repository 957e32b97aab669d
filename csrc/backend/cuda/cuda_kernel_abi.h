// The CUDA kernel ABI: types shared by the CUDA backend (host) and the generated
// __global__ wrappers.
#pragma once
#include <cstdint>
#include <string>

#include "../kernel_table.h"

namespace fm::cudak {

struct u3 {
  unsigned int x, y, z;
};

constexpr int kMaxArgs = 16;
// Kernel arguments by value: device pointers, one per [[buffer(i)]] (argument blocks are
// copied to device memory by the backend first).
struct Args {
  void* ptr[kMaxArgs];
};
// The Metal-style dispatch: grid in threads; block_offset shifts blockIdx when a grid has
// more blocks along y or z than one CUDA launch allows.
struct Dims {
  u3 grid;
  u3 num_groups;
  u3 block_offset;
};

struct KernelInfo {
  const void* fn;
  bool synchronizes;
};

using KernelTable = ::fm::KernelTable<KernelInfo>;

const KernelTable& kernel_table();

}  // namespace fm::cudak
