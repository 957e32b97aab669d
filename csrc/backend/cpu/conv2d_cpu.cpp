// Direct-loop conv2d: correct but slow. To be replaced by a packed, blocked GEMM.
#include "conv2d_cpu.h"

#include <cstring>

namespace fm::cpu {
namespace {
struct Geometry {
  const Conv2dArgs& a;
  int cin_g() const { return a.C_in / a.groups; }
  int cout_g() const { return a.C_out / a.groups; }
  // Input row/col read by output (oh, ow) and kernel tap (kh, kw); -1 when in padding.
  int ih(int oh, int kh) const { return oh * a.stride_h - a.pad_h + kh * a.dil_h; }
  int iw(int ow, int kw) const { return ow * a.stride_w - a.pad_w + kw * a.dil_w; }
};
}  // namespace

void conv2d_forward(const Conv2dArgs& a, const float* x, const float* w, const float* bias,
                    float* y) {
  Geometry g{a};
  for (int n = 0; n < a.N; ++n)
    for (int co = 0; co < a.C_out; ++co) {
      const int grp = co / g.cout_g();
      for (int oh = 0; oh < a.H_out; ++oh)
        for (int ow = 0; ow < a.W_out; ++ow) {
          double acc = bias ? bias[co] : 0.0;
          for (int ci = 0; ci < g.cin_g(); ++ci)
            for (int kh = 0; kh < a.kH; ++kh) {
              const int ih = g.ih(oh, kh);
              if (ih < 0 || ih >= a.H) continue;
              for (int kw = 0; kw < a.kW; ++kw) {
                const int iw = g.iw(ow, kw);
                if (iw < 0 || iw >= a.W) continue;
                const int c = grp * g.cin_g() + ci;
                acc += double(x[((std::int64_t(n) * a.C_in + c) * a.H + ih) * a.W + iw]) *
                       w[((std::int64_t(co) * g.cin_g() + ci) * a.kH + kh) * a.kW + kw];
              }
            }
          y[((std::int64_t(n) * a.C_out + co) * a.H_out + oh) * a.W_out + ow] = float(acc);
        }
    }
}

void conv2d_backward_input(const Conv2dArgs& a, const float* gy, const float* w, float* gx) {
  Geometry g{a};
  std::memset(gx, 0, sizeof(float) * std::size_t(a.N) * a.C_in * a.H * a.W);
  for (int n = 0; n < a.N; ++n)
    for (int co = 0; co < a.C_out; ++co) {
      const int grp = co / g.cout_g();
      for (int oh = 0; oh < a.H_out; ++oh)
        for (int ow = 0; ow < a.W_out; ++ow) {
          const float go = gy[((std::int64_t(n) * a.C_out + co) * a.H_out + oh) * a.W_out + ow];
          for (int ci = 0; ci < g.cin_g(); ++ci)
            for (int kh = 0; kh < a.kH; ++kh) {
              const int ih = g.ih(oh, kh);
              if (ih < 0 || ih >= a.H) continue;
              for (int kw = 0; kw < a.kW; ++kw) {
                const int iw = g.iw(ow, kw);
                if (iw < 0 || iw >= a.W) continue;
                const int c = grp * g.cin_g() + ci;
                gx[((std::int64_t(n) * a.C_in + c) * a.H + ih) * a.W + iw] +=
                    go * w[((std::int64_t(co) * g.cin_g() + ci) * a.kH + kh) * a.kW + kw];
              }
            }
        }
    }
}

void conv2d_backward_weight(const Conv2dArgs& a, const float* gy, const float* x, float* gw) {
  Geometry g{a};
  for (int co = 0; co < a.C_out; ++co) {
    const int grp = co / g.cout_g();
    for (int ci = 0; ci < g.cin_g(); ++ci)
      for (int kh = 0; kh < a.kH; ++kh)
        for (int kw = 0; kw < a.kW; ++kw) {
          double acc = 0;
          const int c = grp * g.cin_g() + ci;
          for (int n = 0; n < a.N; ++n)
            for (int oh = 0; oh < a.H_out; ++oh) {
              const int ih = g.ih(oh, kh);
              if (ih < 0 || ih >= a.H) continue;
              for (int ow = 0; ow < a.W_out; ++ow) {
                const int iw = g.iw(ow, kw);
                if (iw < 0 || iw >= a.W) continue;
                acc += double(gy[((std::int64_t(n) * a.C_out + co) * a.H_out + oh) * a.W_out + ow]) *
                       x[((std::int64_t(n) * a.C_in + c) * a.H + ih) * a.W + iw];
              }
            }
          gw[((std::int64_t(co) * g.cin_g() + ci) * a.kH + kh) * a.kW + kw] = float(acc);
        }
  }
}

void conv2d_backward_bias(const Conv2dArgs& a, const float* gy, float* gb) {
  const std::int64_t plane = std::int64_t(a.H_out) * a.W_out;
  for (int co = 0; co < a.C_out; ++co) {
    double acc = 0;
    for (int n = 0; n < a.N; ++n) {
      const float* p = gy + (std::int64_t(n) * a.C_out + co) * plane;
      for (std::int64_t i = 0; i < plane; ++i) acc += p[i];
    }
    gb[co] = float(acc);
  }
}

}  // namespace fm::cpu
