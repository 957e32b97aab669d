// How a backend joins the device registry (registry.cpp): its own folder registers its
// factory once, at load time, so the registry names no backend:
//
//   FM_REGISTER_BACKEND("cuda", 20, &make_for_registry);
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

}  // namespace fm

#define FM_REGISTER_BACKEND(name, rank, make) \
  static const bool fm_backend_registered = ::fm::register_backend(name, rank, make)
