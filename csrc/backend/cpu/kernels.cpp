// The CPU kernel registry. The generated entries are compiled once per instruction set
// (CMake: FM_CPU_ISAS); at first use the best one this processor supports is chosen.
// FASTMETAL_CPU_ISA=base|avx2|avx512 forces one (the tests run each).
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu_kernel_abi.h"
#include "cpu_env.h"
#include "kernel_stems.h"  // generated

namespace fm::cpu {
namespace base {
FM_GENERATED_KERNELS
}
#if defined(FM_CPU_HAVE_AVX2)
namespace avx2 {
FM_GENERATED_KERNELS
}
#endif
#if defined(FM_CPU_HAVE_AVX512)
namespace avx512 {
FM_GENERATED_KERNELS
}
#endif

namespace {

bool supported(const std::string& isa) {
  if (isa == "base") return true;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
#if defined(FM_CPU_HAVE_AVX2)
  if (isa == "avx2")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#endif
#if defined(FM_CPU_HAVE_AVX512)
  if (isa == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#endif
#endif
  return false;
}

std::string choose_isa() {
  std::vector<std::string> built = {"base"};
#if defined(FM_CPU_HAVE_AVX2)
  built.push_back("avx2");
#endif
#if defined(FM_CPU_HAVE_AVX512)
  built.push_back("avx512");
#endif
  // A value that is not built in or not supported here is reported and the best is used.
  if (std::string asked = env_cpu_isa(built, &supported); !asked.empty()) return asked;
  for (const char* isa : {"avx512", "avx2"})
    if (supported(isa)) return isa;
  return "base";
}

const std::string& chosen_isa() {
  static const std::string isa = choose_isa();
  return isa;
}

}  // namespace

const char* kernel_isa() { return chosen_isa().c_str(); }

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    const std::string& isa = chosen_isa();
    void (*fill)(KernelTable&) = &base::register_kernels;
#if defined(FM_CPU_HAVE_AVX512)
    if (isa == "avx512") fill = &avx512::register_kernels;
#endif
#if defined(FM_CPU_HAVE_AVX2)
    if (isa == "avx2") fill = &avx2::register_kernels;
#endif
    (void)isa;
    KernelTable t;
    fill(t);
    return t;
  }();
  return table;
}

}  // namespace fm::cpu
