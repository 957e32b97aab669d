// Advanced indexing: gather (take) and scatter (put) along one axis with an int64 index
// array (negative indices count from the end; the host has checked the bounds), and the
// positions of a mask's nonzero elements (boolean-mask indexing). Kernels move elements
// as bits, by size (uint32_t for float32, ushort for float16, uint64_t for int64), so one
// instance serves every dtype of that width.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "index_args.h"
using namespace metal;

FM_FUNC int64_t index_offset(constant ViewArgs& a, int k, int64_t i) {
  int64_t off = 0;
  for (int32_t d = a.ndim - 1; d >= 0; --d) {
    const int64_t n = a.shape[d];
    off += (i % n) * a.strides[k][d];
    i /= n;
  }
  return off;
}

FM_FUNC int64_t source_offset(device const int64_t* idx, constant TakeArgs& a, int64_t e) {
  int64_t j = idx[e / a.rest];
  if (j < 0) j += a.axis_len;
  return index_offset(a.view, 0, e) + j * a.axis_stride;
}

template <typename T>
kernel void take(device const T* x [[buffer(0)]], device const int64_t* idx [[buffer(1)]],
                 device T* out [[buffer(2)]], constant TakeArgs& a [[buffer(3)]],
                 uint i [[thread_position_in_grid]]) {
  const int64_t e = a.view.base + int64_t(i);
  out[index_offset(a.view, 2, e)] = x[source_offset(idx, a, e)];
}

FM_INSTANTIATE("take_b1", take, uchar);
FM_INSTANTIATE("take_b2", take, ushort);
FM_INSTANTIATE("take_b4", take, uint32_t);
FM_INSTANTIATE("take_b8", take, uint64_t);

// Repeated indices: one of the values wins, which one is unspecified (NumPy: the last).
template <typename T>
kernel void put(device T* x [[buffer(0)]], device const int64_t* idx [[buffer(1)]],
                device const T* value [[buffer(2)]], constant TakeArgs& a [[buffer(3)]],
                uint i [[thread_position_in_grid]]) {
  const int64_t e = a.view.base + int64_t(i);
  x[source_offset(idx, a, e)] = value[index_offset(a.view, 1, e)];
}

FM_INSTANTIATE("put_b1", put, uchar);
FM_INSTANTIATE("put_b2", put, ushort);
FM_INSTANTIATE("put_b4", put, uint32_t);
FM_INSTANTIATE("put_b8", put, uint64_t);

// The flat positions of the nonzero elements of a contiguous float32 mask of n elements,
// in order, into out (sized by the host from the mask's count). One threadgroup: thread t
// counts its contiguous chunk, a serial scan over the (at most 1024) counts gives each
// chunk's first slot, then every thread writes its chunk's positions. NaN counts as
// nonzero (as NumPy's bool(nan)).
kernel void mask_positions(device const float* mask [[buffer(0)]],
                           device int64_t* out [[buffer(1)]],
                           constant TakeArgs& a [[buffer(2)]],
                           uint32_t tid [[thread_index_in_threadgroup]],
                           uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup int64_t first[1024];
  const uint32_t T = min(tg_size.x * tg_size.y * tg_size.z, 1024u);
  const int64_t n = a.rest;
  const int64_t chunk = (n + int64_t(T) - 1) / int64_t(T);
  const int64_t begin = min(n, int64_t(tid) * chunk), end = min(n, begin + chunk);
  int64_t count = 0;
  for (int64_t k = begin; k < end; ++k) count += mask[k] != 0.0f ? 1 : 0;
  if (tid < T) first[tid] = count;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid == 0) {
    int64_t run = 0;
    for (uint32_t t = 0; t < T; ++t) {
      const int64_t c = first[t];
      first[t] = run;
      run += c;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid < T) {
    int64_t slot = first[tid];
    for (int64_t k = begin; k < end; ++k)
      if (mask[k] != 0.0f) out[slot++] = k;
  }
}
