// conv2d's GEMM launches on the MSL kernels (metal/conv2d.metal, metal/conv_gemm.h): the tile
// choice, the split-K choice, the launches, and the narrow weight gradient of first layers.
// What conv2d.cpp (the op) and conv2d_winograd.cpp (whose products are these GEMMs) share;
// docs/gpu_kernels.md says why these shapes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/array.h"
#include "ops/conv2d.h"

namespace fm::conv2d_gemm {

std::uint32_t ceil_div(std::int64_t a, std::int64_t b);
// Threads per group for a kernel with barriers: the test override (set_conv_group_size),
// else `preferred`, never more than the pipeline allows, and few enough that
// `groups_along_x * threads` fits a 32-bit grid.
std::uint32_t group_threads(Backend& b, const std::string& kernel, std::uint64_t groups_along_x,
                            std::uint32_t preferred = 256);
inline KernelArg bytes(const void* p, std::size_t n) { return KernelArg::inline_bytes(p, n); }

struct GemmTile {
  const char* suffix;   // kernel name suffix
  int rows, cols;       // C tile (BM x BN)
  int depth;            // K slice (BK)
  std::uint32_t threads;  // virtual threads: one per thread is the fast path
};
inline constexpr GemmTile kTiles[] = {
    {"_128x128", 128, 128, 8, 256},
    {"_64x128", 64, 128, 8, 128},
    {"_64x64", 64, 64, 16, 128},
    {"_32x64", 32, 64, 16, 128},
};
inline constexpr int kTile128x128 = 0, kTile64x128 = 1, kTile64x64 = 2, kTile32x64 = 3;

// Groups that keep a large GPU busy (an H100 has 132 multiprocessors, each holding two or
// more of these groups); below it the host takes a smaller tile or splits K.
inline constexpr std::int64_t kFillGroups = 264;

std::int64_t tile_count(const GemmTile& t, std::int64_t rows, std::int64_t cols, std::int64_t groups);
// FASTMETAL_CONV_TILE's tile (an index into kTiles), -1 where unset.
int forced_tile();
// The kernel shapes, tiles, Winograd and split-K choices measured on a discrete GPU (an
// H100), or else those for unified memory.
bool discrete_shapes(const Backend& b);
const GemmTile& choose_tile(Backend& b, std::int64_t rows, std::int64_t cols, std::int64_t groups);
void launch_gemm(Backend& b, const char* base, const GemmTile& tile, const Conv2dArgs& a,
                 std::int64_t rows, std::int64_t cols, std::int64_t splits,
                 const std::vector<KernelArg>& buffers, std::uint32_t flags,
                 std::int64_t batches, bool vec4 = false);
void launch_reduce(Backend& b, const std::string& kernel, const Conv2dArgs& a,
                   std::int64_t outputs, const Array& gy, const Array& x, const Array& out);
void launch_split_gemm(Backend& b, const char* base, const GemmTile& tile, const Conv2dArgs& a,
                       std::int64_t rows, std::int64_t cols, std::int64_t splits,
                       const Array& lhs, const Array& rhs, const Array& out);

enum class Fill { at_least, at_most, two_thirds };
std::int64_t split_count(const GemmTile& tile, std::int64_t tiles, std::int64_t depth,
                         std::int64_t out_size, std::int64_t fill, Fill how);
std::int64_t wave_groups(const GemmTile& tile);
std::int64_t input_grad_splits(Backend& b, const Conv2dArgs& a, const GemmTile& tile,
                               std::int64_t tiles, std::int64_t out_size);
void narrow_backward_weight(Backend& b, const Conv2dArgs& a, std::int64_t cols, const Array& gy,
                            const Array& x, const Array& gw, const Array* gb);

}  // namespace fm::conv2d_gemm
