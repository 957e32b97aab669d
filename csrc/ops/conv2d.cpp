#include "ops/conv2d.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <vector>

#include "backend/env_config.h"
#include "backend/native_ops.h"
#include "core/errors.h"
#include "ops/array_arg.h"
#include "ops/conv2d_shared.h"
#include "ops/reduce.h"
#include "ops/convert.h"

namespace fm {
namespace {

using conv2d_shared::direct_dispatch;
using conv2d_shared::kMaxIndex;
using conv2d_shared::pair_str;

std::atomic<std::uint32_t> g_group_size{0};

// ---- small helpers for the kernel path ----

std::uint32_t ceil_div(std::int64_t a, std::int64_t b) { return std::uint32_t((a + b - 1) / b); }

// Threads per group for a kernel with barriers: the test override, else `preferred` (256:
// the virtual threads of the GEMM tiles), never more than the pipeline allows, and few enough
// that `groups_along_x * threads` fits a 32-bit grid.
std::uint32_t group_threads(Backend& b, const std::string& kernel, std::uint64_t groups_along_x,
                            std::uint32_t preferred = 256) {
  std::uint32_t t = g_group_size.load();
  if (t == 0) t = preferred;
  t = std::max<std::uint32_t>(1, std::min(t, b.max_group_size(kernel)));
  while (t > 1 && groups_along_x * t > std::numeric_limits<std::uint32_t>::max()) t /= 2;
  return t;
}

KernelArg bytes(const void* p, std::size_t n) { return KernelArg::inline_bytes(p, n); }

// A backend's own conv2d (native_ops.h), asked for by these names; without one the MSL
// kernels below run.
using NativeForward = void(const Conv2dArgs&, const Array& x, const Array& w, const Array* bias,
                           const Array& y);
using NativeBackwardInput = void(const Conv2dArgs&, const Array& gy, const Array& w,
                                 const Array& gx);
using NativeBackwardWeight = void(const Conv2dArgs&, const Array& gy, const Array& x,
                                  const Array& gw);
using NativeBackwardBias = void(const Conv2dArgs&, const Array& gy, const Array& gb);

// ---- GEMM tile choice (the GPU side; docs/gpu_kernels.md says why these shapes)

struct GemmTile {
  const char* suffix;   // kernel name suffix
  int rows, cols;       // C tile (BM x BN)
  int depth;            // K slice (BK)
  std::uint32_t threads;  // virtual threads: one per thread is the fast path
};
constexpr GemmTile kTiles[] = {
    {"_128x128", 128, 128, 8, 256},
    {"_64x128", 64, 128, 8, 128},
    {"_64x64", 64, 64, 16, 128},
    {"_32x64", 32, 64, 16, 128},
};
constexpr int kTile128x128 = 0, kTile64x128 = 1, kTile64x64 = 2, kTile32x64 = 3;

// Groups that keep a large GPU busy (an H100 has 132 multiprocessors, each holding two or
// more of these groups); below it the host takes a smaller tile or splits K.
constexpr std::int64_t kFillGroups = 264;

std::int64_t tile_count(const GemmTile& t, std::int64_t rows, std::int64_t cols, std::int64_t groups) {
  return ((rows + t.rows - 1) / t.rows) * ((cols + t.cols - 1) / t.cols) * groups;
}

// Test and tuning hook: FASTMETAL_CONV_TILE=128x128|64x128|64x64|32x64 forces a tile.
int forced_tile() {
  const std::string tile = env::conv_tile();
  if (tile.empty()) return -1;
  for (int i = 0; i < int(std::size(kTiles)); ++i)
    if ("_" + tile == kTiles[i].suffix) return i;
  return -1;
}

// The kernel shapes, tiles, Winograd and split-K choices measured on a discrete GPU (an
// H100), or else those for unified memory.
bool discrete_shapes(const Backend& b) {
  return b.preferred_tiles() == Backend::TileFamily::discrete_gpu;
}

// Two families, told apart by Backend::preferred_tiles(), not by a backend's name: devices
// that share the host's memory (Apple's GPUs; also the CPU, which runs these kernels only in
// tests) get MLX's Apple shapes, 64x64 (32x64 for at most 32 rows), 128 threads. Discrete GPUs
// (measured on an H100, BENCHMARKS.md) get 128x128 where the product has more than 64 rows
// and that still gives a quarter of kFillGroups groups, else 64x128; 32x64 for at most 32
// rows. docs/gpu_kernels.md says why.
const GemmTile& choose_tile(Backend& b, std::int64_t rows, std::int64_t cols, std::int64_t groups) {
  const int forced = forced_tile();
  if (forced >= 0) return kTiles[forced];
  if (rows <= 32) return kTiles[kTile32x64];
  if (!discrete_shapes(b)) return kTiles[kTile64x64];
  if (rows > 64 && tile_count(kTiles[kTile128x128], rows, cols, groups) >= kFillGroups / 4)
    return kTiles[kTile128x128];
  return kTiles[kTile64x128];
}

// Threads per group for the GEMM: the test override, else the tile's virtual threads.
std::uint32_t gemm_threads(Backend& b, const std::string& kernel, const GemmTile& t,
                           std::uint64_t groups_along_x) {
  std::uint32_t n = g_group_size.load();
  if (n == 0) n = t.threads;
  n = std::max<std::uint32_t>(1, std::min(n, b.max_group_size(kernel)));
  while (n > 1 && groups_along_x * n > std::numeric_limits<std::uint32_t>::max()) n /= 2;
  return n;
}

// Grid z = batches * splits: `batches` products side by side (the groups, or Winograd's
// 16 transform points), each split into `splits` K ranges. `vec4`: the tile's variant with
// 16-byte operand loads (the Winograd products, where winograd_vec4 allows it).
void launch_gemm(Backend& b, const char* base, const GemmTile& tile, const Conv2dArgs& a,
                 std::int64_t rows, std::int64_t cols, std::int64_t splits,
                 const std::vector<KernelArg>& buffers, std::uint32_t flags,
                 std::int64_t batches, bool vec4 = false) {
  const std::string kernel = std::string(base) + tile.suffix + (vec4 ? "_vec4" : "");
  const std::uint64_t col_tiles = ceil_div(cols, tile.cols);
  const std::uint32_t t = gemm_threads(b, kernel, tile, col_tiles);
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = std::uint32_t(col_tiles * t);
  d.grid[1] = ceil_div(rows, tile.rows);
  d.grid[2] = std::uint32_t(batches * splits);
  std::vector<KernelArg> args = buffers;
  args.push_back(bytes(&a, sizeof a));
  args.push_back(bytes(&flags, sizeof flags));
  b.launch(kernel, d, args);
}

void launch_reduce(Backend& b, const std::string& kernel, const Conv2dArgs& a,
                   std::int64_t outputs, const Array& gy, const Array& x, const Array& out) {
  const std::uint32_t t = group_threads(b, kernel, std::uint64_t(outputs));
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = std::uint32_t(std::uint64_t(outputs) * t);
  b.launch(kernel, d, {buf(gy), buf(x), buf(out), bytes(&a, sizeof a)});
}

// out = the sum of the `splits` slices of ws (n elements each), in a fixed order.
void sum_splits(Backend& b, const Array& ws, const Array& out, std::int64_t splits) {
  const std::uint32_t n = std::uint32_t(out.size()), n_splits = std::uint32_t(splits);
  const std::string sum = "conv2d_sum_splits";
  Dispatch d;
  d.grid[0] = n;
  d.group[0] = std::uint32_t(std::min<std::int64_t>(b.preferred_group_size(sum), n));
  b.launch(sum, d, {buf(ws), buf(out), bytes(&n, sizeof n), bytes(&n_splits, sizeof n_splits)});
}

// A gradient's GEMM (operands lhs and rhs as the kernel reads them) into `out`; with K split
// into `splits` ranges, each writes its slice of a workspace and sum_splits adds them.
void launch_split_gemm(Backend& b, const char* base, const GemmTile& tile, const Conv2dArgs& a,
                       std::int64_t rows, std::int64_t cols, std::int64_t splits,
                       const Array& lhs, const Array& rhs, const Array& out) {
  if (splits == 1) {
    launch_gemm(b, base, tile, a, rows, cols, 1, {buf(lhs), buf(rhs), buf(lhs), buf(out)}, 0,
                a.groups);
    return;
  }
  Array ws = Array::empty(b, {splits, out.size()}, DType::float32);
  launch_gemm(b, base, tile, a, rows, cols, splits, {buf(lhs), buf(rhs), buf(lhs), buf(ws)}, 0,
              a.groups);
  sum_splits(b, ws, out, splits);
}

// How a split count relates to a `fill` of groups: at least `fill` groups (rounding up), at
// most (rounding down: for a fill that is the number of groups the GPU holds at once, so no
// second, mostly empty wave follows), or at most unless that fills less than two thirds of
// `fill`, then one split more (the few groups of a second wave cost less than a third of
// the GPU idling through the first).
enum class Fill { at_least, at_most, two_thirds };

// Tuning hook: FASTMETAL_CONV_SPLITS=N forces the gradients' split count, none where it is
// unset or empty.
std::optional<std::int64_t> forced_splits() { return env::conv_splits(); }

// The gradients' K splits: the output is small and K long, so split K until there are about
// `fill` groups, keeping at least 8 slices of K per split; every split owns at least one
// slice (the kernel rounds slices per split up). `out_size` elements per split must stay
// indexable. FASTMETAL_CONV_SPLITS=N forces N (tuning hook).
std::int64_t split_count(const GemmTile& tile, std::int64_t tiles, std::int64_t depth,
                         std::int64_t out_size, std::int64_t fill, Fill how) {
  const std::int64_t slices = (depth + tile.depth - 1) / tile.depth;
  std::int64_t per_fill = how == Fill::at_least ? (fill + tiles - 1) / tiles : fill / tiles;
  if (how == Fill::two_thirds && 3 * per_fill * tiles < 2 * fill) ++per_fill;
  std::int64_t splits = std::min<std::int64_t>({per_fill, slices / 8,
                                                128, kMaxIndex / out_size});
  if (const std::optional<std::int64_t> forced = forced_splits())
    splits = std::min<std::int64_t>(*forced, kMaxIndex / out_size);
  splits = std::max<std::int64_t>(splits, 1);
  const std::int64_t per_split = (slices + splits - 1) / splits;
  return (slices + per_split - 1) / per_split;
}

// Groups of a tile's threads that one wave holds on a large GPU (kFillGroups of 256 threads,
// twice as many of 128).
std::int64_t wave_groups(const GemmTile& tile) { return kFillGroups * 256 / tile.threads; }

// The input gradient's K splits: only where its tiles fill less than half of one wave of
// groups (kFillGroups groups of 256 threads, twice as many of 128) and K is long (a 1x1
// layer expanding to many channels: ResNet-50's 256 -> 1024 at 14x14 has 98 tiles of
// 128x128 and K = 1024); then as many splits as fit that wave. Discrete GPUs only (measured
// on an H100, BENCHMARKS.md); FASTMETAL_CONV_SPLITS forces a count on any device.
std::int64_t input_grad_splits(Backend& b, const Conv2dArgs& a, const GemmTile& tile,
                               std::int64_t tiles, std::int64_t out_size) {
  const std::int64_t depth = std::int64_t(a.C_out / a.groups) * a.kH * a.kW;
  const std::int64_t wave = wave_groups(tile);
  if (!forced_splits() && (!discrete_shapes(b) || 2 * tiles > wave)) return 1;
  return split_count(tile, tiles, depth, out_size, wave, Fill::at_most);
}

// ---- Winograd F(m x m, 3x3), m = 2 or 4 (metal/conv_winograd.metal; docs/gpu_kernels.md
// says why and where). Three launches: the weight and input transforms (one grid), the
// (m+2)^2 GEMMs (one launch), the output transform; the transformed tensors are pool
// buffers that live until the launches that read them have run (the backend keeps them
// alive; nothing here waits).

// Stride 1, dilation 1, 3x3, one group: the shapes F(m x m, 3x3) computes.
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

enum class ConvPass { forward, input_grad, weight_grad };

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

// A weight gradient with `cols` <= FM_CONV_NARROW_COLS weights per output channel (a first
// layer): per-chunk sums of every weight (conv2d_backward_weight_narrow), then each weight's
// chunks as one row of reduce.metal's sum; the bias gradient (gb not null) from the same
// pass over gy. MNIST conv1 on an H100: 17.6 us, where the GEMM took 21.3 us plus 5.9 us of
// split-K sums, and its bias 7.7 us of chunk sums.
void narrow_backward_weight(Backend& b, const Conv2dArgs& a, std::int64_t cols, const Array& gy,
                            const Array& x, const Array& gw, const Array* gb) {
  const std::string k = std::string("conv2d_backward_weight_narrow") +
                        (cols <= 4 ? "4" : cols <= 9 ? "9" : "16");
  constexpr std::int64_t per = FM_CONV_NARROW_RUNS * FM_CONV_NARROW_RUN;
  const std::int64_t depth = std::int64_t(a.N) * a.H_out * a.W_out;
  const std::int64_t chunks = (depth + per - 1) / per;
  const std::uint32_t t = group_threads(b, k, std::uint64_t(chunks),
                                        FM_CONV_NARROW_RUNS * FM_CONV_NARROW_LANES);
  Array ws = Array::empty(b, {gw.size(), chunks}, DType::float32);
  const std::optional<Array> wsb =
      gb ? std::optional<Array>(Array::empty(b, {a.C_out, chunks}, DType::float32)) : std::nullopt;
  const std::uint32_t flags = gb ? FM_CONV_BIAS : 0u;
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = std::uint32_t(chunks * t);
  d.grid[1] = std::uint32_t((a.C_out + FM_CONV_NARROW_LANES - 1) / FM_CONV_NARROW_LANES);
  b.launch(k, d, {buf(gy), buf(x), buf(ws), buf(wsb ? *wsb : ws), bytes(&a, sizeof a),
                  bytes(&flags, sizeof flags)});
  sum_rows_into(ws, gw.size(), chunks, 1, gw);
  if (gb) sum_rows_into(*wsb, a.C_out, chunks, 1, *gb);
}

}  // namespace

// ---------------------------------------------------------------- switches

void set_conv_group_size(std::uint32_t threads) { g_group_size.store(threads); }
std::uint32_t conv_group_size() { return g_group_size.load(); }

// ---------------------------------------------------------------- validation

void conv2d_check_spec(const std::string& op, const Conv2dSpec& s) {
  if (s.stride[0] < 1 || s.stride[1] < 1 || s.stride[0] > kMaxIndex || s.stride[1] > kMaxIndex)
    throw ValueError(message(op, "expected stride to be positive (at most 2**31-1), got ",
                             pair_str(s.stride[0], s.stride[1])));
  if (s.dilation[0] < 1 || s.dilation[1] < 1 || s.dilation[0] > kMaxIndex ||
      s.dilation[1] > kMaxIndex)
    throw ValueError(message(op, "expected dilation to be positive (at most 2**31-1), got ",
                             pair_str(s.dilation[0], s.dilation[1])));
  if (s.padding_mode == Conv2dPadding::explicit_ &&
      (s.padding[0] < 0 || s.padding[1] < 0 || s.padding[0] > kMaxIndex ||
       s.padding[1] > kMaxIndex))
    throw ValueError(message(op, "expected padding to be non-negative (at most 2**31-1), got ",
                             pair_str(s.padding[0], s.padding[1])));
  if (s.groups < 1 || s.groups > kMaxIndex)
    throw ValueError(message(op, "expected groups to be a positive int, got ", s.groups));
  if (s.padding_mode == Conv2dPadding::same && (s.stride[0] != 1 || s.stride[1] != 1))
    throw ValueError(message(op,
                             "expected stride 1 with padding='same' (as PyTorch, 'same' is not "
                             "supported for strided convolutions), got stride ",
                             pair_str(s.stride[0], s.stride[1])));
}

Conv2dArgs conv2d_resolve(const std::string& op, const Shape& input, const Shape& weight,
                          const Shape* bias, const Conv2dSpec& s) {
  if (input.size() != 4 && input.size() != 3)
    throw ValueError(message(op,
                             "expected a 4-D input (N, C, H, W) or a 3-D unbatched input "
                             "(C, H, W), got shape ",
                             shape_str(input)));
  if (weight.size() != 4)
    throw ValueError(message(op, "expected a 4-D weight (C_out, C_in/groups, kH, kW), got shape ",
                             shape_str(weight)));
  const bool batched = input.size() == 4;
  const std::int64_t N = batched ? input[0] : 1;
  const std::int64_t C = input[batched ? 1 : 0], H = input[batched ? 2 : 1],
                     W = input[batched ? 3 : 2];
  const std::int64_t C_out = weight[0], cin_g = weight[1], kH = weight[2], kW = weight[3];
  const std::int64_t G = s.groups;
  if (C_out < 1 || cin_g < 1 || kH < 1 || kW < 1)
    throw ValueError(message(op,
                             "expected a weight (C_out, C_in/groups, kH, kW) with every "
                             "dimension at least 1, got shape ",
                             shape_str(weight)));
  if (C < 1)
    throw ValueError(message(op, "expected an input with at least 1 channel, got shape ",
                             shape_str(input)));
  if (C % G != 0)
    throw ValueError(message(op, "expected the input channels (C_in = ", C,
                             ") to be divisible by groups = ", G, ", got input shape ",
                             shape_str(input)));
  if (C_out % G != 0)
    throw ValueError(message(op, "expected the weight's output channels (weight.shape[0] = ",
                             C_out, ") to be divisible by groups = ", G, ", got weight shape ",
                             shape_str(weight)));
  if (cin_g * G != C)
    throw ValueError(message(op, "expected an input with weight.shape[1] * groups = ", cin_g,
                             " * ", G, " = ", cin_g * G, " channels, got ", C,
                             " channels (input shape ", shape_str(input), ", weight shape ",
                             shape_str(weight), ")"));
  if (H < 1 || W < 1)
    throw ValueError(message(op, "expected an input with non-zero height and width, got shape ",
                             shape_str(input)));
  if (bias != nullptr && (bias->size() != 1 || (*bias)[0] != C_out))
    throw ValueError(message(op, "expected a bias of shape (C_out,) = (", C_out,
                             ",), got shape ", shape_str(*bias)));

  // Padding per axis: top/left, and the total.
  std::int64_t pad_top[2], pad_total[2];
  const std::int64_t k[2] = {kH, kW}, in[2] = {H, W};
  for (int d = 0; d < 2; ++d) {
    const std::int64_t span = s.dilation[d] * (k[d] - 1);  // dilated kernel extent - 1
    if (span > kMaxIndex)
      throw ValueError(message(op, "expected a dilated kernel that fits 32-bit indices, got "
                                   "kernel ", pair_str(kH, kW), " with dilation ",
                               pair_str(s.dilation[0], s.dilation[1])));
    switch (s.padding_mode) {
      case Conv2dPadding::explicit_:
        pad_top[d] = s.padding[d];
        pad_total[d] = 2 * s.padding[d];
        break;
      case Conv2dPadding::valid:
        pad_top[d] = pad_total[d] = 0;
        break;
      case Conv2dPadding::same:
        pad_total[d] = span;
        pad_top[d] = span / 2;
        break;
    }
  }
  for (int d = 0; d < 2; ++d) {  // after the loop above: the message prints both axes
    if (in[d] + pad_total[d] > kMaxIndex)
      throw ValueError(message(op, "expected the padded input to fit 32-bit indices, got input ",
                               "shape ", shape_str(input), " with padding ",
                               pair_str(pad_total[0] / 2, pad_total[1] / 2)));
  }
  std::int64_t out[2];
  for (int d = 0; d < 2; ++d) {
    const std::int64_t room = in[d] + pad_total[d] - s.dilation[d] * (k[d] - 1) - 1;
    if (room < 0) {
      throw ValueError(message(
          op, "expected the padded input (", H + pad_total[0], " x ", W + pad_total[1],
          ") to be at least as large as the dilated kernel (", s.dilation[0] * (kH - 1) + 1,
          " x ", s.dilation[1] * (kW - 1) + 1, "), got input shape ", shape_str(input),
          ", weight shape ", shape_str(weight), ", dilation ",
          pair_str(s.dilation[0], s.dilation[1])));
    }
    out[d] = room / s.stride[d] + 1;
  }
  const Shape out_shape = {N, C_out, out[0], out[1]};
  for (const Shape* t : {&input, &weight, &out_shape})
    if (numel(*t) > kMaxIndex)
      throw ValueError(message(op, "expected tensors of fewer than 2**31 elements (the kernels "
                                   "index with 32 bits), got shape ",
                               shape_str(*t)));

  Conv2dArgs a{};
  a.N = std::int32_t(N);
  a.C_in = std::int32_t(C);
  a.H = std::int32_t(H);
  a.W = std::int32_t(W);
  a.C_out = std::int32_t(C_out);
  a.kH = std::int32_t(kH);
  a.kW = std::int32_t(kW);
  a.groups = std::int32_t(G);
  a.H_out = std::int32_t(out[0]);
  a.W_out = std::int32_t(out[1]);
  a.stride_h = std::int32_t(s.stride[0]);
  a.stride_w = std::int32_t(s.stride[1]);
  a.pad_h = std::int32_t(pad_top[0]);
  a.pad_w = std::int32_t(pad_top[1]);
  a.dil_h = std::int32_t(s.dilation[0]);
  a.dil_w = std::int32_t(s.dilation[1]);
  return a;
}

Shape conv2d_output_shape(const Conv2dArgs& a, bool batched) {
  if (batched) return {a.N, a.C_out, a.H_out, a.W_out};
  return {a.C_out, a.H_out, a.W_out};
}

// ---------------------------------------------------------------- compute

void conv2d_forward(const Conv2dArgs& a, const Array& x, const Array& w, const Array* bias,
                    const Array& y) {
  if (y.size() == 0) return;
  Backend& b = y.backend();
  if (auto fast = native<NativeForward>(b, "conv2d_forward")) return fast(a, x, w, bias, y);
  const std::uint32_t flags = bias ? FM_CONV_BIAS : 0u;
  // Without a bias the kernel never reads buffer(2); bind any valid buffer there.
  const KernelArg bias_arg = bias ? buf(*bias) : buf(w);
  const std::int64_t cout_g = a.C_out / a.groups;
  if (cout_g <= 4) {
    // Few output channels per group (depthwise): a GEMM tile would be mostly idle rows.
    // (Not for a short K: MNIST conv1 took 28.2 us here on an H100, one load at a time per
    // thread, against the 32x64 GEMM's 11.1 us.)
    const std::string k = "conv2d_forward_direct";
    b.launch(k, direct_dispatch(b, k, std::int64_t(a.H_out) * a.W_out, a.C_out, a.N),
             {buf(x), buf(w), bias_arg, buf(y), bytes(&a, sizeof a), bytes(&flags, sizeof flags)});
    return;
  }
  if (const int m = winograd_choice(b, a, ConvPass::forward))
    return winograd_forward(b, m, a, x, w, bias_arg, flags, false, y);
  const std::int64_t cols = std::int64_t(a.N) * a.H_out * a.W_out;
  launch_gemm(b, "conv2d_forward", choose_tile(b, cout_g, cols, a.groups), a, cout_g, cols, 1,
              {buf(w), buf(x), bias_arg, buf(y)}, flags, a.groups);
}

void conv2d_backward_input(const Conv2dArgs& a, const Array& gy, const Array& w,
                           const Array& gx) {
  if (gx.size() == 0) return;
  Backend& b = gx.backend();
  if (auto fast = native<NativeBackwardInput>(b, "conv2d_backward_input"))
    return fast(a, gy, w, gx);
  const std::int64_t cin_g = a.C_in / a.groups;
  if (cin_g <= 4) {
    const std::string k = "conv2d_backward_input_direct";
    b.launch(k, direct_dispatch(b, k, std::int64_t(a.H) * a.W, a.C_in, a.N),
             {buf(gy), buf(w), buf(gx), bytes(&a, sizeof a)});
    return;
  }
  if (a.N > 0 && winograd_shape(a)) {
    const Conv2dArgs e = input_gradient_as_forward(a);
    if (const int m = winograd_choice(b, e, ConvPass::input_grad))
      return winograd_forward(b, m, e, gy, w, buf(w), 0, true, gx);
  }
  const std::int64_t cols = std::int64_t(a.N) * a.H * a.W;
  const GemmTile& tile = choose_tile(b, cin_g, cols, a.groups);
  const std::int64_t splits = input_grad_splits(b, a, tile, tile_count(tile, cin_g, cols, a.groups),
                                                gx.size());
  launch_split_gemm(b, "conv2d_backward_input", tile, a, cin_g, cols, splits, w, gy, gx);
}

bool conv2d_backward_weight(const Conv2dArgs& a, const Array& gy, const Array& x,
                            const Array& gw, const Array* gb) {
  if (a.N == 0) {
    fill_zero(gw);
    return false;
  }
  Backend& b = gw.backend();
  if (auto fast = native<NativeBackwardWeight>(b, "conv2d_backward_weight")) {
    fast(a, gy, x, gw);
    return false;
  }
  const std::int64_t cout_g = a.C_out / a.groups, cin_g = a.C_in / a.groups;
  if (cout_g * cin_g <= 4) {
    // Depthwise: a few weights per group, each a long dot product -> one group per weight.
    launch_reduce(b, "conv2d_backward_weight_reduce", a, gw.size(), gy, x, gw);
    return false;
  }
  const std::int64_t cols = cin_g * a.kH * a.kW;
  // (FASTMETAL_CONV_TILE, the tile tuning hook, forces the GEMM: an A/B switch.)
  if (cols <= FM_CONV_NARROW_COLS && forced_tile() < 0) {
    narrow_backward_weight(b, a, cols, gy, x, gw, gb);
    return gb != nullptr;
  }
  if (const int m = winograd_choice(b, a, ConvPass::weight_grad)) {
    winograd_backward_weight(b, m, a, gy, x, gw);
    return false;
  }
  const std::int64_t depth = std::int64_t(a.N) * a.H_out * a.W_out;
  // Split-K fills the GPU whatever the tile count, so discrete GPUs take the 128x128 tile
  // wherever the product has more than 64 rows (measured on an H100, ResNet-50's 1x1
  // 256 -> 1024 at 14x14: 25.1 TFLOP/s against 17.0 on 64x128, 17 splits), and split
  // until there is at least one wave of the tile's groups (MNIST conv2, 3 tiles of 64x128:
  // 128 splits 0.085 ms, 88 splits, half a wave, 0.093 ms; tools/sweeps/conv_wgrad_sweep.py on an
  // H100, BENCHMARKS.md). Other devices keep kFillGroups groups (not measured there).
  const bool discrete = forced_tile() < 0 && discrete_shapes(b);
  const GemmTile& tile = discrete && cout_g > 64 ? kTiles[kTile128x128]
                                                 : choose_tile(b, cout_g, cols, a.groups);
  const std::int64_t splits = split_count(tile, tile_count(tile, cout_g, cols, a.groups), depth,
                                          gw.size(), discrete ? wave_groups(tile) : kFillGroups,
                                          Fill::at_least);
  launch_split_gemm(b, "conv2d_backward_weight", tile, a, cout_g, cols, splits, gy, x, gw);
  return false;
}

void conv2d_backward_bias(const Conv2dArgs& a, const Array& gy, const Array& gb) {
  if (a.N == 0) return fill_zero(gb);
  Backend& b = gb.backend();
  if (auto fast = native<NativeBackwardBias>(b, "conv2d_backward_bias")) return fast(a, gy, gb);
  const std::int64_t hw = std::int64_t(a.H_out) * a.W_out;
  if (a.N == 1) return sum_rows_into(gy, a.C_out, hw, 1, gb);  // one image: already rows
  // One pass of per-channel chunk sums (metal/conv2d.metal's conv2d_bias_grad_chunks), then
  // each channel's chunks as one row of reduce.metal's compensated sum.
  const std::string k = "conv2d_bias_grad_chunks";
  const std::uint32_t t = group_threads(b, k, 1, 128);
  const std::int64_t per = std::int64_t(t) * 8;
  const std::int64_t chunks = (std::int64_t(a.N) * hw + per - 1) / per;
  Array ws = Array::empty(b, {a.C_out, chunks}, DType::float32);
  const std::uint32_t per32 = std::uint32_t(per);
  Dispatch d;
  d.group[0] = t;
  d.grid[0] = std::uint32_t(chunks * t);
  d.grid[1] = std::uint32_t(a.C_out);
  b.launch(k, d, {buf(gy), buf(ws), bytes(&a, sizeof a), bytes(&per32, sizeof per32)});
  sum_rows_into(ws, a.C_out, chunks, 1, gb);
}

}  // namespace fm
