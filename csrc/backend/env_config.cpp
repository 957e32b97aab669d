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

namespace {

struct Choice {
  const char* name;
  int value;
};

// The value of the variable `var` among `choices` (names to numbers); -1 where it is unset,
// and -1 with one reported problem naming the accepted values where it is none of them.
template <std::size_t N>
int named_choice(const char* var, const Choice (&choices)[N]) {
  const char* value = value_of(var);
  if (value == nullptr) return -1;
  std::string accepted;
  for (const Choice& c : choices) {
    if (std::strcmp(value, c.name) == 0) return c.value;
    accepted += std::string(accepted.empty() ? "" : ", ") + c.name;
  }
  report(std::string("[fastmetal] ") + var + "='" + value +
         "' is not understood; accepted values: " + accepted + "; using the default instead");
  return -1;
}

}  // namespace

int sdpa_forward() {
  static const Choice kForward[] = {{"tiled", 1}, {"classic", 0}, {"split", 2}, {"prefetch", 3}};
  return named_choice("FASTMETAL_SDPA_FORWARD", kForward);
}

int sdpa_backward() {
  static const Choice kBackward[] = {{"tiled", 1}, {"classic", 0}};
  return named_choice("FASTMETAL_SDPA_BACKWARD", kBackward);
}

bool compile_fusion() {
  static const Choice kFusion[] = {{"1", 1}, {"0", 0}};
  return named_choice("FASTMETAL_COMPILE_FUSION", kFusion) != 0;
}

int compile_streams() {
  static const Choice kStreams[] = {{"1", 1}, {"2", 2}, {"3", 3}, {"4", 4},
                                    {"5", 5}, {"6", 6}, {"7", 7}, {"8", 8}};
  const int n = named_choice("FASTMETAL_COMPILE_STREAMS", kStreams);
  return n > 0 ? n : 4;
}

}  // namespace fm::env
