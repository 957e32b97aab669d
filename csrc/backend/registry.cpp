// Which devices exist and which one ops use by default.
// The backends register themselves from their folders (registry.h); this file names none.
#include "registry.h"

#include <algorithm>
#include <cstring>
#include <atomic>
#include <map>
#include <mutex>

#include "../core/errors.h"
#include "env_config.h"

namespace fm {
namespace {

struct Registration {
  const char* name;
  int rank;
  BackendFactory make;
};

// What a user is told about a backend this build may lack (FM_BUILD_HINT, from the
// backend's folder, compiled into every build).
struct BuildHint {
  const char* name;
  int rank;
  const char* how;
};

// Filled during static initialisation (before any registry() call), hence function statics.
std::vector<Registration>& registrations() {
  static auto* list = new std::vector<Registration>();  // leaked, as the registry
  return *list;
}
std::vector<BuildHint>& build_hints() {
  static auto* list = new std::vector<BuildHint>();  // leaked, as the registry
  return *list;
}

struct Registry {
  std::mutex mu;  // guards env_error
  std::map<std::string, std::unique_ptr<Backend>> backends;
  std::vector<std::string> order;  // best first
  // The default; null while FASTMETAL_DEVICE names something unusable (env_error says what)
  // and no set_default_device() has replaced it. Atomic: every op call reads it.
  std::atomic<Backend*> default_backend{nullptr};
  std::string env_error;
  // Why a backend is not in `order`, one line each ("metal: ...", "cuda: ...").
  std::vector<std::string> problems;
};

std::string available_list(const Registry& r) {
  std::string s;
  for (const auto& n : r.order) s += (s.empty() ? "" : ", ") + ("'" + n + "'");
  return s;
}

// Leaked on purpose: backends may still be in use while the interpreter shuts down.
Registry& registry() {
  static Registry* r = [] {
    auto* r = new Registry;
    std::vector<Registration> regs = registrations();
    std::stable_sort(regs.begin(), regs.end(),
                     [](const Registration& x, const Registration& y) { return x.rank < y.rank; });
    for (const Registration& reg : regs) {
      std::string why_not;
      if (auto b = reg.make(why_not)) {
        r->order.push_back(reg.name);
        r->backends[reg.name] = std::move(b);
      } else {
        r->problems.push_back(reg.name + (": " + why_not));
      }
    }
    // A backend that is built says itself why its device is missing; one that is not, here.
    std::vector<BuildHint> hints = build_hints();
    std::stable_sort(hints.begin(), hints.end(),
                     [](const BuildHint& x, const BuildHint& y) { return x.rank < y.rank; });
    for (const BuildHint& h : hints)
      if (std::none_of(regs.begin(), regs.end(),
                       [&](const Registration& reg) { return std::strcmp(reg.name, h.name) == 0; }))
        r->problems.push_back(std::string(h.name) + ": not built (" + h.how + ")");
    if (r->order.empty()) throw BackendError("[fastmetal] internal: no backend registered");
    r->default_backend = r->backends[r->order.front()].get();
    if (const std::string asked = env::device(); !asked.empty()) {
      auto it = r->backends.find(asked);
      r->default_backend = it == r->backends.end() ? nullptr : it->second.get();
      if (it == r->backends.end())
        r->env_error = std::string("[fastmetal] FASTMETAL_DEVICE='") + asked +
                       "' is not an available device; available: " + available_list(*r) +
                       " (accepted values: metal, cuda, cpu, where present); unset it or "
                       "call fastmetal.set_default_device()";
    }
    return r;
  }();
  return *r;
}

}  // namespace

bool register_backend(const char* name, int rank, BackendFactory make) {
  registrations().push_back(Registration{name, rank, make});
  return true;
}

bool register_build_hint(const char* name, int rank, const char* how) {
  build_hints().push_back(BuildHint{name, rank, how});
  return true;
}

std::vector<std::string> available_devices() { return registry().order; }

std::vector<std::string> device_problems() { return registry().problems; }

Backend& get_backend(const std::string& name) {
  Registry& r = registry();
  auto it = r.backends.find(name);
  if (it == r.backends.end())
    throw ValueError("[fastmetal] unknown or unavailable device '" + name +
                     "'; available: " + available_list(r));
  return *it->second;
}

Backend& default_backend() {
  Registry& r = registry();
  if (Backend* b = r.default_backend.load(std::memory_order_acquire)) return *b;
  std::lock_guard<std::mutex> lock(r.mu);
  if (Backend* b = r.default_backend.load()) return *b;  // set_default_device() just ran
  throw ValueError(r.env_error);
}

std::string default_device() { return default_backend().name(); }

void set_default_device(const std::string& name) {
  Registry& r = registry();
  Backend& b = get_backend(name);  // validates
  std::lock_guard<std::mutex> lock(r.mu);
  r.env_error.clear();
  r.default_backend.store(&b, std::memory_order_release);
}

namespace env {

std::vector<std::string> config_problems() {
  registry();  // constructs every backend: each reports what it did not understand
  sdpa_forward();  // an op's hook, read on every call: checked here too so a typo warns
  sdpa_backward();
  compile_fusion();
  compile_streams();
  std::vector<std::string> all = reported();
  std::lock_guard<std::mutex> lock(registry().mu);
  if (!registry().env_error.empty()) all.push_back(registry().env_error);
  return all;
}

}  // namespace env

void Backend::copy_to_host(const Storage& src, std::size_t offset, void* dst, std::size_t n) {
  std::memcpy(dst, static_cast<const char*>(src.host) + offset, n);
}
void Backend::write_from_host(Storage& dst, std::size_t offset, const void* src, std::size_t n) {
  std::memcpy(static_cast<char*>(dst.host) + offset, src, n);
}

}  // namespace fm
