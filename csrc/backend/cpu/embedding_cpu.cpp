// The CPU backend's embedding lookup and gradient (ops/embedding.cpp asks for
// "embedding_forward" and "embedding_backward"). The lookup copies rows (the generated
// per-element kernel took 220 us for (16, 64) ids of 64 floats on one Zen core, where a
// row copy is a memcpy). The gradient: the same sums as metal/embedding.metal's radix sort + row sums, in the same order (each row's
// positions in increasing order, from 0.0f), so the result is the MSL kernels' to the bit and
// independent of the thread count. A stable counting sort of the positions by id (serial:
// O(n + rows)), then rows in parallel, each summed by one thread.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/array.h"
#include "embedding_args.h"
#include "native_ops.h"
#include "thread_pool.h"

namespace fm::cpu {
namespace {

void embedding_backward_native(const EmbeddingArgs& a, const Array& ids, const Array& gy,
                               const Array& gw) {
  const auto* id = reinterpret_cast<const std::int64_t*>(ids.host_data());
  const auto* g = reinterpret_cast<const float*>(gy.host_data());
  auto* out = reinterpret_cast<float*>(gw.host_data());
  const std::int64_t n = a.n, rows = a.rows, dim = a.dim;
  // An id outside [0, rows) (possible only in a replayed step: the host checks them
  // otherwise) is counted nowhere, as the MSL kernels' sentinel key.
  auto in_range = [rows](std::int64_t v) { return v >= 0 && v < rows; };
  std::vector<std::int64_t> start(std::size_t(rows) + 1, 0);
  for (std::int64_t p = 0; p < n; ++p)
    if (in_range(id[p])) ++start[std::size_t(id[p]) + 1];
  for (std::int64_t v = 0; v < rows; ++v) start[std::size_t(v) + 1] += start[std::size_t(v)];
  std::vector<std::int64_t> next(start.begin(), start.end() - 1);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t p = 0; p < n; ++p)
    if (in_range(id[p])) order[std::size_t(next[std::size_t(id[p])]++)] = p;
  // Chunks of rows big enough to amortise a task, small enough to balance.
  const std::int64_t per_task = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, dim));
  const std::int64_t tasks = (rows + per_task - 1) / per_task;
  ThreadPool::instance().parallel_for(tasks, [&](std::int64_t t) {
    const std::int64_t v1 = std::min(rows, (t + 1) * per_task);
    for (std::int64_t v = t * per_task; v < v1; ++v) {
      float* row = out + v * dim;
      std::memset(row, 0, sizeof(float) * std::size_t(dim));
      if (v == a.padding_idx) continue;
      for (std::int64_t k = start[std::size_t(v)]; k < start[std::size_t(v) + 1]; ++k) {
        const float* src = g + order[std::size_t(k)] * dim;
        for (std::int64_t j = 0; j < dim; ++j) row[j] += src[j];
      }
    }
  });
}

// Rows of a contiguous weight (any dtype: bytes) into out, in chunks of positions.
void embedding_forward_native(const EmbeddingArgs& a, const Array& ids, const Array& weight,
                              const Array& out) {
  const auto* id = reinterpret_cast<const std::int64_t*>(ids.host_data());
  const char* w = weight.host_data();
  char* o = out.host_data();
  const std::size_t row = std::size_t(a.dim) * itemsize(weight.dtype);
  const std::int64_t per_task =
      std::max<std::int64_t>(1, std::int64_t(65536 / std::max<std::size_t>(1, row)));
  const std::int64_t tasks = (a.n + per_task - 1) / per_task;
  ThreadPool::instance().parallel_for(tasks, [&](std::int64_t t) {
    const std::int64_t p1 = std::min<std::int64_t>(a.n, (t + 1) * per_task);
    for (std::int64_t p = t * per_task; p < p1; ++p) {
      char* dst = o + std::size_t(p) * row;
      if (id[p] >= 0 && id[p] < a.limit) {
        std::memcpy(dst, w + std::size_t(id[p]) * row, row);
      } else {  // out of range (only in a replayed step): a row of a.fill's bits (NaN)
        const std::size_t size = itemsize(weight.dtype);
        for (std::size_t k = 0; k < row; k += size) std::memcpy(dst + k, &a.fill, size);
      }
    }
  });
}

}  // namespace

FM_CPU_NATIVE("embedding_forward", &embedding_forward_native, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("embedding_backward", &embedding_backward_native, &native_reduce_matmul_enabled());

}  // namespace fm::cpu
