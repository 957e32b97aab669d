// Hand-written CPU algorithms that should be compiled once per instruction set (like the
// generated kernel entries) live in csrc/backend/cpu/isa/*.cpp, inside
// `namespace fm::cpu::FM_CPU_ISA { ... }`. CMake compiles each of those files once per ISA
// (base, and on x86-64 also avx2 and avx512); call them through FM_CPU_DISPATCH, which picks
// the copy matching kernel_isa() (the same choice as the kernels):
//
//   // isa/gemm.cpp:  namespace fm::cpu::FM_CPU_ISA { void sgemm(...) { ... } }
//   // declare once:  FM_CPU_DECLARE(void sgemm(int, int, int, const float*, ...));
//   FM_CPU_DISPATCH(sgemm, m, n, k, a, b, c);
#pragma once
#include <cstring>

#include "cpu_kernel_abi.h"

#if defined(FM_CPU_HAVE_AVX512)
#define FM_CPU_DECLARE_AVX512(decl) namespace avx512 { decl; }
#else
#define FM_CPU_DECLARE_AVX512(decl)
#endif
#if defined(FM_CPU_HAVE_AVX2)
#define FM_CPU_DECLARE_AVX2(decl) namespace avx2 { decl; }
#else
#define FM_CPU_DECLARE_AVX2(decl)
#endif

// Use at namespace fm::cpu scope.
#define FM_CPU_DECLARE(decl)  \
  namespace base { decl; }    \
  FM_CPU_DECLARE_AVX2(decl)   \
  FM_CPU_DECLARE_AVX512(decl)

namespace fm::cpu {
enum class Isa { base, avx2, avx512 };
inline Isa current_isa() {
  static const Isa isa = [] {
    const char* s = kernel_isa();
    if (std::strcmp(s, "avx512") == 0) return Isa::avx512;
    if (std::strcmp(s, "avx2") == 0) return Isa::avx2;
    return Isa::base;
  }();
  return isa;
}
}  // namespace fm::cpu

// Each built ISA separately: a build of base and avx512 alone (FASTMETAL_CPU_ISAS) must still
// run the avx512 copies (it ran base's when the macro required both, seen on the GPU
// machine's Xeon: matmul 4x slower while _cpu_isa() said avx512).
#if defined(FM_CPU_HAVE_AVX512)
#define FM_CPU_IF_AVX512(fn, ...) \
  ::fm::cpu::current_isa() == ::fm::cpu::Isa::avx512 ? ::fm::cpu::avx512::fn(__VA_ARGS__) :
#else
#define FM_CPU_IF_AVX512(fn, ...)
#endif
#if defined(FM_CPU_HAVE_AVX2)
#define FM_CPU_IF_AVX2(fn, ...) \
  ::fm::cpu::current_isa() == ::fm::cpu::Isa::avx2 ? ::fm::cpu::avx2::fn(__VA_ARGS__) :
#else
#define FM_CPU_IF_AVX2(fn, ...)
#endif
#define FM_CPU_DISPATCH(fn, ...)                                                  \
  (FM_CPU_IF_AVX512(fn, __VA_ARGS__) FM_CPU_IF_AVX2(fn, __VA_ARGS__)::fm::cpu::base::fn( \
      __VA_ARGS__))
