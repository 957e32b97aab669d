// FASTMETAL_* environment variables, parsed strictly in one place (backend/registry.cpp).
// A value that is not understood is never ignored silently: the parser returns the default
// and records one line naming the variable, the value and the accepted values, which
// `import fastmetal` turns into a RuntimeWarning (config_problems()).
#pragma once
#include <string>
#include <vector>

namespace fm::env {

// FASTMETAL_NUM_THREADS as a thread count in [1, 1024]; 0 where unset or not understood.
int num_threads();
// FASTMETAL_CPU_ISA where it names one of `known` that `usable` accepts; "" where unset or
// not usable (then the best ISA is chosen). `known` lists the variants built in.
std::string cpu_isa(const std::vector<std::string>& known, bool (*usable)(const std::string&));
// Records a problem with a variable (deduplicated).
void report(const std::string& problem);
// Every problem found so far; checks each variable first, so this is complete at import.
std::vector<std::string> config_problems();

}  // namespace fm::env
