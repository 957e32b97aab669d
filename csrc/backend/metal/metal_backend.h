// The Metal backend (Apple GPUs). Plain C++: the Objective-C++ lives in metal_backend.mm,
// the only Objective-C in the project; nothing Objective-C crosses this header.
#pragma once
#include <memory>
#include <string>

#include "../backend.h"

namespace fm::metal {

// The backend on MTLCreateSystemDefaultDevice() (else the first of MTLCopyAllDevices()), or
// nullptr where there is no usable Metal device (none at all, or one without Metal 3):
// then devices() omits "metal" and one line on stderr says why.
std::unique_ptr<Backend> make_metal_backend();

// Why the last make_metal_backend() returned nullptr, in one line ("" if it did not).
std::string metal_unavailable_reason();

}  // namespace fm::metal
