// The CPU algorithms of the reductions (the cpu backend's native ops "reduce_*_rows",
// registered in reduce_cpu.cpp; same semantics as metal/reduce.metal), compiled per ISA in
// isa/reduce_rows.cpp. Input contiguous float32 viewed as (outer, R, inner) (reduce_args.h).
// Sums accumulate in float64 over fixed chunks of R and add the chunk sums in order, so
// the result is the same bitwise for any number of threads. Called without the GIL.
#pragma once
#include <cstdint>

namespace fm::cpu {

enum class CpuReduce { sum, sumsq_dev, max, min };

// out[o] = f(reduction of row o) for the outer * inner outputs: sum / divisor (sqrt if
// `root`), sum of squares of (x - mean[o]) likewise, max or min (NaN propagating).
void reduce_rows(CpuReduce op, const float* x, std::int64_t outer, std::int64_t R,
                 std::int64_t inner, const double* mean, double divisor, bool root, float* out,
                 double* out_f64 = nullptr);
// Index along R of the max (Sign 1) or min (Sign -1); the first NaN wins, ties go first.
void arg_rows(int sign, const float* x, std::int64_t outer, std::int64_t R, std::int64_t inner,
              std::int64_t* out);

}  // namespace fm::cpu
