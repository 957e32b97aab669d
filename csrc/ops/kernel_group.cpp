#include "native_path.h"

#include <atomic>

namespace fm {
namespace {
std::atomic<bool> g_fast{true};
std::atomic<std::uint32_t> g_group{0};
}  // namespace

bool use_cpu_fast_path(const Backend& b) { return g_fast.load() && b.name() == "cpu"; }
void set_cpu_fast_path(bool enabled) { g_fast.store(enabled); }
bool cpu_fast_path_enabled() { return g_fast.load(); }
void set_kernel_group_size(std::uint32_t threads) { g_group.store(threads); }
std::uint32_t kernel_group_size() { return g_group.load(); }

}  // namespace fm
