// Kernel instantiation, written once for every backend.
//
//   FM_INSTANTIATE("unary_v_sigmoid_float32", unary_v, float, Op_sigmoid);
//
// On Metal this is an explicit template instantiation carrying the host name the library
// finds the function by. On the CPU and CUDA the build's generator (tools/gen_kernels.py)
// reads these lines and writes the launch entries, so here the macro expands to nothing.
#pragma once

#if defined(__METAL_VERSION__)
#define FM_INSTANTIATE(name, func, ...) \
  template [[host_name(name)]] [[kernel]] decltype(func<__VA_ARGS__>) func<__VA_ARGS__>
#else
#define FM_INSTANTIATE(name, func, ...) static_assert(true, name)
#endif
