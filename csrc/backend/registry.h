// How a backend joins the device registry (registry.cpp): its own folder registers its
// factory once, at load time, so the registry names no backend:
//
//   FM_REGISTER_BACKEND(name, rank, &make_for_registry);
//
// The rank orders fastmetal.devices() (lowest first; the first available one is the
// default device). The factory returns the backend, or nullptr with `why_not` set (one
// line) where the device is absent.
#pragma once
#include <memory>
#include <string>

#include "backend.h"

namespace fm {

using BackendFactory = std::unique_ptr<Backend> (*)(std::string& why_not);

// Returns true, so that a registration can initialise a static bool.
bool register_backend(const char* name, int rank, BackendFactory make);
// How to get the backend `name` (rank as registered) where a build lacks it, for
// device_problems(): "<name>: not built (<how>)". Registered by build_hint.cpp in the
// backend's folder, which every build compiles (CMakeLists.txt), built backend or not.
bool register_build_hint(const char* name, int rank, const char* how);

}  // namespace fm

#define FM_REGISTER_BACKEND(name, rank, make) \
  static const bool fm_backend_registered = ::fm::register_backend(name, rank, make)
#define FM_BUILD_HINT(name, rank, how) \
  static const bool fm_build_hint_registered = ::fm::register_build_hint(name, rank, how)
