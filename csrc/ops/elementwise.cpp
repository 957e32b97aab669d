#include "ops/elementwise.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <limits>

#include "core/errors.h"
#include "elementwise_args.h"
#include "backend/backend.h"
#include "backend/env_config.h"
#include "ops/array_arg.h"
#include "ops/convert.h"

namespace fm {
namespace {

std::atomic<bool> g_wide_everywhere{false};

constexpr std::int64_t kMaxGrid = std::numeric_limits<std::uint32_t>::max();

bool all_zero(const Strides& s) {
  for (auto v : s)
    if (v != 0) return false;
  return true;
}
bool unit(const Strides& s) { return s.size() == 1 && s[0] == 1; }

// The 16-byte-chunk kernels (*_w, *_rw) exist for float32 and float16 only (float64 has
// the one-element layouts: tools/gen/gen_kernels.py).
bool has_wide_kernels(DType t) { return t == DType::float32 || t == DType::float16; }

std::string kernel_name(const char* kind, const char* layout, const std::string& op, DType t) {
  std::string name;
  name.reserve(64);  // one allocation: this runs on every call
  name.append(kind).append("_").append(layout).append("_").append(op).append("_").append(dtype_name(t));
  return name;
}

// 1-D launch over n contiguous elements, in pieces if n does not fit a 32-bit grid.
void launch_contiguous(Backend& be, const std::string& kernel, std::vector<KernelArg> args,
                       std::vector<std::size_t> advance_bytes, std::int64_t n) {
  const std::uint32_t group = be.preferred_group_size(kernel);
  for (std::int64_t done = 0; done < n; done += kMaxGrid) {
    const std::int64_t count = std::min(kMaxGrid, n - done);
    Dispatch d;
    d.grid[0] = std::uint32_t(count);
    d.group[0] = group;
    be.launch(kernel, d, args);
    for (std::size_t i = 0; i < args.size(); ++i) args[i].offset += advance_bytes[i] * count;
  }
}

// Whether a buffer argument's address is a multiple of FM_WIDE_BYTES. Device-only
// storage (no host pointer) comes from the pool, page-aligned.
bool wide_aligned(const KernelArg& a) {
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(a.storage->host);
  return (base + a.offset) % FM_WIDE_BYTES == 0;
}

// Threads of a *_w launch over `chunks` 16-byte chunks. Each thread takes every G-th chunk
// (G = the threads launched), FM_WIDE_CHUNKS at a time. By default G = chunks /
// FM_WIDE_CHUNKS: every thread does one such step. FASTMETAL_ELEMENTWISE_GRID (a tuning
// hook, read on every call) overrides it: an integer J gives chunks / J threads (J chunks a
// thread), "device" as many threads as the device runs at once (Backend::resident_threads,
// where it knows; a grid-stride loop over the whole array).
std::int64_t wide_threads(const Backend& be, std::int64_t chunks) {
  std::int64_t per_thread = FM_WIDE_CHUNKS;
  if (const std::int64_t grid = env::elementwise_grid(); grid == env::kGridDevice) {
    if (const std::int64_t resident = be.resident_threads(); resident > 0)
      return std::max<std::int64_t>(1, std::min(resident, (chunks + FM_WIDE_CHUNKS - 1) / FM_WIDE_CHUNKS));
  } else if (grid > 0) {
    per_thread = grid;
  }
  return std::max<std::int64_t>(1, (chunks + per_thread - 1) / per_thread);
}

// Contiguous launch that GPU devices run in 16-byte chunks (the *_w kernels: wide accesses
// and several loads in flight per thread are what reach memory bandwidth there), when every
// operand is aligned to the chunk; the elements past the last whole chunk, and backends
// without wide_elementwise(), take the one-element kernel.
void launch_contiguous_vec(Backend& be, const char* kind, const std::string& op, DType t,
                           std::vector<KernelArg> args, std::vector<std::size_t> advance_bytes,
                           std::int64_t n) {
  const std::int64_t lanes = FM_WIDE_BYTES / std::int64_t(itemsize(t));
  bool wide = n >= lanes && has_wide_kernels(t) && (be.wide_elementwise() || g_wide_everywhere.load());
  for (const KernelArg& a : args) wide = wide && wide_aligned(a);
  if (wide) {
    // In pieces of at most 2^31 chunks, so that the kernels' 32-bit chunk indices (up to
    // chunks + FM_WIDE_CHUNKS * threads) cannot wrap.
    const std::int64_t chunks = n / lanes;
    const std::string kernel = kernel_name(kind, "w", op, t);
    const std::uint32_t group = be.preferred_group_size(kernel);
    constexpr std::int64_t kMaxPiece = std::int64_t(1) << 31;
    for (std::int64_t done = 0; done < chunks; done += kMaxPiece) {
      const std::uint32_t count = std::uint32_t(std::min(kMaxPiece, chunks - done));
      std::vector<KernelArg> piece = args;
      for (std::size_t i = 0; i < piece.size(); ++i)
        piece[i].offset += advance_bytes[i] * std::size_t(lanes * done);
      piece.push_back(KernelArg::inline_bytes(&count, sizeof(count)));
      Dispatch d;
      d.grid[0] = std::uint32_t(wide_threads(be, count));
      d.group[0] = group;
      d.cost = std::uint64_t(lanes) * ((count + d.grid[0] - 1) / d.grid[0]);
      be.launch(kernel, d, piece);
    }
    for (std::size_t i = 0; i < args.size(); ++i)
      args[i].offset += advance_bytes[i] * std::size_t(lanes * chunks);
    n -= lanes * chunks;
    if (n == 0) return;
  }
  launch_contiguous(be, kernel_name(kind, "v", op, t), std::move(args), std::move(advance_bytes), n);
}

// Binary op over 2 dims whose last has unit stride everywhere (rows of a broadcast or
// sliced array) in 16-byte chunks (binary_rw), when every row is whole chunks and starts
// aligned in every operand. Returns false (nothing launched) otherwise.
bool launch_rows_wide(Backend& be, const std::string& op, DType t, const std::vector<KernelArg>& args,
                      const Shape& shape, const std::vector<const Strides*>& strides) {
  if (!has_wide_kernels(t) || !(be.wide_elementwise() || g_wide_everywhere.load()) ||
      shape.size() != 2)
    return false;
  const std::int64_t item = std::int64_t(itemsize(t));
  const std::int64_t lanes = FM_WIDE_BYTES / item;
  const std::int64_t rows = shape[0], cols = shape[1];
  // (the kernel forms row indices up to rows + FM_WIDE_ROWS - 1 in 32 bits)
  if (cols % lanes != 0 || cols / lanes > kMaxGrid || rows > kMaxGrid - FM_WIDE_ROWS) return false;
  ChunkRowArgs ra{};
  ra.rows = std::uint32_t(rows);
  for (std::size_t k = 0; k < 3; ++k) {
    const Strides& s = *strides[k];
    if (s[1] != 1 || (s[0] * item) % FM_WIDE_BYTES != 0 || !wide_aligned(args[k])) return false;
    ra.row_stride[k] = s[0] / lanes;
  }
  std::vector<KernelArg> full = args;
  full.push_back(KernelArg::inline_bytes(&ra, sizeof(ra)));
  const std::string kernel = kernel_name("binary", "rw", op, t);
  Dispatch d;
  d.grid[0] = std::uint32_t(cols / lanes);
  d.grid[1] = std::uint32_t((rows + FM_WIDE_ROWS - 1) / FM_WIDE_ROWS);
  d.group[0] = std::min<std::uint32_t>(be.preferred_group_size(kernel), d.grid[0]);
  d.group[1] = std::min<std::uint32_t>(std::max<std::uint32_t>(1, be.preferred_group_size(kernel) / d.group[0]),
                                       d.grid[1]);
  d.cost = std::uint64_t(lanes * FM_WIDE_ROWS);
  be.launch(kernel, d, full);
  return true;
}

// Layout for arrays that are not contiguous: rows with unit stride everywhere (r) or any
// strides (s) when at most 3 dims remain (padded to exactly 3), else general (g).
const char* strided_layout(Shape& shape, const std::vector<Strides*>& strides) {
  if (shape.size() > 3) return "g";
  while (shape.size() < 3) {
    shape.insert(shape.begin(), 1);
    for (Strides* s : strides)
      if (s) s->insert(s->begin(), 0);
  }
  for (Strides* s : strides)
    if (s && s->back() != 1) return "s";
  return "r";
}

void launch_strided(Backend& be, const std::string& kernel, std::vector<KernelArg> args,
                    const Shape& shape, const std::vector<const Strides*>& strides) {
  if (shape.size() > FM_MAX_DIMS)
    throw ValueError("[fastmetal] elementwise ops support at most " +
                     std::to_string(FM_MAX_DIMS) + " non-mergeable dimensions, got " +
                     std::to_string(shape.size()));
  StridedArgs a{};
  a.ndim = std::int32_t(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] > kMaxGrid) throw ValueError("[fastmetal] dimension too large for one launch");
    a.shape[d] = std::int32_t(shape[d]);
    for (std::size_t k = 0; k < 3; ++k) a.strides[k][d] = strides[k] ? (*strides[k])[d] : 0;
  }
  // Metal kernels use 32-bit index math when every offset this launch forms fits.
  std::int64_t widest = 0;
  for (std::size_t k = 0; k < 3; ++k) {
    std::int64_t span = 0;
    for (std::size_t d = 0; d < shape.size(); ++d)
      span += (a.strides[k][d] < 0 ? -a.strides[k][d] : a.strides[k][d]) * (shape[d] - 1);
    widest = std::max(widest, span);
  }
  a.index32 = widest <= std::int64_t(INT32_MAX) ? 1 : 0;
  const std::size_t nd = shape.size();
  std::int64_t rest = 1;
  for (std::size_t d = 0; d + 2 < nd; ++d) rest *= shape[d];
  if (rest > kMaxGrid) throw ValueError("[fastmetal] array too large for one strided launch");
  Dispatch dsp;
  dsp.grid[0] = std::uint32_t(shape[nd - 1]);
  dsp.grid[1] = nd > 1 ? std::uint32_t(shape[nd - 2]) : 1;
  dsp.grid[2] = std::uint32_t(rest);
  dsp.group[0] = std::min<std::uint32_t>(be.preferred_group_size(kernel), dsp.grid[0]);
  args.push_back(KernelArg::inline_bytes(&a, sizeof(a)));
  be.launch(kernel, dsp, args);
}

// Strided launch of any rank. A *_g kernel (more than 3 dims left after merging) divides
// every element's outer index by each extent, tens of cycles an element where grid threads
// run serially (Backend::serial_grid); there, where the outer dims hold few indices and each
// 3-dim block is large, one 3-dim launch per outer index is several times faster (its row
// offsets are hoisted and its rows vectorised). GPUs keep the one *_g launch.
// strides[k] addresses operand k (0, 1, 2 = output; nullptr where absent) through
// args[arg_of[k]].
constexpr std::int64_t kMaxOuterPieces = 256;
constexpr std::int64_t kMinPieceElements = 16384;

void launch_strided_any(Backend& be, const char* kind, const std::string& op, DType t,
                        const std::vector<KernelArg>& args, Shape shape,
                        std::array<Strides*, 3> strides, std::array<int, 3> arg_of) {
  const std::size_t nd = shape.size();
  std::int64_t outer = 1;
  for (std::size_t d = 0; d + 3 < nd; ++d) outer *= shape[d];
  const std::int64_t inner = nd > 3 ? numel(Shape(shape.end() - 3, shape.end())) : 0;
  if (nd <= 3 || !be.serial_grid() || outer > kMaxOuterPieces || inner < kMinPieceElements) {
    const char* layout = strided_layout(shape, {strides[0], strides[1], strides[2]});
    launch_strided(be, kernel_name(kind, layout, op, t), args, shape,
                   {strides[0], strides[1], strides[2]});
    return;
  }
  Shape block(shape.end() - 3, shape.end());
  std::array<Strides, 3> block_strides;
  std::array<Strides*, 3> block_ptrs{nullptr, nullptr, nullptr};
  for (std::size_t k = 0; k < 3; ++k)
    if (strides[k]) {
      block_strides[k].assign(strides[k]->end() - 3, strides[k]->end());
      block_ptrs[k] = &block_strides[k];
    }
  const char* layout = strided_layout(block, {block_ptrs[0], block_ptrs[1], block_ptrs[2]});
  const std::string kernel = kernel_name(kind, layout, op, t);
  const std::size_t item = itemsize(t);
  Shape index(nd - 3, 0);  // the outer multi-index, last dim fastest
  for (std::int64_t piece = 0; piece < outer; ++piece) {
    std::vector<KernelArg> piece_args = args;
    for (std::size_t k = 0; k < 3; ++k) {
      if (!strides[k]) continue;
      std::int64_t elements = 0;
      for (std::size_t d = 0; d + 3 < nd; ++d) elements += index[d] * (*strides[k])[d];
      // The address of an element of the operand: never before its buffer's start.
      KernelArg& a = piece_args[std::size_t(arg_of[k])];
      a.offset = std::size_t(std::int64_t(a.offset) + elements * std::int64_t(item));
    }
    launch_strided(be, kernel, std::move(piece_args), block,
                   {block_ptrs[0], block_ptrs[1], block_ptrs[2]});
    for (std::size_t d = nd - 3; d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

void set_wide_elementwise_everywhere(bool enabled) { g_wide_everywhere.store(enabled); }

void launch_unary(const std::string& op, const Array& x, const Array& out) {
  if (out.size() == 0) return;
  Backend& be = out.backend();
  const std::size_t item = itemsize(out.dtype);
  if (x.shape == out.shape && x.contiguous() && out.contiguous()) {  // the common case, directly
    launch_contiguous_vec(be, "unary", op, out.dtype,
                          {buf(x),
                           buf(out)},
                          {item, item}, out.size());
    return;
  }
  Shape shape = out.shape;
  Strides xs = broadcast_strides(x.shape, x.strides, shape), os = out.strides;
  merge_dims(shape, {&xs, &os});
  std::vector<KernelArg> args = {buf(x),
                                 buf(out)};
  if (shape.empty() || (unit(xs) && unit(os))) {
    launch_contiguous_vec(be, "unary", op, out.dtype, args, {item, item}, numel(shape));
  } else {
    launch_strided_any(be, "unary", op, out.dtype, args, shape, {&xs, nullptr, &os}, {0, -1, 1});
  }
}

void launch_binary(const std::string& op, const Array& x, const Array& y, const Array& out) {
  if (out.size() == 0) return;
  Backend& be = out.backend();
  if (x.shape == out.shape && y.shape == out.shape && x.contiguous() && y.contiguous() &&
      out.contiguous()) {  // the common case, directly
    const std::size_t item = itemsize(out.dtype);
    launch_contiguous_vec(be, "binary", op, out.dtype,
                          {buf(x),
                           buf(y),
                           buf(out)},
                          {item, item, item}, out.size());
    return;
  }
  Shape shape = out.shape;
  Strides xs = broadcast_strides(x.shape, x.strides, shape);
  Strides ys = broadcast_strides(y.shape, y.strides, shape);
  Strides os = out.strides;
  merge_dims(shape, {&xs, &ys, &os});
  std::vector<KernelArg> args = {buf(x),
                                 buf(y),
                                 buf(out)};
  const std::size_t item = itemsize(out.dtype);
  const std::int64_t n = numel(shape);
  const bool flat_out = shape.empty() || unit(os);
  if (flat_out && (shape.empty() || (unit(xs) && unit(ys)))) {
    launch_contiguous_vec(be, "binary", op, out.dtype, args, {item, item, item}, n);
  } else if (flat_out && all_zero(xs) && unit(ys)) {
    launch_contiguous(be, kernel_name("binary", "sv", op, out.dtype), args, {0, item, item}, n);
  } else if (flat_out && unit(xs) && all_zero(ys)) {
    launch_contiguous(be, kernel_name("binary", "vs", op, out.dtype), args, {item, 0, item}, n);
  } else if (!launch_rows_wide(be, op, out.dtype, args, shape, {&xs, &ys, &os})) {
    launch_strided_any(be, "binary", op, out.dtype, args, shape, {&xs, &ys, &os}, {0, 1, 2});
  }
}

void launch_unary_any(const std::string& op, const Array& x, const Array& out) {
  // The op table's kernels compute the floats (float64 copies go through the conversion
  // kernels, as every non-float copy does); integers and bool have their own.
  const bool table = x.dtype == DType::float32 || x.dtype == DType::float16 ||
                     (x.dtype == DType::float64 && op != "copy");
  if (table) return launch_unary(op, x, out);
  // copies; and floor/ceil/trunc/round of integers, which change nothing
  if (op == "copy" || is_rounding(op)) return launch_convert(x, out);
  launch_unary_int(op, x, out);
}

void launch_binary_any(const std::string& op, const Array& x, const Array& y, const Array& out) {
  if (is_comparison(op) && out.dtype == DType::bool_) return launch_compare(op, x, y, out);
  if (is_float(x.dtype) && !is_bitwise(op)) return launch_binary(op, x, y, out);
  if (x.dtype == DType::bool_) {  // NumPy's bool arithmetic: + and maximum "or", * and minimum "and"
    if (op == "add" || op == "maximum") return launch_binary_int("bitwise_or", x, y, out);
    if (op == "multiply" || op == "minimum") return launch_binary_int("bitwise_and", x, y, out);
  }
  launch_binary_int(op, x, y, out);
}

}  // namespace fm
