// The float lanes of one native vector register for the ISA this file is compiled for
// (isa_dispatch.h builds each isa/ file once per ISA, each in its own namespace): the one
// place where the files written with the compiler's vector types (norm_loops.h,
// reduce_rows.cpp, attention.cpp) choose their width. simd_kernels.h has its intrinsics.
#pragma once

namespace fm::cpu::FM_CPU_ISA {
#if defined(__AVX512F__)
inline constexpr int kFloatLanes = 16;  // zmm
#elif defined(__AVX2__)
inline constexpr int kFloatLanes = 8;   // ymm
#else
inline constexpr int kFloatLanes = 4;   // xmm (SSE2, the x86-64 base) or NEON
#endif
}  // namespace fm::cpu::FM_CPU_ISA
