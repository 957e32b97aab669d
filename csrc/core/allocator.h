// A caching allocator: freed blocks go back to a pool keyed by size class, so loops that
// allocate the same sizes again and again never return to the system allocator.
// Thread-safe. Each backend owns one, with its own raw allocate/free.
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <string>

namespace fm {

// Raised where a device cannot allocate a block; pybind11 turns std::bad_alloc into
// Python's MemoryError, with this message.
struct OutOfMemory : std::bad_alloc {
  explicit OutOfMemory(std::string msg) : msg_(std::move(msg)) {}
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

class CachingAllocator {
 public:
  struct Block {
    void* host = nullptr;    // CPU address (host-visible memory) or nullptr
    void* handle = nullptr;  // backend object
    std::size_t size = 0;    // size class actually allocated
  };
  using RawAlloc = std::function<Block(std::size_t)>;
  using RawFree = std::function<void(const Block&)>;

  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free, std::size_t max_cached_bytes);
  ~CachingAllocator();

  // A block of at least nbytes; OutOfMemory where the device cannot provide it.
  Block acquire(std::size_t nbytes);
  void give_back(const Block& block);
  void empty_cache();

  std::size_t cached_bytes() const;
  static std::size_t size_class(std::size_t nbytes);

 private:
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  std::size_t max_cached_;
  mutable std::mutex mu_;
  std::multimap<std::size_t, Block> free_;
  std::size_t cached_ = 0;
};

}  // namespace fm
