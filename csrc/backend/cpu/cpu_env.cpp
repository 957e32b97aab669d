#include "cpu_env.h"

#include <cstdlib>
#include <cstring>

#include "../env_config.h"

namespace fm::cpu {
namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

int env_num_threads() {
  const char* value = std::getenv("FASTMETAL_NUM_THREADS");
  if (value == nullptr || *value == '\0') return 0;
  // Digits only: std::stoi would take "4abc" as 4 and "-1" as a number.
  long n = 0;
  bool ok = std::strlen(value) <= 4;
  for (const char* c = value; ok && *c; ++c) {
    ok = *c >= '0' && *c <= '9';
    n = n * 10 + (*c - '0');
  }
  if (ok && n >= 1 && n <= 1024) return int(n);
  env::report(std::string("[fastmetal] FASTMETAL_NUM_THREADS='") + value +
              "' is not understood; accepted values: an integer from 1 to 1024; using the "
              "cores this process may use instead");
  return 0;
}

std::string env_cpu_isa(const std::vector<std::string>& known, bool (*usable)(const std::string&)) {
  const char* value = std::getenv("FASTMETAL_CPU_ISA");
  if (value == nullptr || *value == '\0') return "";
  const std::string isa = value;
  bool is_known = false;
  for (const auto& k : known) is_known = is_known || k == isa;
  if (is_known && usable(isa)) return isa;
  std::vector<std::string> here;
  for (const auto& k : known)
    if (usable(k)) here.push_back(k);
  env::report("[fastmetal] FASTMETAL_CPU_ISA='" + isa + "' " +
              (is_known ? "is not supported by this CPU" : "is not understood") +
              "; accepted values: " + joined(known) + " (this CPU: " + joined(here) +
              "); using " + here.back() + " instead");
  return "";
}

std::optional<std::uint64_t> env_emulator_seed() {
  const char* value = std::getenv("FASTMETAL_EMULATOR_SEED");
  if (value == nullptr) return std::nullopt;
  return std::uint64_t(std::strtoull(value, nullptr, 10));
}

}  // namespace fm::cpu
