// Which devices exist, which one ops use by default, and the backend-generic defaults.
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <map>
#include <mutex>

#include "../core/errors.h"
#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_kernel_abi.h"
#include "env_config.h"
#if defined(FASTMETAL_HAVE_METAL)
#include "metal/metal_backend.h"
#endif
#if defined(FASTMETAL_HAVE_CUDA)
#include "cuda/cuda_backend.h"
#endif

namespace fm {
namespace {

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
#if defined(FASTMETAL_HAVE_METAL)
    if (auto b = metal::make_metal_backend()) {
      r->order.push_back("metal");
      r->backends["metal"] = std::move(b);
    } else {
      r->problems.push_back("metal: " + metal::metal_unavailable_reason());
    }
#elif defined(__APPLE__)
    r->problems.push_back("metal: not built (this build was configured with FASTMETAL_METAL=OFF "
                          "or without Apple's Metal compiler)");
#else
    r->problems.push_back("metal: not built (Metal needs macOS and an Apple GPU)");
#endif
#if defined(FASTMETAL_HAVE_CUDA)
    if (auto b = cuda::make_cuda_backend()) {
      r->order.push_back("cuda");
      r->backends["cuda"] = std::move(b);
    } else {
      r->problems.push_back("cuda: no usable NVIDIA GPU found (no device, no driver, or the "
                            "driver is older than the CUDA runtime this was built with)");
    }
#else
    r->problems.push_back("cuda: not built (build with FASTMETAL_CUDA=ON where nvcc and an "
                          "NVIDIA GPU are present)");
#endif
    r->order.push_back("cpu");
    r->backends["cpu"] = cpu::make_cpu_backend();
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
  cpu::kernel_isa();
  registry();
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
