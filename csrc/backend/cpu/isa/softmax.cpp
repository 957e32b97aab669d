// The softmax family (softmax / log_softmax / logsumexp along any axis, and their backward)
// and the fused cross-entropy of normalization_cpu.h, compiled once per ISA: the formulas of
// metal/normalization.metal and metal/training.metal over contiguous float32, with the
// loops and fixed-order sums of norm_loops.h.
#include "norm_loops.h"

namespace fm::cpu::FM_CPU_ISA {

// ------------------------------------------------------------------- softmax family
namespace {
inline float exp_nonpos(float v) { return fm_exp_nonpos(v); }
inline float exp_any(float v) { return fm_exp(v); }

// sum of exp(x[i] - m) (full: any argument; else x - m <= 0 or NaN), 16 float lanes per
// block (this loop of fm_exp vectorises), blocks added in float64.
inline double sum_exp(const float* x, i64 n, float m, bool full) {
  double total = 0.0;
  for (i64 b0 = 0; b0 < n; b0 += kBlock) {
    const i64 b1 = std::min(n, b0 + kBlock);
    float acc[L] = {};
    i64 i = b0;
    if (full) {
      for (; i + L <= b1; i += L)
        for (int j = 0; j < L; ++j) acc[j] += exp_any(x[i + j] - m);
    } else {
      for (; i + L <= b1; i += L)
        for (int j = 0; j < L; ++j) acc[j] += exp_nonpos(x[i + j] - m);
    }
    for (int j = 0; i < b1; ++i, ++j) acc[j] += full ? exp_any(x[i] - m) : exp_nonpos(x[i] - m);
    float s = 0.0f;
    for (int j = 0; j < L; ++j) s += acc[j];
    total += double(s);
  }
  return total;
}

void softmax_row(const SoftmaxArgs& a, const float* x, float* out, i64 r, float* lse) {
  const i64 n = a.n;
  float m = max_of(x, n);
  if (a.mode == kLogSumExp) {
    if (std::isinf(m)) m = 0.0f;
    const double s = sum_exp(x, n, m, true);
    lse[r] = m + std::log(float(s));
    return;
  }
  if (a.mode == kSoftmax) {
    double total = 0.0;
    for (i64 b0 = 0; b0 < n; b0 += kBlock) {
      const i64 b1 = std::min(n, b0 + kBlock);
      float acc[L] = {};
      i64 i = b0;
      for (; i + L <= b1; i += L)
        for (int j = 0; j < L; ++j) {
          const float e = exp_nonpos(x[i + j] - m);
          out[i + j] = e;
          acc[j] += e;
        }
      for (int j = 0; i < b1; ++i, ++j) {
        const float e = exp_nonpos(x[i] - m);
        out[i] = e;
        acc[j] += e;
      }
      float s = 0.0f;
      for (int j = 0; j < L; ++j) s += acc[j];
      total += double(s);
    }
    const float inv = 1.0f / float(total);
    for (i64 i = 0; i < n; ++i) out[i] *= inv;
    return;
  }
  const double s = sum_exp(x, n, m, false);
  const float ls = std::log(float(s));
  for (i64 i = 0; i < n; ++i) out[i] = (x[i] - m) - ls;
}

// Columns: a block of `w` neighbouring positions of one outer index, reduced along n at
// stride inner, in arrays of w lanes.
constexpr i64 kColBlock = 256;
void softmax_cols_block(const SoftmaxArgs& a, const float* x, float* out, i64 o, i64 i0, i64 w) {
  const i64 n = a.n, inner = a.inner;
  const float* xb = x + o * n * inner + i0;
  float m[kColBlock], s[kColBlock];
  for (i64 j = 0; j < w; ++j) m[j] = -INFINITY, s[j] = 0.0f;
  for (i64 k = 0; k < n; ++k) {
    const float* xk = xb + k * inner;
    for (i64 j = 0; j < w; ++j) m[j] = xk[j] > m[j] ? xk[j] : m[j];
  }
  if (a.mode == kLogSumExp) {
    for (i64 j = 0; j < w; ++j) m[j] = std::isinf(m[j]) ? 0.0f : m[j];
    for (i64 k = 0; k < n; ++k) {
      const float* xk = xb + k * inner;
      for (i64 j = 0; j < w; ++j) s[j] += exp_any(xk[j] - m[j]);
    }
    float* ob = out + o * inner + i0;
    for (i64 j = 0; j < w; ++j) ob[j] = m[j] + std::log(s[j]);
    return;
  }
  float* obase = out + o * n * inner + i0;
  for (i64 k = 0; k < n; ++k) {
    const float* xk = xb + k * inner;
    float* ok = obase + k * inner;
    for (i64 j = 0; j < w; ++j) {
      const float e = exp_nonpos(xk[j] - m[j]);
      if (a.mode == kSoftmax) ok[j] = e;
      s[j] += e;
    }
  }
  if (a.mode == kSoftmax) {
    for (i64 j = 0; j < w; ++j) s[j] = 1.0f / s[j];
    for (i64 k = 0; k < n; ++k) {
      float* ok = obase + k * inner;
      for (i64 j = 0; j < w; ++j) ok[j] *= s[j];
    }
  } else {
    for (i64 j = 0; j < w; ++j) s[j] = std::log(s[j]);
    for (i64 k = 0; k < n; ++k) {
      const float* xk = xb + k * inner;
      float* ok = obase + k * inner;
      for (i64 j = 0; j < w; ++j) ok[j] = (xk[j] - m[j]) - s[j];
    }
  }
}

// Runs f over (outer, column block) tasks or row tasks of about kTask elements.
template <class Rows, class Cols>
void softmax_tasks(const SoftmaxArgs& a, Rows rows, Cols cols) {
  const i64 outer = a.outer, n = std::max<i64>(1, a.n), inner = a.inner;
  if (inner == 1) {
    const i64 rpt = per_task(n);
    parallel_tasks((outer + rpt - 1) / rpt, [&](i64 t) {
      for (i64 r = t * rpt; r < std::min(outer, (t + 1) * rpt); ++r) rows(r);
    });
    return;
  }
  const i64 blocks = (inner + kColBlock - 1) / kColBlock;
  parallel_tasks(outer * blocks, [&](i64 t) {
    const i64 o = t / blocks, i0 = (t % blocks) * kColBlock;
    cols(o, i0, std::min(kColBlock, inner - i0));
  });
}
}  // namespace

void softmax_forward(const SoftmaxArgs& a, const float* x, float* out) {
  softmax_tasks(a, [&](i64 r) {
    const i64 off = a.mode == kLogSumExp ? 0 : r * i64(a.n);
    softmax_row(a, x + r * i64(a.n), out + off, r, out);
  }, [&](i64 o, i64 i0, i64 w) { softmax_cols_block(a, x, out, o, i0, w); });
}

void softmax_backward(const SoftmaxArgs& a, const float* g, const float* y, float* dx) {
  const bool log_mode = a.mode == kLogSoftmax;
  const i64 n = a.n, inner = a.inner;
  softmax_tasks(a, [&](i64 r) {
    const float* gr = g + r * n;
    const float* yr = y + r * n;
    float* dr = dx + r * n;
    if (log_mode) {
      const float s = float(sum_of(gr, n, [](auto v) { return v; }));
      for (i64 i = 0; i < n; ++i) dr[i] = gr[i] - exp_any(yr[i]) * s;
    } else {
      double u, unused;
      sum2_of(gr, yr, nullptr, n, [](auto gv, auto yv, auto, auto& p, auto&) { p += gv * yv; }, u,
              unused);
      const float s = float(u);
      for (i64 i = 0; i < n; ++i) dr[i] = yr[i] * (gr[i] - s);
    }
  }, [&](i64 o, i64 i0, i64 w) {
    const i64 base = o * n * inner + i0;
    float s[kColBlock];
    for (i64 j = 0; j < w; ++j) s[j] = 0.0f;
    for (i64 k = 0; k < n; ++k) {
      const float* gk = g + base + k * inner;
      const float* yk = y + base + k * inner;
      if (log_mode)
        for (i64 j = 0; j < w; ++j) s[j] += gk[j];
      else
        for (i64 j = 0; j < w; ++j) s[j] += gk[j] * yk[j];
    }
    for (i64 k = 0; k < n; ++k) {
      const float* gk = g + base + k * inner;
      const float* yk = y + base + k * inner;
      float* dk = dx + base + k * inner;
      if (log_mode)
        for (i64 j = 0; j < w; ++j) dk[j] = gk[j] - exp_any(yk[j]) * s[j];
      else
        for (i64 j = 0; j < w; ++j) dk[j] = yk[j] * (gk[j] - s[j]);
    }
  });
}

// cross_entropy_rows + cross_entropy_mean (metal/training.metal) for the CPU: per row the
// log-softmax of the native softmax (max, then sum of exp(x - m) in lanes), the row's loss
// ls - (x[label] - m) and the fused gradient (softmax - one_hot) / rows (a label outside
// [0, classes): a NaN loss and gradient row, as the kernel); then the mean of the row losses
// summed in row order, as the kernel (the bits do not depend on the thread count).
void cross_entropy_native(const CrossEntropyArgs& a, const float* x, const std::int64_t* labels,
                          float* loss, float* grad) {
  const i64 n = a.classes, rows = a.rows;
  const float inv = a.inv_rows;
  std::vector<float> row_loss(std::size_t(std::max<i64>(rows, 1)));
  const i64 rpt = per_task(n);
  parallel_tasks((rows + rpt - 1) / rpt, [&](i64 t) {
    for (i64 r = t * rpt; r < std::min(rows, (t + 1) * rpt); ++r) {
      const float* xr = x + r * n;
      float* gr = grad + r * n;
      const i64 label = labels[r];
      if (label < 0 || label >= n) {
        for (i64 i = 0; i < n; ++i) gr[i] = NAN;
        row_loss[std::size_t(r)] = NAN;
        continue;
      }
      const float m = max_of(xr, n);
      const float ls = std::log(float(sum_exp(xr, n, m, false)));
      for (i64 i = 0; i < n; ++i) gr[i] = exp_nonpos((xr[i] - m) - ls) * inv;
      gr[label] = (exp_nonpos((xr[label] - m) - ls) - 1.0f) * inv;
      row_loss[std::size_t(r)] = ls - (xr[label] - m);
    }
  });
  float s = 0.0f;
  for (i64 r = 0; r < rows; ++r) s += row_loss[std::size_t(r)];
  loss[0] = s * inv;
}

}  // namespace fm::cpu::FM_CPU_ISA
