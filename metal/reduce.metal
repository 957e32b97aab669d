// Reductions over one axis of a (outer, R, inner) view (reduce_args.h): sum, mean,
// var / std (sum of squared deviations from a precomputed mean), max, min, argmax, argmin.
//
// One threadgroup per output (threadgroup_position_in_grid.x), or per segment of an output's
// elements when the host splits long rows (reduce_args.h: a second launch then combines
// the segments' partial results, as exactly as the first). Each thread reduces a
// strided share of the R elements (sums Kahan-compensated, so a share of 10^5 elements
// loses almost nothing), then the group combines the shares: simdgroup functions within a
// simdgroup (shuffles for sums, simd_max for max/min), a tree in threadgroup memory across
// simdgroups. The compensated arithmetic needs IEEE float semantics: the Metal backend
// must not compile this file with fast math (which may reassociate it away). Correct for ANY threadgroup
// size up to 1024 (partial simdgroups, non-powers of two): every barrier sits where the
// whole group reaches it, and only slots written by this launch are read.
//
// NaN as NumPy: sums propagate NaN (and inf - inf); max/min propagate NaN; argmax/argmin
// return the index of the first NaN if there is one, else of the first extreme value.
//
// float64 (FM_INSTANTIATE_DISCRETE: the CPU and CUDA; Apple GPUs have no double): the same
// reductions in double, the shares combined by a threadgroup tree only (*_tree kernels: the
// simdgroup functions carry floats), the divisor read as a double (reduce_args.h).
#include <metal_stdlib>
#include "fm_kernel.h"
#include "reduce_args.h"
using namespace metal;

enum : uint32_t { kReduceSlots = 1024 };  // Metal's largest threadgroup

FM_FUNC uint32_t reduce_index(constant ReduceArgs& a, uint32_t o, uint32_t r) {
  const uint32_t ob = o / a.inner, oi = o - ob * a.inner;
  return (ob * a.R + r) * a.inner + oi;
}

// The elements [begin, end) of the R that threadgroup g reduces, for output g / split.
FM_FUNC uint32_t segment_begin(constant ReduceArgs& a, uint32_t g) {
  return (g % a.split) * a.seg_len;
}
FM_FUNC uint32_t segment_end(constant ReduceArgs& a, uint32_t g) {
  return min(a.R, segment_begin(a, g) + a.seg_len);
}

enum : uint32_t { kRoot = 1u, kCombine = 2u, kPartial = 4u };

// Kahan step; an infinite partial sum keeps no compensation (inf - inf would turn it into
// NaN although NumPy's sum stays inf).
template <typename T>
FM_FUNC void kahan_add(thread T& s, thread T& c, T x) {
  const T y = x - c;
  const T t = s + y;
  c = isfinite(t) ? (t - s) - y : T(0);
  s = t;
}

// Error-free transformation of a + b into hi + lo (Knuth's TwoSum); an infinite sum keeps
// no error term.
template <typename T>
FM_FUNC void two_sum(thread T& hi, thread T& lo, T a, T b) {
  const T s = a + b;
  const T bb = s - a;
  const T e = (a - (s - bb)) + (b - bb);
  hi = s;
  lo = isfinite(s) ? e : T(0);
}

// Adds the double-float (bh, bl) into (ah, al) (double-double for T = double).
template <typename T>
FM_FUNC void add_pair(thread T& ah, thread T& al, T bh, T bl) {
  T hi, lo;
  two_sum(hi, lo, ah, bh);
  ah = hi;
  al = lo + (al + bl);
}

// Sum (Dev = false) or sum of squared deviations from mean[o] (Dev = true), divided by
// args.divisor, square-rooted if flags bit 0. The shares are combined as double-floats
// (hi, lo) through simdgroup shuffles and a threadgroup tree, so combining them loses
// almost nothing either. A split row: the first launch (kPartial) writes each segment's
// (hi, lo) to out / out_lo; the second (kCombine, split = 1, R = the segment count) reads
// them back from x / mean as double-floats and finishes.
template <bool Dev>
kernel void reduce_sum(device const float* x [[buffer(0)]],
                       device const float* mean [[buffer(1)]],
                       device float* out [[buffer(2)]],
                       constant ReduceArgs& a [[buffer(3)]],
                       device float* out_lo [[buffer(4)]],
                       uint3 tg_pos [[threadgroup_position_in_grid]],
                       uint32_t tid [[thread_index_in_threadgroup]],
                       uint3 tg_size [[threads_per_threadgroup]],
                       uint32_t lane [[thread_index_in_simdgroup]],
                       uint32_t sg [[simdgroup_index_in_threadgroup]],
                       uint32_t sg_width [[threads_per_simdgroup]]) {
  threadgroup float part_hi[kReduceSlots];
  threadgroup float part_lo[kReduceSlots];
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t g = tg_pos.x, o = g / a.split;
  const uint32_t end = segment_end(a, g);
  float hi = 0.0f, lo = 0.0f;
  if ((a.flags & kCombine) != 0) {
    for (uint32_t r = segment_begin(a, g) + tid; r < end; r += T) {
      const uint32_t i = reduce_index(a, o, r);
      add_pair(hi, lo, x[i], mean[i]);
    }
  } else {
    const float m = Dev ? mean[o] : 0.0f;
    float s = 0.0f, c = 0.0f;
    for (uint32_t r = segment_begin(a, g) + tid; r < end; r += T) {
      float v = x[reduce_index(a, o, r)];
      if (Dev) {
        v -= m;
        v *= v;
      }
      kahan_add(s, c, v);
    }
    // This thread's share is s - c.
    hi = s;
    lo = -c;
  }
  // Tree within the simdgroup over its live lanes (the last simdgroup may be partial).
  const uint32_t live = min(sg_width, T - sg * sg_width);
  uint32_t span = 1;
  while (span < sg_width) span *= 2;
  for (uint32_t h = span / 2; h > 0; h /= 2) {
    const float oh = simd_shuffle_down(hi, ushort(h));
    const float ol = simd_shuffle_down(lo, ushort(h));
    if (lane < h && lane + h < live) add_pair(hi, lo, oh, ol);
  }
  const uint32_t groups = (T + sg_width - 1) / sg_width;
  if (lane == 0) {
    part_hi[sg] = hi;
    part_lo[sg] = lo;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  // Pairwise tree over the simdgroup sums: halve a power-of-two span, skip missing partners.
  span = 1;
  while (span < groups) span *= 2;
  for (uint32_t h = span / 2; h > 0; h /= 2) {
    if (tid < h && tid + h < groups) {
      float th = part_hi[tid], tl = part_lo[tid];
      add_pair(th, tl, part_hi[tid + h], part_lo[tid + h]);
      part_hi[tid] = th;
      part_lo[tid] = tl;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0 && (a.flags & kPartial) != 0) {
    out[g] = part_hi[0];
    out_lo[g] = part_lo[0];
  } else if (tid == 0) {
    const float total = part_hi[0] + part_lo[0];
    const float r = total / a.divisor;
    out[g] = (a.flags & kRoot) != 0 ? sqrt(r) : r;
  }
}

FM_INSTANTIATE("reduce_sum", reduce_sum, false);
FM_INSTANTIATE("reduce_sumsq_dev", reduce_sum, true);

// reduce_sum's semantics for columns (inner >= FM_REDUCE_COL_BLOCK: a sum over axis 0 of a
// (rows, columns) array, a bias gradient). reduce_sum gives each output a threadgroup whose
// threads read one column, inner elements apart: a memory transaction per element, and for
// GPT's (4096, 384) bias gradients 10 us a launch on an H100. Here a threadgroup takes
// FM_REDUCE_COL_BLOCK adjacent columns of one ob and one chunk of FM_REDUCE_COL_ROWS rows;
// virtual thread v (column v % BLOCK, row lane v / BLOCK of FM_REDUCE_COL_LANES) Kahan-sums
// rows lane, lane + LANES, .. of the chunk (a row of BLOCK lanes reads adjacent floats),
// four loads out before their adds; the lanes' (hi, lo) shares are added in lane order.
// Chunks of 64 rows: with 256 (192 groups for GPT's (4096, 384), each thread 8 waits on
// memory) a launch took 4.5 us on an H100.
// Split rows (split = chunks > 1) write the partials output-major (out[o * split + chunk],
// out_lo likewise) for reduce_sum's combine launch, as a split reduce_sum does; otherwise the
// finished result. Grid: outer * ceil(inner / BLOCK) * split groups; any group size.
template <bool Dev>
kernel void reduce_sum_cols(device const float* x [[buffer(0)]],
                            device const float* mean [[buffer(1)]],
                            device float* out [[buffer(2)]],
                            constant ReduceArgs& a [[buffer(3)]],
                            device float* out_lo [[buffer(4)]],
                            uint3 tg_pos [[threadgroup_position_in_grid]],
                            uint32_t tid [[thread_index_in_threadgroup]],
                            uint3 tg_size [[threads_per_threadgroup]]) {
  constexpr uint32_t BLOCK = FM_REDUCE_COL_BLOCK, LANES = FM_REDUCE_COL_LANES;
  threadgroup float share_hi[FM_REDUCE_COL_BLOCK * FM_REDUCE_COL_LANES];  // [lane][column]
  threadgroup float share_lo[FM_REDUCE_COL_BLOCK * FM_REDUCE_COL_LANES];
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t blocks = (a.inner + BLOCK - 1) / BLOCK;
  const uint32_t chunk = tg_pos.x % a.split, cb = (tg_pos.x / a.split) % blocks;
  const uint32_t ob = tg_pos.x / a.split / blocks;
  const uint32_t r0 = chunk * a.seg_len, r1 = min(a.R, r0 + a.seg_len);
  for (uint32_t v = tid; v < BLOCK * LANES; v += T) {
    const uint32_t col = cb * BLOCK + v % BLOCK, lane = v / BLOCK;
    const bool live = col < a.inner;
    const float m = Dev && live ? mean[ob * a.inner + col] : 0.0f;
    const uint32_t base = ob * a.R * a.inner + col;
    float s = 0.0f, c = 0.0f;
    for (uint32_t r = r0 + lane; live && r < r1; r += 4u * LANES) {
      float vals[4];
      FM_UNROLL for (uint32_t u = 0; u < 4u; ++u) {
        const uint32_t rr = r + u * LANES;
        vals[u] = 0.0f;
        if (rr < r1) vals[u] = x[base + rr * a.inner];
      }
      FM_UNROLL for (uint32_t u = 0; u < 4u; ++u) {
        if (r + u * LANES < r1) {
          float val = vals[u];
          if (Dev) {
            val -= m;
            val *= val;
          }
          kahan_add(s, c, val);
        }
      }
    }
    share_hi[v] = s;  // this share is s - c
    share_lo[v] = -c;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint32_t col_in = tid; col_in < BLOCK; col_in += T) {
    const uint32_t col = cb * BLOCK + col_in;
    if (col < a.inner) {
      float hi = share_hi[col_in], lo = share_lo[col_in];
      for (uint32_t lane = 1; lane < LANES; ++lane)
        add_pair(hi, lo, share_hi[lane * BLOCK + col_in], share_lo[lane * BLOCK + col_in]);
      const uint32_t o = ob * a.inner + col;
      if ((a.flags & kPartial) != 0) {
        out[o * a.split + chunk] = hi;
        out_lo[o * a.split + chunk] = lo;
      } else {
        const float r = (hi + lo) / a.divisor;
        out[o] = (a.flags & kRoot) != 0 ? sqrt(r) : r;
      }
    }
  }
}

FM_INSTANTIATE("reduce_sum_cols", reduce_sum_cols, false);
FM_INSTANTIATE("reduce_sumsq_dev_cols", reduce_sum_cols, true);

// The divisor of sum-like results in the kernel's type: float32 reads args.divisor; float64
// args.divisor64, a double's bits (the block is shared with Metal, which has no double).
FM_FUNC float reduce_divisor(constant ReduceArgs& a, float) { return a.divisor; }
#if FM_HAS_DOUBLE
FM_FUNC double reduce_divisor(constant ReduceArgs& a, double) {
  return as_type<double>((uint64_t(a.divisor64[1]) << 32) | uint64_t(a.divisor64[0]));
}
#endif

// reduce_sum's semantics (Dev, flags, the split row's two launches) in T, with the shares
// combined by a pairwise threadgroup tree of (hi, lo) pairs instead of simdgroup shuffles.
template <typename T, bool Dev>
kernel void reduce_sum_tree(device const T* x [[buffer(0)]],
                            device const T* mean [[buffer(1)]],
                            device T* out [[buffer(2)]],
                            constant ReduceArgs& a [[buffer(3)]],
                            device T* out_lo [[buffer(4)]],
                            uint3 tg_pos [[threadgroup_position_in_grid]],
                            uint32_t tid [[thread_index_in_threadgroup]],
                            uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup T part_hi[kReduceSlots];
  threadgroup T part_lo[kReduceSlots];
  const uint32_t n = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t g = tg_pos.x, o = g / a.split;
  const uint32_t end = segment_end(a, g);
  T hi = T(0), lo = T(0);
  if ((a.flags & kCombine) != 0) {
    for (uint32_t r = segment_begin(a, g) + tid; r < end; r += n) {
      const uint32_t i = reduce_index(a, o, r);
      add_pair(hi, lo, x[i], mean[i]);
    }
  } else {
    // Each element's rounding error kept exactly (two-sum into a pair): unlike Kahan's
    // step this holds when an element dwarfs the running sum (1e16, 1, -1e16, ...).
    const T m = Dev ? mean[o] : T(0);
    for (uint32_t r = segment_begin(a, g) + tid; r < end; r += n) {
      T v = x[reduce_index(a, o, r)];
      if (Dev) {
        v -= m;
        v *= v;
      }
      add_pair(hi, lo, v, T(0));
    }
  }
  const uint32_t slots = min(n, uint32_t(kReduceSlots));
  if (tid < slots) {
    part_hi[tid] = hi;
    part_lo[tid] = lo;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint32_t span = 1;
  while (span < slots) span *= 2;
  for (uint32_t h = span / 2; h > 0; h /= 2) {
    if (tid < h && tid + h < slots) {
      T th = part_hi[tid], tl = part_lo[tid];
      add_pair(th, tl, part_hi[tid + h], part_lo[tid + h]);
      part_hi[tid] = th;
      part_lo[tid] = tl;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0 && (a.flags & kPartial) != 0) {
    out[g] = part_hi[0];
    out_lo[g] = part_lo[0];
  } else if (tid == 0) {
    const T r = (part_hi[0] + part_lo[0]) / reduce_divisor(a, T(0));
    out[g] = (a.flags & kRoot) != 0 ? sqrt(r) : r;
  }
}

FM_INSTANTIATE_DISCRETE("reduce_sum_float64", reduce_sum_tree, double, false);
FM_INSTANTIATE_DISCRETE("reduce_sumsq_dev_float64", reduce_sum_tree, double, true);

// max (Sign = 1) or min (Sign = -1, as -max(-x)), NaN propagating: the simdgroup reduces a
// NaN flag and the largest non-NaN value separately (simd_max may ignore NaN). fmax, not
// max: MSL leaves max undefined for NaN, fmax defines it (the other argument). A split
// row's partials are the segments' extremes (NaN kept), combined by this same kernel.
template <int Sign>
kernel void reduce_max(device const float* x [[buffer(0)]],
                       device float* out [[buffer(1)]],
                       constant ReduceArgs& a [[buffer(2)]],
                       uint3 tg_pos [[threadgroup_position_in_grid]],
                       uint32_t tid [[thread_index_in_threadgroup]],
                       uint3 tg_size [[threads_per_threadgroup]],
                       uint32_t lane [[thread_index_in_simdgroup]],
                       uint32_t sg [[simdgroup_index_in_threadgroup]],
                       uint32_t sg_width [[threads_per_simdgroup]]) {
  threadgroup float best[kReduceSlots];
  threadgroup float nan_seen[kReduceSlots];
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t g = tg_pos.x, o = g / a.split;
  const uint32_t end = segment_end(a, g);
  float b = -INFINITY, n = 0.0f;
  for (uint32_t r = segment_begin(a, g) + tid; r < end; r += T) {
    const float v = float(Sign) * x[reduce_index(a, o, r)];
    if (isnan(v)) n = 1.0f;
    else b = fmax(b, v);
  }
  b = simd_max(b);
  n = simd_max(n);
  const uint32_t groups = (T + sg_width - 1) / sg_width;
  if (lane == 0) {
    best[sg] = b;
    nan_seen[sg] = n;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint32_t span = 1;
  while (span < groups) span *= 2;
  for (uint32_t h = span / 2; h > 0; h /= 2) {
    if (tid < h && tid + h < groups) {
      best[tid] = fmax(best[tid], best[tid + h]);
      nan_seen[tid] = fmax(nan_seen[tid], nan_seen[tid + h]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0) out[g] = nan_seen[0] != 0.0f ? NAN : float(Sign) * best[0];
}

FM_INSTANTIATE("reduce_max", reduce_max, 1);
FM_INSTANTIATE("reduce_min", reduce_max, -1);

// reduce_max's semantics in T, combined by a threadgroup tree only.
template <typename T, int Sign>
kernel void reduce_max_tree(device const T* x [[buffer(0)]],
                            device T* out [[buffer(1)]],
                            constant ReduceArgs& a [[buffer(2)]],
                            uint3 tg_pos [[threadgroup_position_in_grid]],
                            uint32_t tid [[thread_index_in_threadgroup]],
                            uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup T best[kReduceSlots];
  threadgroup uint32_t nan_seen[kReduceSlots];
  const uint32_t n = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t g = tg_pos.x, o = g / a.split;
  const uint32_t end = segment_end(a, g);
  T b = T(-INFINITY);
  uint32_t nan = 0;
  for (uint32_t r = segment_begin(a, g) + tid; r < end; r += n) {
    const T v = T(Sign) * x[reduce_index(a, o, r)];
    if (isnan(v)) nan = 1;
    else b = fmax(b, v);
  }
  const uint32_t slots = min(n, uint32_t(kReduceSlots));
  if (tid < slots) {
    best[tid] = b;
    nan_seen[tid] = nan;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint32_t span = 1;
  while (span < slots) span *= 2;
  for (uint32_t h = span / 2; h > 0; h /= 2) {
    if (tid < h && tid + h < slots) {
      best[tid] = fmax(best[tid], best[tid + h]);
      nan_seen[tid] = nan_seen[tid] | nan_seen[tid + h];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0) out[g] = nan_seen[0] != 0 ? T(NAN) : T(Sign) * best[0];
}

FM_INSTANTIATE_DISCRETE("reduce_max_float64", reduce_max_tree, double, 1);
FM_INSTANTIATE_DISCRETE("reduce_min_float64", reduce_max_tree, double, -1);

// The better of two (value, index) candidates for argmax of Sign * x: NaN first, then the
// larger value, ties (and two NaNs) to the smaller index, so the order of combination
// does not matter.
template <typename T>
FM_FUNC bool arg_better(T v, uint32_t i, T w, uint32_t j) {
  const bool vn = isnan(v), wn = isnan(w);
  if (vn || wn) return vn && (!wn || i < j);
  if (v != w) return v > w;
  return i < j;
}

// argmax (Sign = 1) / argmin (Sign = -1) as int64 indices along the axis. Threadgroup tree
// only: the simdgroup functions carry floats, not (value, index) pairs. A split row: the
// first launch writes each segment's winner (an index along the axis) to out[g]; the
// second (kCombine, split = 1, seg_len = R = the original axis) takes the `parts` candidate
// indices of output o from cand[o * parts ...] and reads their values from x again.
template <typename T, int Sign>
kernel void reduce_argmax(device const T* x [[buffer(0)]],
                          device int64_t* out [[buffer(1)]],
                          constant ReduceArgs& a [[buffer(2)]],
                          device const int64_t* cand [[buffer(3)]],
                          uint3 tg_pos [[threadgroup_position_in_grid]],
                          uint32_t tid [[thread_index_in_threadgroup]],
                          uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup T best[kReduceSlots];
  threadgroup uint32_t where[kReduceSlots];
  const uint32_t n = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t g = tg_pos.x, o = g / a.split;
  const bool combine = (a.flags & kCombine) != 0;
  // Combining: k walks the candidates; else the segment's elements.
  const uint32_t k0 = combine ? 0u : segment_begin(a, g);
  const uint32_t k1 = combine ? a.parts : segment_end(a, g);
  T b = T(-INFINITY);
  uint32_t bi = 0xffffffffu;
  for (uint32_t k = k0 + tid; k < k1; k += n) {
    const uint32_t r = combine ? uint32_t(cand[o * a.parts + k]) : k;
    const T v = T(Sign) * x[reduce_index(a, o, r)];
    if (bi == 0xffffffffu || arg_better(v, r, b, bi)) {
      b = v;
      bi = r;
    }
  }
  if (tid < kReduceSlots) {
    best[tid] = b;
    where[tid] = bi;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const uint32_t slots = min(n, uint32_t(kReduceSlots));
  uint32_t span = 1;
  while (span < slots) span *= 2;
  for (uint32_t h = span / 2; h > 0; h /= 2) {
    if (tid < h && tid + h < slots) {
      const uint32_t j = where[tid + h];
      // An empty share (index 0xffffffff) never wins.
      if (j != 0xffffffffu &&
          (where[tid] == 0xffffffffu || arg_better(best[tid + h], j, best[tid], where[tid]))) {
        best[tid] = best[tid + h];
        where[tid] = j;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0) out[g] = int64_t(where[0]);
}

FM_INSTANTIATE("reduce_argmax", reduce_argmax, float, 1);
FM_INSTANTIATE("reduce_argmin", reduce_argmax, float, -1);
FM_INSTANTIATE_DISCRETE("reduce_argmax_float64", reduce_argmax, double, 1);
FM_INSTANTIATE_DISCRETE("reduce_argmin_float64", reduce_argmax, double, -1);

// Sum of int64 (index) arrays, wrapping around on overflow as NumPy's int64 sum: the
// additions are done in uint64_t, whose overflow is defined. Threadgroup tree only (the
// simdgroup functions carry 32-bit values). Mean (Out = float) = the sum converted to
// float, divided by args.divisor (fastmetal has no float64; NumPy's mean of integers is
// float64).
FM_FUNC void store_sum(device int64_t* out, uint32_t o, int64_t s, float) { out[o] = s; }
FM_FUNC void store_sum(device float* out, uint32_t o, int64_t s, float divisor) {
  out[o] = float(s) / divisor;
}

template <typename Out>
kernel void reduce_sum_int64(device const int64_t* x [[buffer(0)]],
                             device Out* out [[buffer(1)]],
                             constant ReduceArgs& a [[buffer(2)]],
                             uint3 tg_pos [[threadgroup_position_in_grid]],
                             uint32_t tid [[thread_index_in_threadgroup]],
                             uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup uint64_t part[kReduceSlots];
  const uint32_t T = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t o = tg_pos.x;
  uint64_t s = 0;
  for (uint32_t r = tid; r < a.R; r += T) s += uint64_t(x[reduce_index(a, o, r)]);
  const uint32_t slots = min(T, uint32_t(kReduceSlots));
  if (tid < slots) part[tid] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint32_t span = 1;
  while (span < slots) span *= 2;
  for (uint32_t h = span / 2; h > 0; h /= 2) {
    if (tid < h && tid + h < slots) part[tid] += part[tid + h];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0) store_sum(out, o, int64_t(part[0]), a.divisor);
}

FM_INSTANTIATE("reduce_sum_int64", reduce_sum_int64, int64_t);
FM_INSTANTIATE("reduce_mean_int64", reduce_sum_int64, float);

// prod (float32 / float64: products in float / double, NaN and inf as IEEE; int64: wrapping,
// in uint64_t) and
// max / min of int64 arrays, as NumPy's multiply / maximum / minimum reductions: each thread
// folds a strided share, then a threadgroup tree (no simdgroup functions: they carry 32-bit
// values). One threadgroup per output (never split). Op: 0 product, 1 maximum, 2 minimum.
template <typename T>
FM_FUNC T fold_multiply(T a, T b) { return a * b; }  // float, double: IEEE
FM_FUNC int64_t fold_multiply(int64_t a, int64_t b) {
  return as_type<int64_t>(uint64_t(a) * uint64_t(b));
}

template <typename T, int Op>
FM_FUNC T fold(T a, T b) {
  switch (Op) {
    case 1: return a > b ? a : b;
    case 2: return a < b ? a : b;
    default: return fold_multiply(a, b);
  }
}

template <typename T, int Op>
FM_FUNC T fold_identity() {
  switch (Op) {
    case 1: return T(-9223372036854775807 - 1);  // int64 only
    case 2: return T(9223372036854775807);
    default: return T(1);
  }
}

template <typename T, int Op>
kernel void reduce_fold(device const T* x [[buffer(0)]], device T* out [[buffer(1)]],
                        constant ReduceArgs& a [[buffer(2)]],
                        uint3 tg_pos [[threadgroup_position_in_grid]],
                        uint32_t tid [[thread_index_in_threadgroup]],
                        uint3 tg_size [[threads_per_threadgroup]]) {
  threadgroup T part[kReduceSlots];
  const uint32_t n = tg_size.x * tg_size.y * tg_size.z;
  const uint32_t o = tg_pos.x;
  T s = fold_identity<T, Op>();
  for (uint32_t r = tid; r < a.R; r += n) s = fold<T, Op>(s, x[reduce_index(a, o, r)]);
  const uint32_t slots = min(n, uint32_t(kReduceSlots));
  if (tid < slots) part[tid] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint32_t span = 1;
  while (span < slots) span *= 2;
  for (uint32_t h = span / 2; h > 0; h /= 2) {
    if (tid < h && tid + h < slots) part[tid] = fold<T, Op>(part[tid], part[tid + h]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0) out[o] = part[0];
}

FM_INSTANTIATE("reduce_prod_float32", reduce_fold, float, 0);
FM_INSTANTIATE_DISCRETE("reduce_prod_float64", reduce_fold, double, 0);
FM_INSTANTIATE("reduce_prod_int64", reduce_fold, int64_t, 0);
FM_INSTANTIATE("reduce_max_int64", reduce_fold, int64_t, 1);
FM_INSTANTIATE("reduce_min_int64", reduce_fold, int64_t, 2);
