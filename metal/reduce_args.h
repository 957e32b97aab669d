// Argument block of the reduction kernels (metal/reduce.metal), shared with the host
// (csrc/ops/reduce.cpp). The input is contiguous float32 viewed as (outer, R, inner): each
// output o = (ob, oi) reduces the R elements x[(ob * R + r) * inner + oi]. Outputs are
// contiguous, outer * inner of them.
#pragma once

//
// Long rows are split (csrc/ops/reduce.cpp, from the problem's shape only): threadgroup g
// reduces segment g % split of output g / split, elements [s * seg_len, (s + 1) * seg_len)
// of the R, and writes a partial result at g; a second launch combines the `split`
// partials of each output (flag bit 1), so the partition, and with it every bit of the
// result, depends on the problem only. Unsplit: split = 1, seg_len = R.
// reduce_sum_cols (columns: inner >= FM_REDUCE_COL_BLOCK): columns per threadgroup, row
// lanes per column, and rows per chunk of a split.
#define FM_REDUCE_COL_BLOCK 32
#define FM_REDUCE_COL_LANES 8
#define FM_REDUCE_COL_ROWS 64

struct ReduceArgs {
  uint32_t outer, R, inner;
  // sum-like results are divided by this (1 for sum, R for mean, R - ddof for var/std).
  float divisor;
  // bit 0: take the square root of the result (std). bit 1: combine partials (the second
  // launch). bit 2: write partials (the first launch of a split sum: hi and lo parts).
  uint32_t flags;
  uint32_t split, seg_len;
  uint32_t parts;  // argmax's second launch: candidates per output (the first's split)
  // The float64 kernels' divisor: a double's bits, low word first (the block is shared with
  // Metal, which has no double; float32 kernels read `divisor`).
  uint32_t divisor64[2];
};
