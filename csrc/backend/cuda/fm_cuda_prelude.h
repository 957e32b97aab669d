// First include of every generated CUDA entry file: CUDA and system headers come before
// the .metal source, whose shim defines keyword macros (see fm_cpu_prelude.h).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "cuda_kernel_abi.h"
