// The backend-neutral FASTMETAL_* variables (env_config.h says which, and where the others are).
#include <algorithm>
#include "env_config.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace fm::env {
namespace {

std::mutex problems_mu;
std::vector<std::string>& problem_list() {
  static auto* list = new std::vector<std::string>();  // leaked, as the device registry
  return *list;
}

// The variable's value, or null where it is unset or empty.
const char* value_of(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

}  // namespace

void report(const std::string& problem) {
  std::lock_guard<std::mutex> lock(problems_mu);
  auto& list = problem_list();
  for (const auto& p : list)
    if (p == problem) return;
  list.push_back(problem);
}

std::vector<std::string> reported() {
  std::lock_guard<std::mutex> lock(problems_mu);
  return problem_list();
}

std::string device() {
  const char* value = value_of("FASTMETAL_DEVICE");
  return value != nullptr ? value : "";
}

std::string conv_tile() {
  const char* value = value_of("FASTMETAL_CONV_TILE");
  return value != nullptr ? value : "";
}

std::optional<std::int64_t> conv_splits() {
  const char* value = value_of("FASTMETAL_CONV_SPLITS");
  if (value == nullptr) return std::nullopt;
  return std::int64_t(std::atoll(value));
}

std::string matmul_tile() {
  const char* value = value_of("FASTMETAL_MATMUL_TILE");
  return value == nullptr ? std::string() : std::string(value);
}

std::int64_t matmul_splits() {
  const char* value = value_of("FASTMETAL_MATMUL_SPLITS");
  return value == nullptr ? 0 : std::max<std::int64_t>(0, std::atoll(value));
}

int conv_algo() {
  const char* value = value_of("FASTMETAL_CONV_ALGO");
  if (value == nullptr) return -1;
  if (std::strcmp(value, "gemm") == 0) return 0;
  if (std::strcmp(value, "winograd") == 0) return 2;
  if (std::strcmp(value, "winograd4") == 0) return 4;
  return -1;
}

std::int64_t elementwise_grid() {
  const char* value = value_of("FASTMETAL_ELEMENTWISE_GRID");
  if (value == nullptr) return 0;
  if (std::strcmp(value, "device") == 0) return kGridDevice;
  const long j = std::strtol(value, nullptr, 10);
  return j > 0 ? j : 0;
}

int sdpa_forward() {
  const char* value = value_of("FASTMETAL_SDPA_FORWARD");
  if (value == nullptr) return -1;
  if (std::strcmp(value, "tiled") == 0) return 1;
  if (std::strcmp(value, "classic") == 0) return 0;
  if (std::strcmp(value, "split") == 0) return 2;
  if (std::strcmp(value, "prefetch") == 0) return 3;
  report(std::string("[fastmetal] FASTMETAL_SDPA_FORWARD='") + value +
         "' is not understood; accepted values: tiled, classic, split, prefetch; using "
         "the op's choice instead");
  return -1;
}

int sdpa_backward() {
  const char* value = value_of("FASTMETAL_SDPA_BACKWARD");
  if (value == nullptr) return -1;
  if (std::strcmp(value, "tiled") == 0) return 1;
  if (std::strcmp(value, "classic") == 0) return 0;
  report(std::string("[fastmetal] FASTMETAL_SDPA_BACKWARD='") + value +
         "' is not understood; accepted values: tiled, classic; using "
         "the op's choice instead");
  return -1;
}

}  // namespace fm::env
