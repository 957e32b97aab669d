// The header's functions, dispatched to the per-ISA copies in isa/reduce_rows.cpp, and
// their registration as the cpu backend's reductions (ops/reduce.cpp asks for them by name).
#include "reduce_cpu.h"

#include "isa_dispatch.h"
#include "native_ops.h"

namespace fm::cpu {
using i64 = std::int64_t;

FM_CPU_DECLARE(void reduce_rows(CpuReduce, const float*, i64, i64, i64, const double*, double,
                                bool, float*, double*))
FM_CPU_DECLARE(void arg_rows(int, const float*, i64, i64, i64, i64*))

void reduce_rows(CpuReduce op, const float* x, i64 outer, i64 R, i64 inner, const double* mean,
                 double divisor, bool root, float* out, double* out_f64) {
  FM_CPU_DISPATCH(reduce_rows, op, x, outer, R, inner, mean, divisor, root, out, out_f64);
}
void arg_rows(int sign, const float* x, i64 outer, i64 R, i64 inner, i64* out) {
  FM_CPU_DISPATCH(arg_rows, sign, x, outer, R, inner, out);
}

namespace {

// The native-op signatures of ops/reduce.cpp.
template <CpuReduce Op>
void rows_native(const float* x, i64 outer, i64 R, i64 inner, const double* mean, double divisor,
                 bool root, float* out, double* out_f64) {
  reduce_rows(Op, x, outer, R, inner, mean, divisor, root, out, out_f64);
}
template <int Sign>
void arg_rows_native(const float* x, i64 outer, i64 R, i64 inner, i64* out) {
  arg_rows(Sign, x, outer, R, inner, out);
}

}  // namespace

FM_CPU_NATIVE("reduce_sum_rows", &rows_native<CpuReduce::sum>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_sumsq_dev_rows", &rows_native<CpuReduce::sumsq_dev>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_max_rows", &rows_native<CpuReduce::max>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_min_rows", &rows_native<CpuReduce::min>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_argmax_rows", &arg_rows_native<1>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_argmin_rows", &arg_rows_native<-1>, &native_reduce_matmul_enabled());

}  // namespace fm::cpu
