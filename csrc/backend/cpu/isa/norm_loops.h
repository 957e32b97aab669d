// What isa/normalization.cpp and isa/softmax.cpp share, compiled once per ISA with them: the
// 16-lane loops, sums carried on in float64 past a block, and the task split whose
// boundaries depend on the shape only (so the results' bits do not depend on the number of
// threads). Internal to those two files: everything is in an unnamed namespace.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../normalization_cpu.h"
#include "../thread_pool.h"
#include "float_lanes.h"
#include "training_args.h"

// The kernels' exp (metal/fm_math.h: branch-free, so it vectorises), through the CPU shim;
// fm_end.h undoes the shim's keyword macros.
#include <metal_stdlib>
#include "fm_math.h"
#include "fm_end.h"

namespace fm::cpu::FM_CPU_ISA {
namespace {
using i64 = std::int64_t;
constexpr int L = 16;           // float lanes
constexpr i64 kBlock = 2048;    // elements summed in float before the float64 carry
constexpr i64 kTask = 16384;    // elements per task, about

// Lanes of the compiler's vector type: GCC did not vectorise every loop over 16-float lane
// arrays here (the max's select, reductions through a lambda's references), vector types
// it always does. The lanes are added in a fixed order.
constexpr int VL = kFloatLanes;
typedef float VF __attribute__((vector_size(VL * 4)));

inline float lanes_sum(VF v) {
  float s = v[0];
  for (int j = 1; j < VL; ++j) s += v[j];
  return s;
}

inline VF load(const float* p) {
  VF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Sum of f(x[i]) over n contiguous floats: two vectors of lanes per block of kBlock
// elements, the blocks' sums added in float64. f takes and returns a float or a VF.
template <class F>
double sum_of(const float* x, i64 n, F f) {
  double total = 0.0;
  for (i64 b0 = 0; b0 < n; b0 += kBlock) {
    const i64 b1 = std::min(n, b0 + kBlock);
    VF a0 = {}, a1 = {};
    i64 i = b0;
    for (; i + 2 * VL <= b1; i += 2 * VL) {
      a0 += f(load(x + i));
      a1 += f(load(x + i + VL));
    }
    float s = lanes_sum(a0 + a1);
    for (; i < b1; ++i) s += f(x[i]);
    total += double(s);
  }
  return total;
}

// Two sums over up to three arrays at once: f(a[i], b[i], c[i], u, v) adds into u and v
// (floats or VFs); c may be null where f does not read it.
template <class F>
void sum2_of(const float* a, const float* b, const float* c, i64 n, F f, double& su,
             double& sv) {
  su = sv = 0.0;
  const float zero = 0.0f;
  for (i64 b0 = 0; b0 < n; b0 += kBlock) {
    const i64 b1 = std::min(n, b0 + kBlock);
    VF u = {}, v = {};
    i64 i = b0;
    for (; i + VL <= b1; i += VL) f(load(a + i), load(b + i), c ? load(c + i) : VF{}, u, v);
    float us = lanes_sum(u), vs = lanes_sum(v);
    for (; i < b1; ++i) f(a[i], b[i], c ? c[i] : zero, us, vs);
    su += double(us);
    sv += double(vs);
  }
}

// Largest of x[0..n), NaN skipped (-inf if none), in the compiler's vector type (GCC did not
// vectorise the 16-lane select loop here): `v > b ? v : b` is maxps, which keeps b for NaN.
inline float max_of(const float* x, i64 n) {
  VF b0, b1;
  for (int j = 0; j < VL; ++j) b0[j] = b1[j] = -INFINITY;
  i64 i = 0;
  for (; i + 2 * VL <= n; i += 2 * VL) {
    VF v0, v1;
    std::memcpy(&v0, x + i, sizeof v0);
    std::memcpy(&v1, x + i + VL, sizeof v1);
    b0 = v0 > b0 ? v0 : b0;
    b1 = v1 > b1 ? v1 : b1;
  }
  b0 = b1 > b0 ? b1 : b0;
  float m = b0[0];
  for (int j = 1; j < VL; ++j) m = b0[j] > m ? b0[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

template <class F>
void parallel_tasks(i64 tasks, F f) {
  if (tasks <= 0) return;
  if (tasks == 1) return f(i64(0));
  ThreadPool::instance().parallel_for(tasks, [&](i64 t) { f(t); });
}

// Items (rows, channels) per task so that a task has about kTask elements.
inline i64 per_task(i64 elems_per_item) { return std::max<i64>(1, kTask / std::max<i64>(1, elems_per_item)); }

}  // namespace
}  // namespace fm::cpu::FM_CPU_ISA
