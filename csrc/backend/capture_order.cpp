#include "capture_order.h"

#include <algorithm>

namespace fm::capture {
namespace {

struct Access {
  std::uintptr_t begin, end;  // the whole allocation
  bool write;
};

Access access_of(const Storage& s, bool write) {
  const auto begin = allocation_address(s);
  const std::size_t n = std::max(s.nbytes, s.capacity);
  return {begin, begin + std::max<std::size_t>(n, 1), write};
}

bool conflict(const std::vector<Access>& a, const std::vector<Access>& b) {
  for (const Access& x : a)
    for (const Access& y : b)
      if ((x.write || y.write) && x.begin < y.end && y.begin < x.end) return true;
  return false;
}

}  // namespace

std::uintptr_t allocation_address(const Storage& s) {
  // host-visible memory (cpu, metal) by its address; else the device pointer (cuda)
  return reinterpret_cast<std::uintptr_t>(s.host != nullptr ? s.host : s.handle);
}

std::vector<std::vector<std::size_t>> dependencies(
    const Capture& c, const std::function<std::uint32_t(const Entry&)>& writes) {
  const std::vector<Entry>& entries = c.entries();
  const std::size_t n = entries.size();
  std::vector<std::vector<Access>> touched(n);
  std::vector<bool> barrier(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    const Entry& e = entries[i];
    if (e.kind == Entry::Kind::kernel) {
      const std::uint32_t w = writes(e);
      for (std::size_t k = 0; k < e.args.size(); ++k)
        if (e.args[k].storage) touched[i].push_back(access_of(*e.args[k].storage, (w >> k) & 1u));
    } else if (e.kind == Entry::Kind::upload) {
      touched[i].push_back(access_of(*e.dst, true));
    } else if (e.kind == Entry::Kind::host_call) {
      barrier[i] = true;
    }
  }
  // ancestors[j]: bit i set where j already waits for i, directly or through another entry;
  // walking i downwards from j - 1 reaches the later candidates first, whose ancestors then
  // cover the earlier ones (no redundant edges).
  const std::size_t words = (n + 63) / 64;
  std::vector<std::vector<std::uint64_t>> ancestors(n, std::vector<std::uint64_t>(words, 0));
  std::vector<std::vector<std::size_t>> deps(n);
  for (std::size_t j = 0; j < n; ++j) {
    if (entries[j].kind == Entry::Kind::fused) continue;
    std::vector<std::uint64_t>& mine = ancestors[j];
    for (std::size_t i = j; i-- > 0;) {
      if (entries[i].kind == Entry::Kind::fused) continue;
      if ((mine[i / 64] >> (i % 64)) & 1u) continue;
      if (!barrier[i] && !barrier[j] && !conflict(touched[i], touched[j])) continue;
      deps[j].push_back(i);
      mine[i / 64] |= std::uint64_t(1) << (i % 64);
      for (std::size_t w = 0; w < words; ++w) mine[w] |= ancestors[i][w];
    }
  }
  return deps;
}

}  // namespace fm::capture
