// Which recorded launches of a capture must run after which (fastmetal.compile).
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
// `device const T*` buffers are read, other `device` buffers may be written (the caller's
// `writes` mask); argument blocks live in the capture's arena, which the replay only reads.
// Uploads write their destination. A host call (CPU native ops) is ordered after everything
// before it and before everything after it.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "capture.h"

namespace fm::capture {

// For each entry, the earlier entries it must wait for directly: none for skipped (fused)
// entries; for the rest a set with no entry that another of the set already waits for
// (transitively), in decreasing order. `writes(e)`: bit i set where kernel entry e's
// argument i may be written.
// Where an allocation starts, as dependencies() compares them.
std::uintptr_t allocation_address(const Storage& s);

std::vector<std::vector<std::size_t>> dependencies(
    const Capture& c, const std::function<std::uint32_t(const Entry&)>& writes);

}  // namespace fm::capture
