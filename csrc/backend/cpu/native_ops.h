// The CPU backend's fast paths (see ../native_ops.h): plain C++ algorithms that beat the
// MSL kernels compiled for the CPU, registered from the file that implements them:
//
//   FM_CPU_NATIVE("conv2d_forward", conv2d_forward_native);
#pragma once
#include <atomic>

#include "../native_ops.h"

namespace fm::cpu {

NativeOps& native_ops();  // every CPU fast path, filled at load time

// The private switch behind fastmetal._core._set_cpu_conv_path: false runs conv2d's MSL
// kernels on the CPU too (tests and benchmarks compare the two).
std::atomic<bool>& native_conv2d_enabled();
// The private switch behind fastmetal._core._set_native_cpu: false runs the reduction and
// matmul MSL kernels on the CPU (under the fiber emulator, the oracle of the Metal
// kernels) instead of the CPU algorithms.
std::atomic<bool>& native_reduce_matmul_enabled();

}  // namespace fm::cpu

#define FM_CPU_NATIVE_CAT2(a, b) a##b
#define FM_CPU_NATIVE_CAT(a, b) FM_CPU_NATIVE_CAT2(a, b)
// Registers fn as the CPU's implementation of `name` (optionally behind a switch).
#define FM_CPU_NATIVE(name, ...)                                          \
  static const bool FM_CPU_NATIVE_CAT(fm_cpu_native_registered_, __LINE__) = \
      ::fm::cpu::native_ops().add(name, __VA_ARGS__)
