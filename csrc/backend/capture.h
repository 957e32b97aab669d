// Capture and replay of a step's device work (fastmetal.compile).
//
// While a thread records (Recording), every kernel launch, host-to-device copy and native
// (host-side) operation that thread's ops issue is run as usual AND appended to a Capture:
// the kernel by name with its dispatch, its buffers (the Storages are held, so no block of
// the step is given back to the pool or reused while the capture lives), and a copy of its
// argument blocks in the capture's arena. replay() then runs the same work again from C++,
// with no Python per op; a backend may replay it its own way (CUDA: one CUDA graph).
//
// What changes from one replay to the next is only what Python computes from its own state
// (a dropout's Philox key, an optimizer's bias correction, a scheduler's learning rate).
// Such regions are re-run in Python at each replay in *patch* mode (Patching): the ops run
// their argument checks and packing, but each launch only overwrites the argument blocks of
// the recorded launch at the cursor (its buffers stay the recorded ones), and runs nothing.
// Host reads (.numpy(), .item(), the buffer protocol) during a recording are noted: a
// step whose Python reads device results cannot be replayed (fastmetal.compile then runs it
// eagerly).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <typeinfo>
#include <utility>
#include <vector>

#include "../core/array.h"
#include "../core/errors.h"
#include "backend.h"

namespace fm::capture {

struct Entry {
  // fused: a kernel launch folded into an earlier one by the fusion pass (ops/
  // capture_fusion.h); replays skip it. Its args are dropped (the buffers it alone used are
  // let go); its place stays, so the patch regions' positions do not move.
  enum class Kind { kernel, host_call, upload, fused } kind = Kind::kernel;
  // kernel: args as recorded, except argument blocks, which live in the arena: blocks[i] is
  // {argument index, arena offset} (KernelArg::bytes is rebuilt at each replay).
  std::string kernel;
  Dispatch dispatch;
  std::vector<KernelArg> args;
  std::vector<std::pair<std::size_t, std::size_t>> blocks;
  // host_call: a native op with its arguments (state: a std::tuple; type: its type).
  std::function<void()> call;
  std::shared_ptr<void> state;
  const std::type_info* state_type = nullptr;
  // upload: arena[at, at + n) -> dst at dst_offset.
  StoragePtr dst;
  std::size_t dst_offset = 0, at = 0, n = 0;
};

class Capture {
 public:
  explicit Capture(Backend& backend) : backend_(&backend) {}
  Backend& backend() const { return *backend_; }
  const std::vector<Entry>& entries() const { return entries_; }
  // For the fusion pass (after recording, before the first replay): entries and argument
  // blocks it rewrites.
  std::vector<Entry>& entries_to_rewrite() { return entries_; }
  std::size_t size() const { return entries_.size(); }
  // Argument blocks and upload snapshots, each 16-byte aligned.
  const std::vector<char>& arena() const { return arena_; }
  char* arena_at(std::size_t offset) { return arena_.data() + offset; }
  // Whether a host read happened while recording (see above), and where.
  const std::string& host_read() const { return host_read_; }
  // Bumped by every patch: a backend that keeps its own copy of the arena (on the device)
  // refreshes it when this changed.
  std::uint64_t generation() const { return generation_; }
  // The backend's replay state (a CUDA graph), made at its first replay.
  std::shared_ptr<void> backend_state;

  // Runs the recorded work once more, in order (the backend's Backend::replay).
  void replay();
  // Tests: another order for replays to run the entries in, a permutation of them (empty:
  // the list's order). The portable replay follows it; CUDA then replays without its graph.
  // Any order that respects capture_order.h's dependencies gives the same results.
  void set_replay_order(std::vector<std::size_t> order);
  const std::vector<std::size_t>& replay_order() const { return replay_order_; }

  // Recording (the thread's current capture; see record_* below).
  void add_kernel(const std::string& kernel, const Dispatch& d, const std::vector<KernelArg>& args);
  void add_upload(Storage& dst, std::size_t offset, const void* src, std::size_t n);
  Entry& add_host_call();
  void note_host_read(const char* what) {
    if (host_read_.empty()) host_read_ = what;
  }

  // Patching: entries [cursor, end) are rewritten by the ops run in patch mode.
  Entry& next_to_patch(Entry::Kind kind, const char* what);
  void patch_kernel(const std::string& kernel, const std::vector<KernelArg>& args);
  void patch_upload(std::size_t n, const void* src);
  void start_patch(std::size_t begin, std::size_t end);
  void finish_patch();

 private:
  std::size_t put(const void* src, std::size_t n);

  Backend* backend_;
  std::vector<Entry> entries_;
  std::vector<char> arena_;
  std::string host_read_;
  std::uint64_t generation_ = 0;
  std::size_t cursor_ = 0, patch_end_ = 0;
  std::vector<std::size_t> replay_order_;
};

// The calling thread's capture while it records, or while it patches one, else nullptr.
Capture* recording();
Capture* patching();

// Scopes that set the thread's current capture (Python holds them across the traced call).
void begin_recording(Capture& c);
void end_recording();
void begin_patching(Capture& c, std::size_t begin, std::size_t end);
void end_patching();

// Called by Backend::launch / Backend::copy_from_host (backend.h): returns true where the
// work must not run (patch mode), after recording or patching it.
bool on_launch(const std::string& kernel, const Dispatch& d, const std::vector<KernelArg>& args);
bool on_upload(Storage& dst, std::size_t offset, const void* src, std::size_t n);
// Called where Python reads device memory (pyarray.cpp, dlpack.cpp).
void on_host_read(const char* what);

// ---- native ops (native_ops.h): how an argument is kept in a recorded host call.
// Arrays are kept as handles (their Storage stays alive) and are never patched: a patched
// call keeps the recorded buffers, as a patched launch does; values (argument structs,
// numbers) are copied, and patched.
template <typename T>
struct Kept {
  static_assert(!std::is_pointer<std::decay_t<T>>::value,
                "a native op recorded by fastmetal.compile takes Arrays and values, not raw "
                "pointers: record it with capture::run_host instead");
  using type = std::decay_t<T>;
  static constexpr bool buffer = false;
  static type keep(T v) { return v; }
  static const type& use(const type& v) { return v; }
};
template <>
struct Kept<const Array&> {
  using type = Array;
  static constexpr bool buffer = true;
  static type keep(const Array& a) { return a; }
  static const Array& use(const Array& a) { return a; }
};
template <>
struct Kept<const Array*> {
  using type = std::optional<Array>;
  static constexpr bool buffer = true;
  static type keep(const Array* a) { return a ? type(*a) : std::nullopt; }
  static const Array* use(const type& a) { return a ? &*a : nullptr; }
};

template <typename... A>
using KeptTuple = std::tuple<typename Kept<A>::type...>;

template <std::size_t I = 0, typename Tuple, typename... A>
void patch_values(Tuple& recorded, Tuple&& fresh, void (*)(A...)) {
  if constexpr (I < sizeof...(A)) {
    using Arg = std::tuple_element_t<I, std::tuple<A...>>;
    if constexpr (!Kept<Arg>::buffer) std::get<I>(recorded) = std::move(std::get<I>(fresh));
    patch_values<I + 1>(recorded, std::move(fresh), static_cast<void (*)(A...)>(nullptr));
  }
}

// Runs fn(args...) now (not in patch mode) and records it while recording; in patch mode
// updates the recorded call's values instead.
template <typename T>
struct NotDeduced {
  using type = T;
};
template <typename... A>
void run_native(void (*fn)(A...), typename NotDeduced<A>::type... args) {
  using Tuple = KeptTuple<A...>;
  if (Capture* p = patching()) {
    Entry& e = p->next_to_patch(Entry::Kind::host_call, "a native operation");
    if (e.state_type == nullptr || *e.state_type != typeid(Tuple))
      throw BackendError("[fastmetal.compile] the step took another path when replayed: a "
                         "native operation differs from the recorded one");
    patch_values(*static_cast<Tuple*>(e.state.get()), Tuple(Kept<A>::keep(args)...),
                 static_cast<void (*)(A...)>(nullptr));
    return;
  }
  fn(args...);
  if (Capture* r = recording()) {
    auto state = std::make_shared<Tuple>(Kept<A>::keep(args)...);
    Entry& e = r->add_host_call();
    e.state = state;
    e.state_type = &typeid(Tuple);
    Tuple* t = state.get();
    e.call = [fn, t] {
      std::apply([fn](const auto&... kept) { fn(Kept<A>::use(kept)...); }, *t);
    };
  }
}

// Host work that reads and writes device memory through raw pointers (the CPU's row
// reductions): run now and, while recording, kept as it is with `keep` (the Storages it
// touches) held. It has no values to patch: in patch mode it is skipped.
void run_host(std::function<void()> work, std::vector<StoragePtr> keep);

}  // namespace fm::capture
