// The backend interface: everything an op needs from a device, and nothing more.
//
// Backends: one folder each under csrc/backend/, which registers itself (registry.h).
// Ops validate their arguments first, then call allocate/wrap_host and launch with
// kernels found by host name (the names FM_INSTANTIATE gives in metal/*.metal).
//
// Invariants every backend keeps. Any number of Python threads call ops at once (the GIL
// is released around launch and around every wait), all on one Backend object; each is
// checked on every device by tests/test_backend_invariants.py.
//  0. Asynchrony. An op launches its kernels and calls end_op(); it does not wait for the
//     device. The host waits only where it touches memory: copy_to_host, wait_for_host
//     (buffer protocol, NumPy views, DLPack / __cuda_array_interface__ exports), and
//     synchronize(). end_op() waits only when the op's launches on this thread used memory
//     shared with the host (wrap_host shared it, or Storage::copied_from must be written
//     back): the caller owns that memory again when the op returns, so NumPy in -> NumPy
//     out is complete on return. host_waits() counts the waits (a debug counter for tests:
//     a chain of ops on device Arrays adds none). Synchronous backends (cpu) do all of this
//     trivially.
//  1. Pooled blocks. A block goes back to the pool only when its Storage dies, and no work
//     queued before that can touch it once someone else acquires it: either the backend
//     keeps a Storage named by a launch alive until that launch has finished (metal: until
//     its command buffer completed, then released on a caller's thread, never a driver
//     thread), or every later use of the block is ordered after every earlier one (cuda:
//     one stream carries all kernels and copies, and a block is given back to the driver
//     only after that stream drained). So whichever thread acquires a block next, no queued
//     or running kernel still reads or writes it: a thread never sees another thread's
//     data, and its writes never land in a block another thread now owns.
//  2. synchronize() returns only after every launch and copy queued before the call, by any
//     thread, has finished; it may run concurrently with launches from other threads (work
//     queued after it began may or may not be waited for). Afterwards the kept-alive
//     Storages of the finished work are released. A failure of queued work (a kernel fault,
//     a failed command buffer) surfaces as BackendError (RuntimeError) from the next wait
//     or launch.
//  3. Host visibility. copy_to_host is synchronous and ordered after all work queued before
//     it (by any thread); copy_from_host is ordered after queued work and before later
//     kernels, and the host buffer may be reused as soon as it returns (it may return before
//     the data reached the device). On host-visible backends kernel results are visible at
//     Storage::host after wait_for_host(storage) or synchronize().
//  4. Wrapped host memory. wrap_host either shares the memory, then `owner` keeps it alive
//     for as long as the Storage (and so every Array and queued launch using it) lives, or
//     copies it before returning and never touches `ptr` again except through
//     copy_to_host into Storage::copied_from (an out= that could not be shared), which the
//     op does while it still holds the user's array.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/storage.h"

namespace fm {

struct NativeOp;  // native_ops.h
struct KernelArg;
struct Dispatch;
namespace capture {  // capture.h
class Capture;
bool on_launch(const std::string& kernel, const Dispatch& d, const std::vector<KernelArg>& args);
bool on_upload(Storage& dst, std::size_t offset, const void* src, std::size_t n);
}  // namespace capture


// A kernel argument: a buffer (storage + byte offset) or a small block of bytes
// (an argument struct, passed like Metal's setBytes).
struct KernelArg {
  StoragePtr storage;
  std::size_t offset = 0;
  const void* bytes = nullptr;
  std::size_t size = 0;

  static KernelArg buffer(StoragePtr s, std::size_t byte_offset = 0) {
    KernelArg a;
    a.storage = std::move(s);
    a.offset = byte_offset;
    return a;
  }
  static KernelArg inline_bytes(const void* p, std::size_t n) {
    KernelArg a;
    a.bytes = p;
    a.size = n;
    return a;
  }
};

// Grid in threads (Metal's dispatchThreads): threads past `grid` do not exist, the last
// threadgroup along an axis may be partial. Kernels that use barriers are launched with a
// grid that is a multiple of `group` and check bounds themselves.
struct Dispatch {
  std::uint32_t grid[3] = {1, 1, 1};
  std::uint32_t group[3] = {1, 1, 1};
  // Work of one thread relative to one elementwise op (a thread that sums K terms for 64
  // samples: 64 K). The CPU backend sizes its tasks by total work; GPUs ignore it.
  std::uint64_t cost = 1;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Memory readable and writable by the CPU at Storage::host (buffer protocol works).
  virtual bool host_visible() const = 0;
  // Contiguous and row-broadcast elementwise ops run in 16-byte chunks, several a thread (the
  // *_w and *_rw kernels): on a GPU wide accesses are what reach memory bandwidth; the
  // CPU's kernels vectorise across threads instead, so it keeps the one-element kernels.
  virtual bool wide_elementwise() const { return false; }
  // Threads the device runs at once (multiprocessors x resident threads each), for grids
  // sized to the device; 0 where unknown.
  virtual std::int64_t resident_threads() const { return 0; }
  // Grid threads run one after another on a few cores (the CPU): per-element index division
  // is not hidden by memory latency, so strided ops of many dims are launched as several
  // 3-dim blocks instead of one *_g launch (GPUs pay per launch and keep the one).
  virtual bool serial_grid() const { return false; }

  // ---- what the device is, asked by capability rather than by backend name
  // A GPU with its own memory across a bus (an NVIDIA card), as opposed to the CPU or a GPU
  // sharing the host's memory (Apple's).
  virtual bool discrete_gpu() const { return false; }
  // Whether the device computes in double: float64 Arrays exist there (Apple GPUs have no
  // double; there NumPy float64 input computes in float32).
  virtual bool has_float64() const { return true; }
  // Which measured family of kernel shapes (GEMM tiles, Winograd, split-K: ops/conv2d.cpp)
  // suits the device. The discrete shapes were measured on an H100; a new discrete backend
  // opts in once measured, and until then takes the unified-memory shapes.
  enum class TileFamily { unified_memory, discrete_gpu };
  virtual TileFamily preferred_tiles() const { return TileFamily::unified_memory; }
  // The device as DLPack names it (__dlpack_device__): {device type, device id}. Default
  // kDLCPU (1): host-visible memory is exported through NumPy as host memory.
  struct DLPackDevice {
    std::int32_t type, id;
  };
  virtual DLPackDevice dlpack_device() const { return {1, 0}; }
  // Whether Arrays on this device export __cuda_array_interface__ (CUDA device memory).
  virtual bool cuda_array_interface() const { return false; }
  // The queue every kernel and copy goes onto, for engines that order their own work after
  // it without the host waiting (NCCL's collectives: a cudaStream_t on cuda); null where
  // the device has no such handle.
  virtual void* queue_handle() const { return nullptr; }

  // Page-aligned, from a caching pool; contents undefined.
  virtual StoragePtr allocate(std::size_t nbytes) = 0;
  // Make `nbytes` of host memory at `ptr` usable by kernels, sharing it where the device
  // allows (always on cpu; page-aligned regions on metal), else copying it into a new
  // allocation and setting Storage::copied_from. `owner` keeps the memory alive for as
  // long as the Storage lives.
  virtual StoragePtr wrap_host(void* ptr, std::size_t nbytes, std::shared_ptr<void> owner) = 0;

  // Enqueue a kernel; args[i] binds the kernel parameter [[buffer(i)]]. Buffers named by
  // `args` stay alive until it has run (the Storage shared_ptrs are held). Raises
  // BackendError for unknown kernels and driver failures. While the calling thread records
  // a capture (capture.h) the launch is also recorded; while it patches one, the launch
  // only rewrites the recorded launch's argument blocks and does not run.
  void launch(const std::string& kernel, const Dispatch& dispatch,
              const std::vector<KernelArg>& args) {
    if (!capture::on_launch(kernel, dispatch, args)) run_kernel(kernel, dispatch, args);
  }
  // What launch() does on this device (each backend's own; capture replays call it too).
  virtual void run_kernel(const std::string& kernel, const Dispatch& dispatch,
                          const std::vector<KernelArg>& args) = 0;
  // Runs a capture's recorded work once more (capture.cpp has the portable loop over
  // run_kernel, native host calls and uploads; CUDA replays a CUDA graph instead).
  virtual void replay(capture::Capture& c);
  // Wait for all queued work of every thread (invariant 2). Called without the GIL.
  virtual void synchronize() = 0;
  // Called by an op after its launches (invariant 0): returns at once unless this thread's
  // launches since its last end_op() used host-shared memory, then waits for them.
  virtual void end_op() {}
  // The host is about to read or write `storage` directly (invariant 3): wait until no
  // queued work uses it. Called without the GIL.
  virtual void wait_for_host(const Storage& storage) {
    (void)storage;
    synchronize();
  }
  // Times the host has waited for this device (synchronize, copy_to_host, wait_for_host).
  std::uint64_t host_waits() const { return host_waits_.load(std::memory_order_relaxed); }

  // Threads per group that suit a 1-D elementwise kernel on this device.
  virtual std::uint32_t preferred_group_size(const std::string& kernel) = 0;
  // Largest threadgroup the kernel can be launched with.
  virtual std::uint32_t max_group_size(const std::string& kernel) = 0;
  // True where `kernel` exists on this backend.
  virtual bool has_kernel(const std::string& kernel) = 0;
  // Bit i set where the kernel may write its argument i (a buffer not declared const in its
  // MSL signature); all bits where the backend does not know (capture_order.h).
  virtual std::uint32_t written_args(const std::string& /*kernel*/) const { return ~0u; }
  // The backend's own implementation of the operation `name` (a fast path), or nullptr:
  // the op then launches the portable MSL kernels. Ops call native<Fn>() (native_ops.h).
  virtual const NativeOp* native_op(const char* /*name*/) const { return nullptr; }

  // Copies between host memory and a storage (for backends without host-visible memory;
  // host-visible backends do a memcpy). Ordered after queued work (invariant 3).
  virtual void copy_to_host(const Storage& src, std::size_t offset, void* dst, std::size_t n);
  // Recorded (and patched) like launch() under a capture.
  void copy_from_host(Storage& dst, std::size_t offset, const void* src, std::size_t n) {
    if (!capture::on_upload(dst, offset, src, n)) write_from_host(dst, offset, src, n);
  }
  virtual void write_from_host(Storage& dst, std::size_t offset, const void* src, std::size_t n);

 protected:
  void count_host_wait() { host_waits_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> host_waits_{0};
};

// ---- the device registry (backend/registry.cpp) ----
std::vector<std::string> available_devices();       // best first, the CPU always last
std::vector<std::string> device_problems();         // why each missing backend is missing
Backend& get_backend(const std::string& name);        // ValueError if unknown/unavailable
Backend& default_backend();
std::string default_device();
void set_default_device(const std::string& name);

}  // namespace fm
