// The normalization ops of normalization_cpu.h (layer / rms / group and batch norm; softmax
// and cross-entropy: isa/softmax.cpp), compiled once per ISA
// (isa_dispatch.h): the same formulas as metal/normalization.metal over contiguous float32,
// in loops over 16 float lanes that the compiler vectorises, with sums of more than a block
// of elements carried on in float64. Work is cut into tasks whose boundaries depend on the
// shape only, and every reduction adds its parts in a fixed order, so the results' bits do
// not depend on the number of threads.
#include "norm_loops.h"

namespace fm::cpu::FM_CPU_ISA {

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

}  // namespace fm::cpu::FM_CPU_ISA
