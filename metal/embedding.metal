// The embedding lookup, its gradient as a deterministic device-side scatter-add, and one_hot.
//
// grad_weight[v, :] = sum of grad_output[p, :] over the positions p with ids[p] == v, in
// increasing p: the same additions in the same order on every device and at every thread or
// group count. The positions are sorted by id with a stable LSD radix sort (8 bits a pass,
// as many passes as the row count needs): per pass, each block of FM_SORT_BLOCK positions
// counts its digits (embedding_sort_histogram), one group scans the counts digit-major
// (embedding_sort_scan), and each block writes its positions to their sorted places, a
// position's rank among equal digits of its block counted from the block's earlier entries
// (embedding_sort_scatter): no atomics anywhere, so no order depends on scheduling. Then a
// thread per weight element finds its row's run of sorted positions by binary search and
// sums them (embedding_backward_rows). Keys and positions are 32-bit (the host checks that
// ids and positions fit).
#include <metal_stdlib>
#include "embedding_args.h"
#include "fm_kernel.h"
using namespace metal;

// Grid: (dim, n). out[p, j] = weight[ids[p], j] for a contiguous weight, moved as bits of
// the element's width (one instance per width serves every dtype of it). An id outside
// [0, limit) (the host checks them, except in a step recorded for replay by
// fastmetal.compile) reads no memory: its row is a.fill's bits (NaN).
template <typename T>
kernel void embedding_forward(device const int64_t* ids [[buffer(0)]],
                              device const T* weight [[buffer(1)]],
                              device T* out [[buffer(2)]],
                              constant EmbeddingArgs& a [[buffer(3)]],
                              uint3 gid [[thread_position_in_grid]]) {
  const int32_t j = int32_t(gid.x), p = int32_t(gid.y);
  if (j >= a.dim || p >= a.n) return;
  const int64_t id = ids[p];
  const uint64_t o = uint64_t(p) * uint64_t(a.dim) + uint64_t(j);
  if (id < 0 || id >= a.limit)
    out[o] = T(a.fill);
  else
    out[o] = weight[uint64_t(id) * uint64_t(a.dim) + uint64_t(j)];
}

FM_INSTANTIATE("embedding_forward_b1", embedding_forward, uchar);
FM_INSTANTIATE("embedding_forward_b2", embedding_forward, ushort);
FM_INSTANTIATE("embedding_forward_b4", embedding_forward, uint32_t);
FM_INSTANTIATE("embedding_forward_b8", embedding_forward, uint64_t);

// Grid: (n). Pass 0's input: the ids as keys, the positions in order. An id outside
// [0, limit) (possible only in a step recorded for replay) gets the key limit: sorted after
// every row's run, summed into no row (the host sorts on enough bits for it).
kernel void embedding_sort_init(device const int64_t* ids [[buffer(0)]],
                                device uint32_t* keys [[buffer(1)]],
                                device uint32_t* pos [[buffer(2)]],
                                constant EmbeddingArgs& a [[buffer(3)]],
                                uint i [[thread_position_in_grid]]) {
  if (int32_t(i) >= a.n) return;
  const int64_t id = ids[i];
  keys[i] = uint32_t(id < 0 || id >= a.limit ? a.limit : id);
  pos[i] = i;
}

// Block g's entry t: its digit, or FM_SORT_DIGITS past the end of the positions.
FM_FUNC uint32_t block_digit(device const uint32_t* keys, constant EmbeddingArgs& a, uint32_t g,
                             uint32_t t) {
  const int64_t i = int64_t(g) * FM_SORT_BLOCK + int64_t(t);
  return i < int64_t(a.n) ? (keys[i] >> uint32_t(a.shift)) & uint32_t(FM_SORT_DIGITS - 1)
                          : uint32_t(FM_SORT_DIGITS);
}

// One group per block: hist[d * blocks + g] = entries of block g with digit d.
kernel void embedding_sort_histogram(device const uint32_t* keys [[buffer(0)]],
                                     device uint32_t* hist [[buffer(1)]],
                                     constant EmbeddingArgs& a [[buffer(2)]],
                                     uint3 tg_pos [[threadgroup_position_in_grid]],
                                     uint32_t tid [[thread_index_in_threadgroup]],
                                     uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup uint32_t digit[FM_SORT_BLOCK];
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t g = tg_pos.x;
  for (uint32_t t = tid; t < uint32_t(FM_SORT_BLOCK); t += T)
    digit[t] = block_digit(keys, a, g, t);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint32_t d = tid; d < uint32_t(FM_SORT_DIGITS); d += T) {
    uint32_t count = 0;
    for (uint32_t t = 0; t < uint32_t(FM_SORT_BLOCK); ++t) count += digit[t] == d ? 1u : 0u;
    hist[uint64_t(d) * uint64_t(a.blocks) + uint64_t(g)] = count;
  }
}

// One group: the exclusive prefix sum of hist (FM_SORT_DIGITS * blocks counts), in place.
// Thread t sums its contiguous chunk, one thread scans the (at most 1024) chunk sums, then
// every thread rewrites its chunk as running offsets.
kernel void embedding_sort_scan(device uint32_t* hist [[buffer(0)]],
                                constant EmbeddingArgs& a [[buffer(1)]],
                                uint32_t tid [[thread_index_in_threadgroup]],
                                uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup uint32_t first[1024];
  const uint32_t T = min(tg_size.x * tg_size.y * tg_size.z, 1024u);
  const int64_t m = int64_t(FM_SORT_DIGITS) * int64_t(a.blocks);
  const int64_t chunk = (m + int64_t(T) - 1) / int64_t(T);
  const int64_t begin = min(m, int64_t(tid) * chunk), end = min(m, begin + chunk);
  uint32_t sum = 0;
  for (int64_t k = begin; k < end; ++k) sum += hist[k];
  if (tid < T) first[tid] = sum;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid == 0) {
    uint32_t run = 0;
    for (uint32_t t = 0; t < T; ++t) {
      const uint32_t c = first[t];
      first[t] = run;
      run += c;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid < T) {
    uint32_t run = first[tid];
    for (int64_t k = begin; k < end; ++k) {
      const uint32_t c = hist[k];
      hist[k] = run;
      run += c;
    }
  }
}

// One group per block: each entry goes to offset[digit, block] + the number of earlier
// entries of the block with the same digit (a stable pass).
kernel void embedding_sort_scatter(device const uint32_t* keys_in [[buffer(0)]],
                                   device const uint32_t* pos_in [[buffer(1)]],
                                   device const uint32_t* offsets [[buffer(2)]],
                                   device uint32_t* keys_out [[buffer(3)]],
                                   device uint32_t* pos_out [[buffer(4)]],
                                   constant EmbeddingArgs& a [[buffer(5)]],
                                   uint3 tg_pos [[threadgroup_position_in_grid]],
                                   uint32_t tid [[thread_index_in_threadgroup]],
                                   uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup uint32_t digit[FM_SORT_BLOCK];
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t g = tg_pos.x;
  for (uint32_t t = tid; t < uint32_t(FM_SORT_BLOCK); t += T)
    digit[t] = block_digit(keys_in, a, g, t);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint32_t t = tid; t < uint32_t(FM_SORT_BLOCK); t += T) {
    const uint32_t d = digit[t];
    if (d >= uint32_t(FM_SORT_DIGITS)) continue;  // past the end of the positions
    uint32_t rank = 0;
    for (uint32_t k = 0; k < t; ++k) rank += digit[k] == d ? 1u : 0u;
    const uint32_t dest = offsets[uint64_t(d) * uint64_t(a.blocks) + uint64_t(g)] + rank;
    const uint64_t i = uint64_t(g) * FM_SORT_BLOCK + uint64_t(t);
    keys_out[dest] = keys_in[i];
    pos_out[dest] = pos_in[i];
  }
}

// The first index in the sorted keys[0, n) holding a key >= v.
FM_FUNC int32_t lower_bound(device const uint32_t* keys, int32_t n, uint32_t v) {
  int32_t lo = 0, hi = n;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Grid: (dim, rows). grad_weight[v, j] = sum over v's run of sorted positions p, in
// increasing p, of grad_output[p, j]; zero for padding_idx and for rows no id names.
kernel void embedding_backward_rows(device const uint32_t* keys [[buffer(0)]],
                                    device const uint32_t* pos [[buffer(1)]],
                                    device const float* grad_out [[buffer(2)]],
                                    device float* grad_weight [[buffer(3)]],
                                    constant EmbeddingArgs& a [[buffer(4)]],
                                    uint3 gid [[thread_position_in_grid]]) {
  const int32_t j = int32_t(gid.x), v = int32_t(gid.y);
  if (j >= a.dim || v >= a.rows) return;
  float acc = 0.0f;
  if (v != a.padding_idx) {
    const int32_t lo = lower_bound(keys, a.n, uint32_t(v));
    for (int32_t k = lo; k < a.n && keys[k] == uint32_t(v); ++k)
      acc += grad_out[uint64_t(pos[k]) * uint64_t(a.dim) + uint64_t(j)];
  }
  grad_weight[uint64_t(v) * uint64_t(a.dim) + uint64_t(j)] = acc;
}

// Grid: (classes, n). out[p, c] = ids[p] == c (int64; the host has checked the ids).
kernel void one_hot_int64(device const int64_t* ids [[buffer(0)]],
                          device int64_t* out [[buffer(1)]],
                          constant EmbeddingArgs& a [[buffer(2)]],
                          uint3 gid [[thread_position_in_grid]]) {
  const int64_t c = int64_t(gid.x), p = int64_t(gid.y);
  if (c >= a.classes || p >= int64_t(a.n)) return;
  out[p * a.classes + c] = ids[p] == c ? 1 : 0;
}
