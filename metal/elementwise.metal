// Elementwise kernels: one template per layout, instantiated for every op and dtype of
// elementwise_ops.tbl by the generated header elementwise_ops.h.
//
// Layouts (the host picks one after merging dimensions):
//   *_v   contiguous operands and output            grid: n threads
//   *_sv  binary, x is one element (a scalar)       grid: n threads
//   *_vs  binary, y is one element
//   *_g   any strides (broadcast = stride 0)        grid: (last dim, dim before, the rest)
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
kernel void unary_g(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                    constant StridedArgs& a [[buffer(2)]],
                    uint3 gid [[thread_position_in_grid]]) {
  const int64_t xi = fm_strided_offset(gid, a.shape, a.strides[0], a.ndim);
  const int64_t oi = fm_strided_offset(gid, a.shape, a.strides[2], a.ndim);
  out[oi] = static_cast<T>(Op()(static_cast<float>(x[xi])));
}

template <typename T, typename Op>
kernel void binary_v(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                     device T* out [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  out[i] = static_cast<T>(Op()(static_cast<float>(x[i]), static_cast<float>(y[i])));
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
kernel void binary_g(device const T* x [[buffer(0)]], device const T* y [[buffer(1)]],
                     device T* out [[buffer(2)]], constant StridedArgs& a [[buffer(3)]],
                     uint3 gid [[thread_position_in_grid]]) {
  const int64_t xi = fm_strided_offset(gid, a.shape, a.strides[0], a.ndim);
  const int64_t yi = fm_strided_offset(gid, a.shape, a.strides[1], a.ndim);
  const int64_t oi = fm_strided_offset(gid, a.shape, a.strides[2], a.ndim);
  out[oi] = static_cast<T>(Op()(static_cast<float>(x[xi]), static_cast<float>(y[yi])));
}

#include "elementwise_ops.h"
