// Kernel instantiation, written once for every backend.
//
//   FM_INSTANTIATE("unary_v_sigmoid_float32", unary_v, float, Op_sigmoid);
//
// On Metal this is an explicit template instantiation carrying the host name the library
// finds the function by. On the CPU and CUDA the build's generator (tools/gen/gen_kernels.py)
// reads these lines and writes the launch entries, so here the macro expands to nothing.
//
//   FM_INSTANTIATE_CPU("fourier_series_l16", fourier_series_k, 16);
//
// A variant only the CPU uses (several lanes per thread, for its vector units): the CPU
// gets an entry, the metallib and the CUDA build leave it out.
//
//   FM_INSTANTIATE_DISCRETE("matmul_128x128_kn", matmul_gemm, 128, 128, 16, ...);
//
// A variant for discrete GPUs that Apple's GPUs cannot run (more than their 32 KiB of
// threadgroup memory): CUDA and the CPU (whose tests run every variant) get entries, the
// metallib leaves it out, and the Metal host never asks for it.
#pragma once

#if defined(__METAL_VERSION__)
#define FM_INSTANTIATE(name, func, ...) \
  template [[host_name(name)]] [[kernel]] decltype(func<__VA_ARGS__>) func<__VA_ARGS__>
#else
#define FM_INSTANTIATE(name, func, ...) static_assert(true, name)
#endif
#define FM_INSTANTIATE_CPU(name, func, ...) static_assert(true, name)
#define FM_INSTANTIATE_DISCRETE(name, func, ...) static_assert(true, name)

// Whether the target has double (Apple GPUs do not): code that names double, which only
// FM_INSTANTIATE_DISCRETE instances use, sits under #if FM_HAS_DOUBLE.
#if defined(__METAL_VERSION__)
#define FM_HAS_DOUBLE 0
#else
#define FM_HAS_DOUBLE 1
#endif

// Helper functions called by kernels. On the CPU they must be inlined into the kernel's
// loop or it does not vectorise (GCC otherwise keeps big helpers like fm_exp out of line);
// on CUDA they must be device functions.
#if defined(__METAL_VERSION__)
#define FM_FUNC inline
#elif defined(__CUDACC__)
#define FM_FUNC __device__ __forceinline__
#else
#define FM_FUNC inline __attribute__((always_inline))
#endif

// Unroll the next loop completely (a constant trip count): the register arrays it indexes
// then stay in registers. Metal's compiler and nvcc take a pragma; the CPU build leaves the
// choice to its vectoriser.
#if defined(__METAL_VERSION__)
#define FM_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__CUDACC__)
#define FM_UNROLL _Pragma("unroll")
#else
#define FM_UNROLL
#endif
