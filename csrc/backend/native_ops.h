// Fast paths owned by a backend. An op that can use a backend's own implementation asks
// for it by name and signature and falls back to the portable MSL kernels when there is
// none:
//
//   using Forward = void(const Conv2dArgs&, const Array&, const Array&, const Array*, const Array&);
//   if (auto fast = native<Forward>(backend, "conv2d_forward")) return fast(a, x, w, bias, y);
//
// A backend keeps one NativeOps table and returns its entries from Backend::native_op; the
// implementations register themselves from the backend's own folder (see the CPU backend's
// FM_CPU_NATIVE). The op names no backend and no instruction set; the backend never
// includes the op.
#pragma once
#include <atomic>
#include <cstring>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "../core/errors.h"
#include "backend.h"
#include "capture.h"

namespace fm {

struct NativeOp {
  const char* name = nullptr;
  const std::type_info* type = nullptr;  // the function type it was registered with
  void (*fn)() = nullptr;                // type-erased function pointer
  // Where set and false, the entry is switched off (a backend's private switch for tests
  // and benchmarks that want the portable kernels).
  const std::atomic<bool>* enabled = nullptr;
};

class NativeOps {
 public:
  // Returns true, so that a registration can initialise a static bool.
  template <typename Fn>
  bool add(const char* name, Fn* fn, const std::atomic<bool>* enabled = nullptr) {
    entries_.push_back(NativeOp{name, &typeid(Fn), reinterpret_cast<void (*)()>(fn), enabled});
    return true;
  }
  const NativeOp* find(const char* name) const {
    for (const NativeOp& e : entries_)
      if (std::strcmp(e.name, name) == 0)
        return e.enabled == nullptr || e.enabled->load(std::memory_order_relaxed) ? &e : nullptr;
    return nullptr;
  }

 private:
  std::vector<NativeOp> entries_;  // a handful per backend: a linear scan is fastest
};

// The backend's implementation of `name` with signature Fn, or nullptr (raw: the caller
// runs it outside any capture bookkeeping; ops use native() below).
template <typename Fn>
Fn* native_pointer(const Backend& b, const char* name) {
  const NativeOp* op = b.native_op(name);
  if (op == nullptr) return nullptr;
  if (*op->type != typeid(Fn))
    throw BackendError(std::string("[fastmetal] internal: the '") + b.name() +
                       "' backend registered native op '" + name + "' with another signature");
  return reinterpret_cast<Fn*>(op->fn);
}

// A native op as ops call it: a function that is recorded by a capture (fastmetal.compile)
// like a kernel launch, for operations that run on the host (void results); queries
// (std::int64_t() choices) just run.
template <typename Fn>
class NativeFn;
template <typename R, typename... A>
class NativeFn<R(A...)> {
 public:
  explicit NativeFn(R (*fn)(A...)) : fn_(fn) {}
  explicit operator bool() const { return fn_ != nullptr; }
  R operator()(A... args) const {
    if constexpr (std::is_void<R>::value) {
      capture::run_native(fn_, args...);
    } else {
      return fn_(args...);
    }
  }

 private:
  R (*fn_)(A...);
};

// The backend's implementation of `name` with signature Fn (falsy where it has none).
template <typename Fn>
NativeFn<Fn> native(const Backend& b, const char* name) {
  return NativeFn<Fn>(native_pointer<Fn>(b, name));
}

}  // namespace fm
