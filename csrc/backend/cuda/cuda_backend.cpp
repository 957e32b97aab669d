#include "cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "../../core/allocator.h"
#include "../../core/errors.h"
#include "../launch.h"
#include "../registry.h"
#include "cuda_kernel_abi.h"

#include "kernel_stems.h"

namespace fm::cuda_kernels {
using KernelTable = ::fm::cudak::KernelTable;
FM_GENERATED_KERNELS
}

namespace fm::cudak {
const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable t;
    cuda_kernels::register_kernels(t);
    return t;
  }();
  return table;
}
}  // namespace fm::cudak

namespace fm::cuda {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw BackendError(std::string("[fastmetal] CUDA ") + what + " failed: " +
                       cudaGetErrorString(err));
}

constexpr unsigned kMaxBlocksYZ = 65535;

// Execution model (backend.h, invariants 0-3): every kernel and copy goes onto one
// non-blocking stream, in the order the host issued them (under mu_). Nothing is kept alive
// for queued work: a Storage that dies while a kernel still uses it returns its block to the
// pool, and whoever acquires that block next can only use it through work queued later on
// the same stream. Blocks go back to the driver (cudaFree) only after the stream drained.
// The host waits in copy_to_host, wait_for_host and synchronize, without the GIL.
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device)
      : device_(device),
        pool_(
            [device](std::size_t n) {
              CachingAllocator::Block b;
              cudaSetDevice(device);
              if (cudaMalloc(&b.handle, n) != cudaSuccess) {
                cudaGetLastError();  // clear the sticky error of the failed allocation
                b.handle = nullptr;
              }
              b.size = n;
              return b;
            },
            [this, device](const CachingAllocator::Block& b) {
              cudaSetDevice(device);
              // Queued kernels may still use the block: let them finish before the driver
              // takes it back (and perhaps hands it to another allocation).
              if (stream_ != nullptr) cudaStreamSynchronize(stream_);
              cudaFree(b.handle);
            },
            std::size_t(4) << 30) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    int sms = 0, per_sm = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_), "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device_),
          "cudaDeviceGetAttribute");
    resident_threads_ = std::int64_t(sms) * per_sm;
    // Tuning hook: FASTMETAL_CUDA_INLINE_ARGS=0 sends every argument block through device
    // memory instead of the launch parameters (to compare the two).
    const char* inline_env = std::getenv("FASTMETAL_CUDA_INLINE_ARGS");
    inline_args_ = inline_env == nullptr || std::string(inline_env) != "0";
  }

  std::string name() const override { return "cuda"; }
  bool host_visible() const override { return false; }
  bool discrete_gpu() const override { return true; }
  TileFamily preferred_tiles() const override { return TileFamily::discrete_gpu; }
  DLPackDevice dlpack_device() const override { return {2, 0}; }  // kDLCUDA, the current device
  bool cuda_array_interface() const override { return true; }
  bool wide_elementwise() const override { return true; }
  std::int64_t resident_threads() const override { return resident_threads_; }

  StoragePtr allocate(std::size_t nbytes) override {
    CachingAllocator::Block b = pool_.acquire(nbytes);
    if (b.handle == nullptr)
      throw BackendError("[fastmetal] CUDA out of memory allocating " + std::to_string(nbytes) +
                         " bytes");
    return pooled_storage(this, pool_, b, nbytes);
  }

  StoragePtr wrap_host(void* ptr, std::size_t nbytes, std::shared_ptr<void>) override {
    StoragePtr s = allocate(nbytes);
    copy_from_host(*s, 0, ptr, nbytes);
    s->copied_from = ptr;
    return s;
  }

  void launch(const std::string& kernel, const Dispatch& d,
              const std::vector<KernelArg>& args) override {
    const cudak::KernelInfo* info = &checked_kernel(cudak::kernel_table().find(kernel), "CUDA",
                                                    kernel, args.size(), cudak::kMaxArgs);
    const GroupCounts counts = group_counts(d);
    if (counts.num_groups[0] == 0 || counts.num_groups[1] == 0 || counts.num_groups[2] == 0)
      return;
    cudak::Args a;
    std::size_t used = 0;
    std::vector<StoragePtr> blocks;  // argument blocks too large to travel inline
    for (std::size_t i = 0; i < args.size(); ++i) {
      a.inline_at[i] = 0;
      if (args[i].storage) {
        a.ptr[i] = buffer_address(args[i], args[i].storage->handle);
        continue;
      }
      a.ptr[i] = nullptr;
      const std::size_t at = (used + 15) / 16 * 16;
      if (inline_args_ && ((info->inline_ok >> i) & 1u) != 0 && at + args[i].size <= sizeof a.bytes) {
        std::memcpy(a.bytes + at, args[i].bytes, args[i].size);
        a.inline_at[i] = static_cast<unsigned short>(at + 1);
        used = at + args[i].size;
      } else {
        blocks.push_back(allocate(args[i].size));
      }
    }
    for (std::size_t i = args.size(); i < std::size_t(cudak::kMaxArgs); ++i) {
      a.ptr[i] = nullptr;
      a.inline_at[i] = 0;
    }
    const dim3 block(counts.group[0], counts.group[1], counts.group[2]);
    cudak::Dims dims;
    dims.grid = cudak::u3{d.grid[0], d.grid[1], d.grid[2]};
    dims.num_groups = cudak::u3{counts.num_groups[0], counts.num_groups[1], counts.num_groups[2]};
    std::lock_guard<std::mutex> lock(mu_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    for (std::size_t i = 0, next = 0; i < args.size(); ++i) {
      if (args[i].storage || a.inline_at[i] != 0) continue;
      // Pageable source: staged by the driver before the call returns, copied in stream
      // order. The block may die right after the launch (stream order protects it).
      StoragePtr& blk = blocks[next++];
      check(cudaMemcpyAsync(blk->handle, args[i].bytes, args[i].size, cudaMemcpyHostToDevice,
                            stream_),
            "cudaMemcpyAsync");
      a.ptr[i] = blk->handle;
    }
    // CUDA caps blocks along y and z at 65535: launch such grids in slabs.
    for (unsigned z0 = 0; z0 < dims.num_groups.z; z0 += kMaxBlocksYZ)
      for (unsigned y0 = 0; y0 < dims.num_groups.y; y0 += kMaxBlocksYZ) {
        dims.block_offset = cudak::u3{0, y0, z0};
        const dim3 grid(dims.num_groups.x, std::min(kMaxBlocksYZ, dims.num_groups.y - y0),
                        std::min(kMaxBlocksYZ, dims.num_groups.z - z0));
        void* params[] = {&a, &dims};
        check(cudaLaunchKernel(info->fn, grid, block, params, 0, stream_), "kernel launch");
      }
  }

  void synchronize() override {
    count_host_wait();
    std::lock_guard<std::mutex> lock(mu_);
    drain_locked();
  }
  void wait_for_host(const Storage&) override { synchronize(); }

  std::uint32_t preferred_group_size(const std::string&) override { return 256; }
  std::uint32_t max_group_size(const std::string&) override { return 1024; }
  bool has_kernel(const std::string& kernel) override {
    return cudak::kernel_table().find(kernel) != nullptr;
  }

  // Copies go through stream_, behind the kernels already queued there: a plain cudaMemcpy
  // runs on the legacy default stream, which a non-blocking stream does not wait for.
  void copy_to_host(const Storage& src, std::size_t offset, void* dst, std::size_t n) override {
    if (n == 0) return;
    count_host_wait();
    std::lock_guard<std::mutex> lock(mu_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpyAsync(dst, static_cast<const char*>(src.handle) + offset, n,
                          cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync to host");
    drain_locked();
  }
  // From pageable memory the driver stages `src` before returning (so the caller may reuse
  // it at once); the copy itself runs in stream order, before any kernel queued later.
  void copy_from_host(Storage& dst, std::size_t offset, const void* src, std::size_t n) override {
    if (n == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpyAsync(static_cast<char*>(dst.handle) + offset, src, n,
                          cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync from host");
  }

 private:
  // Waits for everything queued on stream_ (by any thread); a kernel's fault surfaces here.
  void drain_locked() {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamSynchronize(stream_), "synchronize");
  }

  int device_;
  std::int64_t resident_threads_ = 0;
  bool inline_args_ = true;
  cudaStream_t stream_ = nullptr;  // before pool_: the pool's free waits on it
  CachingAllocator pool_;
  std::mutex mu_;  // orders launches and copies of all threads on stream_
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return nullptr;
  }
  try {
    return std::make_unique<CudaBackend>(0);
  } catch (const BackendError&) {
    return nullptr;
  }
}

FM_REGISTER_BACKEND("cuda", 20, [](std::string& why_not) {
  std::unique_ptr<Backend> b = make_cuda_backend();
  if (!b)
    why_not = "no usable NVIDIA GPU found (no device, no driver, or the driver is older than "
              "the CUDA runtime this was built with)";
  return b;
});

}  // namespace fm::cuda
