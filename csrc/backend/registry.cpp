// Which devices exist, which one ops use by default, and the backend-generic defaults.
// The backends register themselves from their folders (registry.h); this file names none.
#include "registry.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <map>
#include <mutex>

#include "../core/errors.h"
#include "env_config.h"

namespace fm {
namespace {

// What a user is told about a backend this build does not contain (one line each; a
// backend that is built says itself why its device is missing).
#if defined(__APPLE__)
constexpr bool kApple = true;
#else
constexpr bool kApple = false;
#endif
struct Unbuilt {
  const char* name;
  const char* how;
};
const Unbuilt kBuildHints[] = {
    {"metal", kApple ? "this build was configured with FASTMETAL_METAL=OFF or without Apple's "
                       "Metal compiler"
                     : "Metal needs macOS and an Apple GPU"},
    {"cuda", "build with FASTMETAL_CUDA=ON where nvcc and an NVIDIA GPU are present"},
};

struct Registration {
  const char* name;
  int rank;
  BackendFactory make;
};

// Filled during static initialisation (before any registry() call), hence a function static.
std::vector<Registration>& registrations() {
  static auto* list = new std::vector<Registration>();  // leaked, as the registry
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
    for (const Unbuilt& u : kBuildHints)
      if (std::none_of(regs.begin(), regs.end(),
                       [&](const Registration& reg) { return std::strcmp(reg.name, u.name) == 0; }))
        r->problems.push_back(std::string(u.name) + ": not built (" + u.how + ")");
    if (r->order.empty()) throw BackendError("[fastmetal] internal: no backend registered");
    r->default_backend = r->backends[r->order.front()].get();
    if (const char* env = std::getenv("FASTMETAL_DEVICE"); env && *env) {
      auto it = r->backends.find(env);
      r->default_backend = it == r->backends.end() ? nullptr : it->second.get();
      if (it == r->backends.end())
        r->env_error = std::string("[fastmetal] FASTMETAL_DEVICE='") + env +
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
namespace {
std::mutex problems_mu;
std::vector<std::string>& problem_list() {
  static auto* list = new std::vector<std::string>();  // leaked, as the registry
  return *list;
}
std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

void report(const std::string& problem) {
  std::lock_guard<std::mutex> lock(problems_mu);
  auto& list = problem_list();
  for (const auto& p : list)
    if (p == problem) return;
  list.push_back(problem);
}

int num_threads() {
  const char* value = std::getenv("FASTMETAL_NUM_THREADS");
  if (value == nullptr || *value == '\0') return 0;
  // Digits only: std::stoi would take "4abc" as 4 and "-1" as a number.
  long n = 0;
  bool ok = std::strlen(value) <= 4;
  for (const char* c = value; ok && *c; ++c) {
    ok = *c >= '0' && *c <= '9';
    n = n * 10 + (*c - '0');
  }
  if (ok && n >= 1 && n <= 1024) return int(n);
  report(std::string("[fastmetal] FASTMETAL_NUM_THREADS='") + value +
         "' is not understood; accepted values: an integer from 1 to 1024; using the cores "
         "this process may use instead");
  return 0;
}

std::string cpu_isa(const std::vector<std::string>& known, bool (*usable)(const std::string&)) {
  const char* value = std::getenv("FASTMETAL_CPU_ISA");
  if (value == nullptr || *value == '\0') return "";
  const std::string isa = value;
  bool is_known = false;
  for (const auto& k : known) is_known = is_known || k == isa;
  if (is_known && usable(isa)) return isa;
  std::vector<std::string> here;
  for (const auto& k : known)
    if (usable(k)) here.push_back(k);
  report("[fastmetal] FASTMETAL_CPU_ISA='" + isa + "' " +
         (is_known ? "is not supported by this CPU" : "is not understood") +
         "; accepted values: " + joined(known) + " (this CPU: " + joined(here) +
         "); using " + here.back() + " instead");
  return "";
}

std::vector<std::string> config_problems() {
  num_threads();
  registry();  // constructs every backend: each reports what it did not understand
  std::vector<std::string> all;
  {
    std::lock_guard<std::mutex> lock(problems_mu);
    all = problem_list();
  }
  std::lock_guard<std::mutex> lock(registry().mu);
  if (!registry().env_error.empty()) all.push_back(registry().env_error);
  return all;
}

}  // namespace env

void Backend::copy_to_host(const Storage& src, std::size_t offset, void* dst, std::size_t n) {
  std::memcpy(dst, static_cast<const char*>(src.host) + offset, n);
}
void Backend::copy_from_host(Storage& dst, std::size_t offset, const void* src, std::size_t n) {
  std::memcpy(static_cast<char*>(dst.host) + offset, src, n);
}

}  // namespace fm
