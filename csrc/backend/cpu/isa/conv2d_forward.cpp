// conv2d forward and input gradient: the stride-1 direct form over padded images, im2col
// chunks for strided convs. Compiled once per ISA; the GEMM/dot engine is simd_kernels.h.
#include "simd_kernels.h"

namespace fm::cpu::FM_CPU_ISA {
using namespace conv;

namespace {
// Where tap (kh, kw) of channel c starts in a padded source of `plane` floats per channel
// and row pitch Wp: off[(c * kH + kh) * kW + kw].
std::vector<i64> tap_offsets(const Conv2dArgs& a, int channels, i64 plane, int Wp) {
  std::vector<i64> off(std::size_t(channels) * a.kH * a.kW);
  for (int c = 0; c < channels; ++c)
    for (int kh = 0; kh < a.kH; ++kh)
      for (int kw = 0; kw < a.kW; ++kw)
        off[(std::size_t(c) * a.kH + kh) * a.kW + kw] =
            c * plane + i64(kh) * a.dil_h * Wp + i64(kw) * a.dil_w;
  return off;
}

// Runs `d` on every image of `src` (channels x H x W each) copied into a zero-padded
// Hp x Wp buffer (`top` / `left` rows / columns first), plus the slack the last tile reads.
void run_padded(int N, const Direct& d, const float* src, i64 src_image, int channels, int H,
                int W, int Hp, int Wp, int top, int left, float* dst, i64 dst_image) {
  const i64 plane = i64(Hp) * Wp;
  const i64 need = (d.G - 1) * d.src_group + d.off[d.K - 1] + round_up(d.wide(), NR);
  const i64 slack = std::max<i64>(0, need - i64(channels) * plane);
  run_direct(N, d, i64(channels) * plane + slack, dst_image, dst, [&](int n, float* buf) {
    pad_copy(src + n * src_image, channels, H, W, buf, Hp, Wp, top, left, slack);
  });
}
}  // namespace

// ------------------------------------------------------------------ forward
void conv2d_forward(const Conv2dArgs& a, const float* x, const float* w, const float* bias,
                    float* y) {
  const int G = a.groups, Cg = a.C_in / G, Mg = a.C_out / G, T = a.kH * a.kW, K = Cg * T;
  const i64 P = i64(a.H_out) * a.W_out;
  if (a.N <= 0 || a.C_out <= 0 || P <= 0) return;
  if (K == 0) {
    for (i64 i = 0; i < i64(a.N) * a.C_out; ++i)
      std::fill(y + i * P, y + (i + 1) * P, bias ? bias[i % a.C_out] : 0.f);
    return;
  }
  const i64 apg = packed_size(Mg, K);
  std::vector<float> Ap(std::size_t(apg * G));
  for (int g = 0; g < G; ++g)
    pack_a(Mg, K, [&](int m, int k) { return w[(i64(g) * Mg + m) * K + k]; }, Ap.data() + g * apg);
  const i64 x_image = i64(a.C_in) * a.H * a.W, y_image = i64(a.C_out) * P;

  // Stride 1 reads the padded image in place, unless K is so small (first layers: C_in = 1)
  // that building im2col costs less than the junk columns and the copy out of the wide rows.
  // Grouped / depthwise convs always go direct: per-group im2col is all bookkeeping.
  if (a.stride_h == 1 && a.stride_w == 1 && (K >= 32 || G > 1)) {
    const int Hp = a.H_out + (a.kH - 1) * a.dil_h, Wp = a.W_out + (a.kW - 1) * a.dil_w;
    const i64 plane = i64(Hp) * Wp;
    const std::vector<i64> off = tap_offsets(a, Cg, plane, Wp);
    const Direct d{G, Mg, K, Ap.data(), apg, off.data(), Cg * plane, a.H_out, a.W_out, Wp, P, bias};
    run_padded(a.N, d, x, x_image, a.C_in, a.H, a.W, Hp, Wp, a.pad_h, a.pad_w, y, y_image);
    return;
  }

  // im2col chunks (compact positions) feed the same kernel with off[k] = k * CQ, which writes
  // straight into y.
  const i64 CQ = chunk_size(K, P);
  const i64 nchunks = ceil_div(P, CQ);
  std::vector<i64> off(K);
  for (int k = 0; k < K; ++k) off[k] = k * CQ;
  auto do_chunk = [&](int n, i64 i) {
    const i64 q0 = i * CQ, q1 = std::min(P, q0 + CQ);
    float* col = scratch(0, i64(K) * CQ);
    for (int g = 0; g < G; ++g) {
      im2col(a, x + n * x_image + i64(g) * Cg * a.H * a.W, Cg, q0, q1, col, CQ);
      gemm_block(Mg, K, Ap.data() + g * apg, off.data(), col, q1 - q0,
                 y + n * y_image + i64(g) * Mg * P + q0, P, bias ? bias + g * Mg : nullptr,
                 /*spill=*/false);
    }
  };
  over_images(
      a.N, nchunks, [&](int n) { for (i64 i = 0; i < nchunks; ++i) do_chunk(n, i); },
      [](int) {}, do_chunk);
}

// ------------------------------------------------------------------ backward, input
void conv2d_backward_input(const Conv2dArgs& a, const float* gy, const float* w, float* gx) {
  const int G = a.groups, Cg = a.C_in / G, Mg = a.C_out / G, T = a.kH * a.kW;
  const i64 HW = i64(a.H) * a.W, P = i64(a.H_out) * a.W_out;
  const i64 x_image = i64(a.C_in) * HW, y_image = i64(a.C_out) * P;
  if (a.N <= 0 || x_image <= 0) return;
  if (Mg == 0 || P == 0) {
    std::memset(gx, 0, sizeof(float) * a.N * x_image);
    return;
  }

  if (a.stride_h == 1 && a.stride_w == 1) {
    // gx = stride-1 conv of gy padded by (k-1)*d - pad with W'[ci][co][kh][kw] =
    // W[co][ci][kH-1-kh][kW-1-kw].
    const int K = Mg * T;
    const int Hp = a.H + (a.kH - 1) * a.dil_h, Wp = a.W + (a.kW - 1) * a.dil_w;
    const int top = (a.kH - 1) * a.dil_h - a.pad_h, left = (a.kW - 1) * a.dil_w - a.pad_w;
    const i64 plane = i64(Hp) * Wp;
    const i64 apg = packed_size(Cg, K);
    std::vector<float> Ap(std::size_t(apg * G));
    for (int g = 0; g < G; ++g)
      pack_a(Cg, K,
             [&](int ci, int k) {
               const int co = k / T, t = k % T, kh = t / a.kW, kw = t % a.kW;
               return w[((i64(g) * Mg + co) * Cg + ci) * T + (a.kH - 1 - kh) * a.kW +
                        (a.kW - 1 - kw)];
             },
             Ap.data() + g * apg);
    const std::vector<i64> off = tap_offsets(a, Mg, plane, Wp);
    const Direct d{G, Cg, K, Ap.data(), apg, off.data(), Mg * plane, a.H, a.W, Wp, HW, nullptr};
    run_padded(a.N, d, gy, y_image, a.C_out, a.H_out, a.W_out, Hp, Wp, top, left, gx, x_image);
    return;
  }

  // Strided: gcol = W^T gY per chunk of output positions, then col2im (scatter-add); images
  // own disjoint gx, so parallel over images.
  const int K = Cg * T;
  const i64 apg = packed_size(K, Mg);
  std::vector<float> Ap(std::size_t(apg * G));
  for (int g = 0; g < G; ++g)
    pack_a(K, Mg, [&](int k, int co) { return w[(i64(g) * Mg + co) * K + k]; },
           Ap.data() + g * apg);
  const i64 CQ = chunk_size(std::max(K, Mg), P);
  std::vector<i64> off(Mg);
  for (int co = 0; co < Mg; ++co) off[co] = co * CQ;
  ThreadPool::instance().parallel_for(a.N, [&](i64 n) {
    float* gxi = gx + n * x_image;
    std::memset(gxi, 0, sizeof(float) * x_image);
    float* B = scratch(0, i64(Mg) * CQ);
    float* C = scratch(1, i64(K) * CQ);
    for (i64 q0 = 0; q0 < P; q0 += CQ) {
      const i64 q1 = std::min(P, q0 + CQ);
      for (int g = 0; g < G; ++g) {
        for (int co = 0; co < Mg; ++co) {
          const float* s = gy + n * y_image + (i64(g) * Mg + co) * P;
          std::memcpy(B + co * CQ, s + q0, sizeof(float) * (q1 - q0));
          std::fill(B + co * CQ + (q1 - q0), B + (co + 1) * CQ, 0.f);
        }
        gemm_block(K, Mg, Ap.data() + g * apg, off.data(), B, q1 - q0, C, CQ);
        col2im_add(a, C, CQ, Cg, q0, q1, gxi + i64(g) * Cg * HW);
      }
    }
  });
}

}  // namespace fm::cpu::FM_CPU_ISA
