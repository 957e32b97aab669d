// Elementwise kernels: one template per layout, instantiated for every op and dtype of
// elementwise_ops.tbl by the generated header elementwise_ops.h.
//
// Layouts (the host picks one after merging dimensions):
//   *_v   contiguous operands and output            grid: n threads
//   *_w   the same in 16-byte chunks (4 float or 8 half elements, one vector access each;
//         GPU devices, operands 16-byte aligned): thread i takes chunks i, i + G, i + 2G, ...
//         (G = threads_per_grid) below `chunks`, FM_WIDE_CHUNKS at a time with all their
//         loads in flight before the first use; every access of a SIMD group is one
//         contiguous span                         grid: G threads, chosen by the host
//                                                 (see elementwise.cpp); the elements past
//                                                 the last whole chunk by *_v
//   *_sv  binary, x is one element (a scalar)       grid: n threads
//   *_vs  binary, y is one element
//   *_r   3 dims (fewer padded), the last with unit stride in every operand and the
//         output: rows of a broadcast, transposed or sliced array
//   *_rw  binary, 2 dims of whole 16-byte chunks, each row 16-byte aligned in every operand
//         (a row stride of 0 is a broadcast row): a thread takes one chunk column of
//         FM_WIDE_ROWS rows, so a broadcast row is read once for all of them and no index
//         is divided                                grid: (chunks a row, rows / FM_WIDE_ROWS)
//   *_s   3 dims (fewer padded), any strides
//   *_g   any number of dims, any strides (broadcast = stride 0)
// *_r, *_s and *_g use the grid (last dim, dim before, the rest).
// T is the storage type (float or half; double on the CPU and CUDA); every op computes in
// float, float64 in double (*_w and *_rw are float and half only).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "fm_math.h"
#include "strided.h"
using namespace metal;

// An op's result stored as T, computed in float: float16 results take the op's f16 form.
template <typename Op>
FM_FUNC float fm_result(Op op, float x) { return op(x); }
template <typename Op>
FM_FUNC float fm_result(Op op, float x, float y) { return op(x, y); }
template <typename Op>
FM_FUNC half fm_result(Op op, half x) { return static_cast<half>(op.f16(static_cast<float>(x))); }
template <typename Op>
FM_FUNC half fm_result(Op op, half x, half y) {
  return static_cast<half>(op.f16(static_cast<float>(x), static_cast<float>(y)));
}

#if FM_HAS_DOUBLE
// float64 (CPU and CUDA only): computed in double, the op's operator()(double).
template <typename Op>
FM_FUNC double fm_result(Op op, double x) { return op(x); }
template <typename Op>
FM_FUNC double fm_result(Op op, double x, double y) { return op(x, y); }
#endif

// One 16-byte chunk through an op, lane by lane in float: the chunk travels as a uint4 (one
// vector load or store whatever T is) and as_type gives its lanes back as T.
template <typename Op>
FM_FUNC uint fm_lane(Op op, uint a, float) {
  return as_type<uint>(fm_result(op, as_type<float>(a)));
}
template <typename Op>
FM_FUNC uint fm_lane(Op op, uint a, uint b, float) {
  return as_type<uint>(fm_result(op, as_type<float>(a), as_type<float>(b)));
}
template <typename Op>
FM_FUNC uint fm_lane(Op op, uint a, half) {  // two halves
  const vec<half, 2> h = as_type<vec<half, 2>>(a);
  return as_type<uint>(vec<half, 2>(fm_result(op, h.x), fm_result(op, h.y)));
}
template <typename Op>
FM_FUNC uint fm_lane(Op op, uint a, uint b, half) {
  const vec<half, 2> g = as_type<vec<half, 2>>(a);
  const vec<half, 2> h = as_type<vec<half, 2>>(b);
  return as_type<uint>(vec<half, 2>(fm_result(op, g.x, h.x), fm_result(op, g.y, h.y)));
}
template <typename T, typename Op>
FM_FUNC uint4 fm_chunk(Op op, uint4 a) {
  const T t = T(0);
  return uint4(fm_lane(op, a.x, t), fm_lane(op, a.y, t), fm_lane(op, a.z, t), fm_lane(op, a.w, t));
}
template <typename T, typename Op>
FM_FUNC uint4 fm_chunk(Op op, uint4 a, uint4 b) {
  const T t = T(0);
  return uint4(fm_lane(op, a.x, b.x, t), fm_lane(op, a.y, b.y, t), fm_lane(op, a.z, b.z, t),
               fm_lane(op, a.w, b.w, t));
}

template <typename T, typename Op>
kernel void unary_v(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                    uint i [[thread_position_in_grid]]) {
  out[i] = fm_result(Op(), x[i]);
}

template <typename T, typename Op>
kernel void unary_w(device const uint4* x [[buffer(0)]], device uint4* out [[buffer(1)]],
                    constant uint& chunks [[buffer(2)]], uint i [[thread_position_in_grid]],
                    uint n [[threads_per_grid]]) {
  const Op op;
  uint c = i;
  for (; c + (FM_WIDE_CHUNKS - 1) * n < chunks; c += FM_WIDE_CHUNKS * n) {
    uint4 v[FM_WIDE_CHUNKS];
    FM_UNROLL
    for (uint k = 0; k < FM_WIDE_CHUNKS; ++k) v[k] = x[c + k * n];
    FM_UNROLL
    for (uint k = 0; k < FM_WIDE_CHUNKS; ++k) out[c + k * n] = fm_chunk<T>(op, v[k]);
  }
  for (; c < chunks; c += n) out[c] = fm_chunk<T>(op, x[c]);
}

template <typename T, typename Op>
kernel void unary_g(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                    constant StridedArgs& a [[buffer(2)]],
                    uint3 gid [[thread_position_in_grid]]) {
  const int64_t xi = fm_offset_g(gid, a, 0);
  const int64_t oi = fm_offset_g(gid, a, 2);
  out[oi] = fm_result(Op(), x[xi]);
}

template <typename T, typename Op>
kernel void unary_r(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                    constant StridedArgs& a [[buffer(2)]],
                    uint3 gid [[thread_position_in_grid]]) {
  const uint3 row = uint3(0u, gid.y, gid.z);
  const int64_t xi = fm_offset_s(row, a, 0) + gid.x;
  const int64_t oi = fm_offset_s(row, a, 2) + gid.x;
  out[oi] = fm_result(Op(), x[xi]);
}

template <typename T, typename Op>
kernel void unary_s(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                    constant StridedArgs& a [[buffer(2)]],
                    uint3 gid [[thread_position_in_grid]]) {
  out[fm_offset_s(gid, a, 2)] = fm_result(Op(), x[fm_offset_s(gid, a, 0)]);
}

template <typename T, typename Op>
kernel void binary_v(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                     device T* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  out[i] = fm_result(Op(), x[i], y[i]);
}

template <typename T, typename Op>
kernel void binary_w(device const uint4* x [[buffer(0)]], device const uint4* y [[buffer(1)]],
                     device uint4* out [[buffer(2)]], constant uint& chunks [[buffer(3)]],
                     uint i [[thread_position_in_grid]], uint n [[threads_per_grid]]) {
  const Op op;
  uint c = i;
  for (; c + (FM_WIDE_CHUNKS - 1) * n < chunks; c += FM_WIDE_CHUNKS * n) {
    uint4 a[FM_WIDE_CHUNKS];
    uint4 b[FM_WIDE_CHUNKS];
    FM_UNROLL
    for (uint k = 0; k < FM_WIDE_CHUNKS; ++k) {
      a[k] = x[c + k * n];
      b[k] = y[c + k * n];
    }
    FM_UNROLL
    for (uint k = 0; k < FM_WIDE_CHUNKS; ++k) out[c + k * n] = fm_chunk<T>(op, a[k], b[k]);
  }
  for (; c < chunks; c += n) out[c] = fm_chunk<T>(op, x[c], y[c]);
}

template <typename T, typename Op>
kernel void binary_sv(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                      device T* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  out[i] = fm_result(Op(), x[0], y[i]);
}

template <typename T, typename Op>
kernel void binary_vs(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                      device T* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  out[i] = fm_result(Op(), x[i], y[0]);
}

template <typename T, typename Op>
kernel void binary_r(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                     device T* out [[buffer(2)]], constant StridedArgs& a [[buffer(3)]],
                     uint3 gid [[thread_position_in_grid]]) {
  const uint3 row = uint3(0u, gid.y, gid.z);
  const int64_t xi = fm_offset_s(row, a, 0) + gid.x;
  const int64_t yi = fm_offset_s(row, a, 1) + gid.x;
  const int64_t oi = fm_offset_s(row, a, 2) + gid.x;
  out[oi] = fm_result(Op(), x[xi], y[yi]);
}

template <typename T, typename Op>
kernel void binary_rw(device const uint4* x [[buffer(0)]], device const uint4* y [[buffer(1)]],
                      device uint4* out [[buffer(2)]], constant ChunkRowArgs& a [[buffer(3)]],
                      uint2 gid [[thread_position_in_grid]]) {
  // Rows past the last one are clamped to it (loaded again, stored by no one): every loop
  // has a constant trip count, so the arrays stay in registers.
  const uint row0 = gid.y * FM_WIDE_ROWS;
  int64_t row[FM_WIDE_ROWS];
  FM_UNROLL
  for (uint k = 0; k < FM_WIDE_ROWS; ++k) row[k] = int64_t(row0 + k < a.rows ? row0 + k : a.rows - 1);
  uint4 u[FM_WIDE_ROWS];
  uint4 v[FM_WIDE_ROWS];
  // A broadcast row (stride 0) is loaded once and kept in registers for every row.
  FM_UNROLL
  for (uint k = 0; k < FM_WIDE_ROWS; ++k) {
    if (k == 0 || a.row_stride[0] != 0) {
      u[k] = x[row[k] * a.row_stride[0] + gid.x];
    } else {
      u[k] = u[0];
    }
    if (k == 0 || a.row_stride[1] != 0) {
      v[k] = y[row[k] * a.row_stride[1] + gid.x];
    } else {
      v[k] = v[0];
    }
  }
  const Op op;
  FM_UNROLL
  for (uint k = 0; k < FM_WIDE_ROWS; ++k)
    if (row0 + k < a.rows) out[row[k] * a.row_stride[2] + gid.x] = fm_chunk<T>(op, u[k], v[k]);
}

template <typename T, typename Op>
kernel void binary_s(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                     device T* out [[buffer(2)]], constant StridedArgs& a [[buffer(3)]],
                     uint3 gid [[thread_position_in_grid]]) {
  out[fm_offset_s(gid, a, 2)] =
      fm_result(Op(), x[fm_offset_s(gid, a, 0)], y[fm_offset_s(gid, a, 1)]);
}

template <typename T, typename Op>
kernel void binary_g(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                     device T* out [[buffer(2)]], constant StridedArgs& a [[buffer(3)]],
                     uint3 gid [[thread_position_in_grid]]) {
  const int64_t xi = fm_offset_g(gid, a, 0);
  const int64_t yi = fm_offset_g(gid, a, 1);
  const int64_t oi = fm_offset_g(gid, a, 2);
  out[oi] = fm_result(Op(), x[xi], y[yi]);
}

#include "elementwise_ops.h"
