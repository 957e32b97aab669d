// Which recorded launches of a capture must run after which (fastmetal.compile), and how to
// spread them over a few in-order queues (CUDA streams) without ordering more than that.
//
// A recorded step is a list in issue order, but most of its launches only need the launches
// that wrote what they read, or read what they overwrite: in a training step the weight
// gradients, bias gradients and the optimizer's updates of layers already done do not wait
// for the input gradient flowing further back. A backend that can run launches side by side
// (CUDA: a graph with several branches) replays the capture along these edges instead of
// the list's order, with the same results: every kernel reads and writes exactly what it did
// in the list's order.
//
// Two entries conflict where memory one of them writes overlaps memory the other reads or
// writes (whole allocations are compared, so views of one block conflict, and two Storages
// over overlapping memory do too). What a launch writes comes from its kernel's signature:
// `device const T*` buffers are read, other `device` buffers may be written (the backend's
// Backend::written_args); argument blocks live in the capture's arena, which the replay only reads.
// Uploads write their destination. A host call (CPU native ops) is ordered after everything
// before it and before everything after it.
#pragma once
#include <cstdint>
#include <vector>

#include "capture.h"

namespace fm::capture {

struct Order {
  // For each entry, the earlier entries it must wait for directly: none for skipped (fused)
  // entries; for the rest a set with no entry that another of the set already waits for
  // (transitively), in decreasing order.
  std::vector<std::vector<std::size_t>> deps;
  // Whether entry j waits for entry i (i < j), directly or through others.
  bool waits_for(std::size_t j, std::size_t i) const {
    return (ancestors[j][i / 64] >> (i % 64)) & 1u;
  }
  std::vector<std::vector<std::uint64_t>> ancestors;  // bit sets, one per entry
};

// The memory an entry touches, as order_of() compares it: whole allocations [begin, end),
// and whether the entry may write there (a kernel's writes from its backend's
// Backend::written_args; an upload writes its destination). None for the other kinds.
struct Access {
  std::uintptr_t begin, end;
  bool write;
};
std::vector<Access> accesses(const Capture& c, const Entry& e);

Order order_of(const Capture& c);

// The entries spread over at most `max_lanes` in-order queues: lane[j] (-1 for the entries
// a replay skips), and waits[j], the entries on other lanes that j's lane must wait for
// before j (each after its own lane's earlier entries). With two lanes or more, lane 0
// holds the critical chain alone: the longest path through the dependencies (counted in
// launches; the forward, then the input gradient back to the first layer), which a backend
// may run at a higher priority than the branches beside it (weight gradients, optimizer
// updates) so that they fill the GPU around it instead of slowing it. Any other entry goes
// on the lane of its latest dependency where that lane ran nothing since; else on a lane
// whose last entry it waits for anyway, or an unused one; only where none is left on the
// lane idle longest, which orders it after that lane's last entry as well (an edge the
// order lacks).
struct Lanes {
  std::vector<int> lane;
  std::vector<std::vector<std::size_t>> waits;
  int used = 0;
  bool critical_lane = false;  // lane 0 holds the critical chain alone
};
Lanes assign_lanes(const Capture& c, const Order& order, int max_lanes);

}  // namespace fm::capture
