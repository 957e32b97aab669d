#include "cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
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
            [device](const CachingAllocator::Block& b) {
              cudaSetDevice(device);
              cudaFree(b.handle);
            },
            std::size_t(4) << 30) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }

  std::string name() const override { return "cuda"; }
  bool host_visible() const override { return false; }
  bool wide_elementwise() const override { return true; }

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
    std::lock_guard<std::mutex> lock(mu_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    cudak::Args a{};
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (args[i].storage) {
        a.ptr[i] = buffer_address(args[i], args[i].storage->handle);
      } else {
        // Argument blocks live in device memory until the stream has run the kernel.
        StoragePtr block = allocate(args[i].size);
        check(cudaMemcpyAsync(block->handle, args[i].bytes, args[i].size, cudaMemcpyHostToDevice,
                              stream_),
              "cudaMemcpyAsync");
        a.ptr[i] = block->handle;
        pending_.push_back(std::move(block));
      }
    }
    for (const auto& arg : args)
      if (arg.storage) pending_.push_back(arg.storage);
    const GroupCounts counts = group_counts(d);
    const dim3 block(counts.group[0], counts.group[1], counts.group[2]);
    cudak::Dims dims;
    dims.grid = cudak::u3{d.grid[0], d.grid[1], d.grid[2]};
    dims.num_groups = cudak::u3{counts.num_groups[0], counts.num_groups[1], counts.num_groups[2]};
    if (dims.num_groups.x == 0 || dims.num_groups.y == 0 || dims.num_groups.z == 0) return;
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
    std::vector<StoragePtr> done;
    std::lock_guard<std::mutex> lock(mu_);
    finish_locked(done);
  }

  std::uint32_t preferred_group_size(const std::string&) override { return 256; }
  std::uint32_t max_group_size(const std::string&) override { return 1024; }
  bool has_kernel(const std::string& kernel) override {
    return cudak::kernel_table().find(kernel) != nullptr;
  }

  // Copies go through stream_, behind the kernels already queued there: a plain cudaMemcpy
  // runs on the legacy default stream, which a non-blocking stream does not wait for, and
  // from pageable memory it returns before the data has reached the device, so a kernel
  // queued next on stream_ could read the block's previous contents.
  void copy_to_host(const Storage& src, std::size_t offset, void* dst, std::size_t n) override {
    if (n == 0) return;
    std::vector<StoragePtr> done;
    std::lock_guard<std::mutex> lock(mu_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpyAsync(dst, static_cast<const char*>(src.handle) + offset, n,
                          cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync to host");
    finish_locked(done);
  }
  void copy_from_host(Storage& dst, std::size_t offset, const void* src, std::size_t n) override {
    if (n == 0) return;
    std::vector<StoragePtr> done;
    std::lock_guard<std::mutex> lock(mu_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpyAsync(static_cast<char*>(dst.handle) + offset, src, n,
                          cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync from host");
    // Synchronous for the caller: `src` may be freed or reused as soon as this returns.
    finish_locked(done);
  }

 private:
  // Waits for everything queued on stream_ (by any thread) and hands the storages those
  // launches kept alive to `done`, which the caller destroys after releasing mu_ (their
  // release returns blocks to the pool, which takes its own lock).
  void finish_locked(std::vector<StoragePtr>& done) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamSynchronize(stream_), "synchronize");
    done.swap(pending_);
  }

  int device_;
  CachingAllocator pool_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  std::vector<StoragePtr> pending_;  // kept alive until the stream has used them
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
