// The Metal backend (Apple GPUs). Plain C++: the Objective-C++ lives in metal_backend.mm,
// the only Objective-C in the project; nothing Objective-C crosses this header.
#pragma once
#include <memory>

#include "../backend.h"

namespace fm::metal {

// The backend on MTLCreateSystemDefaultDevice(), or nullptr where there is no usable
// Metal device (none at all, or one without Metal 3) — then devices() omits "metal".
std::unique_ptr<Backend> make_metal_backend();

}  // namespace fm::metal
