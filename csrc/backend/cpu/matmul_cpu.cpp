// The cpu backend's matrix product (native op "matmul", asked for by ops/matmul.cpp): a
// blocked GEMM with packed operands (the conv2d engine's register blocking) on strided,
// batched operands, dispatched to the per-ISA copies in isa/matmul_gemm.cpp.
#include "core/array.h"
#include "isa_dispatch.h"
#include "matmul_args.h"
#include "native_ops.h"

namespace fm::cpu {

FM_CPU_DECLARE(void matmul_gemm(const MatmulArgs& p, const float* A, const float* B, float* C))

namespace {

void matmul_native(const MatmulArgs& p, const Array& a, const Array& b, const Array& out) {
  FM_CPU_DISPATCH(matmul_gemm, p, reinterpret_cast<const float*>(a.host_data()),
                  reinterpret_cast<const float*>(b.host_data()),
                  reinterpret_cast<float*>(out.host_data()));
}

}  // namespace

FM_CPU_NATIVE("matmul", &matmul_native, &native_reduce_matmul_enabled());

}  // namespace fm::cpu
