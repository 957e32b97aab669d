// The CPU backend: kernels from metal/*.metal compiled as C++ (generated entries), run
// on a thread pool; memory is ordinary page-aligned host memory.
#pragma once
#include <memory>

#include "../backend.h"

namespace fm::cpu {
std::unique_ptr<Backend> make_cpu_backend();
}
