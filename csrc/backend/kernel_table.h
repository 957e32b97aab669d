// The kernel table every backend with generated entries keeps: host name (the name
// FM_INSTANTIATE gives in metal/*.metal) -> the backend's entry record. The generated
// register_<stem>(table) functions fill it with table.add(name, fields...).
// Plain C++ (no CUDA, no Objective-C): nvcc compiles it into the generated wrappers too.
#pragma once
#include <cstddef>
#include <string>
#include <unordered_map>

namespace fm {

template <typename Info>
class KernelTable {
 public:
  template <typename... Fields>
  void add(const char* name, Fields... fields) {
    map_[name] = Info{fields...};
  }
  const Info* find(const std::string& name) const {
    auto it = map_.find(name);
    return it == map_.end() ? nullptr : &it->second;
  }
  std::size_t size() const { return map_.size(); }

 private:
  std::unordered_map<std::string, Info> map_;
};

}  // namespace fm

// Every register_<stem>() the generator wrote for a backend, declared and called in one
// place. Expanded in the namespace of the backend's generated entries, where KernelTable
// names its table type, after including the generated "kernel_stems.h"; defines
// register_kernels(KernelTable&), which fills a table with every kernel.
#define FM_KERNEL_STEM_DECLARE(stem) void register_##stem(KernelTable&);
#define FM_KERNEL_STEM_CALL(stem) register_##stem(table);
#define FM_GENERATED_KERNELS                 \
  FM_KERNEL_STEMS(FM_KERNEL_STEM_DECLARE)    \
  inline void register_kernels(KernelTable& table) { FM_KERNEL_STEMS(FM_KERNEL_STEM_CALL) }
