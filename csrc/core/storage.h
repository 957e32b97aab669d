// fm::Storage: one allocation on a device, shared by the Arrays that view it and by the
// launches that use it. A core type: Arrays hold it without knowing the backend interface
// (csrc/backend/backend.h), which allocates, wraps and releases it.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace fm {

class Backend;

// One allocation on a device. On host-visible backends (cpu, metal) `host` is its CPU
// address; `handle` is the backend's own object (an MTLBuffer, a CUDA pointer).
// shared_from_this: a capture (fastmetal.compile) keeps the destination of a recorded copy.
struct Storage : std::enable_shared_from_this<Storage> {
  Backend* backend = nullptr;
  void* host = nullptr;
  void* handle = nullptr;
  std::size_t nbytes = 0;
  // Where wrap_host had to copy instead of sharing memory: the user's memory, so that
  // results written here can be copied back (see Backend::wrap_host).
  void* copied_from = nullptr;
  // Memory the caller owns (wrap_host shared it instead of copying): an op whose launches
  // use it waits in end_op() before returning (invariant 0).
  bool shared_with_host = false;
  // Pending state for backends that queue work on host-visible memory (metal): the sequence
  // number of the last command batch that names this storage, stamped at launch (0: none),
  // so that wait_for_host / host copies wait only when queued work still uses it. A fresh
  // Storage over a reused pooled block starts at 0: its block went back to the pool only
  // after the work that used it completed (invariant 1).
  std::atomic<std::uint64_t> last_use{0};
  // Advanced by every write into an existing Array over this storage (prepare_write), so
  // that autograd can tell a tensor it saved was overwritten before backward (PyTorch's
  // version counter; shared by all views of the storage).
  std::atomic<std::uint64_t> version{0};
  // Bytes actually allocated (the pool's size class), for returning the block.
  std::size_t capacity = 0;
  // Keeps wrapped user memory alive as long as this storage (owners of Python memory
  // take the GIL themselves when they let go).
  std::shared_ptr<void> owner;
  // Returns the memory to its pool. Runs when the last reference goes. Keep captures to
  // two pointers (e.g. the backend and this Storage): std::function then stores them
  // without a heap allocation, and this runs on every op call.
  std::function<void()> release;

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (release) release();
  }
};
using StoragePtr = std::shared_ptr<Storage>;

}  // namespace fm
