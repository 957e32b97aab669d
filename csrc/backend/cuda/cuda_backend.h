// The CUDA backend (optional, Linux + NVIDIA): the same metal/*.metal kernels compiled by
// nvcc through metal/compat/cuda. Device memory is not host-visible: NumPy inputs and
// results are copied, fastmetal.Arrays stay on the GPU.
#pragma once
#include <memory>

#include "../backend.h"

namespace fm::cuda {
// nullptr when no CUDA device (or driver) is usable.
std::unique_ptr<Backend> make_cuda_backend();
}  // namespace fm::cuda
