// Numerical differentiation and the fused Fourier series.
//
//   stencil_axis        one finite-difference stencil per output point along one axis of an
//                       N-D strided array (numpy.gradient and fastmetal.derivative)
//   fourier_series_l*   sum of K harmonics per sample, without N x K temporaries;
//                       LANES samples per thread (1 for GPUs; 16 or 64 on the CPU, so the
//                       loop over lanes vectorises)
// Each is a template of its storage and compute type T: float, and double for the float64
// instances (FM_INSTANTIATE_DISCRETE: the CPU and CUDA; Apple GPUs have no double), which
// compute every step in double (one lane a thread).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "numerics_args.h"
using namespace metal;


// ---------------------------------------------------------------------------- stencils
// The output is contiguous with shape (outer..., n, inner...). Each point subtracts f[i]
// before weighting: derivative weights sum to zero, so this is exact in real arithmetic and
// keeps float32 cancellation to the size of the differences rather than of f itself.

// Input offset of (outer index o, inner index x). The outermost dim of each decomposition
// needs no modulo (the index is already below its extent): with merged dims (the usual one
// dim per side) this is a multiply, and the loop over x stays vectorisable on the CPU.
FM_FUNC int64_t num_base(constant StencilArgs& a, uint o, uint x) {
  int64_t base = 0;
  uint rem = o;
  for (int32_t d = a.n_outer - 1; d >= 1; --d) {
    const uint s = uint(a.outer_shape[d]);
    base += int64_t(rem % s) * a.outer_strides[d];
    rem /= s;
  }
  if (a.n_outer > 0) base += int64_t(rem) * a.outer_strides[0];
  rem = x;
  for (int32_t d = a.n_inner - 1; d >= 1; --d) {
    const uint s = uint(a.inner_shape[d]);
    base += int64_t(rem % s) * a.inner_strides[d];
    rem /= s;
  }
  if (a.n_inner > 0) base += int64_t(rem) * a.inner_strides[0];
  return base;
}

FM_FUNC uint64_t num_out_index(constant StencilArgs& a, uint o, int32_t i, uint x) {
  return (uint64_t(o) * uint64_t(a.n) + uint64_t(i)) * uint64_t(a.inner_total) + uint64_t(x);
}

// The first n_left and last n_right points along the axis, any stencil rows.
// Grid: axis_in_x ? (n_left + n_right, outer_total, 1) : (inner_total, n_left + n_right, outer_total).
template <typename T>
kernel void stencil_edges(device const T* f [[buffer(0)]],
                          device const T* w [[buffer(1)]],
                          device const int32_t* off [[buffer(2)]],
                          device T* out [[buffer(3)]],
                          constant StencilArgs& a [[buffer(4)]],
                          uint3 gid [[thread_position_in_grid]]) {
  const bool ax = a.axis_in_x != 0;
  const int32_t e = int32_t(ax ? gid.x : gid.y);
  const uint x = ax ? 0u : gid.x;
  const uint o = ax ? gid.y : gid.z;
  const int32_t n = a.n;
  const int32_t i = e < a.n_left ? e : n - a.n_right + (e - a.n_left);
  const int32_t row = a.per_index != 0 ? i
                    : i < a.n_left ? i
                    : a.n_left + 1 + (i - (n - a.n_right));
  const int64_t base = num_base(a, o, x);
  const int32_t start = i + off[row];
  const T fi = f[base + int64_t(i) * a.axis_stride];
  T acc = T(0);
  for (int32_t t = 0; t < a.width; ++t) {
    const int32_t j = clamp(start + t, 0, n - 1);  // padded taps (weight 0) stay in bounds
    acc = fma(w[row * a.width + t], f[base + int64_t(j) * a.axis_stride] - fi, acc);
  }
  out[num_out_index(a, o, i, x)] = acc;
}

FM_INSTANTIATE("stencil_edges", stencil_edges, float);
FM_INSTANTIATE_DISCRETE("stencil_edges_float64", stencil_edges, double);

// The uniform interior weights: float32 reads them from the argument block; float64 from
// the weight buffer (the block is shared with Metal, which has no double).
FM_FUNC float num_uniform_weight(constant StencilArgs& a, device const float*, int t) {
  return a.w_interior[t];
}
#if FM_HAS_DOUBLE
FM_FUNC double num_uniform_weight(constant StencilArgs&, device const double* wt, int t) {
  return wt[t];
}
#endif

// Interior points n_left + p (p < n - n_left - n_right): W taps from i + off_interior, all
// in bounds. PER: per-point weights wt[t * n + i] (non-uniform gradient), else the uniform
// row a.w_interior. Grid as stencil_edges with the interior count in place of the edges,
// except that grid.x counts groups of LANES along the vector direction, starting at v_first.
//   MODE 2: LANES == 1, any strides, axis_in_x read at run time (GPUs; odd strides on the CPU)
//   MODE 1: the axis is the vector direction and has stride 1 (axis_in_x)
//   MODE 0: the inner dim is the vector direction and has stride 1 (n_inner == 1)
// With MODE 0/1 and LANES = 16 the loop over lanes reads consecutive floats: on the CPU it
// becomes plain vector loads (results kept in a local array, stored after the loads, so the
// compiler needs no aliasing checks between f and out).
template <typename T, int W, bool PER, int LANES, int MODE>
kernel void stencil_interior(device const T* f [[buffer(0)]],
                             device const T* wt [[buffer(1)]],
                             device T* out [[buffer(2)]],
                             constant StencilArgs& a [[buffer(3)]],
                             uint3 gid [[thread_position_in_grid]]) {
  const bool ax = MODE == 2 ? a.axis_in_x != 0 : MODE == 1;
  const uint v0 = a.v_first + gid.x * uint(LANES);  // first lane along the vector direction
  const uint o = ax ? gid.y : gid.z;
  const int32_t i0 = a.n_left + int32_t(ax ? v0 : gid.y);
  const uint x0 = ax ? 0u : v0;
  const int32_t n = a.n;
  const int64_t s = a.axis_stride;
  const int64_t vs = MODE == 2 ? 0 : 1;  // element step between lanes (LANES == 1 in MODE 2)
  const int64_t c0 = num_base(a, o, x0) + int64_t(i0) * s;
  const int64_t t0 = int64_t(a.off_interior) * s;
  T wl[W];
  for (int t = 0; t < W; ++t) wl[t] = num_uniform_weight(a, wt, t);
  T acc[LANES];
  for (int j = 0; j < LANES; ++j) {
    const int64_t cj = c0 + int64_t(j) * vs;
    const T fi = f[cj];
    T r = T(0);
    for (int t = 0; t < W; ++t) {
      const T wv = PER ? wt[uint64_t(t) * uint64_t(n) + uint64_t(i0 + (MODE == 1 ? j : 0))] : wl[t];
      r = fma(wv, f[cj + t0 + int64_t(t) * s] - fi, r);
    }
    acc[j] = r;
  }
  const uint64_t ob = num_out_index(a, o, i0, x0);
  for (int j = 0; j < LANES; ++j) out[ob + uint64_t(j)] = acc[j];
}

FM_INSTANTIATE("stencil_interior_3_l1", stencil_interior, float, 3, false, 1, 2);
FM_INSTANTIATE("stencil_interior_5_l1", stencil_interior, float, 5, false, 1, 2);
FM_INSTANTIATE("stencil_interior_7_l1", stencil_interior, float, 7, false, 1, 2);
FM_INSTANTIATE("stencil_interior_9_l1", stencil_interior, float, 9, false, 1, 2);
FM_INSTANTIATE("stencil_interior_3pp_l1", stencil_interior, float, 3, true, 1, 2);
FM_INSTANTIATE_CPU("stencil_interior_3_l16_axis", stencil_interior, float, 3, false, 16, 1);
FM_INSTANTIATE_CPU("stencil_interior_5_l16_axis", stencil_interior, float, 5, false, 16, 1);
FM_INSTANTIATE_CPU("stencil_interior_7_l16_axis", stencil_interior, float, 7, false, 16, 1);
FM_INSTANTIATE_CPU("stencil_interior_9_l16_axis", stencil_interior, float, 9, false, 16, 1);
FM_INSTANTIATE_CPU("stencil_interior_3pp_l16_axis", stencil_interior, float, 3, true, 16, 1);
FM_INSTANTIATE_CPU("stencil_interior_3_l16_inner", stencil_interior, float, 3, false, 16, 0);
FM_INSTANTIATE_CPU("stencil_interior_5_l16_inner", stencil_interior, float, 5, false, 16, 0);
FM_INSTANTIATE_CPU("stencil_interior_7_l16_inner", stencil_interior, float, 7, false, 16, 0);
FM_INSTANTIATE_CPU("stencil_interior_9_l16_inner", stencil_interior, float, 9, false, 16, 0);
FM_INSTANTIATE_CPU("stencil_interior_3pp_l16_inner", stencil_interior, float, 3, true, 16, 0);
FM_INSTANTIATE_DISCRETE("stencil_interior_3_l1_float64", stencil_interior, double, 3, false, 1, 2);
FM_INSTANTIATE_DISCRETE("stencil_interior_5_l1_float64", stencil_interior, double, 5, false, 1, 2);
FM_INSTANTIATE_DISCRETE("stencil_interior_7_l1_float64", stencil_interior, double, 7, false, 1, 2);
FM_INSTANTIATE_DISCRETE("stencil_interior_9_l1_float64", stencil_interior, double, 9, false, 1, 2);
FM_INSTANTIATE_DISCRETE("stencil_interior_3pp_l1_float64", stencil_interior, double, 3, true, 1, 2);

// ---------------------------------------------------------------------------- Fourier
// A product that must stay rounded on its own: the float-float steps below subtract it from
// its own exact FMA value, so fusing it into a later add would count the low part twice.
// Clang (Metal) contracts only within one expression and GCC only single-use products
// (these have a rint() use too); nvcc contracts across statements, so it gets __fmul_rn.
#if defined(__CUDACC__)
FM_FUNC float num_mul_rn(float a, float b) { return __fmul_rn(a, b); }
#if FM_HAS_DOUBLE
FM_FUNC double num_mul_rn(double a, double b) { return __dmul_rn(a, b); }
#endif
#else
template <typename T>
FM_FUNC T num_mul_rn(T a, T b) { return a * b; }
#endif

// sin and cos of 2 pi t for t = t_hi + t_lo turns, |t_hi| <= ~0.5: quarter-turn reduction
// (exact), then odd/even Taylor polynomials in the remaining |r| <= 1/8 turn (truncation
// < 2e-9). Branch-free, so that a loop over lanes vectorises.
FM_FUNC void num_sincos_turns(float t_hi, float t_lo, thread float& s, thread float& c) {
  const float q = rint(4.0f * t_hi);
  const float r = fma(-0.25f, q, t_hi) + t_lo;  // t_hi - q/4 is exact
  const float z = r * r;
  // Coefficients (2 pi)^n / n! with alternating signs, in powers of r (turns).
  float sp = 42.058693944897634f;
  sp = fma(sp, z, -76.70585975306136f);
  sp = fma(sp, z, 81.60524927607504f);
  sp = fma(sp, z, -41.341702240399755f);
  sp = fma(sp, z, 6.283185307179586f);
  const float sr = sp * r;
  float cp = -26.426256783374388f;
  cp = fma(cp, z, 60.24464137187664f);
  cp = fma(cp, z, -85.45681720669371f);
  cp = fma(cp, z, 64.93939402266828f);
  cp = fma(cp, z, -19.739208802178716f);
  const float cr = fma(cp, z, 1.0f);
  // angle = q quarter turns + r: rotate (cr, sr) by q * 90 degrees. Done on the bits
  // (swap by mask, sign by xor): exact, and free of selects that GCC may turn into
  // branches, which would stop the lane loops from vectorising.
  const uint32_t qu = uint32_t(int32_t(q));     // two's complement: & 3 is q mod 4
  const uint32_t swap = 0u - (qu & 1u);          // all ones for odd quadrants
  const uint32_t si = as_type<uint32_t>(sr);
  const uint32_t ci = as_type<uint32_t>(cr);
  s = as_type<float>(((si & ~swap) | (ci & swap)) ^ ((qu & 2u) << 30));
  c = as_type<float>(((ci & ~swap) | (si & swap)) ^ (((qu + 1u) & 2u) << 30));
}

#if FM_HAS_DOUBLE
// The same in double: 2 pi r (|r| <= 1/8 turn) through the double sin and cos, then the
// quarter turns q.
FM_FUNC void num_sincos_turns(double t_hi, double t_lo, thread double& s, thread double& c) {
  const double q = rint(4.0 * t_hi);
  const double r = fma(-0.25, q, t_hi) + t_lo;  // t_hi - q/4 is exact
  const double a = r * 6.283185307179586;
  const double sr = sin(a);
  const double cr = cos(a);
  const uint32_t qu = uint32_t(int32_t(q)) & 3u;  // |q| <= 2
  s = qu == 0u ? sr : (qu == 1u ? cr : (qu == 2u ? -sr : -cr));
  c = qu == 0u ? cr : (qu == 1u ? -sr : (qu == 2u ? -cr : sr));
}
#endif

// All ones where x is finite, else zero (integer ops only: vectorises without branches).
FM_FUNC uint32_t num_finite_mask(float x) {
  return 0u - uint32_t((as_type<uint32_t>(x) & 0x7f800000u) != 0x7f800000u);
}
// x where finite, else 0 (so that the phase steps see finite values only).
FM_FUNC float num_finite_or_zero(float x) { return as_type<float>(as_type<uint32_t>(x) & num_finite_mask(x)); }
// v where x is finite, else NaN (as cos(inf) in NumPy).
FM_FUNC float num_finite_or_nan(float x, float v) {
  const uint32_t m = num_finite_mask(x);
  return as_type<float>((as_type<uint32_t>(v) & m) | (0x7fc00000u & ~m));
}
#if FM_HAS_DOUBLE
FM_FUNC double num_finite_or_zero(double x) { return isfinite(x) ? x : 0.0; }
FM_FUNC double num_finite_or_nan(double x, double v) { return isfinite(x) ? v : NAN; }
#endif

// a + b = s + err exactly (Knuth's two-sum; no multiplications, so FMA contraction
// cannot change it).
template <typename T>
FM_FUNC T num_two_sum(T a, T b, thread T& err) {
  const T s = a + b;
  const T bb = s - a;
  err = (a - (s - bb)) + (b - bb);
  return s;
}

// Drops whole turns from t_hi + t_lo: |result hi| <= 0.5, |lo| <= 2^-25.
template <typename T>
FM_FUNC void num_fold(T t_hi, T t_lo, thread T& hi, thread T& lo) {
  T e;
  const T s = num_two_sum(t_hi, t_lo - rint(t_lo), e);
  hi = s - rint(s);  // exact
  lo = e;
}

// x / P in turns as a float-float u_hi + u_lo, |u_hi| <= 0.5. 1/P is a float-float
// (inv_hi + inv_lo, relative error ~2^-48); x * inv_hi is split exactly with one FMA
// (two-product) and its whole turns dropped exactly, so for |x| up to ~2^20 periods the
// phase keeps ~2^-25 turns of accuracy. Any float x gives bounded values (no overflow).
// In double the same steps keep ~2^-54 turns.
template <typename T>
FM_FUNC void num_turns(T x, T inv_hi, T inv_lo, thread T& u_hi, thread T& u_lo) {
  const T pr = num_mul_rn(x, inv_hi);
  const T pe = fma(x, inv_hi, -pr);
  const T f = pr - rint(pr);  // exact
  num_fold(f, fma(x, inv_lo, pe), u_hi, u_lo);
}

// frac(k * u) as a float-float: k * u_hi is split exactly (two-product by FMA), its integer
// part dropped exactly, so the phase error stays ~2^-25 turns whatever k is.
template <typename T>
FM_FUNC void num_phase(T k, T u_hi, T u_lo, thread T& t_hi, thread T& t_lo) {
  const T pr = num_mul_rn(k, u_hi);
  const T pe = fma(k, u_hi, -pr);
  num_fold(pr - rint(pr), fma(k, u_lo, pe), t_hi, t_lo);
}

// The series' parameters: float32 takes them from the argument block; float64 from the head
// of the coefficient buffer (inv_hi, inv_lo, c0, 0: the block is shared with Metal, which has
// no double). Returns where the (A_k, B_k) pairs start.
FM_FUNC device const float* num_params(constant FourierArgs& p, device const float* coef,
                                       thread float& inv_hi, thread float& inv_lo, thread float& c0) {
  inv_hi = p.inv_hi;
  inv_lo = p.inv_lo;
  c0 = p.c0;
  return coef;
}
#if FM_HAS_DOUBLE
FM_FUNC device const double* num_params(constant FourierArgs&, device const double* coef,
                                        thread double& inv_hi, thread double& inv_lo,
                                        thread double& c0) {
  inv_hi = coef[0];
  inv_lo = coef[1];
  c0 = coef[2];
  return coef + 4;
}
#endif

// Each thread evaluates LANES consecutive samples (no bounds check: the host launches the
// n % LANES tail with LANES = 1). Per block of `block` terms the cos/sin pair is re-seeded
// from an accurately reduced phase, then advanced by rotation with (cos, sin)(2 pi u):
// 2 multiplies + 2 FMAs per term plus 2 FMAs for the coefficients, with an error that
// cannot grow past one block. Each block's partial sum is added to the total separately (shorter sums round less).
template <typename T, int LANES>
kernel void fourier_series_k(device const T* x [[buffer(0)]],
                             device const T* coef_in [[buffer(1)]],
                             device T* out [[buffer(2)]],
                             constant FourierArgs& p [[buffer(3)]],
                             uint gid [[thread_position_in_grid]]) {
  T inv_hi, inv_lo, c0;
  device const T* coef = num_params(p, coef_in, inv_hi, inv_lo, c0);
  const uint64_t base = uint64_t(gid) * uint64_t(LANES);
  T uh[LANES], ul[LANES], c1[LANES], ns1[LANES], acc[LANES];
  T c[LANES], s[LANES], bacc[LANES];
  for (int j = 0; j < LANES; ++j) {
    const T xs = num_finite_or_zero(x[base + uint64_t(j)]);  // inf, NaN -> 0
    T h, l;
    num_turns(xs, inv_hi, inv_lo, h, l);
    uh[j] = h;
    ul[j] = l;
    T sv, cv;
    num_sincos_turns(h, l, sv, cv);
    c1[j] = cv;
    ns1[j] = -sv;  // negated once here so each step is one multiply + one FMA per output
    acc[j] = T(0);
  }
  const int32_t K = p.num_terms;
  for (int32_t k0 = 1; k0 <= K; k0 += p.block) {
    const int32_t k1 = min(k0 + p.block, K + 1);
    for (int j = 0; j < LANES; ++j) {
      T th, tl;
      num_phase(T(k0), uh[j], ul[j], th, tl);
      c[j] = th;  // the phase, turned into (cos, sin) by the next loop
      s[j] = tl;
    }
    for (int j = 0; j < LANES; ++j) {
      T sv, cv;
      num_sincos_turns(c[j], s[j], sv, cv);
      c[j] = cv;
      s[j] = sv;
      bacc[j] = T(0);
    }
    for (int32_t k = k0; k < k1; ++k) {
      const T ak = coef[2 * (k - 1)];
      const T bk = coef[2 * (k - 1) + 1];
      for (int j = 0; j < LANES; ++j) {
        bacc[j] = fma(ak, c[j], fma(bk, s[j], bacc[j]));
        const T cn = fma(s[j], ns1[j], c[j] * c1[j]);
        s[j] = fma(s[j], c1[j], -(c[j] * ns1[j]));
        c[j] = cn;
      }
    }
    for (int j = 0; j < LANES; ++j) acc[j] += bacc[j];
  }
  for (int j = 0; j < LANES; ++j)  // non-finite x -> NaN (as cos(inf) in NumPy)
    out[base + uint64_t(j)] = num_finite_or_nan(x[base + uint64_t(j)], c0 + acc[j]);
}

FM_INSTANTIATE("fourier_series_l1", fourier_series_k, float, 1);
FM_INSTANTIATE_CPU("fourier_series_l16", fourier_series_k, float, 16);
FM_INSTANTIATE_CPU("fourier_series_l64", fourier_series_k, float, 64);
FM_INSTANTIATE_DISCRETE("fourier_series_l1_float64", fourier_series_k, double, 1);
