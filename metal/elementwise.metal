// Elementwise kernels: one template per layout, instantiated for every op and dtype of
// elementwise_ops.tbl by the generated header elementwise_ops.h.
//
// Layouts (the host picks one after merging dimensions):
//   *_v   contiguous operands and output            grid: n threads
//   *_v4  the same, four elements a thread through vec<T, 4> loads and stores (operands
//         aligned to the vector; GPU devices, where one wide access per thread is what
//         reaches memory bandwidth)               grid: n / 4 threads, the rest by *_v
//   *_sv  binary, x is one element (a scalar)       grid: n threads
//   *_vs  binary, y is one element
//   *_r   3 dims (fewer padded), the last with unit stride in every operand and the
//         output: rows of a broadcast, transposed or sliced array
//   *_s   3 dims (fewer padded), any strides
//   *_g   any number of dims, any strides (broadcast = stride 0)
// *_r, *_s and *_g use the grid (last dim, dim before, the rest).
// T is the storage type (float or half); every op computes in float.
#include <metal_stdlib>
#include "fm_kernel.h"
#include "fm_math.h"
#include "strided.h"
using namespace metal;

template <typename T, typename Op>
kernel void unary_v(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                    uint i [[thread_position_in_grid]]) {
  out[i] = static_cast<T>(Op()(static_cast<float>(x[i])));
}

template <typename T, typename Op>
kernel void unary_v4(device const vec<T, 4>* x [[buffer(0)]], device vec<T, 4>* out [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
  const vec<T, 4> v = x[i];
  const Op op;
  out[i] = vec<T, 4>(static_cast<T>(op(static_cast<float>(v.x))), static_cast<T>(op(static_cast<float>(v.y))),
                     static_cast<T>(op(static_cast<float>(v.z))), static_cast<T>(op(static_cast<float>(v.w))));
}

template <typename T, typename Op>
kernel void unary_g(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                    constant StridedArgs& a [[buffer(2)]],
                    uint3 gid [[thread_position_in_grid]]) {
  const int64_t xi = fm_offset_g(gid, a, 0);
  const int64_t oi = fm_offset_g(gid, a, 2);
  out[oi] = static_cast<T>(Op()(static_cast<float>(x[xi])));
}

template <typename T, typename Op>
kernel void unary_r(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                    constant StridedArgs& a [[buffer(2)]],
                    uint3 gid [[thread_position_in_grid]]) {
  const uint3 row = uint3(0u, gid.y, gid.z);
  const int64_t xi = fm_offset_s(row, a, 0) + gid.x;
  const int64_t oi = fm_offset_s(row, a, 2) + gid.x;
  out[oi] = static_cast<T>(Op()(static_cast<float>(x[xi])));
}

template <typename T, typename Op>
kernel void unary_s(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                    constant StridedArgs& a [[buffer(2)]],
                    uint3 gid [[thread_position_in_grid]]) {
  out[fm_offset_s(gid, a, 2)] =
      static_cast<T>(Op()(static_cast<float>(x[fm_offset_s(gid, a, 0)])));
}

template <typename T, typename Op>
kernel void binary_v(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                     device T* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  out[i] = static_cast<T>(Op()(static_cast<float>(x[i]), static_cast<float>(y[i])));
}

template <typename T, typename Op>
kernel void binary_v4(device const vec<T, 4>* x [[buffer(0)]], device const vec<T, 4>* y [[buffer(1)]],
                      device vec<T, 4>* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  const vec<T, 4> a = x[i];
  const vec<T, 4> b = y[i];
  const Op op;
  out[i] = vec<T, 4>(static_cast<T>(op(static_cast<float>(a.x), static_cast<float>(b.x))),
                     static_cast<T>(op(static_cast<float>(a.y), static_cast<float>(b.y))),
                     static_cast<T>(op(static_cast<float>(a.z), static_cast<float>(b.z))),
                     static_cast<T>(op(static_cast<float>(a.w), static_cast<float>(b.w))));
}

template <typename T, typename Op>
kernel void binary_sv(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                      device T* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  out[i] = static_cast<T>(Op()(static_cast<float>(x[0]), static_cast<float>(y[i])));
}

template <typename T, typename Op>
kernel void binary_vs(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                      device T* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  out[i] = static_cast<T>(Op()(static_cast<float>(x[i]), static_cast<float>(y[0])));
}

template <typename T, typename Op>
kernel void binary_r(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                     device T* out [[buffer(2)]], constant StridedArgs& a [[buffer(3)]],
                     uint3 gid [[thread_position_in_grid]]) {
  const uint3 row = uint3(0u, gid.y, gid.z);
  const int64_t xi = fm_offset_s(row, a, 0) + gid.x;
  const int64_t yi = fm_offset_s(row, a, 1) + gid.x;
  const int64_t oi = fm_offset_s(row, a, 2) + gid.x;
  out[oi] = static_cast<T>(Op()(static_cast<float>(x[xi]), static_cast<float>(y[yi])));
}

template <typename T, typename Op>
kernel void binary_s(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                     device T* out [[buffer(2)]], constant StridedArgs& a [[buffer(3)]],
                     uint3 gid [[thread_position_in_grid]]) {
  out[fm_offset_s(gid, a, 2)] = static_cast<T>(Op()(
      static_cast<float>(x[fm_offset_s(gid, a, 0)]),
      static_cast<float>(y[fm_offset_s(gid, a, 1)])));
}

template <typename T, typename Op>
kernel void binary_g(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                     device T* out [[buffer(2)]], constant StridedArgs& a [[buffer(3)]],
                     uint3 gid [[thread_position_in_grid]]) {
  const int64_t xi = fm_offset_g(gid, a, 0);
  const int64_t yi = fm_offset_g(gid, a, 1);
  const int64_t oi = fm_offset_g(gid, a, 2);
  out[oi] = static_cast<T>(Op()(static_cast<float>(x[xi]), static_cast<float>(y[yi])));
}

#include "elementwise_ops.h"
