#include "capture.h"

#include <cstring>

namespace fm::capture {
namespace {

thread_local Capture* t_recording = nullptr;
thread_local Capture* t_patching = nullptr;

std::size_t align16(std::size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

Capture* recording() { return t_recording; }
Capture* patching() { return t_patching; }

void begin_recording(Capture& c) {
  if (t_recording != nullptr || t_patching != nullptr)
    throw ValueError("[fastmetal.compile] this thread is already tracing a compiled function: "
                     "a compiled function cannot call another while it is traced");
  t_recording = &c;
}
void end_recording() { t_recording = nullptr; }

void begin_patching(Capture& c, std::size_t begin, std::size_t end) {
  if (t_recording != nullptr || t_patching != nullptr)
    throw ValueError("[fastmetal.compile] this thread is already tracing or replaying a "
                     "compiled function");
  c.start_patch(begin, end);
  t_patching = &c;
}
void end_patching() {
  Capture* c = t_patching;
  t_patching = nullptr;
  if (c != nullptr) c->finish_patch();
}

std::size_t Capture::put(const void* src, std::size_t n) {
  const std::size_t at = align16(arena_.size());
  arena_.resize(at + align16(n == 0 ? 1 : n));
  if (n != 0) std::memcpy(arena_.data() + at, src, n);
  return at;
}

void Capture::add_kernel(const std::string& kernel, const Dispatch& d,
                         const std::vector<KernelArg>& args) {
  Entry e;
  e.kind = Entry::Kind::kernel;
  e.kernel = kernel;
  e.dispatch = d;
  e.args = args;
  for (std::size_t i = 0; i < args.size(); ++i)
    if (!args[i].storage) {
      e.blocks.emplace_back(i, put(args[i].bytes, args[i].size));
      e.args[i].bytes = nullptr;  // rebuilt from the arena at each replay
    }
  entries_.push_back(std::move(e));
}

void Capture::add_upload(Storage& dst, std::size_t offset, const void* src, std::size_t n) {
  Entry e;
  e.kind = Entry::Kind::upload;
  e.dst = dst.shared_from_this();  // kept alive (and so never reused) while the capture lives
  e.dst_offset = offset;
  e.n = n;
  e.at = put(src, n);
  entries_.push_back(std::move(e));
}

Entry& Capture::add_host_call() {
  entries_.emplace_back();
  entries_.back().kind = Entry::Kind::host_call;
  return entries_.back();
}

void Capture::start_patch(std::size_t begin, std::size_t end) {
  if (begin > end || end > entries_.size())
    throw ValueError("[fastmetal.compile] internal: a patch region outside the capture");
  cursor_ = begin;
  patch_end_ = end;
  ++generation_;
}

void Capture::finish_patch() {
  const bool complete = cursor_ == patch_end_;
  cursor_ = patch_end_ = 0;
  if (!complete)
    throw BackendError("[fastmetal.compile] the step took another path when replayed: fewer "
                       "operations ran than were recorded (Python control flow that depends "
                       "on changing state cannot be captured)");
}

Entry& Capture::next_to_patch(Entry::Kind kind, const char* what) {
  if (cursor_ >= patch_end_ || entries_[cursor_].kind != kind)
    throw BackendError(std::string("[fastmetal.compile] the step took another path when "
                                   "replayed: ") + what + " differs from the recorded one");
  return entries_[cursor_++];
}

void Capture::patch_kernel(const std::string& kernel, const std::vector<KernelArg>& args) {
  Entry& e = next_to_patch(Entry::Kind::kernel, "a kernel launch");
  if (e.kernel != kernel || e.args.size() != args.size())
    throw BackendError("[fastmetal.compile] the step took another path when replayed: kernel '" +
                       kernel + "' ran where '" + e.kernel + "' was recorded");
  for (const auto& [i, at] : e.blocks) {
    if (args[i].storage || args[i].size != e.args[i].size)
      throw BackendError("[fastmetal.compile] internal: kernel '" + kernel +
                         "' changed its arguments between recording and replay");
    std::memcpy(arena_.data() + at, args[i].bytes, args[i].size);
  }
}

void Capture::patch_upload(std::size_t n, const void* src) {
  Entry& e = next_to_patch(Entry::Kind::upload, "a copy from the host");
  if (e.n != n)
    throw BackendError("[fastmetal.compile] the step took another path when replayed: a copy "
                       "from the host changed its size");
  std::memcpy(arena_.data() + e.at, src, n);
}

void Capture::replay() { backend_->replay(*this); }

void Capture::set_replay_order(std::vector<std::size_t> order) {
  std::vector<bool> seen(entries_.size(), false);
  for (std::size_t i : order) {
    if (i >= entries_.size() || seen[i])
      throw ValueError("[fastmetal.compile] expected replay_order to be a permutation of the " +
                       std::to_string(entries_.size()) + " recorded entries, got index " +
                       std::to_string(i) + (i < entries_.size() ? " twice" : ""));
    seen[i] = true;
  }
  if (!order.empty() && order.size() != entries_.size())
    throw ValueError("[fastmetal.compile] expected replay_order to be a permutation of the " +
                     std::to_string(entries_.size()) + " recorded entries, got " +
                     std::to_string(order.size()) + " indices");
  replay_order_ = std::move(order);
}

bool on_launch(const std::string& kernel, const Dispatch& d, const std::vector<KernelArg>& args) {
  if (t_patching != nullptr) {
    t_patching->patch_kernel(kernel, args);
    return true;
  }
  if (t_recording != nullptr) t_recording->add_kernel(kernel, d, args);
  return false;
}

bool on_upload(Storage& dst, std::size_t offset, const void* src, std::size_t n) {
  if (t_patching != nullptr) {
    t_patching->patch_upload(n, src);
    return true;
  }
  if (t_recording != nullptr) t_recording->add_upload(dst, offset, src, n);
  return false;
}

void on_host_read(const char* what) {
  if (t_recording != nullptr) t_recording->note_host_read(what);
}

void run_host(std::function<void()> work, std::vector<StoragePtr> keep) {
  if (Capture* p = patching()) {
    p->next_to_patch(Entry::Kind::host_call, "a host operation");
    return;
  }
  work();
  if (Capture* r = recording()) {
    Entry& e = r->add_host_call();
    auto kept = std::make_shared<std::vector<StoragePtr>>(std::move(keep));
    e.state = kept;
    e.call = std::move(work);
  }
}

}  // namespace fm::capture

namespace fm {
using capture::Entry;

// The portable replay: the recorded work in order (or a test's replay_order), through the backend's own entry points
// (the CPU's thread pool, Metal's command encoder): no Python, no argument checks, no
// allocation. Argument blocks are read from the arena where patches wrote them.
void Backend::replay(capture::Capture& c) {
  std::vector<KernelArg> args;
  const std::vector<std::size_t>& order = c.replay_order();
  for (std::size_t k = 0; k < c.size(); ++k) {
    const Entry& e = c.entries()[order.empty() ? k : order[k]];
    switch (e.kind) {
      case Entry::Kind::kernel:
        args = e.args;
        for (const auto& [i, at] : e.blocks) args[i].bytes = c.arena_at(at);
        run_kernel(e.kernel, e.dispatch, args);
        break;
      case Entry::Kind::host_call:
        e.call();
        break;
      case Entry::Kind::upload:
        write_from_host(*e.dst, e.dst_offset, c.arena_at(e.at), e.n);
        break;
      case Entry::Kind::fused:
        break;
    }
  }
  end_op();
}

}  // namespace fm
