// The CPU backend's normalization and softmax ops (ops/normalization.cpp asks for them by
// name) and the fused cross-entropy (ops/training.cpp: "cross_entropy", a log-softmax): the
// per-ISA copies in isa/normalization.cpp, behind the _set_native_cpu switch (false: the MSL
// kernels under the emulator, as a GPU runs them).
#include "normalization_cpu.h"

#include "core/array.h"
#include "isa_dispatch.h"
#include "native_ops.h"
#include "training_args.h"

namespace fm::cpu {

FM_CPU_DECLARE(void row_norm_forward(const RowNormArgs&, const float*, const float*,
                                     const float*, float*, float*, float*))
FM_CPU_DECLARE(void row_norm_backward(const RowNormArgs&, const float*, const float*,
                                      const float*, const float*, const float*, float*, float*,
                                      float*))
FM_CPU_DECLARE(void batch_norm_forward(const BatchNormArgs&, const float*, const float*,
                                       const float*, const float*, const float*, float*, float*,
                                       float*, float*, float*))
FM_CPU_DECLARE(void batch_norm_backward(const BatchNormArgs&, const float*, const float*,
                                        const float*, const float*, const float*, float*,
                                        float*, float*))
FM_CPU_DECLARE(void softmax_forward(const SoftmaxArgs&, const float*, float*))
FM_CPU_DECLARE(void softmax_backward(const SoftmaxArgs&, const float*, const float*, float*))
FM_CPU_DECLARE(void cross_entropy_native(const CrossEntropyArgs&, const float*,
                                         const std::int64_t*, float*, float*))

namespace {

// Host memory of contiguous float32 Arrays (the CPU backend's launches run synchronously).
const float* in(const Array& a) { return reinterpret_cast<const float*>(a.host_data()); }
const float* in(const Array* a) { return a ? in(*a) : nullptr; }
float* out(const Array& a) { return reinterpret_cast<float*>(a.host_data()); }
float* out(const Array* a) { return a ? out(*a) : nullptr; }

// The native-op signatures of ops/normalization.cpp.
void row_forward(const RowNormArgs& a, const Array& x, const Array* w, const Array* b,
                 const Array& y, const Array& mean, const Array& rstd) {
  FM_CPU_DISPATCH(row_norm_forward, a, in(x), in(w), in(b), out(y), out(mean), out(rstd));
}
void row_backward(const RowNormArgs& a, const Array& g, const Array& x, const Array* w,
                  const Array& mean, const Array& rstd, const Array& dx, const Array* dw,
                  const Array* db) {
  FM_CPU_DISPATCH(row_norm_backward, a, in(g), in(x), in(w), in(mean), in(rstd), out(dx),
                  out(dw), out(db));
}
void bn_forward(const BatchNormArgs& a, const Array& x, const Array* w, const Array* b,
                const Array* rm, const Array* rv, const Array& y, const Array& save_mean,
                const Array& save_rstd, const Array* new_rm, const Array* new_rv) {
  FM_CPU_DISPATCH(batch_norm_forward, a, in(x), in(w), in(b), in(rm), in(rv), out(y),
                  out(save_mean), out(save_rstd), out(new_rm), out(new_rv));
}
void bn_backward(const BatchNormArgs& a, const Array& g, const Array& x, const Array* w,
                 const Array& mean, const Array& rstd, const Array& dx, const Array& dw,
                 const Array& db) {
  FM_CPU_DISPATCH(batch_norm_backward, a, in(g), in(x), in(w), in(mean), in(rstd), out(dx),
                  out(dw), out(db));
}
void sm_forward(const SoftmaxArgs& a, const Array& x, const Array& o) {
  FM_CPU_DISPATCH(softmax_forward, a, in(x), out(o));
}
void sm_backward(const SoftmaxArgs& a, const Array& g, const Array& y, const Array& dx) {
  FM_CPU_DISPATCH(softmax_backward, a, in(g), in(y), out(dx));
}

void ce_forward(const CrossEntropyArgs& a, const Array& logits, const Array& labels,
                const Array& loss, const Array& grad) {
  FM_CPU_DISPATCH(cross_entropy_native, a, in(logits),
                  reinterpret_cast<const std::int64_t*>(labels.host_data()), out(loss), out(grad));
}

}  // namespace

FM_CPU_NATIVE("row_norm_forward", &row_forward, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("row_norm_backward", &row_backward, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("batch_norm_forward", &bn_forward, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("batch_norm_backward", &bn_backward, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("softmax_forward", &sm_forward, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("softmax_backward", &sm_backward, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("cross_entropy", &ce_forward, &native_reduce_matmul_enabled());

}  // namespace fm::cpu
