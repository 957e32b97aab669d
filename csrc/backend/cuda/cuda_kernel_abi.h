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
constexpr int kInlineBytes = 1024;
// Kernel arguments by value (a __grid_constant__ parameter): one per [[buffer(i)]], either a
// device pointer or a small argument block carried inside the launch's own parameters
// (inline_at[i] = 1 + its byte offset in `bytes`), so a launch needs no copy to device
// memory and no allocation. Blocks too large for `bytes` are copied to device memory.
struct Args {
  void* ptr[kMaxArgs];
  unsigned short inline_at[kMaxArgs];
  alignas(16) unsigned char bytes[kInlineBytes];
};

#ifdef __CUDACC__
// The address of argument i inside the kernel: generic pointers into a __grid_constant__
// parameter are valid (sm_70 and later); argument blocks are only read.
__device__ __forceinline__ void* arg_ptr(const Args& a, int i) {
  return a.inline_at[i] != 0 ? const_cast<unsigned char*>(a.bytes + (a.inline_at[i] - 1))
                             : a.ptr[i];
}
#endif
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
  // Bit i: [[buffer(i)]] is a `constant` argument block, which may travel inline (the
  // kernel reads it through arg_ptr). `device` buffers are read as a.ptr[i] directly, so an
  // argument block bound to one is copied to device memory.
  std::uint32_t inline_ok;
  // Bit i: [[buffer(i)]] is device memory the kernel may write (not declared const): what
  // a compiled step's graph orders its launches by (capture_order.h).
  std::uint32_t writes;
};

using KernelTable = ::fm::KernelTable<KernelInfo>;

const KernelTable& kernel_table();

}  // namespace fm::cudak
