#include "ops/conv2d_gemm.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <limits>
#include <optional>

#include "backend/env_config.h"
#include "ops/array_arg.h"
#include "ops/conv2d_shared.h"
#include "ops/reduce.h"

namespace fm {
namespace {
// The threads per group the tests force on conv2d's kernels (0: each launch's own choice).
std::atomic<std::uint32_t> g_group_size{0};
}  // namespace

void set_conv_group_size(std::uint32_t threads) { g_group_size.store(threads); }
std::uint32_t conv_group_size() { return g_group_size.load(); }

namespace conv2d_gemm {

using conv2d_shared::kMaxIndex;

std::uint32_t ceil_div(std::int64_t a, std::int64_t b) { return std::uint32_t((a + b - 1) / b); }

std::uint32_t group_threads(Backend& b, const std::string& kernel, std::uint64_t groups_along_x,
                            std::uint32_t preferred) {
  std::uint32_t t = g_group_size.load();
  if (t == 0) t = preferred;
  t = std::max<std::uint32_t>(1, std::min(t, b.max_group_size(kernel)));
  while (t > 1 && groups_along_x * t > std::numeric_limits<std::uint32_t>::max()) t /= 2;
  return t;
}

// ---- GEMM tile choice (the GPU side; docs/gpu_kernels.md says why these shapes)

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
                 std::int64_t batches, bool vec4) {
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
// (enum class Fill, conv2d_gemm.h)

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

}  // namespace conv2d_gemm
}  // namespace fm
