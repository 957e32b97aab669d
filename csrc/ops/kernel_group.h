// The one place that decides whether an op of csrc/ops/ runs fastmetal's own CPU algorithm
// (plain C++ / the conv2d GEMM engine) instead of its MSL kernels: on the `cpu` device,
// unless a test forced the kernels (which then run under the CPU fiber emulator, the
// oracle of the Metal kernels). Used by reductions and matmul; conv2d has its own switch
// in csrc/conv2d.cpp.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace fm {

bool use_cpu_fast_path(const Backend& b);
// Tests: false forces the MSL kernels on the cpu device.
void set_cpu_fast_path(bool enabled);
bool cpu_fast_path_enabled();

// Tests: threads per group for the reduction and matmul kernels (0: the op's own choice).
void set_kernel_group_size(std::uint32_t threads);
std::uint32_t kernel_group_size();

}  // namespace fm
