// Typed kernel arguments for the generated launch entries of every backend: the parameter
// types come from the kernel's own signature (decltype of the instantiated function), so
// the generator only has to know which parameter is a buffer and which a builtin.
//
// FM_ENTRY_FN qualifies these helpers: plain `inline` on the CPU; the CUDA entry header
// defines it as `__device__ __forceinline__` before including this file.
#pragma once
#include <cstddef>
#include <tuple>
#include <type_traits>

#ifndef FM_ENTRY_FN
#define FM_ENTRY_FN inline
#endif

namespace fm::kernel_params {

template <typename F>
struct params_of;
template <typename R, typename... A>
struct params_of<R (*)(A...)> {
  using type = std::tuple<A...>;
};
template <typename F, std::size_t I>
using param_t = std::tuple_element_t<I, typename params_of<F>::type>;

// A buffer argument: pointer parameters get the pointer, reference (and by-value)
// parameters the object it points to.
template <typename F, std::size_t I>
FM_ENTRY_FN decltype(auto) arg(void* p) {
  using P = param_t<F, I>;
  if constexpr (std::is_pointer_v<P>) {
    return static_cast<P>(p);
  } else {
    using V = std::remove_reference_t<P>;
    return *static_cast<V*>(p);
  }
}

// A builtin argument from a position with .x .y .z: uint takes x, uint2 (x, y), uint3 all.
template <typename F, std::size_t I, typename Vec3,
          typename = std::enable_if_t<!std::is_arithmetic_v<Vec3>>>
FM_ENTRY_FN auto builtin(const Vec3& v) {
  using P = std::remove_cv_t<std::remove_reference_t<param_t<F, I>>>;
  if constexpr (std::is_integral_v<P>) {
    return static_cast<P>(v.x);
  } else if constexpr (sizeof(P) == 2 * sizeof(v.x)) {
    return P(v.x, v.y);
  } else {
    return P(v.x, v.y, v.z);
  }
}
// A scalar builtin (thread_index_in_threadgroup, ...).
template <typename F, std::size_t I>
FM_ENTRY_FN auto builtin(unsigned int v) {
  using P = std::remove_cv_t<std::remove_reference_t<param_t<F, I>>>;
  return static_cast<P>(v);
}

}  // namespace fm::kernel_params
