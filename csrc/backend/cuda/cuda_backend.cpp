#include "cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "../../core/allocator.h"
#include "../../core/errors.h"
#include "../capture.h"
#include "../capture_order.h"
#include "../env_config.h"
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
  void* queue_handle() const override { return stream_; }
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

  void run_kernel(const std::string& kernel, const Dispatch& d,
                  const std::vector<KernelArg>& args) override {
    launch_on(stream_, kernel, d, args);
  }

  // run_kernel onto stream `s` (a compiled step's graph records its branches on several);
  // a `priority` other than 0 goes with the launch (a graph's critical chain).
  void launch_on(cudaStream_t s, const std::string& kernel, const Dispatch& d,
                 const std::vector<KernelArg>& args, int priority = 0) {
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
    std::lock_guard<std::recursive_mutex> lock(mu_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    for (std::size_t i = 0, next = 0; i < args.size(); ++i) {
      if (args[i].storage || a.inline_at[i] != 0) continue;
      // Pageable source: staged by the driver before the call returns, copied in stream
      // order. The block may die right after the launch (stream order protects it).
      StoragePtr& blk = blocks[next++];
      check(cudaMemcpyAsync(blk->handle, args[i].bytes, args[i].size, cudaMemcpyHostToDevice, s),
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
        if (priority == 0) {
          check(cudaLaunchKernel(info->fn, grid, block, params, 0, s), "kernel launch");
          continue;
        }
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributePriority;
        attr.val.priority = priority;
        cudaLaunchConfig_t config{};
        config.gridDim = grid;
        config.blockDim = block;
        config.stream = s;
        config.attrs = &attr;
        config.numAttrs = 1;
        check(cudaLaunchKernelExC(&config, info->fn, params), "kernel launch");
      }
  }

  // A capture replays as one CUDA graph, recorded at its first replay by running the
  // capture's launches under stream capture. The graph's kernels read their argument blocks
  // from a device copy of the capture's arena, so that a patch (a new dropout key, a new
  // learning rate) is one upload of the arena before the launch, not a new graph; recorded
  // copies from the host come from that copy too (a device-to-device copy node).
  struct GraphState {
    cudaGraphExec_t exec = nullptr;
    StoragePtr arena;  // the capture's arena on the device
    std::uint64_t generation = ~std::uint64_t(0);
    ~GraphState() {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
  };

  void replay(capture::Capture& c) override {
    if (c.size() == 0) return;
    if (!c.replay_order().empty()) return Backend::replay(c);  // a test's order: no graph
    std::lock_guard<std::recursive_mutex> lock(mu_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    auto state = std::static_pointer_cast<GraphState>(c.backend_state);
    if (!state) {
      state = std::make_shared<GraphState>();
      state->arena = allocate(std::max<std::size_t>(c.arena().size(), 16));
      record_graph(c, *state);
      c.backend_state = state;
    }
    if (state->generation != c.generation()) {
      check(cudaMemcpyAsync(state->arena->handle, c.arena().data(), c.arena().size(),
                            cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync of a capture's arguments");
      state->generation = c.generation();
    }
    check(cudaGraphLaunch(state->exec, stream_), "cudaGraphLaunch");
  }

  void synchronize() override {
    count_host_wait();
    std::lock_guard<std::recursive_mutex> lock(mu_);
    drain_locked();
  }
  void wait_for_host(const Storage&) override { synchronize(); }

  std::uint32_t preferred_group_size(const std::string&) override { return 256; }
  std::uint32_t max_group_size(const std::string&) override { return 1024; }
  bool has_kernel(const std::string& kernel) override {
    return cudak::kernel_table().find(kernel) != nullptr;
  }
  std::uint32_t written_args(const std::string& kernel) const override {
    const cudak::KernelInfo* info = cudak::kernel_table().find(kernel);
    return info != nullptr ? info->writes : ~0u;
  }

  // Copies go through stream_, behind the kernels already queued there: a plain cudaMemcpy
  // runs on the legacy default stream, which a non-blocking stream does not wait for.
  void copy_to_host(const Storage& src, std::size_t offset, void* dst, std::size_t n) override {
    if (n == 0) return;
    count_host_wait();
    std::lock_guard<std::recursive_mutex> lock(mu_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpyAsync(dst, static_cast<const char*>(src.handle) + offset, n,
                          cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync to host");
    drain_locked();
  }
  // From pageable memory the driver stages `src` before returning (so the caller may reuse
  // it at once); the copy itself runs in stream order, before any kernel queued later.
  void write_from_host(Storage& dst, std::size_t offset, const void* src, std::size_t n) override {
    if (n == 0) return;
    std::lock_guard<std::recursive_mutex> lock(mu_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpyAsync(static_cast<char*>(dst.handle) + offset, src, n,
                          cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync from host");
  }

 private:
  // Called with mu_ held. Host calls (the CPU's native ops) never exist on this device.
  // The graph's edges are the capture's data dependencies (capture_order.h), not its list
  // order: each launch is recorded on one of up to FASTMETAL_COMPILE_STREAMS capture
  // streams (capture::assign_lanes; forked from stream_, joined back at the end), after
  // waiting for the events of the launches it depends on that ran on other streams.
  // Independent launches (a layer's weight and bias gradients beside its input gradient,
  // the optimizer's update of a layer whose gradient is done) become parallel branches the
  // GPU may run side by side. One stream gives the list's order, a chain, as before.
  void record_graph(capture::Capture& c, GraphState& state) {
    const std::vector<capture::Entry>& entries = c.entries();
    const capture::Order order = capture::order_of(c);
    const capture::Lanes lanes =
        capture::assign_lanes(c, order, std::min<int>(env::compile_streams(), 1 + kSideStreams));
    // With a critical lane, every lane is a side stream (the critical one first, at the
    // device's highest priority) and stream_ only forks and joins them.
    std::vector<cudaStream_t> streams{lanes.critical_lane ? priority_stream() : stream_};
    for (int k = 1; k < lanes.used; ++k) streams.push_back(side_stream(std::size_t(k - 1)));
    const std::size_t first_side = lanes.critical_lane ? 0 : 1;
    // done[i]: recorded after entry i on its stream (waited for by dependents elsewhere).
    std::vector<cudaEvent_t> done(entries.size() + 1, nullptr);
    auto event = [&](std::size_t i) {
      if (done[i] == nullptr)
        check(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming), "cudaEventCreate");
      return done[i];
    };
    const std::size_t fork = entries.size();  // the event that joins the side streams
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
    try {
      check(cudaEventRecord(event(fork), stream_), "cudaEventRecord");
      for (std::size_t k = first_side; k < streams.size(); ++k)
        check(cudaStreamWaitEvent(streams[k], event(fork), 0), "cudaStreamWaitEvent");
      std::vector<KernelArg> args;
      for (std::size_t j = 0; j < entries.size(); ++j) {
        const capture::Entry& e = entries[j];
        if (e.kind == capture::Entry::Kind::host_call)
          throw BackendError("[fastmetal.compile] internal: a host call recorded on cuda");
        if (lanes.lane[j] < 0) continue;  // fused, or an empty upload
        cudaStream_t s = streams[std::size_t(lanes.lane[j])];
        for (std::size_t d : lanes.waits[j])
          check(cudaStreamWaitEvent(s, event(d), 0), "cudaStreamWaitEvent");
        if (e.kind == capture::Entry::Kind::kernel) {
          args = e.args;
          for (const auto& [i, at] : e.blocks) args[i] = KernelArg::buffer(state.arena, at);
          launch_on(s, e.kernel, e.dispatch, args,
                    lanes.critical_lane && lanes.lane[j] == 0 ? high_priority_ : 0);
        } else {
          check(cudaMemcpyAsync(static_cast<char*>(e.dst->handle) + e.dst_offset,
                                static_cast<const char*>(state.arena->handle) + e.at, e.n,
                                cudaMemcpyDeviceToDevice, s),
                "cudaMemcpyAsync in a capture");
        }
        if (streams.size() > 1) check(cudaEventRecord(event(j), s), "cudaEventRecord");
      }
      for (std::size_t k = first_side; k < streams.size(); ++k) {  // join: stream_ waits for all
        check(cudaEventRecord(event(fork), streams[k]), "cudaEventRecord");
        check(cudaStreamWaitEvent(stream_, event(fork), 0), "cudaStreamWaitEvent");
      }
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      destroy_events(done);
      throw;
    }
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    destroy_events(done);  // the captured waits are graph edges now
    check(ended, "cudaStreamEndCapture");
    const cudaError_t made = cudaGraphInstantiateWithFlags(
        &state.exec, graph, lanes.critical_lane ? cudaGraphInstantiateFlagUseNodePriority : 0);
    cudaGraphDestroy(graph);
    check(made, "cudaGraphInstantiate");
  }

  static void destroy_events(std::vector<cudaEvent_t>& events) {
    for (cudaEvent_t& ev : events)
      if (ev != nullptr) cudaEventDestroy(ev), ev = nullptr;
  }

  // The stream a graph's critical chain is recorded on, at the device's highest priority.
  cudaStream_t priority_stream() {
    if (priority_ == nullptr) {
      int least = 0, greatest = 0;
      check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
      high_priority_ = greatest;
      check(cudaStreamCreateWithPriority(&priority_, cudaStreamNonBlocking, greatest),
            "cudaStreamCreateWithPriority");
    }
    return priority_;
  }

  // The k-th extra stream a graph is recorded on, made at first use.
  cudaStream_t side_stream(std::size_t k) {
    if (side_[k] == nullptr)
      check(cudaStreamCreateWithFlags(&side_[k], cudaStreamNonBlocking), "cudaStreamCreate");
    return side_[k];
  }

  // Waits for everything queued on stream_ (by any thread); a kernel's fault surfaces here.
  void drain_locked() {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamSynchronize(stream_), "synchronize");
  }

  int device_;
  std::int64_t resident_threads_ = 0;
  bool inline_args_ = true;
  cudaStream_t stream_ = nullptr;  // before pool_: the pool's free waits on it
  // Streams only a graph's recording uses (record_graph): work never runs on them.
  static constexpr std::size_t kSideStreams = 7;
  cudaStream_t side_[kSideStreams] = {};
  cudaStream_t priority_ = nullptr;
  int high_priority_ = 0;
  CachingAllocator pool_;
  // Orders launches and copies of all threads on stream_; recursive because replay() holds
  // it while run_kernel() records a CUDA graph (no other thread may enqueue meanwhile).
  std::recursive_mutex mu_;
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
