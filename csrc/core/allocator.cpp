#include "allocator.h"

#include <vector>

namespace fm {

namespace {
constexpr std::size_t kPage = 16384;  // Apple Silicon's page; a multiple of 4 KiB pages
}

CachingAllocator::CachingAllocator(RawAlloc raw_alloc, RawFree raw_free,
                                   std::size_t max_cached_bytes)
    : raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)),
      max_cached_(max_cached_bytes) {}

CachingAllocator::~CachingAllocator() { empty_cache(); }

// Whole pages; above 1 MiB round up to a quarter of the next power of two, so a pool
// entry is reused by requests up to 25% smaller than it.
std::size_t CachingAllocator::size_class(std::size_t n) {
  if (n == 0) n = 1;
  std::size_t pages = (n + kPage - 1) / kPage * kPage;
  if (pages <= (std::size_t(1) << 20)) return pages;
  std::size_t p2 = std::size_t(1) << (63 - __builtin_clzll(pages));
  std::size_t step = p2 / 4;
  return (pages + step - 1) / step * step;
}

CachingAllocator::Block CachingAllocator::acquire(std::size_t nbytes) {
  // Beyond this no device has the memory, and size_class's rounding would overflow.
  if (nbytes > (std::size_t(1) << 60))
    throw OutOfMemory("[fastmetal] cannot allocate " + std::to_string(nbytes) +
                      " bytes: more memory than any device has");
  const std::size_t want = size_class(nbytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(want);
    if (it != free_.end() && it->first == want) {
      Block b = it->second;
      free_.erase(it);
      cached_ -= b.size;
      return b;
    }
  }
  Block b = raw_alloc_(want);
  if (b.host == nullptr && b.handle == nullptr) {
    empty_cache();  // memory may be held by the pool: free it and try once more
    b = raw_alloc_(want);
  }
  if (b.host == nullptr && b.handle == nullptr)
    throw OutOfMemory("[fastmetal] out of device memory allocating " + std::to_string(nbytes) +
                      " bytes");
  return b;
}

void CachingAllocator::give_back(const Block& block) {
  std::vector<Block> evict;
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(block.size, block);
    cached_ += block.size;
    while (cached_ > max_cached_ && !free_.empty()) {
      auto it = std::prev(free_.end());  // evict the largest first
      cached_ -= it->second.size;
      evict.push_back(it->second);
      free_.erase(it);
    }
  }
  for (auto& b : evict) raw_free_(b);
}

void CachingAllocator::empty_cache() {
  std::multimap<std::size_t, Block> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.swap(free_);
    cached_ = 0;
  }
  for (auto& [size, b] : all) raw_free_(b);
}

std::size_t CachingAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

}  // namespace fm
