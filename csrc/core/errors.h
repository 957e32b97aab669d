// Error types of the portable core. module.cpp maps them onto Python exceptions:
// ValueError / TypeError for bad input (raised before any work starts), RuntimeError
// for failures of a backend or driver, and IndexError for an id or class label out of range
// (Python's IndexError and ValueError at once, as NumPy's AxisError: PyTorch raises
// IndexError there, and fastmetal raised ValueError before).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace fm {

struct ValueError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
struct IndexError : ValueError {
  using ValueError::ValueError;
};
struct TypeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
struct BackendError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "[fastmetal.conv2d] expected a 4-D input (N, C, H, W), got shape (3, 32, 32)"
template <typename... Parts>
std::string message(const std::string& op, const Parts&... parts) {
  std::ostringstream s;
  s << "[fastmetal." << op << "] ";
  (s << ... << parts);
  return s.str();
}

}  // namespace fm
