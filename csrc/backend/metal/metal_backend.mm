// The Metal backend: one device, one command queue, the kernels of metal/*.metal from the
// metallib embedded in this binary (metallib_embed.S), pipelines found by host name.
//
// Execution model: launch() encodes into the current command buffer (one serial compute
// encoder, so each dispatch sees the writes of the one before) and returns; ops do not wait
// (end_op() waits only for ops that used memory shared with the caller, backend.h
// invariant 0). synchronize() and wait_for_host() commit and wait for every command buffer
// committed before they began, by any thread (command_tracker.h); each commit also retires
// the command buffers that have completed, so their blocks return to the pool. Every buffer a launch names is kept (StoragePtr) until its command
// buffer has completed, and only then dropped, on a caller's thread: pooled memory cannot be reused and Python owners
// cannot be freed while the GPU may still touch them, and no Metal thread ever runs
// Python code (keep_alive takes the GIL itself; callers release it around launch/sync).
//
// Every entry runs inside @autoreleasepool. Exceptions never unwind through one (an
// exception leaving @autoreleasepool leaves the pool undrained): see pooled().
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <dispatch/dispatch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../../core/allocator.h"
#include "../../core/errors.h"
#include "../capture.h"
#include "../launch.h"
#include "command_tracker.h"
#include "dispatch_math.h"
#include "metal_backend.h"
#include "../registry.h"

#if !__has_feature(objc_arc)
#error "metal_backend.mm must be compiled with -fobjc-arc"
#endif

// The metallib bytes, placed in the binary by metallib_embed.S (.incbin).
extern "C" const unsigned char fastmetal_metallib_start[];
extern "C" const unsigned char fastmetal_metallib_end[];

namespace fm::metal {
namespace {

// The buffer argument table of a compute encoder has 31 entries.
constexpr std::size_t kMaxBufferArgs = 31;
// Commit (without waiting) after this many dispatches, so a long loop without
// synchronize() starts running on the GPU instead of piling up in one command buffer.
constexpr int kMaxDispatchesPerCommandBuffer = 128;
// Bytes of freed allocations kept for reuse.
constexpr std::size_t kMaxCachedBytes = std::size_t(1) << 30;

std::string to_std(NSString* _Nullable s) {
  const char* c = s != nil ? s.UTF8String : nullptr;
  return c != nullptr ? std::string(c) : std::string();
}

std::string describe(NSError* _Nullable error) {
  if (error == nil) return "unknown error";
  std::string s = to_std(error.localizedDescription);
  return s.empty() ? "unknown error" : s;
}

// Runs f inside an autorelease pool and rethrows its exception after the pool is drained.
// An Objective-C exception (Metal raises NSException on API misuse) becomes a BackendError
// instead of terminating the process.
template <typename F>
auto pooled(F&& f) -> decltype(f()) {
  using R = decltype(f());
  std::exception_ptr error;
  [[maybe_unused]] std::optional<std::conditional_t<std::is_void_v<R>, int, R>> result;
  @autoreleasepool {
    @try {
      try {
        if constexpr (std::is_void_v<R>)
          f();
        else
          result.emplace(f());
      } catch (const std::exception&) {
        error = std::current_exception();
      }
    } @catch (NSException* e) {
      error = std::make_exception_ptr(
          BackendError("[fastmetal] Metal raised " + to_std(e.name) + ": " + to_std(e.reason)));
    }
  }
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<R>) return std::move(*result);
}

// MTLBuffer <-> Storage::handle / CachingAllocator::Block::handle. The void* owns one
// reference (taken by retain_handle, given back by release_handle).
void* retain_handle(id<MTLBuffer> buffer) { return (__bridge_retained void*)buffer; }
void release_handle(void* handle) {
  // ARC takes over the reference and drops it when `buffer` goes out of scope.
  id<MTLBuffer> buffer = (__bridge_transfer id<MTLBuffer>)handle;
  (void)buffer;
}
id<MTLBuffer> buffer_of(const Storage& s) { return (__bridge id<MTLBuffer>)s.handle; }

struct Pipeline {
  id<MTLComputePipelineState> state;
  std::uint32_t max_threads = 1;  // maxTotalThreadsPerThreadgroup
  std::uint32_t simd_width = 1;   // threadExecutionWidth
};


class MetalBackend final : public Backend {
 public:
  MetalBackend(id<MTLDevice> device, id<MTLCommandQueue> queue, id<MTLLibrary> library)
      : device_(device),
        queue_(queue),
        library_(library),
        max_group_dims_(device.maxThreadsPerThreadgroup),
        max_buffer_length_(device.maxBufferLength),
        pool_(
            [device](std::size_t n) {
              CachingAllocator::Block b;
              @autoreleasepool {
                if (n > device.maxBufferLength) return b;
                // Shared storage: CPU and GPU see the same (page-aligned) memory.
                id<MTLBuffer> buffer = [device newBufferWithLength:n
                                                           options:MTLResourceStorageModeShared];
                if (buffer == nil) return b;
                b.host = [buffer contents];
                b.handle = retain_handle(buffer);
                b.size = n;
              }
              return b;
            },
            [](const CachingAllocator::Block& b) { release_handle(b.handle); }, kMaxCachedBytes) {
    NSArray<NSString*>* names = library.functionNames;
    for (NSUInteger i = 0; i < names.count; ++i) function_names_.insert(to_std([names objectAtIndex:i]));
  }

  ~MetalBackend() override {
    try {
      synchronize();
    } catch (...) {
      // Shutting down: a failed command buffer has nobody left to report to.
    }
  }

  std::string name() const override { return "metal"; }
  bool host_visible() const override { return true; }
  bool has_float64() const override { return false; }  // Apple GPUs have no double
  bool wide_elementwise() const override { return true; }

  StoragePtr allocate(std::size_t nbytes) override {
    return pooled([&] { return pool_storage(nbytes, nullptr); });
  }

  // Shares the caller's memory with the GPU where Metal can wrap it: the pages holding
  // [ptr, ptr + nbytes) become one no-copy buffer, and Storage::host points at ptr inside
  // it (launch() binds host - contents as the offset). Otherwise the bytes are copied into
  // a pooled buffer and Storage::copied_from tells the caller where results go back.
  StoragePtr wrap_host(void* ptr, std::size_t nbytes, std::shared_ptr<void> owner) override {
    return pooled([&]() -> StoragePtr {
      if (ptr == nullptr || nbytes == 0) return pool_storage(nbytes, std::move(owner));
      // 16 KiB (Apple Silicon's GPU page) also covers 4 KiB pages (Intel, Rosetta).
      const std::uintptr_t page = std::max<std::uintptr_t>(std::uintptr_t(getpagesize()), 16384);
      const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(ptr);
      const PageSpan span = page_span(at, nbytes, page);
      // The bound offset (ptr - page start) must suit the element type: else copy.
      if (span.ok && span.end - span.begin <= max_buffer_length_ && offset_bindable(at - span.begin)) {
        id<MTLBuffer> buffer =
            [device_ newBufferWithBytesNoCopy:reinterpret_cast<void*>(span.begin)
                                       length:NSUInteger(span.end - span.begin)
                                      options:MTLResourceStorageModeShared
                                  deallocator:nil];
        if (buffer != nil) {
          auto s = std::make_shared<Storage>();
          s->backend = this;
          s->host = ptr;
          s->nbytes = nbytes;
          s->handle = retain_handle(buffer);
          s->shared_with_host = true;
          // The MTLBuffer goes first, then the memory it wraps.
          s->release = [handle = s->handle, owner = std::move(owner)]() mutable {
            release_handle(handle);
            owner.reset();
          };
          return s;
        }
      }
      StoragePtr s = pool_storage(nbytes, std::move(owner));
      std::memcpy(s->host, ptr, nbytes);
      s->copied_from = ptr;
      return s;
    });
  }

  // fastmetal.compile on Metal: a capture's kernels are encoded ONCE, at its first replay,
  // into an indirect command buffer (ICB), and every replay then only executes that ICB:
  // no pipeline lookup, setBuffer or dispatch per kernel, which is what a step of small
  // kernels spends its host time on. What changes between replays (a dropout key, a
  // learning rate: the patched argument blocks) lives in the capture's arena, so the ICB
  // binds every argument block from the ICB's own copy of the arena (an ICB command cannot
  // setBytes). Each replay blits a snapshot of the arena into that copy first: in queue
  // order, so the previous replay has read the old values by then (Metal tracks the hazard
  // on the buffer), as CUDA's graph replay uploads its arena. Recorded copies from the host
  // (uploads) split the kernels into runs: each run is one executeCommandsInBuffer range,
  // and the copy after it a blit from the arena copy, so everything keeps its recorded order.
  // Every command carries a barrier: the step's kernels read what the previous one wrote,
  // as in the serial encoder of eager launches. Compute commands in an ICB need macOS 11;
  // before that (and for a capture with host calls, which only the CPU records) the replay
  // encodes the recorded launches again through run_kernel (Backend::replay), from C++.
  void replay(capture::Capture& c) override {
    if (c.size() == 0) return;
    if (!c.replay_order().empty()) return Backend::replay(c);  // a test's order: no ICB
    if (@available(macOS 11.0, *)) {
      bool shares_host_memory = false;
      pooled([&] {
        std::lock_guard<std::mutex> lock(mu_);
        auto state = std::static_pointer_cast<IcbReplay>(c.backend_state);
        if (!state) {
          state = encode_icb_locked(c);
          c.backend_state = state;
        }
        if (!state->usable) return;
        encode_replay_locked(c, *state);
        shares_host_memory = state->shares_host_memory;
      });
      auto state = std::static_pointer_cast<IcbReplay>(c.backend_state);
      if (state && state->usable) {
        if (shares_host_memory) launched_on_host_memory_ = true;
        end_op();
        return;
      }
    }
    Backend::replay(c);
  }

  void run_kernel(const std::string& kernel, const Dispatch& d,
                  const std::vector<KernelArg>& args) override {
    pooled([&] { launch_impl(kernel, d, args); });
  }

  // The op's launches on this thread used the caller's memory: it is the caller's again
  // once the op returns, so wait for them (other ops return at once).
  void end_op() override {
    if (!launched_on_host_memory_) return;
    launched_on_host_memory_ = false;
    synchronize();
  }

  // Shared memory: the host may touch a storage once no queued command buffer uses it
  // (Storage::last_use against the command buffers known to have completed).
  void wait_for_host(const Storage& storage) override {
    if (storage.last_use.load(std::memory_order_acquire) > completed_through_.load(std::memory_order_acquire))
      synchronize();
  }

  // Returns once every command buffer committed before the call (by any thread) completed;
  // what completed goes back to the pool and its Python owners are released.
  void synchronize() override {
    count_host_wait();
    pooled([&] {
      std::uint64_t committed_through = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        flush_locked();
        committed_through = open_seq_ - 1;
      }
      const std::string error = submitted_.wait_committed(
          [](id<MTLCommandBuffer> cb) { [cb waitUntilCompleted]; },
          [](id<MTLCommandBuffer> cb) {
            return cb.status == MTLCommandBufferStatusCompleted ||
                   cb.status == MTLCommandBufferStatusError;
          },
          [](id<MTLCommandBuffer> cb) {
            return cb.status == MTLCommandBufferStatusError ? describe(cb.error) : std::string();
          });
      // Every command buffer up to committed_through has completed (or failed).
      std::uint64_t seen = completed_through_.load(std::memory_order_relaxed);
      while (seen < committed_through &&
             !completed_through_.compare_exchange_weak(seen, committed_through,
                                                       std::memory_order_release)) {
      }
      if (!error.empty())
        throw BackendError("[fastmetal] Metal command buffer failed: " + error);
    });
  }

  std::uint32_t preferred_group_size(const std::string& kernel) override {
    return pooled([&] {
      const Pipeline& p = pipeline(kernel);
      // A few SIMD groups per threadgroup: 256 threads on Apple GPUs (width 32).
      return std::max<std::uint32_t>(1, std::min(p.max_threads, p.simd_width * 8));
    });
  }

  std::uint32_t max_group_size(const std::string& kernel) override {
    return pooled([&] { return pipeline(kernel).max_threads; });
  }

  bool has_kernel(const std::string& kernel) override {
    return function_names_.count(kernel) != 0;
  }

  // Host-visible memory: a memcpy, after any queued work that may still use the storage (a
  // fresh allocation, e.g. a scalar operand or labels, needs no wait).
  void copy_to_host(const Storage& src, std::size_t offset, void* dst, std::size_t n) override {
    wait_for_host(src);
    std::memcpy(dst, static_cast<const char*>(src.host) + offset, n);
  }
  void write_from_host(Storage& dst, std::size_t offset, const void* src, std::size_t n) override {
    wait_for_host(dst);
    std::memcpy(static_cast<char*>(dst.host) + offset, src, n);
  }

 private:
  // A capture encoded into an indirect command buffer (replay() above).
  struct IcbReplay {
    bool usable = false;  // false: the capture has host calls; replay by re-encoding
    id<MTLIndirectCommandBuffer> icb;
    id<MTLBuffer> arena;  // the ICB's copy of the capture's arena (argument blocks, uploads)
    struct Run {
      NSUInteger first = 0, count = 0;              // ICB commands
      std::vector<const capture::Entry*> uploads;  // the copies from the host after them
    };
    std::vector<Run> runs;
    std::vector<id<MTLResource>> resources;  // every buffer the ICB binds (useResources)
    std::vector<StoragePtr> storages;        // their Storages, for last_use
    bool shares_host_memory = false;
  };

  // The pipeline of a kernel for ICB commands (supportIndirectCommandBuffers), on first use.
  const Pipeline& icb_pipeline(const std::string& kernel) {
    {
      std::lock_guard<std::mutex> lock(pipelines_mu_);
      auto it = icb_pipelines_.find(kernel);
      if (it != icb_pipelines_.end()) return it->second;
    }
    const Pipeline& plain = pipeline(kernel);  // checks the name, finds the function
    NSString* ns_name = [NSString stringWithUTF8String:kernel.c_str()];
    if (ns_name == nil) throw BackendError("[fastmetal] invalid kernel name '" + kernel + "'");
    id<MTLFunction> function = [library_ newFunctionWithName:ns_name];
    if (function == nil)
      throw BackendError("[fastmetal] the Metal library has no function '" + kernel + "'");
    MTLComputePipelineDescriptor* descriptor = [[MTLComputePipelineDescriptor alloc] init];
    descriptor.computeFunction = function;
    descriptor.supportIndirectCommandBuffers = YES;
    NSError* error = nil;
    id<MTLComputePipelineState> state = [device_ newComputePipelineStateWithDescriptor:descriptor
                                                                              options:MTLPipelineOptionNone
                                                                           reflection:nil
                                                                                error:&error];
    if (state == nil)
      throw BackendError("[fastmetal] could not create the Metal ICB pipeline for '" + kernel +
                         "': " + describe(error));
    Pipeline p = plain;
    p.state = state;
    p.max_threads = std::min<std::uint32_t>(
        plain.max_threads, std::uint32_t(std::max<NSUInteger>(1, state.maxTotalThreadsPerThreadgroup)));
    std::lock_guard<std::mutex> lock(pipelines_mu_);
    return icb_pipelines_.emplace(kernel, std::move(p)).first->second;
  }

  // Encodes the capture's kernels into one ICB (called with mu_ held, at the first replay).
  std::shared_ptr<IcbReplay> encode_icb_locked(const capture::Capture& c) API_AVAILABLE(macos(11.0)) {
    auto state = std::make_shared<IcbReplay>();
    NSUInteger commands = 0;
    for (const capture::Entry& e : c.entries()) {
      if (e.kind == capture::Entry::Kind::host_call) return state;  // not usable
      if (e.kind == capture::Entry::Kind::fused) continue;
      if (e.kind == capture::Entry::Kind::kernel &&
          std::uint64_t(e.dispatch.grid[0]) * e.dispatch.grid[1] * e.dispatch.grid[2] != 0)
        ++commands;
    }
    state->arena = [device_ newBufferWithLength:std::max<NSUInteger>(c.arena().size(), 16)
                                        options:MTLResourceStorageModePrivate];
    if (state->arena == nil)
      throw BackendError("[fastmetal.compile] Metal could not allocate the capture's arguments");
    if (commands > 0) {
      MTLIndirectCommandBufferDescriptor* descriptor = [[MTLIndirectCommandBufferDescriptor alloc] init];
      descriptor.commandTypes = MTLIndirectCommandTypeConcurrentDispatchThreads;
      descriptor.inheritPipelineState = NO;
      descriptor.inheritBuffers = NO;
      descriptor.maxKernelBufferBindCount = kMaxBufferArgs;
      // Shared: the commands are encoded by the CPU, here.
      state->icb = [device_ newIndirectCommandBufferWithDescriptor:descriptor
                                                   maxCommandCount:commands
                                                           options:MTLResourceStorageModeShared];
      if (state->icb == nil)
        throw BackendError("[fastmetal.compile] Metal could not create an indirect command "
                           "buffer of " + std::to_string(commands) + " commands");
    }
    std::unordered_set<const void*> named;
    auto bind = [&](const StoragePtr& s) {
      if (!named.insert(s->handle).second) return;
      state->resources.push_back(buffer_of(*s));
      state->storages.push_back(s);
      if (s->shared_with_host || s->copied_from != nullptr) state->shares_host_memory = true;
    };
    state->runs.emplace_back();
    NSUInteger index = 0;
    for (const capture::Entry& e : c.entries()) {
      if (e.kind == capture::Entry::Kind::fused) continue;
      if (e.kind == capture::Entry::Kind::upload) {
        bind(e.dst);
        state->runs.back().uploads.push_back(&e);
        continue;
      }
      if (std::uint64_t(e.dispatch.grid[0]) * e.dispatch.grid[1] * e.dispatch.grid[2] == 0) continue;
      if (!state->runs.back().uploads.empty()) state->runs.push_back({index, 0, {}});
      const Pipeline& p = icb_pipeline(e.kernel);
      id<MTLIndirectComputeCommand> command = [state->icb indirectComputeCommandAtIndex:index];
      [command setComputePipelineState:p.state];
      for (std::size_t i = 0; i < e.args.size(); ++i) {
        const KernelArg& a = e.args[i];
        if (a.storage) {
          id<MTLBuffer> buffer = buffer_of(*a.storage);
          const char* contents = static_cast<const char*>([buffer contents]);
          const std::size_t base = std::size_t(static_cast<const char*>(a.storage->host) - contents);
          [command setKernelBuffer:buffer offset:NSUInteger(base + a.offset) atIndex:NSUInteger(i)];
          bind(a.storage);
        }
      }
      for (const auto& [i, at] : e.blocks)  // argument blocks: from the arena's copy
        [command setKernelBuffer:state->arena offset:NSUInteger(at) atIndex:NSUInteger(i)];
      [command concurrentDispatchThreads:MTLSizeMake(e.dispatch.grid[0], e.dispatch.grid[1],
                                                     e.dispatch.grid[2])
                   threadsPerThreadgroup:group_size(e.dispatch, p)];
      [command setBarrier];
      ++index;
      ++state->runs.back().count;
    }
    state->resources.push_back(state->arena);
    state->usable = true;
    return state;
  }

  // One replay into the open command buffer (mu_ held): the arena's snapshot, then each
  // run of ICB commands and the uploads after it.
  void encode_replay_locked(const capture::Capture& c, IcbReplay& state) API_AVAILABLE(macos(11.0)) {
    if (encoder_ != nil) {  // what is queued runs first; the replay gets encoders of its own
      [encoder_ endEncoding];
      encoder_ = nil;
    }
    if (cb_ == nil) {
      cb_ = [queue_ commandBuffer];
      if (cb_ == nil) throw BackendError("[fastmetal] Metal could not create a command buffer");
    }
    if (!c.arena().empty()) {
      id<MTLBuffer> snapshot = [device_ newBufferWithBytes:c.arena().data()
                                                    length:NSUInteger(c.arena().size())
                                                   options:MTLResourceStorageModeShared];
      id<MTLBlitCommandEncoder> blit = [cb_ blitCommandEncoder];
      if (snapshot == nil || blit == nil)
        throw BackendError("[fastmetal.compile] Metal could not copy the capture's arguments");
      [blit copyFromBuffer:snapshot sourceOffset:0 toBuffer:state.arena destinationOffset:0
                      size:snapshot.length];
      [blit endEncoding];
    }
    for (const IcbReplay::Run& run : state.runs) {
      if (run.count > 0) {
        id<MTLComputeCommandEncoder> encoder =
            [cb_ computeCommandEncoderWithDispatchType:MTLDispatchTypeSerial];
        if (encoder == nil)
          throw BackendError("[fastmetal] Metal could not create a compute command encoder");
        // Buffers an ICB names are not made resident by the ICB itself.
        [encoder useResources:state.resources.data()
                        count:NSUInteger(state.resources.size())
                        usage:MTLResourceUsageRead | MTLResourceUsageWrite];
        [encoder executeCommandsInBuffer:state.icb withRange:NSMakeRange(run.first, run.count)];
        [encoder endEncoding];
      }
      if (!run.uploads.empty()) {
        id<MTLBlitCommandEncoder> copies = [cb_ blitCommandEncoder];
        if (copies == nil) throw BackendError("[fastmetal] Metal could not create a blit encoder");
        for (const capture::Entry* u : run.uploads) {
          id<MTLBuffer> dst = buffer_of(*u->dst);
          const char* contents = static_cast<const char*>([dst contents]);
          const std::size_t base = std::size_t(static_cast<const char*>(u->dst->host) - contents);
          [copies copyFromBuffer:state.arena sourceOffset:NSUInteger(u->at) toBuffer:dst
               destinationOffset:NSUInteger(base + u->dst_offset) size:NSUInteger(u->n)];
        }
        [copies endEncoding];
      }
    }
    for (const StoragePtr& s : state.storages) {
      s->last_use.store(open_seq_, std::memory_order_release);
      keep_.push_back(s);
    }
    dispatches_ += int(state.runs.size());
    if (dispatches_ >= kMaxDispatchesPerCommandBuffer) flush_locked();
  }

  // A pooled allocation; `owner` (if any) lives as long as the Storage.
  StoragePtr pool_storage(std::size_t nbytes, std::shared_ptr<void> owner) {
    CachingAllocator::Block b = pool_.acquire(nbytes);
    if (b.handle == nullptr)
      throw BackendError("[fastmetal] Metal could not allocate " + std::to_string(nbytes) +
                         " bytes (device limit per buffer: " + std::to_string(max_buffer_length_) +
                         ")");
    return pooled_storage(this, pool_, b, nbytes, std::move(owner));
  }

  // The pipeline of a kernel, built on first use. Thread-safe; references stay valid.
  const Pipeline& pipeline(const std::string& kernel) {
    std::lock_guard<std::mutex> lock(pipelines_mu_);
    auto it = pipelines_.find(kernel);
    if (it != pipelines_.end()) return it->second;
    if (function_names_.count(kernel) == 0)
      throw BackendError("[fastmetal] no Metal kernel named '" + kernel + "'");
    NSString* ns_name = [NSString stringWithUTF8String:kernel.c_str()];
    if (ns_name == nil) throw BackendError("[fastmetal] invalid kernel name '" + kernel + "'");
    id<MTLFunction> function = [library_ newFunctionWithName:ns_name];
    if (function == nil)
      throw BackendError("[fastmetal] the Metal library has no function '" + kernel + "'");
    NSError* error = nil;
    id<MTLComputePipelineState> state = [device_ newComputePipelineStateWithFunction:function
                                                                                error:&error];
    if (state == nil)
      throw BackendError("[fastmetal] could not create the Metal pipeline for '" + kernel +
                         "': " + describe(error));
    Pipeline p;
    p.state = state;
    p.max_threads = std::uint32_t(std::max<NSUInteger>(1, state.maxTotalThreadsPerThreadgroup));
    p.simd_width = std::uint32_t(std::max<NSUInteger>(1, state.threadExecutionWidth));
    return pipelines_.emplace(kernel, std::move(p)).first->second;
  }

  // Threads per group: clamped to the grid, the device and the pipeline (clamp_group).
  MTLSize group_size(const Dispatch& d, const Pipeline& p) const {
    std::uint64_t g[3] = {d.group[0], d.group[1], d.group[2]};
    const std::uint64_t axis_max[3] = {max_group_dims_.width, max_group_dims_.height,
                                       max_group_dims_.depth};
    clamp_group(g, d.grid, axis_max, p.max_threads);
    return MTLSizeMake(NSUInteger(g[0]), NSUInteger(g[1]), NSUInteger(g[2]));
  }

  void launch_impl(const std::string& kernel, const Dispatch& d,
                   const std::vector<KernelArg>& args) {
    if (args.size() > kMaxBufferArgs)
      throw BackendError("[fastmetal] kernel '" + kernel + "' given " + std::to_string(args.size()) +
                         " arguments; Metal binds at most " + std::to_string(kMaxBufferArgs));
    const Pipeline& p = pipeline(kernel);  // unknown kernels fail even for empty grids
    if (std::uint64_t(d.grid[0]) * d.grid[1] * d.grid[2] == 0) return;

    // Check every argument before anything is encoded.
    std::vector<NSUInteger> offsets(args.size(), 0);
    for (std::size_t i = 0; i < args.size(); ++i) {
      const KernelArg& a = args[i];
      auto where = [&] { return "[fastmetal] kernel '" + kernel + "' argument " + std::to_string(i); };
      if (a.storage) {
        if (a.storage->backend != this || a.storage->handle == nullptr)
          throw BackendError(where() + " is not a Metal allocation");
        id<MTLBuffer> buffer = buffer_of(*a.storage);
        const char* contents = static_cast<const char*>([buffer contents]);
        const std::size_t base = std::size_t(static_cast<const char*>(a.storage->host) - contents);
        if (base > buffer.length || a.offset > buffer.length - base)
          throw BackendError(where() + " has an offset past the end of its buffer");
        if (!offset_bindable(base + a.offset))
          throw BackendError(where() + " has a byte offset of " + std::to_string(base + a.offset) +
                             ", not a multiple of " + std::to_string(kBufferOffsetAlignment));
        offsets[i] = NSUInteger(base + a.offset);
      } else if (a.bytes == nullptr || a.size == 0) {
        throw BackendError(where() + " is empty");
      }
    }
    const MTLSize group = group_size(d, p);

    std::unique_lock<std::mutex> lock(mu_);
    id<MTLComputeCommandEncoder> encoder = encoder_locked();
    [encoder setComputePipelineState:p.state];
    for (std::size_t i = 0; i < args.size(); ++i) {
      const KernelArg& a = args[i];
      if (a.storage) {
        [encoder setBuffer:buffer_of(*a.storage) offset:offsets[i] atIndex:NSUInteger(i)];
        a.storage->last_use.store(open_seq_, std::memory_order_release);
        if (a.storage->shared_with_host || a.storage->copied_from != nullptr)
          launched_on_host_memory_ = true;
        keep_.push_back(a.storage);
      } else if (fits_set_bytes(a.size)) {
        [encoder setBytes:a.bytes length:NSUInteger(a.size) atIndex:NSUInteger(i)];
      } else {
        // The command buffer retains this temporary until it has run.
        id<MTLBuffer> block = [device_ newBufferWithBytes:a.bytes
                                                   length:NSUInteger(a.size)
                                                  options:MTLResourceStorageModeShared];
        if (block == nil)
          throw BackendError("[fastmetal] Metal could not allocate an argument block of " +
                             std::to_string(a.size) + " bytes");
        [encoder setBuffer:block offset:0 atIndex:NSUInteger(i)];
      }
    }
    [encoder dispatchThreads:MTLSizeMake(d.grid[0], d.grid[1], d.grid[2])
        threadsPerThreadgroup:group];
    if (++dispatches_ >= kMaxDispatchesPerCommandBuffer) {
      flush_locked();
      lock.unlock();
      reap_completed();
    }
  }

  // The open compute encoder, creating the command buffer and encoder as needed.
  id<MTLComputeCommandEncoder> encoder_locked() {
    if (encoder_ == nil) {
      if (cb_ == nil) {
        cb_ = [queue_ commandBuffer];
        if (cb_ == nil) throw BackendError("[fastmetal] Metal could not create a command buffer");
      }
      // Serial: each dispatch starts after the previous one finished, so kernels that read
      // what an earlier kernel wrote need no explicit barrier.
      encoder_ = [cb_ computeCommandEncoderWithDispatchType:MTLDispatchTypeSerial];
      if (encoder_ == nil)
        throw BackendError("[fastmetal] Metal could not create a compute command encoder");
    }
    return encoder_;
  }

  // Ends encoding and commits the open command buffer (without waiting).
  void flush_locked() {
    if (encoder_ != nil) {
      [encoder_ endEncoding];
      encoder_ = nil;
    }
    if (cb_ != nil) {
      [cb_ commit];
      std::vector<StoragePtr> keep;
      keep.swap(keep_);
      submitted_.committed(cb_, std::move(keep));
      cb_ = nil;
      ++open_seq_;
    }
    dispatches_ = 0;
  }

  // Retires the command buffers that have completed (their storages go back to the pool,
  // Python owners take the GIL to let go): never under mu_, which a thread holding the GIL
  // may be waiting for.
  void reap_completed() {
    submitted_.reap(
        [](id<MTLCommandBuffer> cb) {
          return cb.status == MTLCommandBufferStatusCompleted ||
                 cb.status == MTLCommandBufferStatusError;
        },
        [](id<MTLCommandBuffer> cb) {
          return cb.status == MTLCommandBufferStatusError ? describe(cb.error) : std::string();
        });
  }

  id<MTLDevice> device_;
  id<MTLCommandQueue> queue_;
  id<MTLLibrary> library_;
  const MTLSize max_group_dims_;
  const NSUInteger max_buffer_length_;
  std::unordered_set<std::string> function_names_;  // immutable after construction

  std::mutex pipelines_mu_;
  std::unordered_map<std::string, Pipeline> pipelines_;
  std::unordered_map<std::string, Pipeline> icb_pipelines_;  // supportIndirectCommandBuffers

  // This thread's launches since its last end_op() bound memory shared with the caller.
  static thread_local bool launched_on_host_memory_;

  std::mutex mu_;  // guards cb_, encoder_, keep_, dispatches_, open_seq_
  id<MTLCommandBuffer> cb_;
  id<MTLComputeCommandEncoder> encoder_;
  std::vector<StoragePtr> keep_;  // storages named by the open command buffer
  int dispatches_ = 0;
  // Sequence number of the open (or next) command buffer; those before it are committed.
  std::uint64_t open_seq_ = 1;
  // Every command buffer up to this sequence number has completed (set by synchronize()).
  std::atomic<std::uint64_t> completed_through_{0};
  // Committed command buffers and their storages (its own lock, taken after mu_).
  CommandTracker<id<MTLCommandBuffer>, StoragePtr> submitted_;

  CachingAllocator pool_;  // last: its cached buffers go before the device does
};

thread_local bool MetalBackend::launched_on_host_memory_ = false;

}  // namespace

namespace {
std::mutex unavailable_mu;
std::string unavailable;  // why make_metal_backend() returned nullptr
}  // namespace

std::string metal_unavailable_reason() {
  std::lock_guard<std::mutex> lock(unavailable_mu);
  return unavailable;
}

std::unique_ptr<Backend> make_metal_backend() {
  std::unique_ptr<Backend> backend;
  std::string disabled;  // why no device is used
  @autoreleasepool {
    // A command-line process (python) may get nil here where CoreGraphics is not linked or
    // no display is attached; the device list still has the GPU then.
    id<MTLDevice> device = MTLCreateSystemDefaultDevice();
    if (device == nil) {
      NSArray<id<MTLDevice>>* all = MTLCopyAllDevices();
      if (all.count > 0) device = [all objectAtIndex:0];
    }
    if (device == nil) {
      disabled = "no Metal device (MTLCreateSystemDefaultDevice and MTLCopyAllDevices found none)";
    } else {
      const std::size_t size = std::size_t(fastmetal_metallib_end - fastmetal_metallib_start);
      id<MTLCommandQueue> queue = nil;
      id<MTLLibrary> library = nil;
      if (![device supportsFamily:MTLGPUFamilyMetal3]) {
        disabled = "'" + to_std(device.name) + "' does not support Metal 3";
      } else if (size == 0) {
        disabled = "the embedded metallib is empty (broken build)";
      } else if ((queue = [device newCommandQueue]) == nil) {
        disabled = "could not create a command queue";
      } else {
        // The bytes live in this binary for the life of the process: a no-op destructor
        // makes dispatch use them in place instead of copying them.
        dispatch_data_t data =
            dispatch_data_create(fastmetal_metallib_start, size,
                                 dispatch_get_global_queue(DISPATCH_QUEUE_PRIORITY_DEFAULT, 0),
                                 ^{});
        NSError* error = nil;
        library = [device newLibraryWithData:data error:&error];
        if (library == nil) disabled = "could not load the embedded metallib: " + describe(error);
      }
      if (disabled.empty()) {
        try {
          backend = std::make_unique<MetalBackend>(device, queue, library);
        } catch (const std::exception& e) {
          disabled = e.what();
        }
      }
    }
  }
  if (!disabled.empty()) std::fprintf(stderr, "[fastmetal] Metal backend disabled: %s\n", disabled.c_str());
  {
    std::lock_guard<std::mutex> lock(unavailable_mu);
    unavailable = disabled;
  }
  return backend;
}

FM_REGISTER_BACKEND("metal", 10, [](std::string& why_not) {
  std::unique_ptr<Backend> b = make_metal_backend();
  if (!b) why_not = metal_unavailable_reason();
  return b;
});

}  // namespace fm::metal
