// First include of every generated CPU entry file: all system headers come before the
// .metal source, whose shim defines keyword macros (kernel, device, ...) that would
// break system headers included after it.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "cpu_kernel_abi.h"
