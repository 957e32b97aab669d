#include "ops/embedding.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "backend/native_ops.h"
#include "core/errors.h"
#include "ops/array_arg.h"
#include "ops/convert.h"
#include "ops/kernel_group.h"

namespace fm {
namespace {

constexpr std::int64_t kMaxI32 = std::numeric_limits<std::int32_t>::max();

Array int64_ids(const Array& ids, const char* op) {
  if (ids.dtype != DType::int64)
    throw TypeError(message(op, "expected input (the ids) to be an integer array (int64), got ",
                            dtype_name(ids.dtype)));
  return ids.contiguous() ? ids : convert(ids, DType::int64);
}

// The ids' smallest and largest values, read on the host (a copy; ordered after queued work).
// one_hot's shape and check depend on them, which a replay (fastmetal.compile) cannot redo:
// such a step runs eagerly instead.
void id_range(const Array& ids, std::int64_t& lo, std::int64_t& hi) {
  capture::on_host_read("one_hot's range check of the ids");
  std::vector<std::int64_t> host(std::size_t(ids.size()));
  ids.backend().copy_to_host(*ids.storage, ids.byte_offset(), host.data(),
                             host.size() * sizeof(std::int64_t));
  const auto mm = std::minmax_element(host.begin(), host.end());
  lo = *mm.first;
  hi = *mm.second;
}

// Checks the ids on the host (ValueError) and returns whether the kernels may still see an
// id outside [0, rows): while a step is recorded for replay (fastmetal.compile), because a
// replay runs no host code. The kernels then check each id themselves (a row of NaN in the
// lookup, nothing added to the gradient) and, on a discrete GPU, the host does not read
// the ids at all (that read would wait for the device and make the step uncapturable).
bool check_ids(const Array& ids, std::int64_t rows, const char* op) {
  const bool replayed = capture::recording() != nullptr;
  if (ids.size() == 0 || (replayed && !ids.backend().host_visible())) return replayed;
  std::vector<std::int64_t> host(std::size_t(ids.size()));
  ids.backend().copy_to_host(*ids.storage, ids.byte_offset(), host.data(),
                             host.size() * sizeof(std::int64_t));
  const auto mm = std::minmax_element(host.begin(), host.end());
  if (*mm.first < 0 || *mm.second >= rows)
    throw IndexError(message(op, "expected every id in input to be in [0, ", rows,
                             ") (num_embeddings = ", rows, "), got ",
                             *mm.first < 0 ? *mm.first : *mm.second, " (index out of range)"));
  return replayed;
}

// The bits the lookup writes for an out-of-range id: NaN of a float dtype, else 0.
std::int64_t missing_row_fill(DType t) {
  switch (t) {
    case DType::float16: return 0x7E00;
    case DType::float32: return 0x7FC00000;
    case DType::float64: return 0x7FF8000000000000;
    default: return 0;
  }
}

Dispatch grid2(Backend& be, const std::string& kernel, std::uint32_t x, std::uint32_t y) {
  Dispatch d;
  d.grid[0] = x;
  d.grid[1] = y;
  d.group[0] = std::max<std::uint32_t>(1, std::min(be.preferred_group_size(kernel), x));
  return d;
}

// Threads of a group of the sort's kernels: the test override, else `preferred`.
std::uint32_t sort_threads(Backend& be, const std::string& kernel, std::uint32_t preferred) {
  std::uint32_t t = kernel_group_size();
  if (t == 0) t = preferred;
  return std::max<std::uint32_t>(1, std::min(t, be.max_group_size(kernel)));
}

// A backend's own lookup and gradient (the CPU's row copies and counting sort), by name.
using NativeForward = void(const EmbeddingArgs&, const Array& ids, const Array& weight,
                           const Array& out);
using NativeBackward = void(const EmbeddingArgs&, const Array& ids, const Array& grad_output,
                            const Array& grad_weight);

}  // namespace

Array embedding(const Array& ids_in, const Array& weight) {
  const char* op = "embedding";
  const Array ids = int64_ids(ids_in, op);
  if (weight.ndim() != 2)
    throw ValueError(message(op, "expected a 2-D weight (num_embeddings, embedding_dim), got shape ",
                             shape_str(weight.shape)));
  check_ids(ids, weight.shape[0], op);  // the kernels check each id as well
  const Array w = weight.contiguous() ? weight : convert(weight, weight.dtype);
  Shape shape = ids.shape;
  shape.push_back(w.shape[1]);
  Backend& be = w.backend();
  Array out = Array::empty(be, shape, w.dtype, op);
  if (out.size() == 0) return out;
  if (ids.size() > kMaxI32 || w.shape[1] > kMaxI32)
    throw ValueError(message(op, "expected fewer than 2**31 ids and columns, got ", ids.size(),
                             " ids of ", w.shape[1]));
  EmbeddingArgs a{};
  a.n = std::int32_t(ids.size());
  a.rows = std::int32_t(std::min<std::int64_t>(w.shape[0], kMaxI32));
  a.dim = std::int32_t(w.shape[1]);
  a.limit = w.shape[0];
  a.fill = missing_row_fill(w.dtype);
  if (auto fast = native<NativeForward>(be, "embedding_forward")) {
    fast(a, ids, w, out);
    return out;
  }
  const std::string k = std::string("embedding_forward_") +
                        width_name(w.dtype);
  Dispatch d = grid2(be, k, std::uint32_t(a.dim), std::uint32_t(a.n));
  be.launch(k, d, {buf(ids), buf(w), buf(out), KernelArg::inline_bytes(&a, sizeof a)});
  return out;
}

Array embedding_backward(const Array& grad_output, const Array& ids_in,
                         std::int64_t num_embeddings, std::int64_t padding_idx) {
  const char* op = "embedding_backward";
  const Array ids = int64_ids(ids_in, op);
  if (num_embeddings < 1 || num_embeddings > kMaxI32)
    throw ValueError(message(op, "expected num_embeddings in [1, 2**31), got ", num_embeddings));
  if (padding_idx < -1 || padding_idx >= num_embeddings)
    throw ValueError(message(op, "expected padding_idx in [0, ", num_embeddings,
                             ") or -1 (none), got ", padding_idx));
  Shape want = ids.shape;
  if (grad_output.ndim() != ids.ndim() + 1)
    throw ValueError(message(op, "expected grad_output of shape input.shape + (embedding_dim,) = ",
                             shape_str(ids.shape), " + (dim,), got ", shape_str(grad_output.shape)));
  const std::int64_t dim = grad_output.shape.back();
  want.push_back(dim);
  if (grad_output.shape != want)
    throw ValueError(message(op, "expected grad_output of shape ", shape_str(want),
                             " (input.shape + (embedding_dim,)), got ",
                             shape_str(grad_output.shape)));
  if (ids.size() > kMaxI32 - FM_SORT_BLOCK || dim > kMaxI32)
    throw ValueError(message(op, "expected fewer than 2**31 - 256 ids and columns, got ",
                             ids.size(), " ids of ", dim));
  const bool unchecked = check_ids(ids, num_embeddings, op);
  Backend& be = grad_output.backend();
  Array gw = Array::empty(be, {num_embeddings, dim}, DType::float32, op);
  if (gw.size() == 0) return gw;
  EmbeddingArgs a{};
  a.n = std::int32_t(ids.size());
  a.rows = std::int32_t(num_embeddings);
  a.dim = std::int32_t(dim);
  a.blocks = std::int32_t((ids.size() + FM_SORT_BLOCK - 1) / FM_SORT_BLOCK);
  a.padding_idx = std::int32_t(padding_idx);
  a.limit = num_embeddings;
  if (auto fast = native<NativeBackward>(be, "embedding_backward")) {
    fast(a, ids, grad_output, gw);
    return gw;
  }
  const KernelArg args_arg = KernelArg::inline_bytes(&a, sizeof a);
  // Keys and positions (uint32, in float32-sized buffers), twice for the passes' ping-pong.
  const std::int64_t n = std::max<std::int64_t>(1, ids.size());
  Array keys[2] = {Array::empty(be, {n}, DType::float32, op), Array::empty(be, {n}, DType::float32, op)};
  Array pos[2] = {Array::empty(be, {n}, DType::float32, op), Array::empty(be, {n}, DType::float32, op)};
  if (a.n > 0) {
    Dispatch d = grid2(be, "embedding_sort_init", std::uint32_t(a.n), 1);
    be.launch("embedding_sort_init", d, {buf(ids), buf(keys[0]), buf(pos[0]), args_arg});
  }
  // Enough bits for every key: the ids, and where they may be out of range (unchecked), the
  // key num_embeddings that embedding_sort_init gives those (sorted last, summed nowhere).
  int bits = 0;
  while (bits < 31 && (std::int64_t(1) << bits) < num_embeddings + (unchecked ? 1 : 0)) ++bits;
  int cur = 0;
  if (a.n > 0) {
    Array hist = Array::empty(be, {std::int64_t(FM_SORT_DIGITS) * a.blocks}, DType::float32, op);
    const std::uint32_t t_hist = sort_threads(be, "embedding_sort_histogram", FM_SORT_BLOCK);
    const std::uint32_t t_scat = sort_threads(be, "embedding_sort_scatter", FM_SORT_BLOCK);
    const std::uint32_t t_scan = std::min<std::uint32_t>(
        1024, sort_threads(be, "embedding_sort_scan", 1024));
    for (int shift = 0; shift < bits; shift += 8) {
      EmbeddingArgs p = a;
      p.shift = shift;
      const KernelArg pa = KernelArg::inline_bytes(&p, sizeof p);
      Dispatch dh;
      dh.group[0] = t_hist;
      dh.grid[0] = std::uint32_t(a.blocks) * t_hist;
      dh.cost = FM_SORT_BLOCK;
      be.launch("embedding_sort_histogram", dh, {buf(keys[cur]), buf(hist), pa});
      Dispatch ds;
      ds.group[0] = t_scan;
      ds.grid[0] = t_scan;
      ds.cost = std::uint64_t(FM_SORT_DIGITS) * std::uint64_t(a.blocks) / t_scan + 1;
      be.launch("embedding_sort_scan", ds, {buf(hist), pa});
      Dispatch dc;
      dc.group[0] = t_scat;
      dc.grid[0] = std::uint32_t(a.blocks) * t_scat;
      dc.cost = FM_SORT_BLOCK;
      be.launch("embedding_sort_scatter", dc,
                {buf(keys[cur]), buf(pos[cur]), buf(hist), buf(keys[1 - cur]), buf(pos[1 - cur]),
                 pa});
      cur = 1 - cur;
    }
  }
  Dispatch d = grid2(be, "embedding_backward_rows", std::uint32_t(dim),
                     std::uint32_t(num_embeddings));
  d.cost = std::uint64_t(32 + ids.size() / num_embeddings);
  be.launch("embedding_backward_rows", d,
            {buf(keys[cur]), buf(pos[cur]), buf(grad_output), buf(gw), args_arg});
  return gw;
}

Array one_hot(const Array& ids_in, std::int64_t num_classes) {
  const char* op = "one_hot";
  const Array ids = int64_ids(ids_in, op);
  if (num_classes < -1)
    throw ValueError(message(op, "expected num_classes to be -1 (max + 1) or positive, got ",
                             num_classes));
  std::int64_t lo = 0, hi = -1;
  if (ids.size() > 0) id_range(ids, lo, hi);
  if (lo < 0)
    throw ValueError(message(op, "expected non-negative class values in input, got ", lo));
  if (num_classes == -1) {
    if (ids.size() == 0)
      throw ValueError(message(op, "expected num_classes to be given for an empty input "
                                   "(-1 means max(input) + 1), got -1"));
    num_classes = hi + 1;
  }
  if (hi >= num_classes)
    throw ValueError(message(op, "expected class values smaller than num_classes = ",
                             num_classes, ", got ", hi));
  if (ids.size() > kMaxI32 || num_classes > std::numeric_limits<std::uint32_t>::max())
    throw ValueError(message(op, "expected fewer than 2**31 ids and 2**32 classes, got ",
                             ids.size(), " ids, ", num_classes, " classes"));
  Shape shape = ids.shape;
  shape.push_back(num_classes);
  Backend& be = ids.backend();
  Array out = Array::empty(be, shape, DType::int64, op);
  if (out.size() == 0) return out;
  EmbeddingArgs a{};
  a.classes = num_classes;
  a.n = std::int32_t(ids.size());
  Dispatch d = grid2(be, "one_hot_int64", std::uint32_t(num_classes), std::uint32_t(a.n));
  be.launch("one_hot_int64", d, {buf(ids), buf(out), KernelArg::inline_bytes(&a, sizeof a)});
  return out;
}

}  // namespace fm
