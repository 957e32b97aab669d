#include "kernel_group.h"

#include <atomic>

namespace fm {
namespace {
std::atomic<std::uint32_t> g_group{0};
}  // namespace

void set_kernel_group_size(std::uint32_t threads) { g_group.store(threads); }
std::uint32_t kernel_group_size() { return g_group.load(); }

}  // namespace fm
