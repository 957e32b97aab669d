// The CPU backend's own FASTMETAL_* settings, parsed here (the backend-neutral ones are in
// backend/env_config.h); what is not understood is report()ed like every other setting.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fm::cpu {

// FASTMETAL_NUM_THREADS as a thread count in [1, 1024]; 0 where unset or not understood.
int env_num_threads();
// FASTMETAL_CPU_ISA where it names one of `known` that `usable` accepts; "" where unset or
// not usable (then the best ISA is chosen). `known` lists the variants built in.
std::string env_cpu_isa(const std::vector<std::string>& known, bool (*usable)(const std::string&));
// FASTMETAL_EMULATOR_SEED: the first launch's seed of the fiber emulator's lane order (the
// integer prefix of the value, as strtoull reads it), none where unset.
std::optional<std::uint64_t> env_emulator_seed();

}  // namespace fm::cpu
