// The CPU's gradient clipping (ops/training.cpp asks for "grad_norm" and "grad_scale"):
// metal/grad_clip.metal's partition and arithmetic as plain loops (the per-ISA copies in
// isa/grad_clip.cpp; the kernels' barriers would run under the fiber emulator), behind the
// _set_native_cpu switch. Chunks are the tasks and their partials are combined in chunk
// order, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/array.h"
#include "grad_clip_args.h"
#include "isa_dispatch.h"
#include "native_ops.h"
#include "thread_pool.h"

namespace fm::cpu {

FM_CPU_DECLARE(void grad_norm_chunk(int, std::uint32_t, const void*, std::int64_t, float, float*))
FM_CPU_DECLARE(float grad_norm_finish(std::uint32_t, const float*, std::int64_t, float))
FM_CPU_DECLARE(void grad_scale_span(int, void*, std::int64_t, float))

namespace {
using i64 = std::int64_t;

// A run of one gradient's elements: its bytes per element, first byte, length.
struct Span {
  int bytes;
  char* base;
  i64 len;
};

// The gradients cut into spans of at most `most` elements, in order.
std::vector<Span> spans(const std::vector<Array>& grads, i64 most) {
  std::vector<Span> out;
  for (const Array& g : grads) {
    const int bytes = int(itemsize(g.dtype));
    for (i64 at = 0; at < g.size(); at += most)
      out.push_back({bytes, g.host_data() + at * bytes, std::min(most, g.size() - at)});
  }
  return out;
}

void grad_norm_native(const std::vector<Array>& grads, float p, const GradNormFinishArgs& a,
                      const Array& total, const Array& scale) {
  const std::vector<Span> chunks = spans(grads, FM_GRAD_CHUNK);
  const i64 n = i64(chunks.size());
  std::vector<float> parts(std::size_t(2 * n));
  constexpr i64 kPerTask = 8;  // chunks per task: 32768 elements
  ThreadPool::instance().parallel_for((n + kPerTask - 1) / kPerTask, [&](i64 t) {
    for (i64 c = t * kPerTask; c < std::min(n, (t + 1) * kPerTask); ++c) {
      const Span& k = chunks[std::size_t(c)];
      FM_CPU_DISPATCH(grad_norm_chunk, k.bytes, a.mode, k.base, k.len, p, &parts[std::size_t(2 * c)]);
    }
  });
  const float s = FM_CPU_DISPATCH(grad_norm_finish, a.mode, parts.data(), n, a.inv_p);
  *reinterpret_cast<float*>(total.host_data()) = s;
  const float q = a.max_norm / (s + 1e-6f);
  *reinterpret_cast<float*>(scale.host_data()) = (std::isnan(q) || q < 1.0f) ? q : 1.0f;
}

void grad_scale_native(const std::vector<Array>& grads, const Array& scale) {
  const float s = *reinterpret_cast<const float*>(scale.host_data());
  const std::vector<Span> tasks = spans(grads, i64(1) << 16);
  ThreadPool::instance().parallel_for(i64(tasks.size()), [&](i64 t) {
    const Span& k = tasks[std::size_t(t)];
    FM_CPU_DISPATCH(grad_scale_span, k.bytes, k.base, k.len, s);
  });
}

}  // namespace

FM_CPU_NATIVE("grad_norm", &grad_norm_native, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("grad_scale", &grad_scale_native, &native_reduce_matmul_enabled());

}  // namespace fm::cpu
