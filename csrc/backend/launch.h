// What every backend's allocate() and launch() share, written once: Storage from a pooled
// block, the buffer address of a kernel argument, and the dispatch-size rules. A backend
// supplies only what differs (its raw allocation, how it binds an argument, how it runs a
// grid). The kernel table (name -> entry) is kernel_table.h.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../core/allocator.h"
#include "../core/errors.h"
#include "backend.h"

namespace fm {

// A Storage over `block` (acquired from `pool`) that gives the block back when the last
// reference goes; `owner` (if any) is released after that. The release captures two
// pointers only (no heap allocation: this runs on every op call).
inline StoragePtr pooled_storage(Backend* backend, CachingAllocator& pool,
                                 const CachingAllocator::Block& block, std::size_t nbytes,
                                 std::shared_ptr<void> owner = nullptr) {
  auto s = std::make_shared<Storage>();
  s->backend = backend;
  s->host = block.host;
  s->handle = block.handle;
  s->nbytes = nbytes;
  s->capacity = block.size;
  s->owner = std::move(owner);
  Storage* self = s.get();
  CachingAllocator* from = &pool;
  s->release = [from, self] { from->give_back({self->host, self->handle, self->capacity}); };
  return s;
}

// Raises BackendError unless `kernel` exists (info != nullptr) and takes at most
// `max_args` arguments; `device` names the backend in the message ("CPU", "CUDA").
template <typename Info>
const Info& checked_kernel(const Info* info, const char* device, const std::string& kernel,
                           std::size_t n_args, std::size_t max_args) {
  if (info == nullptr)
    throw BackendError(std::string("[fastmetal] no ") + device + " kernel named '" + kernel + "'");
  if (n_args > max_args)
    throw BackendError("[fastmetal] too many kernel arguments for '" + kernel + "'");
  return *info;
}

// The address a buffer argument binds: its storage's base (Storage::host on host-visible
// backends, Storage::handle as a device pointer on others) plus its byte offset.
inline void* buffer_address(const KernelArg& arg, void* base) {
  return static_cast<char*>(base) + arg.offset;
}

// The dispatch-size rules (Metal's dispatchThreads): a group of at least one thread per
// axis, and ceil(grid / group) groups, the last one along an axis possibly partial.
struct GroupCounts {
  std::uint32_t group[3];
  std::uint32_t num_groups[3];
  std::uint64_t total_groups() const {
    return std::uint64_t(num_groups[0]) * num_groups[1] * num_groups[2];
  }
};
inline GroupCounts group_counts(const Dispatch& d) {
  GroupCounts c{};
  for (int i = 0; i < 3; ++i) {
    c.group[i] = std::max<std::uint32_t>(1, d.group[i]);
    c.num_groups[i] = (d.grid[i] + c.group[i] - 1) / c.group[i];
  }
  return c;
}

}  // namespace fm
