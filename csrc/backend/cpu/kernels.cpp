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

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

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

#if defined(__x86_64__) && defined(__GNUC__)
// What this processor and its OS support, read with CPUID and XGETBV directly: the
// compilers' __builtin_cpu_supports needs a runtime (libgcc's, compiler-rt's) that some
// toolchains stub out, answering "no" to everything (zig's, which builds the manylinux wheel
// in tools/ci/wheel_check.sh). An instruction set counts only when the OS saves its registers.
struct X86Isas {
  bool avx2 = false;    // with FMA and F16C, as the avx2 kernels are compiled
  bool avx512 = false;  // F, BW, DQ and VL, plus the above
};

X86Isas x86_isas() {
  X86Isas isas;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return isas;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
             f16c = c & (1u << 29);
  if (!(osxsave && avx && fma && f16c)) return isas;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_state = (xcr0_lo & 0x06) == 0x06;   // SSE and AVX registers
  const bool zmm_state = (xcr0_lo & 0xe6) == 0xe6;   // and opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_state || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return isas;
  isas.avx2 = b & (1u << 5);
  const bool f = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
  isas.avx512 = isas.avx2 && zmm_state && f && dq && bw && vl;
  return isas;
}
#endif

bool supported(const std::string& isa) {
  if (isa == "base") return true;
#if defined(__x86_64__) && defined(__GNUC__)
  static const X86Isas isas = x86_isas();
#if defined(FM_CPU_HAVE_AVX2)
  if (isa == "avx2") return isas.avx2;
#endif
#if defined(FM_CPU_HAVE_AVX512)
  if (isa == "avx512") return isas.avx512;
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
