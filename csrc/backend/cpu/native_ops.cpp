#include "native_ops.h"

#include <cstdint>
#include <cstring>

#include "cpu_kernel_abi.h"

namespace fm::cpu {

NativeOps& native_ops() {
  static NativeOps ops;
  return ops;
}

std::atomic<bool>& native_conv2d_enabled() {
  static std::atomic<bool> enabled{true};
  return enabled;
}

std::atomic<bool>& native_reduce_matmul_enabled() {
  static std::atomic<bool> enabled{true};
  return enabled;
}

namespace {

// Samples per thread of the numerics kernels' wide variants (fourier_series_l<N>,
// stencil_*_l16_*): the CPU runs many per thread so the loop over them vectorises (GPUs
// run one). On AVX-512, 64 lanes = four independent 16-wide recurrences that hide the FMA
// latency (measured faster than 16 or 32); narrower ISAs have 16 vector registers, so 16
// lanes keep the state (5 vectors of lanes) in registers.
std::int64_t fourier_series_lanes() { return std::strcmp(kernel_isa(), "avx512") == 0 ? 64 : 16; }
std::int64_t stencil_lanes() { return 16; }

}  // namespace

FM_CPU_NATIVE("fourier_series_lanes", &fourier_series_lanes);
FM_CPU_NATIVE("stencil_lanes", &stencil_lanes);

}  // namespace fm::cpu
