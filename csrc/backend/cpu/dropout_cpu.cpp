// The CPU backend's dropout (ops/training.cpp asks for "dropout_apply" by name): the per-ISA
// copies in isa/dropout.cpp, which give the MSL kernel's mask bit for bit.
#include "core/array.h"
#include "isa_dispatch.h"
#include "native_ops.h"
#include "training_args.h"

namespace fm::cpu {

FM_CPU_DECLARE(void dropout_native(const DropoutArgs& a, const float* x, float* out))

namespace {
// Contiguous float32 Arrays in host memory (the CPU backend's launches run synchronously).
void dropout_apply_native(const DropoutArgs& a, const Array& x, const Array& out) {
  FM_CPU_DISPATCH(dropout_native, a, reinterpret_cast<const float*>(x.host_data()),
                  reinterpret_cast<float*>(out.host_data()));
}
}  // namespace

FM_CPU_NATIVE("dropout_apply", &dropout_apply_native);

}  // namespace fm::cpu
