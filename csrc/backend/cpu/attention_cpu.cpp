// The cpu backend's fused attention (native ops "sdpa_forward" / "sdpa_backward", asked for by
// ops/attention.cpp): the tiled plain-C++ form of metal/attention_forward.metal and
// attention_backward.metal in isa/attention.cpp, dispatched per ISA. Behind _set_native_cpu
// (false: the MSL kernels under the emulator).
#include <cstdint>

#include "attention_args.h"
#include "core/array.h"
#include "isa_dispatch.h"
#include "native_ops.h"

namespace fm::cpu {

FM_CPU_DECLARE(void sdpa_forward_native(const SdpaArgs& a, bool half, const void* q,
                                        const void* k, const void* v, const float* mask,
                                        void* out, float* lse))
FM_CPU_DECLARE(void sdpa_backward_native(const SdpaArgs& a, bool half, const void* go,
                                         const void* q, const void* k, const void* v,
                                         const float* mask, const void* out, const float* lse,
                                         void* dq, void* dk, void* dv))

namespace {

const float* mask_data(const Array* m) {
  return m ? reinterpret_cast<const float*>(m->host_data()) : nullptr;
}

// Arrays in host memory, addressed by the strides in SdpaArgs from element [0, ..., 0] (the
// CPU backend's launches run synchronously).
void forward(const SdpaArgs& a, const Array& q, const Array& k, const Array& v,
             const Array* mask, const Array& out, const Array& lse) {
  FM_CPU_DISPATCH(sdpa_forward_native, a, q.dtype == DType::float16, q.host_data(),
                  k.host_data(), v.host_data(), mask_data(mask), out.host_data(),
                  reinterpret_cast<float*>(lse.host_data()));
}

void backward(const SdpaArgs& a, const Array& go, const Array& q, const Array& k,
              const Array& v, const Array* mask, const Array& out, const Array& lse,
              const Array& dq, const Array& dk, const Array& dv) {
  FM_CPU_DISPATCH(sdpa_backward_native, a, q.dtype == DType::float16, go.host_data(),
                  q.host_data(), k.host_data(), v.host_data(), mask_data(mask),
                  out.host_data(), reinterpret_cast<const float*>(lse.host_data()),
                  dq.host_data(), dk.host_data(), dv.host_data());
}

}  // namespace

FM_CPU_NATIVE("sdpa_forward", &forward, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("sdpa_backward", &backward, &native_reduce_matmul_enabled());

}  // namespace fm::cpu
