// The CPU backend: kernels from metal/*.metal compiled as C++ (generated entries), run
// on a thread pool; memory is ordinary page-aligned host memory.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <new>

#include <unistd.h>

#include "../../core/allocator.h"
#include "../../core/errors.h"
#include "../launch.h"
#include "../registry.h"
#include "cpu_env.h"
#include "cpu_kernel_abi.h"
#include "native_ops.h"
#include "thread_pool.h"

namespace fm::cpu {
namespace {

constexpr std::size_t kAlign = 16384;
// Below this much work (in elementwise-op units, Dispatch::cost) a launch runs on the
// calling thread: waking workers costs more.
constexpr std::uint64_t kMinWorkPerTask = 16384;

std::uint32_t ceil_div(std::uint32_t a, std::uint32_t b) { return (a + b - 1) / b; }

// More than the machine's physical memory cannot be used, but where the kernel overcommits
// (vm.overcommit_memory=1, common in containers) aligned_alloc still succeeds and the
// process is killed when the pages are touched: refuse it up front (MemoryError).
std::size_t physical_memory_bytes() {
  static const std::size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? std::size_t(pages) * std::size_t(page) : SIZE_MAX;
  }();
  return bytes;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend()
      : pool_(
            [](std::size_t n) {
              CachingAllocator::Block b;
              b.host = n <= physical_memory_bytes() ? std::aligned_alloc(kAlign, n) : nullptr;
              b.size = n;
              return b;
            },
            [](const CachingAllocator::Block& b) { std::free(b.host); },
            std::size_t(1) << 30) {}

  std::string name() const override { return "cpu"; }
  bool host_visible() const override { return true; }
  bool serial_grid() const override { return true; }

  StoragePtr allocate(std::size_t nbytes) override {
    CachingAllocator::Block b = pool_.acquire(nbytes);
    if (b.host == nullptr) throw BackendError("[fastmetal] out of host memory allocating " +
                                              std::to_string(nbytes) + " bytes");
    return pooled_storage(this, pool_, b, nbytes);
  }

  StoragePtr wrap_host(void* ptr, std::size_t nbytes, std::shared_ptr<void> owner) override {
    auto s = std::make_shared<Storage>();
    s->backend = this;
    s->host = ptr;
    s->nbytes = nbytes;
    s->owner = std::move(owner);
    return s;
  }

  void run_kernel(const std::string& kernel, const Dispatch& d,
                  const std::vector<KernelArg>& args) override {
    constexpr std::size_t kMaxArgs = 32;
    const KernelInfo* info =
        &checked_kernel(kernel_table().find(kernel), "CPU", kernel, args.size(), kMaxArgs);
    void* ptrs[kMaxArgs];
    for (std::size_t i = 0; i < args.size(); ++i)  // argument blocks are read in place
      ptrs[i] = args[i].storage ? buffer_address(args[i], args[i].storage->host)
                                : const_cast<void*>(args[i].bytes);
    const GroupCounts counts = group_counts(d);
    Launch L;
    L.grid = uvec3{d.grid[0], d.grid[1], d.grid[2]};
    L.group = uvec3{counts.group[0], counts.group[1], counts.group[2]};
    L.num_groups = uvec3{counts.num_groups[0], counts.num_groups[1], counts.num_groups[2]};
    const std::uint64_t total = std::uint64_t(L.grid.x) * L.grid.y * L.grid.z;
    if (total == 0) return;
    ThreadPool& pool = ThreadPool::instance();
    std::uint64_t tasks = std::min<std::uint64_t>(4 * std::uint64_t(pool.num_threads()),
                                                  std::max<std::uint64_t>(1, total * std::max<std::uint64_t>(1, d.cost) / kMinWorkPerTask));
    if (pool.num_threads() == 1) tasks = 1;
    void* const* a = ptrs;

    if (info->mode == Mode::grid) {
      L.lo = uvec3{0, 0, 0};
      L.hi = L.grid;
      if (tasks == 1) {  // small launch: run here, no pool round trip
        info->fn(L, a);
        return;
      }
      // Split along the outermost axis that has enough extent; keep x chunks whole cache lines.
      int axis = L.grid.z >= tasks ? 2 : (L.grid.z == 1 && L.grid.y >= tasks ? 1 : 0);
      const std::uint32_t extent = axis == 2 ? L.grid.z : axis == 1 ? L.grid.y : L.grid.x;
      tasks = std::min<std::uint64_t>(tasks, extent);
      std::uint32_t chunk = ceil_div(extent, std::uint32_t(tasks));
      if (axis == 0 && d.cost <= 1) chunk = (chunk + 63) / 64 * 64;  // cheap threads: whole cache lines
      const std::int64_t n = ceil_div(extent, chunk);
      pool.parallel_for(n, [&](std::int64_t t) {
        Launch part = L;
        const std::uint32_t lo = std::uint32_t(t) * chunk;
        const std::uint32_t hi = std::min(extent, lo + chunk);
        (axis == 2 ? part.lo.z : axis == 1 ? part.lo.y : part.lo.x) = lo;
        (axis == 2 ? part.hi.z : axis == 1 ? part.hi.y : part.hi.x) = hi;
        info->fn(part, a);
      });
      return;
    }
    const std::uint64_t groups = counts.total_groups();
    if (info->mode == Mode::emulated) tasks = 1;  // one seed, one order: reproducible runs
    tasks = std::min(tasks, groups);
    const std::uint64_t per = (groups + tasks - 1) / tasks;
    pool.parallel_for(std::int64_t((groups + per - 1) / per), [&](std::int64_t t) {
      Launch part = L;
      part.group_begin = std::uint64_t(t) * per;
      part.group_end = std::min(groups, part.group_begin + per);
      info->fn(part, a);
    });
  }

  // Launches run to completion before they return: nothing is ever pending.
  void synchronize() override {}
  void wait_for_host(const Storage&) override {}
  std::uint32_t preferred_group_size(const std::string&) override { return 256; }
  std::uint32_t max_group_size(const std::string&) override { return 1024; }
  bool has_kernel(const std::string& kernel) override {
    return kernel_table().find(kernel) != nullptr;
  }
  std::uint32_t written_args(const std::string& kernel) const override {
    const KernelInfo* info = kernel_table().find(kernel);
    return info != nullptr ? info->writes : ~0u;
  }
  const NativeOp* native_op(const char* name) const override { return native_ops().find(name); }

 private:
  CachingAllocator pool_;
};

// Always available, so ranked last: a GPU, where there is one, is the default device.
// Choosing the kernels' instruction set and reading the thread count here reports a
// FASTMETAL_CPU_ISA or FASTMETAL_NUM_THREADS it does not understand together with the
// other settings, when the registry is built (env::config_problems).
std::unique_ptr<Backend> make_cpu_backend(std::string&) {
  env_num_threads();
  kernel_isa();
  return std::make_unique<CpuBackend>();
}

FM_REGISTER_BACKEND("cpu", 100, &make_cpu_backend);

}  // namespace

}  // namespace fm::cpu

