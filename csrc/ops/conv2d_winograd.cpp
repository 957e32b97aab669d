#include "ops/conv2d_winograd.h"

#include <algorithm>
#include <string>

#include "backend/env_config.h"
#include "ops/array_arg.h"
#include "ops/conv2d_gemm.h"
#include "ops/conv2d_shared.h"

namespace fm::conv2d_winograd {

using conv2d_gemm::bytes;
using conv2d_gemm::ceil_div;
using conv2d_gemm::choose_tile;
using conv2d_gemm::discrete_shapes;
using conv2d_gemm::Fill;
using conv2d_gemm::forced_tile;
using conv2d_gemm::GemmTile;
using conv2d_gemm::group_threads;
using conv2d_gemm::kFillGroups;
using conv2d_gemm::kTile128x128;
using conv2d_gemm::kTile32x64;
using conv2d_gemm::kTile64x128;
using conv2d_gemm::kTile64x64;
using conv2d_gemm::kTiles;
using conv2d_gemm::launch_gemm;
using conv2d_gemm::split_count;
using conv2d_gemm::tile_count;
using conv2d_gemm::wave_groups;
using conv2d_shared::kMaxIndex;

// ---- Winograd F(m x m, 3x3), m = 2 or 4 (metal/conv_winograd.metal; docs/gpu_kernels.md
// says why and where). Three launches: the weight and input transforms (one grid), the
// (m+2)^2 GEMMs (one launch), the output transform; the transformed tensors are pool
// buffers that live until the launches that read them have run (the backend keeps them
// alive; nothing here waits).

bool winograd_shape(const Conv2dArgs& a) {
  return a.kH == 3 && a.kW == 3 && a.stride_h == 1 && a.stride_w == 1 && a.dil_h == 1 &&
         a.dil_w == 1 && a.groups == 1;
}

std::int64_t winograd_tile_count(const Conv2dArgs& a, int m) {
  return std::int64_t(a.N) * ((a.H_out + m - 1) / m) * ((a.W_out + m - 1) / m);
}

// The transformed tensors ((m+2)^2 x channels x tiles) must be indexable with 32 bits.
bool winograd_fits(const Conv2dArgs& a, int m) {
  const std::int64_t points = (m + 2) * (m + 2), tiles = winograd_tile_count(a, m);
  return points * std::max(a.C_in, a.C_out) * tiles <= kMaxIndex &&
         points * std::int64_t(a.C_in) * a.C_out <= kMaxIndex;
}

// FASTMETAL_CONV_ALGO=gemm|winograd|winograd4 forces the algorithm where Winograd applies
// (tests, tour, benchmark): the implicit GEMM, F(2x2, 3x3), or F(4x4, 3x3), for every pass.
// Anything else (or unset) lets the host choose.
int forced_algo() { return env::conv_algo(); }

// The Winograd output tile m to use (2 or 4), or 0 for the implicit GEMM. Winograd where it
// applies and was measured faster: discrete GPUs (an H100, BENCHMARKS.md), forward and input
// gradient with at least 16 channels on both sides (below that the transforms' memory
// traffic outweighs the saved multiplications) as F(4x4, 3x3); weight gradient as
// F(4x4, 3x3) with at least 32 (tools/sweeps/conv_wgrad_sweep.py, since the products' 16-byte loads
// and the row-parallel last step: MNIST's 32 -> 64 layer 0.059 ms against 0.083-0.093 for
// the implicit GEMM; ResNet-50 layer1 0.148 ms, layer2 0.104, layer3 0.119; below 32
// channels not measured).
// Devices whose memory the host sees (Apple GPUs, not measured yet; the CPU, which runs
// these kernels only in tests) keep the implicit GEMM.
int winograd_choice(Backend& b, const Conv2dArgs& a, ConvPass pass) {
  if (!winograd_shape(a) || a.N == 0) return 0;
  int m;
  const int forced = forced_algo();
  if (forced >= 0) {
    m = forced;
  } else if (!discrete_shapes(b)) {
    m = 0;
  } else if (pass == ConvPass::weight_grad) {
    m = a.C_in >= 32 && a.C_out >= 32 ? 4 : 0;
  } else {
    m = a.C_in >= 16 && a.C_out >= 16 ? 4 : 0;
  }
  return m != 0 && winograd_fits(a, m) ? m : 0;
}

// The transforms' grid (conv2d_winograd[4]_transforms, _grad_transforms): `tiles` along x,
// `rows` (channels, and the weight's rows) along y.
Dispatch transform_dispatch(Backend& b, const std::string& kernel, std::int64_t tiles,
                            std::int64_t rows) {
  Dispatch d;
  d.grid[0] = std::uint32_t(tiles);
  d.grid[1] = std::uint32_t(rows);
  d.group[0] = std::uint32_t(std::min<std::int64_t>(b.preferred_group_size(kernel), tiles));
  return d;
}

// The Winograd last steps (conv2d_winograd[4]_output, _weight_grad): `per_group` items
// (tiles or weights) a group along x, a thread per row of the m + 2 transform points of
// each (the kernels say why), `channels` along y.
Dispatch row_step_dispatch(Backend& b, const std::string& kernel, std::int64_t items,
                           std::int64_t per_group, int m, std::int64_t channels) {
  const std::uint32_t groups = ceil_div(items, per_group);
  Dispatch d;
  d.group[0] = group_threads(b, kernel, groups, std::uint32_t((m + 2) * per_group));
  d.grid[0] = groups * d.group[0];
  d.grid[1] = std::uint32_t(channels);
  return d;
}

// The products' tile. On discrete GPUs, products of more than 64 rows take 64x128, not
// choose_tile's 128x128 (F(4x4) on an H100, --conv-sweep, BENCHMARKS.md: ResNet-50 layer3
// forward 58.0 against 51.5 effective TFLOP/s, input gradient 57.2 against 50.9; layer2
// 57.4 / 57.1 against 55.0 / 54.8); products of at most 64 rows take 64x128 or 64x64 (both
// 128 threads), whichever leaves the last wave of groups fuller (2 * kFillGroups groups of
// 128 threads in flight on an H100): MNIST conv2's 9,216 F(2x2) tiles run 6% faster on
// 64x64, ResNet-50 layer1's 25,088 on 64x128.
const GemmTile& winograd_tile(Backend& b, std::int64_t rows, std::int64_t cols,
                              std::int64_t points) {
  const GemmTile& t = choose_tile(b, rows, cols, points);
  if (forced_tile() >= 0 || !discrete_shapes(b)) return t;
  if (&t == &kTiles[kTile128x128]) return kTiles[kTile64x128];
  if (&t != &kTiles[kTile64x128]) return t;
  const auto fullness = [&](const GemmTile& c) {
    const std::int64_t n = tile_count(c, rows, cols, points), slots = 2 * kFillGroups;
    return double(n) / double((n + slots - 1) / slots * slots);
  };
  return fullness(kTiles[kTile64x64]) > fullness(t) + 0.05 ? kTiles[kTile64x64] : t;
}

// Whether a Winograd product can load its operands as 16-byte quads: every row of the
// transformed tensors (U: C_in long, V and Z: tiles long; fresh allocations, so their
// starts are aligned) starts 16-byte aligned and holds whole quads, so a quad is wholly
// inside or outside the GEMM. The `_vec4` kernels cut the product's per-slice load work
// (on an H100, BENCHMARKS.md: the scalar loads' address arithmetic and constant reloads
// were 45% of the layer3 weight-gradient product's stall samples).
bool winograd_vec4(std::int64_t row_lengths_a, std::int64_t row_lengths_b) {
  return row_lengths_a % 4 == 0 && row_lengths_b % 4 == 0;
}

// y = conv(x, w) (+ bias) for a Winograd shape `a` with F(m x m, 3x3); `flip`: w is the
// layer weight of the input gradient whose equivalent forward convolution `a` describes
// (see the kernels).
void winograd_forward(Backend& b, int m, const Conv2dArgs& a, const Array& x, const Array& w,
                      const KernelArg& bias_arg, std::uint32_t bias_flag, bool flip,
                      const Array& y) {
  const std::int64_t tiles = winograd_tile_count(a, m), points = (m + 2) * (m + 2);
  Array u = Array::empty(b, {points, a.C_out, a.C_in}, DType::float32);
  Array v = Array::empty(b, {points, a.C_in, tiles}, DType::float32);
  Array prod = Array::empty(b, {points, a.C_out, tiles}, DType::float32);
  const std::uint32_t wflags = flip ? 1u : 0u;
  const std::string base = m == 4 ? "conv2d_winograd4" : "conv2d_winograd";
  const std::string tk = base + "_transforms", ok = base + "_output";
  const std::int64_t weight_rows = (std::int64_t(a.C_out) * a.C_in + tiles - 1) / tiles;
  b.launch(tk, transform_dispatch(b, tk, tiles, weight_rows + a.C_in),
           {buf(x), buf(v), buf(w), buf(u), bytes(&a, sizeof a), bytes(&wflags, sizeof wflags)});
  launch_gemm(b, (base + "_gemm").c_str(), winograd_tile(b, a.C_out, tiles, points), a, a.C_out,
              tiles, 1, {buf(u), buf(v), buf(u), buf(prod)}, 0, points,
              winograd_vec4(a.C_in, tiles));
  b.launch(ok, row_step_dispatch(b, ok, tiles, FM_WINOGRAD_OUT_TILES, m, a.C_out),
           {buf(prod), bias_arg, buf(y), bytes(&a, sizeof a), bytes(&bias_flag, sizeof bias_flag)});
}

// The input gradient of a stride-1 3x3 convolution is the forward convolution of gy with
// the weight rotated by 180 degrees, channels swapped, padding 2 - pad (negative: a crop).
Conv2dArgs input_gradient_as_forward(const Conv2dArgs& a) {
  Conv2dArgs e = a;
  e.C_in = a.C_out;
  e.C_out = a.C_in;
  e.H = a.H_out;
  e.W = a.W_out;
  e.H_out = a.H;
  e.W_out = a.W;
  e.pad_h = a.kH - 1 - a.pad_h;
  e.pad_w = a.kW - 1 - a.pad_w;
  return e;
}

void winograd_backward_weight(Backend& b, int m, const Conv2dArgs& a, const Array& gy,
                              const Array& x, const Array& gw) {
  const std::int64_t tiles = winograd_tile_count(a, m), points = (m + 2) * (m + 2);
  Array v = Array::empty(b, {points, a.C_in, tiles}, DType::float32);
  Array z = Array::empty(b, {points, a.C_out, tiles}, DType::float32);
  const std::string base = m == 4 ? "conv2d_winograd4" : "conv2d_winograd";
  const std::string tk = base + "_grad_transforms", gk = base + "_weight_grad";
  b.launch(tk, transform_dispatch(b, tk, tiles, std::int64_t(a.C_in) + a.C_out),
           {buf(x), buf(v), buf(gy), buf(z), bytes(&a, sizeof a)});
  // Discrete GPUs: 64x64 where there are at most 64 input channels (columns; a 128-wide tile
  // would idle half or more of them), else 64x128. K (the tiles) is split to fill one wave
  // (wave_groups; Fill::two_thirds). Measured with --conv-sweep on an H100 (BENCHMARKS.md),
  // F(4x4, 3x3): ResNet-50 layer3 (256 channels, 512 tiles) 46.9 effective TFLOP/s on
  // 128x128 unsplit (144 groups), 51.2 on 64x128 unsplit (288 of a wave of 528), 54.7 on
  // 64x128 in 2 splits (576), 50.2 in 4; layer2 (128 channels) 55.5 on 64x128 in 7 splits
  // (504 groups); layer1 (64) 37.8 on 64x64 in 14 (504).
  // Where 64x64 tiles alone fill one wave but not two (layer3: 576 groups), 64x64 with K
  // split into at least two waves: layer3 0.109 ms in 2 splits (1,152 groups) against 0.116
  // on 64x128 in 2, 0.116 on 64x64 unsplit (cuDNN 0.099); layer2 keeps 64x128 (0.097 ms,
  // against 0.111-0.160 on 64x64).
  const bool discrete = forced_tile() < 0 && discrete_shapes(b);
  const GemmTile& small = kTiles[kTile64x64];
  const std::int64_t small_tiles = tile_count(small, a.C_out, a.C_in, points);
  const bool small_fills = discrete && a.C_out > 32 && small_tiles >= wave_groups(small) &&
                           small_tiles < 2 * wave_groups(small);
  const GemmTile& tile = !discrete                     ? choose_tile(b, a.C_out, a.C_in, points)
                         : a.C_out <= 32               ? kTiles[kTile32x64]
                         : a.C_in <= 64 || small_fills ? small
                                                       : kTiles[kTile64x128];
  const std::int64_t per_point = std::int64_t(a.C_out) * a.C_in;
  const std::int64_t count = tile_count(tile, a.C_out, a.C_in, points);
  const std::int64_t splits =
      small_fills ? split_count(tile, count, tiles, points * per_point, 2 * wave_groups(tile),
                                Fill::at_least)
                  : split_count(tile, count, tiles, points * per_point, wave_groups(tile),
                                Fill::two_thirds);
  Array du = Array::empty(b, {splits, points, a.C_out, a.C_in}, DType::float32);
  launch_gemm(b, (base + "_weight_gemm").c_str(), tile, a, a.C_out, a.C_in, splits,
              {buf(z), buf(v), buf(z), buf(du)}, 0, points, winograd_vec4(tiles, tiles));
  const std::uint32_t n_splits = std::uint32_t(splits);
  b.launch(gk, row_step_dispatch(b, gk, per_point, FM_WINOGRAD_WGRAD_OUTPUTS, m, 1),
           {buf(du), buf(gw), bytes(&a, sizeof a), bytes(&n_splits, sizeof n_splits)});
}


}  // namespace fm::conv2d_winograd
