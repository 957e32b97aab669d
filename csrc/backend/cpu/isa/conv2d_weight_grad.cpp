// conv2d weight and bias gradients: long dot products, or per-tap GEMMs over a channels-last copy.
// Fast CPU conv2d, compiled once per ISA; the GEMM/dot engine is simd_kernels.h.
#include "simd_kernels.h"

namespace fm::cpu::FM_CPU_ISA {
using namespace conv;

// ------------------------------------------------------------------ backward, weight
namespace {
// How many image ranges the batch reduction is split into, each summed on its own and then
// added in a fixed order. A function of the problem only, never of the thread count, so that
// the gradient is bitwise the same with any FASTMETAL_NUM_THREADS (a split per thread would
// change the order of the float additions). One range below 8 units (the rows of each unit
// are spread over the pool instead); at most 32 ranges, and at most 64 MiB of partial sums.
int reduction_parts(int units, i64 floats_per_part) {
  if (units < 8) return 1;
  const i64 by_memory = std::max<i64>(1, (i64(16) << 20) / std::max<i64>(1, floats_per_part));
  return int(std::min<i64>({i64(units), 32, by_memory}));
}

// Stride 1 with enough input channels per group: one GEMM per tap,
//   gW[:, :, kh, kw] (C_out x Cg) += gY (C_out x Q) * Xt[q + tap] (Q x Cg),
// over the Q = H_out * Wp positions of the padded row pitch (gY zero on the junk columns),
// with Xt the zero-padded image in NHWC order: row q + tap of Xt is Cg contiguous floats, so
// the forward micro-kernel reads it in place and broadcasts packed gY.
void backward_weight_taps(const Conv2dArgs& a, const float* gy, const float* x, float* gw) {
  const int G = a.groups, Cg = a.C_in / G, Mg = a.C_out / G, T = a.kH * a.kW;
  const i64 HW = i64(a.H) * a.W, P = i64(a.H_out) * a.W_out;
  const i64 x_image = i64(a.C_in) * HW, y_image = i64(a.C_out) * P;
  const int Hp = a.H_out + (a.kH - 1) * a.dil_h, Wp = a.W_out + (a.kW - 1) * a.dil_w;
  const i64 Q = i64(a.H_out) * Wp;
  // Reads reach pixel Q - 1 + the largest tap, plus a partial tile past the last channel.
  const i64 pixels = i64(Hp) * Wp + i64(a.kW - 1) * a.dil_w;
  const i64 xt_floats = pixels * a.C_in + VL;
  const i64 apg = packed_size(Mg, int(Q));
  const i64 ldc = round_up(Cg, VL);
  const i64 ct_floats = i64(T) * G * Mg * ldc;
  std::vector<i64> off(static_cast<std::size_t>(Q));
  for (i64 q = 0; q < Q; ++q) off[q] = q * a.C_in;
  std::vector<i64> tap_off(T);
  for (int kh = 0; kh < a.kH; ++kh)
    for (int kw = 0; kw < a.kW; ++kw)
      tap_off[kh * a.kW + kw] = (i64(kh) * a.dil_h * Wp + i64(kw) * a.dil_w) * a.C_in;

  auto prepare = [&](int n, float* Ap, float* xt) {
    std::memset(xt, 0, sizeof(float) * xt_floats);
    const float* xi = x + n * x_image;
    const int r1 = std::min(a.H, Hp - a.pad_h), c1 = std::min(a.W, Wp - a.pad_w);
    for (int c = 0; c < a.C_in; ++c)
      for (int r = 0; r < r1; ++r) {
        const float* s = xi + c * HW + i64(r) * a.W;
        float* d = xt + (i64(r + a.pad_h) * Wp + a.pad_w) * a.C_in + c;
        for (int col = 0; col < c1; ++col) d[i64(col) * a.C_in] = s[col];
      }
    const float* gyi = gy + n * y_image;
    for (int g = 0; g < G; ++g)
      for (int s = 0; s < int(ceil_div(Mg, MR)); ++s) {
        float* d = Ap + g * apg + i64(s) * Q * MR;
        const int rows = std::min(MR, Mg - s * MR);
        std::memset(d, 0, sizeof(float) * Q * MR);
        for (int r = 0; r < rows; ++r) {
          const float* src = gyi + (i64(g) * Mg + s * MR + r) * P;
          for (int oh = 0; oh < a.H_out; ++oh) {
            float* dr = d + i64(oh) * Wp * MR + r;
            const float* sr = src + i64(oh) * a.W_out;
            for (int ow = 0; ow < a.W_out; ++ow) dr[i64(ow) * MR] = sr[ow];
          }
        }
      }
  };
  auto compute = [&](const float* Ap, const float* xt, int t, int g, float* Ct) {
    gemm_block(Mg, int(Q), Ap + g * apg, off.data(), xt + tap_off[t] + i64(g) * Cg, Cg,
               Ct + (i64(t) * G + g) * Mg * ldc, ldc, nullptr, /*spill=*/true,
               /*accumulate=*/true);
  };

  auto& pool = ThreadPool::instance();
  const int parts = reduction_parts(a.N, ct_floats);
  std::vector<float> ct(std::size_t(parts) * ct_floats, 0.f);
  if (parts > 1) {
    // Fixed, contiguous image ranges per part, summed in a fixed order below.
    pool.parallel_for(parts, [&](i64 p) {
      float* Ap = scratch(0, G * apg);
      float* xt = scratch(1, xt_floats);
      for (int n = int(p * a.N / parts); n < int((p + 1) * a.N / parts); ++n) {
        prepare(n, Ap, xt);
        for (int t = 0; t < T; ++t)
          for (int g = 0; g < G; ++g) compute(Ap, xt, t, g, ct.data() + p * ct_floats);
      }
    });
  } else {
    float* Ap = scratch(2, G * apg);
    float* xt = scratch(3, xt_floats);
    for (int n = 0; n < a.N; ++n) {
      prepare(n, Ap, xt);
      pool.parallel_for(i64(T) * G, [&](i64 i) { compute(Ap, xt, int(i / G), int(i % G), ct.data()); });
    }
  }
  // gw[g*Mg + co][ci][tap] = sum over parts of ct[tap][g][co][ci].
  for (int g = 0; g < G; ++g)
    for (int co = 0; co < Mg; ++co)
      for (int t = 0; t < T; ++t) {
        float* d = gw + (i64(g) * Mg + co) * Cg * T + t;
        for (int ci = 0; ci < Cg; ++ci) {
          float sum = 0.f;
          for (int p = 0; p < parts; ++p)
            sum += ct[p * ct_floats + ((i64(t) * G + g) * Mg + co) * ldc + ci];
          d[i64(ci) * T] = sum;
        }
      }
}
}  // namespace

void conv2d_backward_weight(const Conv2dArgs& a, const float* gy, const float* x, float* gw) {
  const int G = a.groups, Cg = a.C_in / G, Mg = a.C_out / G, T = a.kH * a.kW, K = Cg * T;
  const i64 HW = i64(a.H) * a.W, P = i64(a.H_out) * a.W_out;
  const i64 x_image = i64(a.C_in) * HW, y_image = i64(a.C_out) * P;
  const i64 wsize = i64(a.C_out) * K;
  if (wsize <= 0) return;
  std::memset(gw, 0, sizeof(float) * wsize);
  if (a.N <= 0 || P <= 0) return;
  // The per-tap GEMM is the faster one when its rows (Cg floats) fill whole full-width tiles,
  // or on narrow images where the dot form wastes more on junk columns (measured on AVX-512:
  // Cg 48: 122 vs 99 GF/s; Cg 32 on 24x24: 105 vs 98; Cg 64 on 56x56: 108 vs 113).
  const i64 vecs = Cg / VL;
  if (a.stride_h == 1 && a.stride_w == 1 && Cg % VL == 0 && vecs >= 2 &&
      (vecs % NV == 0 || a.W_out < 32)) {
    backward_weight_taps(a, gy, x, gw);
    return;
  }

  // A "unit" is A rows (gY, lda apart) and B rows (B + bgroup * g + boff[k]) over a common
  // length L; units sum into gw.
  //  * stride 1: nb consecutive images, each a padded plane (Hp x Wp) of x and the matching
  //    plane of gY (zeros off the H_out x W_out corner), planes of one channel adjacent; the
  //    taps are offsets into that run, and zero gY kills the junk. Several small images per
  //    unit keep L long, so the final reductions are amortised.
  //  * strided, or tiny K (C_in = 1 first layers, where the wide copy of gY would cost more
  //    than the arithmetic): via im2col, compact output positions of nb whole images side by
  //    side (gY copied), or of one image (gY read in place), or a chunk of one large image.
  const bool direct = a.stride_h == 1 && a.stride_w == 1 && (K >= 32 || G > 1);
  // The vector sums of every (group, row block) can stay live across units when they are
  // small enough (16x gw): then one image per unit is best (no zero rows, gY in place).
  const int mblocks = int(ceil_div(Mg, DMA));
  const i64 vtile = ceil_div(K, DNB) * DTILE;
  const i64 vtotal = i64(G) * mblocks * vtile;
  const bool persistent = vtotal <= (i64(1) << 21);
  const int Hp = a.H_out + (a.kH - 1) * a.dil_h, Wp = a.W_out + (a.kW - 1) * a.dil_w;
  const i64 plane = i64(Hp) * Wp;
  const i64 target = std::max<i64>(1024, 65536 / K);  // im2col: positions per unit
  const i64 CQ = direct ? 0 : std::min(P, target);
  // Tiny K: one image per unit, gY read in place (copying it costs more than the reductions).
  const int nb_max = int(std::min<i64>(
      a.N, persistent ? 1 : std::max<i64>(1, direct ? ceil_div(2048, plane) : K < 32 ? 1 : target / CQ)));
  const i64 chunks = direct ? 1 : ceil_div(P, CQ);
  const i64 ld_max = round_up(nb_max * CQ, VL);
  // Buffer sizes for the largest unit.
  auto direct_len = [&](int nb) { return round_up((nb - 1) * plane + i64(a.H_out) * Wp, VL); };
  auto direct_slack = [&](int nb) {
    const i64 cs = nb * plane;
    const i64 tap = i64(a.kH - 1) * a.dil_h * Wp + i64(a.kW - 1) * a.dil_w;
    return std::max<i64>(0, (a.C_in - 1) * cs + tap + direct_len(nb) - a.C_in * cs);
  };
  const i64 a_floats = direct ? a.C_out * round_up(nb_max * plane, VL) : a.C_out * ld_max;
  const i64 b_floats = direct ? a.C_in * nb_max * plane + direct_slack(nb_max) : i64(G) * K * ld_max;

  struct Unit {
    const float* A;
    i64 L, lda, bgroup;
    const i64* boff;
  };
  // Fills A and B for images [n0, n0 + nb) (direct) or chunk u of image n0 (strided).
  auto prepare = [&](int n0, int nb, i64 u, float* A, float* B, std::vector<i64>& boff) -> Unit {
    boff.resize(K);
    if (direct) {
      const i64 cs = nb * plane, lda = round_up(nb * plane, VL);
      const i64 L = direct_len(nb);
      for (int co = 0; co < a.C_out; ++co) {
        float* d = A + co * lda;
        std::memset(d, 0, sizeof(float) * lda);
        for (int i = 0; i < nb; ++i) {
          const float* s = gy + (n0 + i) * y_image + co * P;
          for (int oh = 0; oh < a.H_out; ++oh)
            std::memcpy(d + i * plane + i64(oh) * Wp, s + i64(oh) * a.W_out, sizeof(float) * a.W_out);
        }
      }
      for (int c = 0; c < a.C_in; ++c)
        for (int i = 0; i < nb; ++i)
          pad_copy(x + (n0 + i) * x_image + c * HW, 1, a.H, a.W, B + c * cs + i * plane, Hp, Wp,
                   a.pad_h, a.pad_w, 0);
      std::memset(B + a.C_in * cs, 0, sizeof(float) * direct_slack(nb));
      for (int ci = 0; ci < Cg; ++ci)
        for (int kh = 0; kh < a.kH; ++kh)
          for (int kw = 0; kw < a.kW; ++kw)
            boff[(ci * a.kH + kh) * a.kW + kw] = ci * cs + i64(kh) * a.dil_h * Wp + i64(kw) * a.dil_w;
      return Unit{A, L, lda, Cg * cs, boff.data()};
    }
    const i64 q0 = u * CQ, q1 = std::min(P, q0 + CQ), len = q1 - q0;
    const i64 ld = round_up(nb * len, VL);
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < nb; ++i)
        im2col(a, x + (n0 + i) * x_image + i64(g) * Cg * HW, Cg, q0, q1,
               B + i64(g) * K * ld + i * len, ld, i == nb - 1 ? ld - i * len : len);
    for (int k = 0; k < K; ++k) boff[k] = k * ld;
    if (nb == 1) return Unit{gy + n0 * y_image + q0, len, P, i64(K) * ld, boff.data()};
    for (int co = 0; co < a.C_out; ++co) {
      for (int i = 0; i < nb; ++i)
        std::memcpy(A + co * ld + i * len, gy + (n0 + i) * y_image + co * P + q0, sizeof(float) * len);
      std::fill(A + co * ld + nb * len, A + (co + 1) * ld, 0.f);
    }
    return Unit{A, ld, ld, i64(K) * ld, boff.data()};
  };
  // Accumulates the vector sums of rows [g*Mg + mb*DMA, ...) for one prepared unit, and
  // adds them into out.
  auto compute = [&](const float* B, const Unit& un, int g, int mb, float* vacc) {
    const int m0 = mb * DMA, ma = std::min(DMA, Mg - m0);
    const float* arows[DMA];
    for (int i = 0; i < ma; ++i) arows[i] = un.A + (i64(g) * Mg + m0 + i) * un.lda;
    std::vector<const float*>& brows = brow_cache();
    brows.resize(K);
    for (int k = 0; k < K; ++k) brows[k] = B + g * un.bgroup + un.boff[k];
    dot_acc(ma, K, arows, brows.data(), un.L, vacc);
  };
  auto finish = [&](int g, int mb, const float* vacc, float* out) {
    const int m0 = mb * DMA, ma = std::min(DMA, Mg - m0);
    dot_reduce(ma, K, vacc, out + (i64(g) * Mg + m0) * K, K);
  };

  auto& pool = ThreadPool::instance();
  const int parts = reduction_parts(int(ceil_div(a.N, nb_max)), wsize);
  if (parts > 1) {
    // Partial sums over fixed, contiguous ranges of images, added in a fixed order: the
    // result depends neither on scheduling nor on the number of threads.
    std::vector<float> partial(std::size_t(parts - 1) * wsize, 0.f);
    pool.parallel_for(parts, [&](i64 t) {
      float* out = t == 0 ? gw : partial.data() + (t - 1) * wsize;
      float* A = scratch(0, a_floats);
      float* B = scratch(1, b_floats);
      float* vacc = scratch(4, persistent ? vtotal : vtile);
      if (persistent) std::memset(vacc, 0, sizeof(float) * vtotal);
      static thread_local std::vector<i64> boff;
      const int n_end = int((t + 1) * a.N / parts);
      for (int n = int(t * a.N / parts); n < n_end;) {
        const int nb = std::min(nb_max, n_end - n);
        for (i64 u = 0; u < chunks; ++u) {
          const Unit un = prepare(n, nb, u, A, B, boff);
          for (int g = 0; g < G; ++g)
            for (int mb = 0; mb < mblocks; ++mb) {
              float* v = persistent ? vacc + (i64(g) * mblocks + mb) * vtile : vacc;
              if (!persistent) std::memset(v, 0, sizeof(float) * vtile);
              compute(B, un, g, mb, v);
              if (!persistent) finish(g, mb, v, out);
            }
        }
        n += nb;
      }
      if (persistent)
        for (int g = 0; g < G; ++g)
          for (int mb = 0; mb < mblocks; ++mb)
            finish(g, mb, vacc + (i64(g) * mblocks + mb) * vtile, out);
    });
    for (int t = 1; t < parts; ++t) {
      const float* p = partial.data() + (t - 1) * wsize;
      for (i64 i = 0; i < wsize; ++i) gw[i] += p[i];
    }
    return;
  }
  // Small batch: prepare each unit here, split its rows (disjoint in gw) over the pool.
  float* A = scratch(2, a_floats);
  float* B = scratch(3, b_floats);
  std::vector<float> shared(std::size_t(persistent ? vtotal : 0), 0.f);
  std::vector<i64> boff;
  for (int n = 0; n < a.N;) {
    const int nb = std::min(nb_max, a.N - n);
    for (i64 u = 0; u < chunks; ++u) {
      const Unit un = prepare(n, nb, u, A, B, boff);
      pool.parallel_for(i64(G) * mblocks, [&](i64 i) {
        const int g = int(i / mblocks), mb = int(i % mblocks);
        float* v = persistent ? shared.data() + i * vtile : scratch(4, vtile);
        if (!persistent) std::memset(v, 0, sizeof(float) * vtile);
        compute(B, un, g, mb, v);
        if (!persistent) finish(g, mb, v, gw);
      });
    }
    n += nb;
  }
  if (persistent)
    pool.parallel_for(i64(G) * mblocks, [&](i64 i) {
      finish(int(i / mblocks), int(i % mblocks), shared.data() + i * vtile, gw);
    });
}

// ------------------------------------------------------------------ backward, bias
void conv2d_backward_bias(const Conv2dArgs& a, const float* gy, float* gb) {
  const i64 P = i64(a.H_out) * a.W_out;
  ThreadPool::instance().parallel_for(a.C_out, [&](i64 co) {
    double total = 0;
    for (int n = 0; n < a.N; ++n) {
      const float* p = gy + (i64(n) * a.C_out + co) * P;
      V s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
      i64 i = 0;
      for (; i + 4 * VL <= P; i += 4 * VL) {
        s0 = vadd(s0, vload(p + i));
        s1 = vadd(s1, vload(p + i + VL));
        s2 = vadd(s2, vload(p + i + 2 * VL));
        s3 = vadd(s3, vload(p + i + 3 * VL));
      }
      double part = vsum(vadd(vadd(s0, s1), vadd(s2, s3)));
      for (; i < P; ++i) part += p[i];
      total += part;
    }
    gb[co] = float(total);
  });
}

}  // namespace fm::cpu::FM_CPU_ISA
