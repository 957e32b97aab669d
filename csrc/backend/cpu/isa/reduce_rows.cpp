// The reductions of reduce_cpu.h, compiled once per ISA (isa_dispatch.h): the max/min
// and sum loops below vectorise to the widest vectors the target has.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../reduce_cpu.h"
#include "../thread_pool.h"
#include "float_lanes.h"

namespace fm::cpu::FM_CPU_ISA {
namespace {
using i64 = std::int64_t;

// Work is cut into tasks of (outer row, chunk of R, block of inner) whose boundaries depend
// on the shape only, never on the thread count: each task writes its own partial and the
// partials are combined in order.
struct Tiling {
  i64 outer, R, inner, rows, chunks, iblock, iblocks;
  Tiling(i64 o, i64 r, i64 in) : outer(o), R(r), inner(in) {
    iblock = std::min<i64>(inner, 512);
    iblocks = (inner + iblock - 1) / iblock;
    rows = std::max<i64>(1, (i64(1) << 16) / iblock);
    chunks = std::max<i64>(1, (R + rows - 1) / rows);
  }
  i64 tasks() const { return outer * chunks * iblocks; }
  // Partial slot of (ob, chunk, oi).
  i64 slot(i64 ob, i64 c, i64 oi) const { return (ob * chunks + c) * inner + oi; }
  template <class F>
  void run(F task) const {
    ThreadPool::instance().parallel_for(tasks(), [&](i64 t) {
      const i64 ib = t % iblocks, c = (t / iblocks) % chunks, ob = t / (iblocks * chunks);
      const i64 r0 = c * rows, r1 = std::min(R, r0 + rows);
      const i64 i0 = ib * iblock, i1 = std::min(inner, i0 + iblock);
      task(ob, c, r0, r1, i0, i1);
    });
  }
};

// Sum of f(x) over one contiguous run, in eight float64 lanes added in a fixed order.
template <class F>
double sum_run(const float* x, i64 n, F f) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  i64 r = 0;
  for (; r + 8 <= n; r += 8)
    for (int j = 0; j < 8; ++j) acc[j] += f(double(x[r + j]));
  for (int j = 0; r < n; ++r, ++j) acc[j] += f(double(x[r]));
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Largest of sign * x[0..n) ignoring NaN (-inf if none), and whether a NaN was seen, in
// 16 independent lanes. Written as selects the compiler turns into vector compare / max
// instructions: the NaN flag is a max of 0/1 values (a conditional store of it, or an
// integer flag, keeps GCC's loop scalar), and `v > b ? v : b` is exactly x86's maxps.
inline float max_run(const float* x, i64 n, float sign, bool& nan) {
  constexpr int L = 16;
  float b[L], m[L];
  for (int j = 0; j < L; ++j) b[j] = -INFINITY, m[j] = 0.0f;
  i64 r = 0;
  for (; r + L <= n; r += L)
    for (int j = 0; j < L; ++j) {
      const float v = sign * x[r + j];
      const float u = v != v ? 1.0f : 0.0f;
      m[j] = m[j] > u ? m[j] : u;
      b[j] = v > b[j] ? v : b[j];
    }
  for (; r < n; ++r) {
    const float v = sign * x[r];
    m[0] = v != v ? 1.0f : m[0];
    b[0] = v > b[0] ? v : b[0];
  }
  float best = b[0];
  nan = false;
  for (int j = 0; j < L; ++j) {
    best = b[j] > best ? b[j] : best;
    nan = nan || m[j] != 0.0f;
  }
  return best;
}

// Index of the first NaN of x[0..n), or n: blocks of 16 tested with a vectorised flag.
inline i64 first_nan(const float* x, i64 n) {
  constexpr int L = 16;
  i64 r = 0;
  for (; r + L <= n; r += L) {
    float any = 0.0f;
    for (int j = 0; j < L; ++j) any = x[r + j] != x[r + j] ? 1.0f : any;
    if (any != 0.0f) break;
  }
  for (; r < n; ++r)
    if (x[r] != x[r]) return r;
  return n;
}

// First index of the largest of Sign * x[0..n) (n < 2^31), or of its first NaN, in one
// pass. Written with the compiler's vector types (GCC and clang), since the auto-vectoriser
// turns the per-lane select of an index into branches: U independent chains of vectors
// keep their best values, the indices where they were seen (a bitwise blend on the compare
// mask) and a NaN mask. Ties between lanes go to the smallest index, so the answer is the
// first occurrence; with every value -inf it is 0. `value`: the extreme of Sign * x, or NaN.
constexpr int AL = kFloatLanes;
typedef float VF __attribute__((vector_size(AL * 4)));
typedef std::int32_t VI __attribute__((vector_size(AL * 4)));

template <int Sign>
i64 argmax_run(const float* x, i64 n, float& value) {
  constexpr int U = 4;
  VF b[U];
  VI w[U], nan = {}, lane;
  for (int j = 0; j < AL; ++j) lane[j] = j;
  for (int u = 0; u < U; ++u) {
    for (int j = 0; j < AL; ++j) b[u][j] = -INFINITY;
    w[u] = VI{};
  }
  std::int32_t r = 0;
  const std::int32_t nv = std::int32_t(n - n % (U * AL));
  VI at_r = lane;  // the indices of the lanes of x[r..r + AL)
  for (; r < nv; r += U * AL, at_r += U * AL)
    for (int u = 0; u < U; ++u) {
      VF v;
      __builtin_memcpy(&v, x + r + u * AL, sizeof v);
      if (Sign < 0) v = -v;
      const VI gt = v > b[u];
      nan |= v != v;
      b[u] = (VF)(((VI)v & gt) | ((VI)b[u] & ~gt));
      w[u] = ((at_r + u * AL) & gt) | (w[u] & ~gt);
    }
  float best = -INFINITY;
  std::int32_t at = 0;
  bool any_nan = false;
  for (int j = 0; j < AL; ++j) any_nan = any_nan || nan[j] != 0;
  for (int u = 0; u < U; ++u)
    for (int j = 0; j < AL; ++j)
      if (b[u][j] > best || (b[u][j] == best && w[u][j] < at)) best = b[u][j], at = w[u][j];
  for (; r < n && !any_nan; ++r) {  // the tail, in order: later indices win only if larger
    const float v = Sign > 0 ? x[r] : -x[r];
    if (v != v) any_nan = true;
    if (v > best) best = v, at = r;
  }
  if (any_nan) {
    value = std::numeric_limits<float>::quiet_NaN();
    return first_nan(x, n);
  }
  value = best;
  return at;
}

template <class F>
void sums(const Tiling& t, const float* x, const double* mean, F f, std::vector<double>& part) {
  t.run([&](i64 ob, i64 c, i64 r0, i64 r1, i64 i0, i64 i1) {
    if (t.inner == 1) {
      const double m = mean ? mean[ob] : 0.0;
      part[t.slot(ob, c, 0)] = sum_run(x + ob * t.R + r0, r1 - r0, [&](double v) { return f(v - m); });
      return;
    }
    double acc[512];
    double m[512];
    for (i64 i = i0; i < i1; ++i) {
      acc[i - i0] = 0.0;
      m[i - i0] = mean ? mean[ob * t.inner + i] : 0.0;
    }
    for (i64 r = r0; r < r1; ++r) {
      const float* row = x + (ob * t.R + r) * t.inner;
      for (i64 i = i0; i < i1; ++i) acc[i - i0] += f(double(row[i]) - m[i - i0]);
    }
    for (i64 i = i0; i < i1; ++i) part[t.slot(ob, c, i)] = acc[i - i0];
  });
}
}  // namespace

void reduce_rows(CpuReduce op, const float* x, i64 outer, i64 R, i64 inner, const double* mean,
                 double divisor, bool root, float* out, double* out_f64) {
  const Tiling t(outer, R, inner);
  const i64 outputs = outer * inner;
  if (outputs == 0) return;
  if (op == CpuReduce::sum || op == CpuReduce::sumsq_dev) {
    std::vector<double> part(std::size_t(outer * t.chunks * inner), 0.0);
    if (R > 0) {
      if (op == CpuReduce::sum)
        sums(t, x, nullptr, [](double v) { return v; }, part);
      else
        sums(t, x, mean, [](double v) { return v * v; }, part);
    }
    for (i64 o = 0; o < outputs; ++o) {
      const i64 ob = o / inner, oi = o - ob * inner;
      double s = 0.0;
      for (i64 c = 0; c < t.chunks; ++c) s += part[t.slot(ob, c, oi)];
      s /= divisor;
      if (root) s = std::sqrt(s);
      if (out_f64) out_f64[o] = s;
      if (out) out[o] = float(s);
    }
    return;
  }
  // max / min: the extreme non-NaN value per task and whether a NaN was seen.
  const float sign = op == CpuReduce::max ? 1.0f : -1.0f;
  std::vector<float> best(std::size_t(outer * t.chunks * inner), -INFINITY);
  std::vector<char> nan(best.size(), 0);
  t.run([&](i64 ob, i64 c, i64 r0, i64 r1, i64 i0, i64 i1) {
    if (inner == 1) {
      bool n = false;
      best[t.slot(ob, c, 0)] = max_run(x + ob * R + r0, r1 - r0, sign, n);
      nan[t.slot(ob, c, 0)] = n;
      return;
    }
    // Row by row across the block of inner positions: elementwise selects that vectorise.
    float b[512], m[512];
    const i64 w = i1 - i0;
    for (i64 i = 0; i < w; ++i) b[i] = -INFINITY, m[i] = 0.0f;
    for (i64 r = r0; r < r1; ++r) {
      const float* row = x + (ob * R + r) * inner + i0;
      for (i64 i = 0; i < w; ++i) {
        const float v = sign * row[i];
        const float u = v != v ? 1.0f : 0.0f;
        m[i] = m[i] > u ? m[i] : u;
        b[i] = v > b[i] ? v : b[i];
      }
    }
    for (i64 i = 0; i < w; ++i) {
      best[t.slot(ob, c, i0 + i)] = b[i];
      nan[t.slot(ob, c, i0 + i)] = m[i] != 0.0f;
    }
  });
  for (i64 o = 0; o < outputs; ++o) {
    const i64 ob = o / inner, oi = o - ob * inner;
    float b = -INFINITY;
    bool n = false;
    for (i64 c = 0; c < t.chunks; ++c) {
      b = std::max(b, best[t.slot(ob, c, oi)]);
      n |= nan[t.slot(ob, c, oi)] != 0;
    }
    out[o] = n ? std::numeric_limits<float>::quiet_NaN() : sign * b;
  }
}

void arg_rows(int sign, const float* x, i64 outer, i64 R, i64 inner, i64* out) {
  const Tiling t(outer, R, inner);
  const i64 outputs = outer * inner;
  if (outputs == 0 || R == 0) return;
  const float s = float(sign);
  std::vector<float> best(std::size_t(outer * t.chunks * inner));
  std::vector<i64> where(best.size());
  // Scans ascending: the first NaN ends the scan, a value wins only if strictly better.
  t.run([&](i64 ob, i64 c, i64 r0, i64 r1, i64 i0, i64 i1) {
    if (inner == 1) {  // one vectorised pass (tasks have at most 2^16 rows here)
      float b;
      const float* p = x + ob * R + r0;
      where[t.slot(ob, c, 0)] = r0 + (sign > 0 ? argmax_run<1>(p, r1 - r0, b) : argmax_run<-1>(p, r1 - r0, b));
      best[t.slot(ob, c, 0)] = b;
      return;
    }
    for (i64 i = i0; i < i1; ++i) {
      const float* p = x + (ob * R) * inner + i;
      float b = s * p[r0 * inner];
      i64 w = r0;
      if (b == b)
        for (i64 r = r0 + 1; r < r1; ++r) {
          const float v = s * p[r * inner];
          if (v != v) {
            b = v;
            w = r;
            break;
          }
          if (v > b) {
            b = v;
            w = r;
          }
        }
      best[t.slot(ob, c, i)] = b;
      where[t.slot(ob, c, i)] = w;
    }
  });
  for (i64 o = 0; o < outputs; ++o) {
    const i64 ob = o / inner, oi = o - ob * inner;
    float b = best[t.slot(ob, 0, oi)];
    i64 w = where[t.slot(ob, 0, oi)];
    for (i64 c = 1; c < t.chunks && b == b; ++c) {
      const float v = best[t.slot(ob, c, oi)];
      if (v != v || v > b) {
        b = v;
        w = where[t.slot(ob, c, oi)];
      }
    }
    out[o] = w;
  }
}

}  // namespace fm::cpu::FM_CPU_ISA
