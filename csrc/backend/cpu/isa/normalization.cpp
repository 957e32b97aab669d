// The normalization and softmax ops of normalization_cpu.h, compiled once per ISA
// (isa_dispatch.h): the same formulas as metal/normalization.metal over contiguous float32,
// in loops over 16 float lanes that the compiler vectorises, with sums of more than a block
// of elements carried on in float64. Work is cut into tasks whose boundaries depend on the
// shape only, and every reduction adds its parts in a fixed order, so the results' bits do
// not depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../normalization_cpu.h"
#include "../thread_pool.h"

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

// Sum of f(x[i]) (and of f2) over n contiguous floats: 16 float lanes per block of kBlock,
// the blocks' sums added in float64.
template <class F>
double sum_of(const float* x, i64 n, F f) {
  double total = 0.0;
  for (i64 b0 = 0; b0 < n; b0 += kBlock) {
    const i64 b1 = std::min(n, b0 + kBlock);
    float acc[L] = {};
    i64 i = b0;
    for (; i + L <= b1; i += L)
      for (int j = 0; j < L; ++j) acc[j] += f(x[i + j]);
    for (int j = 0; i < b1; ++i, ++j) acc[j] += f(x[i]);
    float s = 0.0f;
    for (int j = 0; j < L; ++j) s += acc[j];
    total += double(s);
  }
  return total;
}

// Two sums over a pair of arrays at once: f(a[i], b[i]) -> (u, v) added into su, sv.
template <class F>
void sum2_of(const float* a, const float* b, i64 n, F f, double& su, double& sv) {
  su = sv = 0.0;
  for (i64 b0 = 0; b0 < n; b0 += kBlock) {
    const i64 b1 = std::min(n, b0 + kBlock);
    float u[L] = {}, v[L] = {};
    i64 i = b0;
    for (; i + L <= b1; i += L)
      for (int j = 0; j < L; ++j) f(a[i + j], b[i + j], u[j], v[j]);
    for (int j = 0; i < b1; ++i, ++j) f(a[i], b[i], u[j], v[j]);
    float s = 0.0f, t = 0.0f;
    for (int j = 0; j < L; ++j) s += u[j], t += v[j];
    su += double(s);
    sv += double(t);
  }
}

// Largest of x[0..n), NaN skipped (-inf if none), in 16 lanes.
inline float max_of(const float* x, i64 n) {
  float b[L];
  for (int j = 0; j < L; ++j) b[j] = -INFINITY;
  i64 i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) b[j] = x[i + j] > b[j] ? x[i + j] : b[j];
  for (; i < n; ++i) b[0] = x[i] > b[0] ? x[i] : b[0];
  float m = b[0];
  for (int j = 1; j < L; ++j) m = b[j] > m ? b[j] : m;
  return m;
}

template <class F>
void parallel_tasks(i64 tasks, F f) {
  if (tasks <= 0) return;
  if (tasks == 1) return f(i64(0));
  ThreadPool::instance().parallel_for(tasks, [&](i64 t) { f(t); });
}

// Items (rows, channels) per task so that a task has about kTask elements.
i64 per_task(i64 elems_per_item) { return std::max<i64>(1, kTask / std::max<i64>(1, elems_per_item)); }

}  // namespace

// ------------------------------------------------------------------- layer / rms / group
void row_norm_forward(const RowNormArgs& a, const float* x, const float* w, const float* b,
                      float* y, float* mean_out, float* rstd_out) {
  const i64 n = a.n, rows = a.rows, S = a.spatial, Cg = a.group_ch;
  const bool rms = (a.flags & kNormRms) != 0;
  const i64 rpt = per_task(n);
  parallel_tasks((rows + rpt - 1) / rpt, [&](i64 t) {
    for (i64 r = t * rpt; r < std::min(rows, (t + 1) * rpt); ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      float mean = 0.0f, var;
      if (rms) {
        var = float(sum_of(xr, n, [](float v) { return v * v; }) / double(n));
      } else {
        mean = float(sum_of(xr, n, [](float v) { return v; }) / double(n));
        var = float(sum_of(xr, n, [mean](float v) { return (v - mean) * (v - mean); }) / double(n));
      }
      const float rstd = 1.0f / std::sqrt(var + a.eps);
      mean_out[r] = mean;
      rstd_out[r] = rstd;
      const i64 c0 = (r % a.groups) * Cg;
      if (S == 1) {  // weight per element
        const float* wr = w ? w + c0 : nullptr;
        const float* br = b ? b + c0 : nullptr;
        if (wr && br) {
          for (i64 i = 0; i < n; ++i) yr[i] = ((xr[i] - mean) * rstd) * wr[i] + br[i];
        } else if (wr) {
          for (i64 i = 0; i < n; ++i) yr[i] = ((xr[i] - mean) * rstd) * wr[i];
        } else if (br) {
          for (i64 i = 0; i < n; ++i) yr[i] = ((xr[i] - mean) * rstd) + br[i];
        } else {
          for (i64 i = 0; i < n; ++i) yr[i] = (xr[i] - mean) * rstd;
        }
      } else {  // weight per channel: segments of S
        for (i64 c = 0; c < Cg; ++c) {
          const float wc = w ? w[c0 + c] : 1.0f, bc = b ? b[c0 + c] : 0.0f;
          const float* xs = xr + c * S;
          float* ys = yr + c * S;
          for (i64 s = 0; s < S; ++s) ys[s] = ((xs[s] - mean) * rstd) * wc + bc;
        }
      }
    }
  });
}

namespace {
// One row's backward: dx, and (where pw) this row's g * xhat and g added into pw / pb at the
// row's weight indices.
void row_backward(const RowNormArgs& a, i64 r, const float* g, const float* x, const float* w,
                  float mean, float rstd, float* dx, float* pw, float* pb) {
  const i64 n = a.n, S = a.spatial, Cg = a.group_ch;
  const bool rms = (a.flags & kNormRms) != 0;
  const i64 c0 = (r % a.groups) * Cg;
  const float* gr = g + r * n;
  const float* xr = x + r * n;
  float* dr = dx + r * n;
  double sg = 0.0, sgx = 0.0;
  if (S == 1) {
    const float* wr = w ? w + c0 : nullptr;
    if (wr) {
      // wg = g * w; sums of wg and wg * xhat (xhat through the index: w is a third array).
      double a1 = 0.0, a2 = 0.0;
      for (i64 b0 = 0; b0 < n; b0 += kBlock) {
        const i64 b1 = std::min(n, b0 + kBlock);
        float u[L] = {}, v[L] = {};
        i64 i = b0;
        for (; i + L <= b1; i += L)
          for (int j = 0; j < L; ++j) {
            const float wg = gr[i + j] * wr[i + j];
            u[j] += wg;
            v[j] += wg * ((xr[i + j] - mean) * rstd);
          }
        for (int j = 0; i < b1; ++i, ++j) {
          const float wg = gr[i] * wr[i];
          u[j] += wg;
          v[j] += wg * ((xr[i] - mean) * rstd);
        }
        float s = 0.0f, t = 0.0f;
        for (int j = 0; j < L; ++j) s += u[j], t += v[j];
        a1 += double(s);
        a2 += double(t);
      }
      sg = a1;
      sgx = a2;
    } else {
      sum2_of(gr, xr, n, [mean, rstd](float gv, float xv, float& u, float& v) {
        u += gv;
        v += gv * ((xv - mean) * rstd);
      }, sg, sgx);
    }
    const float mg = rms ? 0.0f : float(sg / double(n)), mgx = float(sgx / double(n));
    if (wr) {
      for (i64 i = 0; i < n; ++i) {
        const float xhat = (xr[i] - mean) * rstd;
        dr[i] = rstd * ((gr[i] * wr[i] - mg) - xhat * mgx);
      }
    } else {
      for (i64 i = 0; i < n; ++i) {
        const float xhat = (xr[i] - mean) * rstd;
        dr[i] = rstd * ((gr[i] - mg) - xhat * mgx);
      }
    }
    if (pw) {
      float* pwr = pw + c0;
      float* pbr = pb + c0;
      for (i64 i = 0; i < n; ++i) {
        pwr[i] += gr[i] * ((xr[i] - mean) * rstd);
        pbr[i] += gr[i];
      }
    }
    return;
  }
  // Channels of S elements: the weight is one number per segment.
  for (i64 c = 0; c < Cg; ++c) {
    const float wc = w ? w[c0 + c] : 1.0f;
    double u, v;
    sum2_of(gr + c * S, xr + c * S, S, [mean, rstd](float gv, float xv, float& p, float& q) {
      p += gv;
      q += gv * ((xv - mean) * rstd);
    }, u, v);
    sg += double(wc) * u;
    sgx += double(wc) * v;
    if (pw) {  // one row owns (sample, channel): a plain store
      pw[c0 + c] = float(v);
      pb[c0 + c] = float(u);
    }
  }
  const float mg = rms ? 0.0f : float(sg / double(n)), mgx = float(sgx / double(n));
  for (i64 c = 0; c < Cg; ++c) {
    const float wc = w ? w[c0 + c] : 1.0f;
    const float* gs = gr + c * S;
    const float* xs = xr + c * S;
    float* ds = dr + c * S;
    for (i64 s = 0; s < S; ++s) {
      const float xhat = (xs[s] - mean) * rstd;
      ds[s] = rstd * ((gs[s] * wc - mg) - xhat * mgx);
    }
  }
}
}  // namespace

void row_norm_backward(const RowNormArgs& a, const float* g, const float* x, const float* w,
                       const float* mean, const float* rstd, float* dx, float* dw, float* db) {
  const i64 n = a.n, rows = a.rows;
  const i64 C = i64(a.groups) * a.group_ch;  // weight length
  const bool per_element = a.groups == 1 && a.spatial == 1;  // layer norm
  // Partials of the affine gradients: layer norm, one row of C per block of rows; group
  // norm, one row of C per sample (each (sample, channel) belongs to one row).
  const i64 rpt = per_element ? std::max<i64>(1, std::min<i64>(64, per_task(n))) : a.groups;
  const i64 blocks = (rows + rpt - 1) / rpt;
  std::vector<float> pw, pb;
  if (dw) {
    pw.assign(std::size_t(blocks * C), 0.0f);
    pb.assign(std::size_t(blocks * C), 0.0f);
  }
  const i64 per = per_task(rpt * n) * rpt;  // rows per task: whole blocks
  parallel_tasks((rows + per - 1) / per, [&](i64 t) {
    for (i64 r = t * per; r < std::min(rows, (t + 1) * per); ++r) {
      float* pwr = dw ? pw.data() + (r / rpt) * C : nullptr;
      float* pbr = dw ? pb.data() + (r / rpt) * C : nullptr;
      // Group norm: the partial row is the sample's, row r fills its group's channels.
      row_backward(a, r, g, x, w, mean[r], rstd[r], dx, pwr, pbr);
    }
  });
  if (!dw) return;
  const i64 cpt = 256;
  parallel_tasks((C + cpt - 1) / cpt, [&](i64 t) {
    const i64 c1 = std::min(C, (t + 1) * cpt);
    for (i64 c = t * cpt; c < c1; ++c) {
      double sw = 0.0, sb = 0.0;
      for (i64 k = 0; k < blocks; ++k) {
        sw += double(pw[std::size_t(k * C + c)]);
        sb += double(pb[std::size_t(k * C + c)]);
      }
      dw[c] = float(sw);
      db[c] = float(sb);
    }
  });
}

// ------------------------------------------------------------------- batch norm
namespace {
// Per-channel sums for batch norm over (N, C, S): f over each channel's N segments of S.
// Channels are the tasks (segments long enough to vectorise) ...
template <class F>
void channel_sums(const BatchNormArgs& a, F segment_sum, double* out_u, double* out_v) {
  const i64 N = a.N, C = a.C, S = a.S;
  const i64 cpt = per_task(N * S);
  parallel_tasks((C + cpt - 1) / cpt, [&](i64 t) {
    for (i64 c = t * cpt; c < std::min(C, (t + 1) * cpt); ++c) {
      double u = 0.0, v = 0.0;
      for (i64 n = 0; n < N; ++n) {
        double p = 0.0, q = 0.0;
        segment_sum(c, (n * C + c) * S, S, p, q);
        u += p;
        v += q;
      }
      out_u[c] = u;
      if (out_v) out_v[c] = v;
    }
  });
}

// ... or, for short segments (S < 16, e.g. (N, C) input), blocks of the C * S columns of
// the rows n, each column summed over n in float64 lanes, then the S columns of a channel
// added in order.
template <class F>
void column_sums(const BatchNormArgs& a, F f, double* out_u, double* out_v) {
  const i64 N = a.N, C = a.C, S = a.S, W = C * S;
  std::vector<double> cu(static_cast<std::size_t>(W), 0.0), cv(static_cast<std::size_t>(W), 0.0);
  constexpr i64 kCols = 256;
  parallel_tasks((W + kCols - 1) / kCols, [&](i64 t) {
    const i64 j0 = t * kCols, j1 = std::min(W, j0 + kCols);
    for (i64 n = 0; n < N; ++n)
      for (i64 j = j0; j < j1; ++j) {
        float p, q;
        f(j / S, n * W + j, p, q);
        cu[std::size_t(j)] += double(p);
        cv[std::size_t(j)] += double(q);
      }
  });
  for (i64 c = 0; c < C; ++c) {
    double u = 0.0, v = 0.0;
    for (i64 s = 0; s < S; ++s) {
      u += cu[std::size_t(c * S + s)];
      v += cv[std::size_t(c * S + s)];
    }
    out_u[c] = u;
    if (out_v) out_v[c] = v;
  }
}

constexpr i64 kShortSegment = 16;

// out[i] = f(c, i) over every element, tasks of channel ranges (long segments) or of rows.
template <class F>
void each_element(const BatchNormArgs& a, F f) {
  const i64 N = a.N, C = a.C, S = a.S;
  if (S >= kShortSegment) {
    const i64 cpt = per_task(N * S);
    parallel_tasks((C + cpt - 1) / cpt, [&](i64 t) {
      for (i64 c = t * cpt; c < std::min(C, (t + 1) * cpt); ++c)
        for (i64 n = 0; n < N; ++n) f(c, (n * C + c) * S, S);
    });
  } else {
    const i64 npt = per_task(C * S);
    parallel_tasks((N + npt - 1) / npt, [&](i64 t) {
      for (i64 n = t * npt; n < std::min(N, (t + 1) * npt); ++n)
        for (i64 c = 0; c < C; ++c) f(c, (n * C + c) * S, S);
    });
  }
}
}  // namespace

void batch_norm_forward(const BatchNormArgs& a, const float* x, const float* w, const float* b,
                        const float* rm, const float* rv, float* y, float* save_mean,
                        float* save_rstd, float* new_mean, float* new_var) {
  const i64 C = a.C, S = a.S, count = i64(a.N) * S;
  const bool training = (a.flags & kNormTraining) != 0;
  std::vector<float> scale(static_cast<std::size_t>(C)), shift(static_cast<std::size_t>(C));
  if (training) {
    std::vector<double> sum(static_cast<std::size_t>(C)), dev(static_cast<std::size_t>(C));
    std::vector<float> mean(static_cast<std::size_t>(C));
    if (S >= kShortSegment) {
      channel_sums(a, [&](i64, i64 off, i64 len, double& p, double&) {
        p = sum_of(x + off, len, [](float v) { return v; });
      }, sum.data(), nullptr);
    } else {
      column_sums(a, [&](i64, i64 i, float& p, float& q) { p = x[i]; q = 0.0f; }, sum.data(),
                  nullptr);
    }
    for (i64 c = 0; c < C; ++c) mean[std::size_t(c)] = float(sum[std::size_t(c)] / double(count));
    if (S >= kShortSegment) {
      channel_sums(a, [&](i64 c, i64 off, i64 len, double& p, double&) {
        const float m = mean[std::size_t(c)];
        p = sum_of(x + off, len, [m](float v) { return (v - m) * (v - m); });
      }, dev.data(), nullptr);
    } else {
      column_sums(a, [&](i64 c, i64 i, float& p, float& q) {
        const float d = x[i] - mean[std::size_t(c)];
        p = d * d;
        q = 0.0f;
      }, dev.data(), nullptr);
    }
    for (i64 c = 0; c < C; ++c) {
      const float m = mean[std::size_t(c)];
      const float var = float(dev[std::size_t(c)] / double(count));
      const float rstd = 1.0f / std::sqrt(var + a.eps);
      save_mean[c] = m;
      save_rstd[c] = rstd;
      if ((a.flags & kNormRunning) != 0) {
        const float unbiased = float(dev[std::size_t(c)] / double(count - 1));
        new_mean[c] = a.momentum * m + (1.0f - a.momentum) * rm[c];
        new_var[c] = a.momentum * unbiased + (1.0f - a.momentum) * rv[c];
      }
    }
  } else {
    for (i64 c = 0; c < C; ++c) {
      save_mean[c] = rm[c];
      save_rstd[c] = 1.0f / std::sqrt(rv[c] + a.eps);
    }
  }
  for (i64 c = 0; c < C; ++c) {
    const float sc = w ? w[c] * save_rstd[c] : save_rstd[c];
    scale[std::size_t(c)] = sc;
    shift[std::size_t(c)] = (b ? b[c] : 0.0f) - save_mean[c] * sc;
  }
  each_element(a, [&](i64 c, i64 off, i64 len) {
    const float sc = scale[std::size_t(c)], sh = shift[std::size_t(c)];
    const float* xs = x + off;
    float* ys = y + off;
    for (i64 s = 0; s < len; ++s) ys[s] = xs[s] * sc + sh;
  });
}

void batch_norm_backward(const BatchNormArgs& a, const float* g, const float* x, const float* w,
                         const float* mean, const float* rstd, float* dx, float* dw, float* db) {
  const i64 C = a.C, S = a.S, count = i64(a.N) * S;
  const bool training = (a.flags & kNormTraining) != 0;
  std::vector<double> sg(static_cast<std::size_t>(C)), sgx(static_cast<std::size_t>(C));
  if (S >= kShortSegment) {
    channel_sums(a, [&](i64 c, i64 off, i64 len, double& p, double& q) {
      const float m = mean[c];
      sum2_of(g + off, x + off, len, [m](float gv, float xv, float& u, float& v) {
        u += gv;
        v += gv * (xv - m);
      }, p, q);
    }, sg.data(), sgx.data());
  } else {
    column_sums(a, [&](i64 c, i64 i, float& p, float& q) {
      p = g[i];
      q = g[i] * (x[i] - mean[c]);
    }, sg.data(), sgx.data());
  }
  std::vector<float> k1(static_cast<std::size_t>(C)), k2(static_cast<std::size_t>(C)), k3(static_cast<std::size_t>(C));
  for (i64 c = 0; c < C; ++c) {
    const float r = rstd[c];
    const float sgxh = float(sgx[std::size_t(c)]) * r;  // sum(g * xhat)
    dw[c] = sgxh;
    db[c] = float(sg[std::size_t(c)]);
    const float wr = (w ? w[c] : 1.0f) * r;
    // dx = wr * ((g - mg) - xhat * mgx)
    k1[std::size_t(c)] = wr;
    k2[std::size_t(c)] = training ? float(sg[std::size_t(c)] / double(count)) : 0.0f;
    k3[std::size_t(c)] = training ? sgxh / float(count) : 0.0f;
  }
  each_element(a, [&](i64 c, i64 off, i64 len) {
    const float wr = k1[std::size_t(c)], mg = k2[std::size_t(c)], mgx = k3[std::size_t(c)];
    const float m = mean[c], r = rstd[c];
    const float* gs = g + off;
    const float* xs = x + off;
    float* ds = dx + off;
    for (i64 s = 0; s < len; ++s) ds[s] = wr * ((gs[s] - mg) - ((xs[s] - m) * r) * mgx);
  });
}

// ------------------------------------------------------------------- softmax family
namespace {
inline float exp_nonpos(float v) { return fm_exp_nonpos(v); }
inline float exp_any(float v) { return fm_exp(v); }

void softmax_row(const SoftmaxArgs& a, const float* x, float* out, i64 r, float* lse) {
  const i64 n = a.n;
  float m = max_of(x, n);
  if (a.mode == kLogSumExp) {
    if (std::isinf(m)) m = 0.0f;
    const double s = sum_of(x, n, [m](float v) { return exp_any(v - m); });
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
  const double s = sum_of(x, n, [m](float v) { return exp_nonpos(v - m); });
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
      const float s = float(sum_of(gr, n, [](float v) { return v; }));
      for (i64 i = 0; i < n; ++i) dr[i] = gr[i] - exp_any(yr[i]) * s;
    } else {
      double u, unused;
      sum2_of(gr, yr, n, [](float gv, float yv, float& p, float&) { p += gv * yv; }, u, unused);
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

}  // namespace fm::cpu::FM_CPU_ISA
