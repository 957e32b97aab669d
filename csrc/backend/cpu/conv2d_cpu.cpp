// The header's functions, dispatched to the per-ISA copies in isa/conv2d_forward.cpp and
// isa/conv2d_weight_grad.cpp (packed, register-blocked GEMM micro-kernels: isa/conv2d_engine.h).
#include "conv2d_cpu.h"

#include "isa_dispatch.h"

namespace fm::cpu {

FM_CPU_DECLARE(void conv2d_forward(const Conv2dArgs&, const float*, const float*, const float*, float*))
FM_CPU_DECLARE(void conv2d_backward_input(const Conv2dArgs&, const float*, const float*, float*))
FM_CPU_DECLARE(void conv2d_backward_weight(const Conv2dArgs&, const float*, const float*, float*))
FM_CPU_DECLARE(void conv2d_backward_bias(const Conv2dArgs&, const float*, float*))

void conv2d_forward(const Conv2dArgs& a, const float* x, const float* w, const float* bias,
                    float* y) {
  FM_CPU_DISPATCH(conv2d_forward, a, x, w, bias, y);
}
void conv2d_backward_input(const Conv2dArgs& a, const float* gy, const float* w, float* gx) {
  FM_CPU_DISPATCH(conv2d_backward_input, a, gy, w, gx);
}
void conv2d_backward_weight(const Conv2dArgs& a, const float* gy, const float* x, float* gw) {
  FM_CPU_DISPATCH(conv2d_backward_weight, a, gy, x, gw);
}
void conv2d_backward_bias(const Conv2dArgs& a, const float* gy, float* gb) {
  FM_CPU_DISPATCH(conv2d_backward_bias, a, gy, gb);
}

}  // namespace fm::cpu
