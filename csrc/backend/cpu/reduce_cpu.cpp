// The header's functions, dispatched to the per-ISA copies in isa/reduce_rows.cpp, and
// their registration as the cpu backend's reductions (ops/reduce.cpp asks for them by name).
#include "reduce_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "isa_dispatch.h"
#include "native_ops.h"
#include "thread_pool.h"

namespace fm::cpu {
using i64 = std::int64_t;

FM_CPU_DECLARE(void reduce_rows(CpuReduce, const float*, i64, i64, i64, const double*, double,
                                bool, float*, double*))
FM_CPU_DECLARE(void arg_rows(int, const float*, i64, i64, i64, i64*))

void reduce_rows(CpuReduce op, const float* x, i64 outer, i64 R, i64 inner, const double* mean,
                 double divisor, bool root, float* out, double* out_f64) {
  FM_CPU_DISPATCH(reduce_rows, op, x, outer, R, inner, mean, divisor, root, out, out_f64);
}
void arg_rows(int sign, const float* x, i64 outer, i64 R, i64 inner, i64* out) {
  FM_CPU_DISPATCH(arg_rows, sign, x, outer, R, inner, out);
}

namespace {

// The native-op signatures of ops/reduce.cpp.
template <CpuReduce Op>
void rows_native(const float* x, i64 outer, i64 R, i64 inner, const double* mean, double divisor,
                 bool root, float* out, double* out_f64) {
  reduce_rows(Op, x, outer, R, inner, mean, divisor, root, out, out_f64);
}
template <int Sign>
void arg_rows_native(const float* x, i64 outer, i64 R, i64 inner, i64* out) {
  arg_rows(Sign, x, outer, R, inner, out);
}

// ---- float64: the same reductions in double, compiled once (not per ISA): libm-free loops
// over blocks of the inner dimension that the compiler vectorises in any ISA. Tasks are
// (outer row, chunk of R, inner block) with shape-only boundaries, their partials combined
// in chunk order, so results do not depend on the thread count. Sums keep each element's
// rounding error exactly (two-sum into a pair, as metal/reduce.metal's float64 kernels).
constexpr i64 kBlock = 256, kChunkRows = 1 << 14;

struct Tasks64 {
  i64 outer, R, inner, iblocks, chunks;
  Tasks64(i64 o, i64 r, i64 in)
      : outer(o), R(r), inner(in), iblocks((in + kBlock - 1) / kBlock),
        chunks(std::max<i64>(1, (r + kChunkRows - 1) / kChunkRows)) {}
  // f(ob, chunk, r0, r1, i0, i1) for every task, spread over the pool.
  template <class F>
  void run(F f) const {
    ThreadPool::instance().parallel_for(outer * chunks * iblocks, [&](i64 t) {
      const i64 ib = t % iblocks, c = (t / iblocks) % chunks, ob = t / (iblocks * chunks);
      f(ob, c, c * kChunkRows, std::min(R, (c + 1) * kChunkRows), ib * kBlock,
        std::min(inner, (ib + 1) * kBlock));
    });
  }
  i64 slot(i64 ob, i64 c, i64 oi) const { return (ob * chunks + c) * inner + oi; }
};

// hi + lo += v with the rounding error of the add kept (none past an infinite sum).
inline void add_exact(double& hi, double& lo, double v) {
  const double s = hi + v;
  const double bb = s - hi;
  const double e = (hi - (s - bb)) + (v - bb);
  hi = s;
  lo += std::isfinite(s) ? e : 0.0;
}

template <CpuReduce Op>
void rows_native_f64(const double* x, i64 outer, i64 R, i64 inner, const double* mean,
                     double divisor, bool root, double* out) {
  const Tasks64 t(outer, R, inner);
  const std::size_t slots = std::size_t(outer * t.chunks * inner);
  if constexpr (Op == CpuReduce::sum || Op == CpuReduce::sumsq_dev) {
    std::vector<double> part_hi(slots), part_lo(slots);
    t.run([&](i64 ob, i64 c, i64 r0, i64 r1, i64 i0, i64 i1) {
      double hi[kBlock] = {}, lo[kBlock] = {}, m[kBlock] = {};
      if (Op == CpuReduce::sumsq_dev)
        for (i64 i = i0; i < i1; ++i) m[i - i0] = mean[ob * inner + i];
      if (inner == 1) {  // one output along contiguous rows: 8 independent pairs (r mod 8)
        constexpr int L = 8;
        const double* row = x + ob * R;
        i64 r = r0;
        for (; r + L <= r1; r += L)
          for (int j = 0; j < L; ++j) {
            double v = row[r + j];
            if (Op == CpuReduce::sumsq_dev) v = (v - m[0]) * (v - m[0]);
            add_exact(hi[j], lo[j], v);
          }
        for (int j = 0; r < r1; ++r, ++j) {
          double v = row[r];
          if (Op == CpuReduce::sumsq_dev) v = (v - m[0]) * (v - m[0]);
          add_exact(hi[j], lo[j], v);
        }
        double h = 0.0, l = 0.0;
        for (int j = 0; j < L; ++j) {
          add_exact(h, l, hi[j]);
          l += lo[j];
        }
        part_hi[std::size_t(t.slot(ob, c, 0))] = h;
        part_lo[std::size_t(t.slot(ob, c, 0))] = l;
        return;
      }
      for (i64 r = r0; r < r1; ++r) {
        const double* row = x + (ob * R + r) * inner;
        for (i64 i = i0; i < i1; ++i) {
          double v = row[i];
          if (Op == CpuReduce::sumsq_dev) v = (v - m[i - i0]) * (v - m[i - i0]);
          add_exact(hi[i - i0], lo[i - i0], v);
        }
      }
      for (i64 i = i0; i < i1; ++i) {
        part_hi[std::size_t(t.slot(ob, c, i))] = hi[i - i0];
        part_lo[std::size_t(t.slot(ob, c, i))] = lo[i - i0];
      }
    });
    for (i64 ob = 0; ob < outer; ++ob)
      for (i64 i = 0; i < inner; ++i) {
        double hi = 0.0, lo = 0.0;
        for (i64 c = 0; c < t.chunks; ++c) {
          add_exact(hi, lo, part_hi[std::size_t(t.slot(ob, c, i))]);
          lo += part_lo[std::size_t(t.slot(ob, c, i))];
        }
        const double r = (hi + lo) / divisor;
        out[ob * inner + i] = root ? std::sqrt(r) : r;
      }
  } else {  // max, min: NaN propagating
    const double sign = Op == CpuReduce::max ? 1.0 : -1.0;
    std::vector<double> part(slots);
    t.run([&](i64 ob, i64 c, i64 r0, i64 r1, i64 i0, i64 i1) {
      double b[kBlock], nan[kBlock];
      for (i64 i = 0; i < kBlock; ++i) b[i] = -INFINITY, nan[i] = 0.0;
      for (i64 r = r0; r < r1; ++r) {
        const double* row = x + (ob * R + r) * inner;
        for (i64 i = i0; i < i1; ++i) {
          const double v = sign * row[i];
          nan[i - i0] = v != v ? 1.0 : nan[i - i0];
          b[i - i0] = v > b[i - i0] ? v : b[i - i0];
        }
      }
      for (i64 i = i0; i < i1; ++i)
        part[std::size_t(t.slot(ob, c, i))] = nan[i - i0] != 0.0 ? NAN : b[i - i0];
    });
    for (i64 ob = 0; ob < outer; ++ob)
      for (i64 i = 0; i < inner; ++i) {
        double b = -INFINITY;
        for (i64 c = 0; c < t.chunks; ++c) {
          const double v = part[std::size_t(t.slot(ob, c, i))];
          b = (v != v || v > b || b != b) ? (b != b ? b : v) : b;
        }
        out[ob * inner + i] = sign * b;
      }
  }
  (void)root;
}

// Index along R of the max (Sign 1) or min (Sign -1) of float64 rows; the first NaN wins,
// ties go to the first.
template <int Sign>
void arg_rows_native_f64(const double* x, i64 outer, i64 R, i64 inner, i64* out) {
  const Tasks64 t(outer, R, inner);
  const std::size_t slots = std::size_t(outer * t.chunks * inner);
  std::vector<double> best(slots);
  std::vector<i64> where(slots);
  t.run([&](i64 ob, i64 c, i64 r0, i64 r1, i64 i0, i64 i1) {
    for (i64 i = i0; i < i1; ++i) {
      double b = -INFINITY;
      i64 w = r0;
      for (i64 r = r0; r < r1; ++r) {
        const double v = double(Sign) * x[(ob * R + r) * inner + i];
        if (v != v) {
          b = v, w = r;
          break;
        }
        if (v > b || r == r0) b = v, w = r;
      }
      best[std::size_t(t.slot(ob, c, i))] = b;
      where[std::size_t(t.slot(ob, c, i))] = w;
    }
  });
  for (i64 ob = 0; ob < outer; ++ob)
    for (i64 i = 0; i < inner; ++i) {
      double b = 0.0;
      i64 w = -1;
      for (i64 c = 0; c < t.chunks; ++c) {
        const double v = best[std::size_t(t.slot(ob, c, i))];
        if (w >= 0 && b != b) break;  // an earlier NaN wins
        if (w < 0 || v != v || v > b) b = v, w = where[std::size_t(t.slot(ob, c, i))];
      }
      out[ob * inner + i] = w;
    }
}

}  // namespace

FM_CPU_NATIVE("reduce_sum_rows_float64", &rows_native_f64<CpuReduce::sum>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_sumsq_dev_rows_float64", &rows_native_f64<CpuReduce::sumsq_dev>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_max_rows_float64", &rows_native_f64<CpuReduce::max>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_min_rows_float64", &rows_native_f64<CpuReduce::min>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_argmax_rows_float64", &arg_rows_native_f64<1>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_argmin_rows_float64", &arg_rows_native_f64<-1>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_sum_rows", &rows_native<CpuReduce::sum>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_sumsq_dev_rows", &rows_native<CpuReduce::sumsq_dev>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_max_rows", &rows_native<CpuReduce::max>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_min_rows", &rows_native<CpuReduce::min>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_argmax_rows", &arg_rows_native<1>, &native_reduce_matmul_enabled());
FM_CPU_NATIVE("reduce_argmin_rows", &arg_rows_native<-1>, &native_reduce_matmul_enabled());

}  // namespace fm::cpu
