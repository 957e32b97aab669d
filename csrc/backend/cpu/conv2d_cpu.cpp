// The header's functions, dispatched to the per-ISA copies in isa/conv2d_forward.cpp and
// isa/conv2d_weight_grad.cpp (packed, register-blocked GEMM micro-kernels: isa/simd_kernels.h),
// and their registration as the CPU backend's conv2d (ops/conv2d.cpp asks for it by name).
#include "conv2d_cpu.h"

#include "core/array.h"
#include "isa_dispatch.h"
#include "native_ops.h"

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

namespace {

// The native-op signatures of ops/conv2d.cpp: contiguous float32 Arrays in host memory.
float* f32(const Array& a) { return reinterpret_cast<float*>(a.host_data()); }

void forward_native(const Conv2dArgs& a, const Array& x, const Array& w, const Array* bias,
                    const Array& y) {
  conv2d_forward(a, f32(x), f32(w), bias ? f32(*bias) : nullptr, f32(y));
}
void backward_input_native(const Conv2dArgs& a, const Array& gy, const Array& w, const Array& gx) {
  conv2d_backward_input(a, f32(gy), f32(w), f32(gx));
}
void backward_weight_native(const Conv2dArgs& a, const Array& gy, const Array& x, const Array& gw) {
  conv2d_backward_weight(a, f32(gy), f32(x), f32(gw));
}
void backward_bias_native(const Conv2dArgs& a, const Array& gy, const Array& gb) {
  conv2d_backward_bias(a, f32(gy), f32(gb));
}

}  // namespace

FM_CPU_NATIVE("conv2d_forward", &forward_native, &native_conv2d_enabled());
FM_CPU_NATIVE("conv2d_backward_input", &backward_input_native, &native_conv2d_enabled());
FM_CPU_NATIVE("conv2d_backward_weight", &backward_weight_native, &native_conv2d_enabled());
FM_CPU_NATIVE("conv2d_backward_bias", &backward_bias_native, &native_conv2d_enabled());

}  // namespace fm::cpu
