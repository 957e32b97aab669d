#include "capture_order.h"

#include <algorithm>
#include <utility>

namespace fm::capture {
namespace {

// The whole allocation: host-visible memory (cpu, metal) by its address, else the device
// pointer (cuda).
Access access_of(const Storage& s, bool write) {
  const auto begin = reinterpret_cast<std::uintptr_t>(s.host != nullptr ? s.host : s.handle);
  const std::size_t n = std::max(s.nbytes, s.capacity);
  return {begin, begin + std::max<std::size_t>(n, 1), write};
}

bool conflict(const std::vector<Access>& a, const std::vector<Access>& b) {
  for (const Access& x : a)
    for (const Access& y : b)
      if ((x.write || y.write) && x.begin < y.end && y.begin < x.end) return true;
  return false;
}

bool skipped(const Entry& e) {
  return e.kind == Entry::Kind::fused || (e.kind == Entry::Kind::upload && e.n == 0);
}

}  // namespace

std::vector<Access> accesses(const Capture& c, const Entry& e) {
  std::vector<Access> out;
  if (e.kind == Entry::Kind::kernel) {
    const std::uint32_t w = c.backend().written_args(e.kernel);
    for (std::size_t k = 0; k < e.args.size(); ++k)
      if (e.args[k].storage) out.push_back(access_of(*e.args[k].storage, (w >> k) & 1u));
  } else if (e.kind == Entry::Kind::upload) {
    out.push_back(access_of(*e.dst, true));
  }
  return out;
}

Order order_of(const Capture& c) {
  const std::vector<Entry>& entries = c.entries();
  const std::size_t n = entries.size();
  std::vector<std::vector<Access>> touched(n);
  std::vector<bool> barrier(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    touched[i] = accesses(c, entries[i]);
    barrier[i] = entries[i].kind == Entry::Kind::host_call;
  }
  // Walking i downwards from j - 1 reaches the later candidates first, whose ancestors then
  // cover the earlier ones (no redundant edges).
  const std::size_t words = (n + 63) / 64;
  Order o;
  o.ancestors.assign(n, std::vector<std::uint64_t>(words, 0));
  o.deps.resize(n);
  for (std::size_t j = 0; j < n; ++j) {
    if (skipped(entries[j])) continue;
    std::vector<std::uint64_t>& mine = o.ancestors[j];
    for (std::size_t i = j; i-- > 0;) {
      if (skipped(entries[i]) || o.waits_for(j, i)) continue;
      if (!barrier[i] && !barrier[j] && !conflict(touched[i], touched[j])) continue;
      o.deps[j].push_back(i);
      mine[i / 64] |= std::uint64_t(1) << (i % 64);
      for (std::size_t w = 0; w < words; ++w) mine[w] |= o.ancestors[i][w];
    }
  }
  return o;
}

namespace {

// The longest path through the dependencies, in launches (ties: the most threads launched
// along it): marked entries.
std::vector<bool> critical_chain(const Capture& c, const Order& order) {
  const std::size_t n = c.size();
  std::vector<std::vector<std::size_t>> users(n);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t d : order.deps[j]) users[d].push_back(j);
  // the longest path starting at j: (launches, threads)
  std::vector<std::pair<std::size_t, double>> rest(n, {0, 0.0});
  std::vector<std::ptrdiff_t> next(n, -1);
  std::ptrdiff_t start = -1;
  for (std::size_t j = n; j-- > 0;) {
    const Entry& e = c.entries()[j];
    if (skipped(e)) continue;
    std::pair<std::size_t, double> best{0, 0.0};
    for (std::size_t u : users[j])
      if (rest[u] > best) best = rest[u], next[j] = std::ptrdiff_t(u);
    const double threads = e.kind == Entry::Kind::kernel
                               ? double(e.dispatch.grid[0]) * e.dispatch.grid[1] * e.dispatch.grid[2]
                               : 0.0;
    rest[j] = {best.first + 1, best.second + threads};
    if (start < 0 || rest[j] >= rest[std::size_t(start)]) start = std::ptrdiff_t(j);
  }
  std::vector<bool> on(n, false);
  for (std::ptrdiff_t j = start; j >= 0; j = next[std::size_t(j)]) on[std::size_t(j)] = true;
  return on;
}

}  // namespace

Lanes assign_lanes(const Capture& c, const Order& order, int max_lanes) {
  const std::size_t n = c.size(), lanes = std::size_t(std::max(1, max_lanes));
  Lanes out;
  out.lane.assign(n, -1);
  out.waits.resize(n);
  out.critical_lane = lanes > 1;
  const std::vector<bool> critical =
      out.critical_lane ? critical_chain(c, order) : std::vector<bool>(n, false);
  const std::size_t first = out.critical_lane ? 1 : 0;  // the lanes of the other entries
  std::vector<std::ptrdiff_t> last(lanes, -1);  // lane -> its last entry
  // known[k][m]: the latest entry of lane m that lane k has waited for (or run, m == k)
  std::vector<std::vector<std::ptrdiff_t>> known(lanes, std::vector<std::ptrdiff_t>(lanes, -1));
  std::vector<std::vector<std::ptrdiff_t>> known_at(n);  // known[lane[j]] once j is queued
  for (std::size_t j = 0; j < n; ++j) {
    if (skipped(c.entries()[j])) continue;
    const std::vector<std::size_t>& deps = order.deps[j];
    std::ptrdiff_t pick = critical[j] ? 0 : -1;
    for (std::size_t d : deps) {  // decreasing: the latest first
      if (pick >= 0) break;
      const std::size_t m = std::size_t(out.lane[d]);
      if (m >= first && last[m] == std::ptrdiff_t(d)) pick = std::ptrdiff_t(m);
    }
    for (std::size_t k = first; pick < 0 && k < lanes; ++k)  // its last entry is j's ancestor
      if (last[k] >= 0 && order.waits_for(j, std::size_t(last[k]))) pick = std::ptrdiff_t(k);
    for (std::size_t k = first; pick < 0 && k < lanes; ++k)  // an unused lane
      if (last[k] < 0) pick = std::ptrdiff_t(k);
    if (pick < 0) {  // every lane busy with unrelated work: the one idle longest
      pick = std::ptrdiff_t(first);
      for (std::size_t k = first + 1; k < lanes; ++k)
        if (last[k] < last[std::size_t(pick)]) pick = std::ptrdiff_t(k);
    }
    const std::size_t k = std::size_t(pick);
    for (std::size_t d : deps) {
      const std::size_t m = std::size_t(out.lane[d]);
      if (m == k || known[k][m] >= std::ptrdiff_t(d)) continue;
      out.waits[j].push_back(d);
      // after d, everything d's lane had run or waited for when d was queued is done too
      for (std::size_t q = 0; q < lanes; ++q) known[k][q] = std::max(known[k][q], known_at[d][q]);
    }
    out.lane[j] = int(k);
    last[k] = std::ptrdiff_t(j);
    known[k][k] = std::ptrdiff_t(j);
    known_at[j] = known[k];
    out.used = std::max(out.used, int(k) + 1);
  }
  return out;
}

}  // namespace fm::capture
