// Types shared by the CUDA backend (host) and the generated __global__ wrappers.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>

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

class KernelTable {
 public:
  void add(const char* name, const void* fn, bool synchronizes) {
    map_[name] = KernelInfo{fn, synchronizes};
  }
  const KernelInfo* find(const std::string& name) const {
    auto it = map_.find(name);
    return it == map_.end() ? nullptr : &it->second;
  }

 private:
  std::unordered_map<std::string, KernelInfo> map_;
};

const KernelTable& kernel_table();

}  // namespace fm::cudak
