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
#if defined(__AVX512F__)
constexpr int VL = 16;
#elif defined(__AVX2__)
constexpr int VL = 8;
#else
constexpr int VL = 4;
#endif
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
        var = float(sum_of(xr, n, [](auto v) { return v * v; }) / double(n));
      } else {
        mean = float(sum_of(xr, n, [](auto v) { return v; }) / double(n));
        var = float(sum_of(xr, n, [mean](auto v) { return (v - mean) * (v - mean); }) / double(n));
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
// dx = rstd * ((g * w - mg) - xhat * mgx) over a row (w null: 1), and where pw is given the
// partials pw += g * xhat, pb += g. A function of restrict parameters: GCC ignores restrict
// on local pointers, and with six arrays its runtime alias checks give up (the loop stayed
// scalar).
void dx_and_partials(i64 n, const float* __restrict g, const float* __restrict x,
                     const float* __restrict w, float mean, float rstd, float mg, float mgx,
                     float* __restrict dx, float* __restrict pw, float* __restrict pb) {
  if (pw && w) {
    for (i64 i = 0; i < n; ++i) {
      const float xhat = (x[i] - mean) * rstd;
      dx[i] = rstd * ((g[i] * w[i] - mg) - xhat * mgx);
      pw[i] += g[i] * xhat;
      pb[i] += g[i];
    }
  } else if (pw) {
    for (i64 i = 0; i < n; ++i) {
      const float xhat = (x[i] - mean) * rstd;
      dx[i] = rstd * ((g[i] - mg) - xhat * mgx);
      pw[i] += g[i] * xhat;
      pb[i] += g[i];
    }
  } else if (w) {
    for (i64 i = 0; i < n; ++i)
      dx[i] = rstd * ((g[i] * w[i] - mg) - ((x[i] - mean) * rstd) * mgx);
  } else {
    for (i64 i = 0; i < n; ++i) dx[i] = rstd * ((g[i] - mg) - ((x[i] - mean) * rstd) * mgx);
  }
}

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
      sum2_of(gr, xr, wr, n, [mean, rstd](auto gv, auto xv, auto wv, auto& u, auto& v) {
        const auto wg = gv * wv;
        u += wg;
        v += wg * ((xv - mean) * rstd);
      }, sg, sgx);
    } else {
      sum2_of(gr, xr, nullptr, n, [mean, rstd](auto gv, auto xv, auto, auto& u, auto& v) {
        u += gv;
        v += gv * ((xv - mean) * rstd);
      }, sg, sgx);
    }
    const float mg = rms ? 0.0f : float(sg / double(n)), mgx = float(sgx / double(n));
    // dx, and the affine partials in the same pass (xhat computed once).
    if (pw)
      dx_and_partials(n, gr, xr, wr, mean, rstd, mg, mgx, dr, pw + c0, pb + c0);
    else
      dx_and_partials(n, gr, xr, wr, mean, rstd, mg, mgx, dr, nullptr, nullptr);
    return;
  }
  // Channels of S elements: the weight is one number per segment.
  for (i64 c = 0; c < Cg; ++c) {
    const float wc = w ? w[c0 + c] : 1.0f;
    double u, v;
    sum2_of(gr + c * S, xr + c * S, nullptr, S, [mean, rstd](auto gv, auto xv, auto, auto& p, auto& q) {
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
// Long segments (S >= 16): a task owns whole channels and makes every pass over one channel
// before the next, so the later passes read it from cache. Short segments ((N, C) input and
// the like): a task owns a block of whole channels' columns of the rows n (C * S columns)
// and sums each column over n in float64, then adds a channel's S columns in order.
namespace {
constexpr i64 kShortSegment = 16;
constexpr i64 kColumns = 256;

// Columns per block: whole channels, about kColumns.
i64 block_columns(i64 S) { return std::max<i64>(1, kColumns / S) * S; }

struct ChannelStats {
  float mean, rstd;
};

// Training statistics of channel c (long segments), and the running update.
ChannelStats bn_train_channel(const BatchNormArgs& a, const float* x, i64 c, const float* rm,
                              const float* rv, float* new_mean, float* new_var) {
  const i64 N = a.N, C = a.C, S = a.S, count = N * S;
  double s = 0.0;
  for (i64 n = 0; n < N; ++n) s += sum_of(x + (n * C + c) * S, S, [](auto v) { return v; });
  const float mean = float(s / double(count));
  double d = 0.0;
  for (i64 n = 0; n < N; ++n)
    d += sum_of(x + (n * C + c) * S, S, [mean](auto v) { return (v - mean) * (v - mean); });
  const float rstd = 1.0f / std::sqrt(float(d / double(count)) + a.eps);
  if ((a.flags & kNormRunning) != 0) {
    const float unbiased = float(d / double(count - 1));
    new_mean[c] = a.momentum * mean + (1.0f - a.momentum) * rm[c];
    new_var[c] = a.momentum * unbiased + (1.0f - a.momentum) * rv[c];
  }
  return {mean, rstd};
}
}  // namespace

void batch_norm_forward(const BatchNormArgs& a, const float* x, const float* w, const float* b,
                        const float* rm, const float* rv, float* y, float* save_mean,
                        float* save_rstd, float* new_mean, float* new_var) {
  const i64 N = a.N, C = a.C, S = a.S, count = N * S;
  const bool training = (a.flags & kNormTraining) != 0;
  auto finish = [&](i64 c, float mean, float rstd, float& scale, float& shift) {
    save_mean[c] = mean;
    save_rstd[c] = rstd;
    scale = w ? w[c] * rstd : rstd;
    shift = (b ? b[c] : 0.0f) - mean * scale;
  };
  if (S >= kShortSegment) {
    const i64 cpt = per_task(N * S);
    parallel_tasks((C + cpt - 1) / cpt, [&](i64 t) {
      for (i64 c = t * cpt; c < std::min(C, (t + 1) * cpt); ++c) {
        ChannelStats st{rm ? rm[c] : 0.0f, 0.0f};
        if (training) st = bn_train_channel(a, x, c, rm, rv, new_mean, new_var);
        else st.rstd = 1.0f / std::sqrt(rv[c] + a.eps);
        float scale, shift;
        finish(c, st.mean, st.rstd, scale, shift);
        for (i64 n = 0; n < N; ++n) {
          const float* xs = x + (n * C + c) * S;
          float* ys = y + (n * C + c) * S;
          for (i64 s = 0; s < S; ++s) ys[s] = xs[s] * scale + shift;
        }
      }
    });
    return;
  }
  const i64 W = C * S, bw = block_columns(S);
  parallel_tasks((W + bw - 1) / bw, [&](i64 t) {
    const i64 j0 = t * bw, j1 = std::min(W, j0 + bw), nj = j1 - j0;
    double acc[kColumns + kShortSegment];
    float colv[kColumns + kShortSegment], scale[kColumns + kShortSegment],
        shift[kColumns + kShortSegment];
    if (training) {
      for (i64 j = 0; j < nj; ++j) acc[j] = 0.0;
      for (i64 n = 0; n < N; ++n) {
        const float* xr = x + n * W + j0;
        for (i64 j = 0; j < nj; ++j) acc[j] += double(xr[j]);
      }
      for (i64 j = 0; j < nj; j += S) {  // channel means, spread over their columns
        double s = 0.0;
        for (i64 k = 0; k < S; ++k) s += acc[j + k];
        for (i64 k = 0; k < S; ++k) colv[j + k] = float(s / double(count));
      }
      for (i64 j = 0; j < nj; ++j) acc[j] = 0.0;
      for (i64 n = 0; n < N; ++n) {
        const float* xr = x + n * W + j0;
        for (i64 j = 0; j < nj; ++j) {
          const float d = xr[j] - colv[j];
          acc[j] += double(d * d);
        }
      }
    }
    for (i64 j = 0; j < nj; j += S) {
      const i64 c = (j0 + j) / S;
      ChannelStats st{rm ? rm[c] : 0.0f, 0.0f};
      if (training) {
        double d = 0.0;
        for (i64 k = 0; k < S; ++k) d += acc[j + k];
        st.mean = colv[j];
        st.rstd = 1.0f / std::sqrt(float(d / double(count)) + a.eps);
        if ((a.flags & kNormRunning) != 0) {
          new_mean[c] = a.momentum * st.mean + (1.0f - a.momentum) * rm[c];
          new_var[c] = a.momentum * float(d / double(count - 1)) + (1.0f - a.momentum) * rv[c];
        }
      } else {
        st.rstd = 1.0f / std::sqrt(rv[c] + a.eps);
      }
      float sc, sh;
      finish(c, st.mean, st.rstd, sc, sh);
      for (i64 k = 0; k < S; ++k) scale[j + k] = sc, shift[j + k] = sh;
    }
    for (i64 n = 0; n < N; ++n) {
      const float* xr = x + n * W + j0;
      float* yr = y + n * W + j0;
      for (i64 j = 0; j < nj; ++j) yr[j] = xr[j] * scale[j] + shift[j];
    }
  });
}

void batch_norm_backward(const BatchNormArgs& a, const float* g, const float* x, const float* w,
                         const float* mean, const float* rstd, float* dx, float* dw, float* db) {
  const i64 N = a.N, C = a.C, S = a.S, count = N * S;
  const bool training = (a.flags & kNormTraining) != 0;
  // From channel c's sums: dweight, dbias, and dx = k1 * ((g - k2) - xhat * k3).
  auto coefficients = [&](i64 c, double sg, double sgx, float& k1, float& k2, float& k3) {
    const float r = rstd[c];
    const float sgxh = float(sgx) * r;  // sum(g * xhat)
    dw[c] = sgxh;
    db[c] = float(sg);
    k1 = (w ? w[c] : 1.0f) * r;
    k2 = training ? float(sg / double(count)) : 0.0f;
    k3 = training ? sgxh / float(count) : 0.0f;
  };
  if (S >= kShortSegment) {
    const i64 cpt = per_task(N * S);
    parallel_tasks((C + cpt - 1) / cpt, [&](i64 t) {
      for (i64 c = t * cpt; c < std::min(C, (t + 1) * cpt); ++c) {
        const float m = mean[c], r = rstd[c];
        double sg = 0.0, sgx = 0.0;
        if (S % VL == 0 && S < kBlock) {
          // Short rows (8x8 maps: 64 floats): the lanes run on across the channel's rows and
          // are carried into float64 about every kBlock elements, not at the end of each row.
          VF u = {}, v = {};
          i64 since_carry = 0;
          for (i64 n = 0; n < N; ++n) {
            const i64 off = (n * C + c) * S;
            for (i64 i = 0; i < S; i += VL) {
              const VF gv = load(g + off + i), xv = load(x + off + i);
              u += gv;
              v += gv * (xv - m);
            }
            since_carry += S;
            if (since_carry >= kBlock) {
              sg += double(lanes_sum(u));
              sgx += double(lanes_sum(v));
              u = VF{};
              v = VF{};
              since_carry = 0;
            }
          }
          sg += double(lanes_sum(u));
          sgx += double(lanes_sum(v));
        } else {
          for (i64 n = 0; n < N; ++n) {
            double p, q;
            const i64 off = (n * C + c) * S;
            sum2_of(g + off, x + off, nullptr, S, [m](auto gv, auto xv, auto, auto& u, auto& v) {
              u += gv;
              v += gv * (xv - m);
            }, p, q);
            sg += p;
            sgx += q;
          }
        }
        float k1, k2, k3;
        coefficients(c, sg, sgx, k1, k2, k3);
        for (i64 n = 0; n < N; ++n) {
          const i64 off = (n * C + c) * S;
          const float* gs = g + off;
          const float* xs = x + off;
          float* ds = dx + off;
          for (i64 s = 0; s < S; ++s) ds[s] = k1 * ((gs[s] - k2) - ((xs[s] - m) * r) * k3);
        }
      }
    });
    return;
  }
  const i64 W = C * S, bw = block_columns(S);
  parallel_tasks((W + bw - 1) / bw, [&](i64 t) {
    const i64 j0 = t * bw, j1 = std::min(W, j0 + bw), nj = j1 - j0;
    double ag[kColumns + kShortSegment], agx[kColumns + kShortSegment];
    float cm[kColumns + kShortSegment], cr[kColumns + kShortSegment],
        k1[kColumns + kShortSegment], k2[kColumns + kShortSegment], k3[kColumns + kShortSegment];
    for (i64 j = 0; j < nj; ++j) {
      ag[j] = agx[j] = 0.0;
      cm[j] = mean[(j0 + j) / S];
      cr[j] = rstd[(j0 + j) / S];
    }
    for (i64 n = 0; n < N; ++n) {
      const float* gr = g + n * W + j0;
      const float* xr = x + n * W + j0;
      for (i64 j = 0; j < nj; ++j) {
        ag[j] += double(gr[j]);
        agx[j] += double(gr[j] * (xr[j] - cm[j]));
      }
    }
    for (i64 j = 0; j < nj; j += S) {
      double sg = 0.0, sgx = 0.0;
      for (i64 k = 0; k < S; ++k) sg += ag[j + k], sgx += agx[j + k];
      float a1, a2, a3;
      coefficients((j0 + j) / S, sg, sgx, a1, a2, a3);
      for (i64 k = 0; k < S; ++k) k1[j + k] = a1, k2[j + k] = a2, k3[j + k] = a3;
    }
    for (i64 n = 0; n < N; ++n) {
      const float* gr = g + n * W + j0;
      const float* xr = x + n * W + j0;
      float* dr = dx + n * W + j0;
      for (i64 j = 0; j < nj; ++j)
        dr[j] = k1[j] * ((gr[j] - k2[j]) - ((xr[j] - cm[j]) * cr[j]) * k3[j]);
    }
  });
}

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
