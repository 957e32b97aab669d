#include "ops/capture_fusion.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>

#include "backend/capture.h"
#include "backend/env_config.h"
#include "conv2d_args.h"
#include "elementwise_args.h"
#include "training_args.h"

namespace fm {
namespace {

using capture::Capture;
using capture::Entry;

bool starts_with(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

bool same_buffer(const KernelArg& a, const KernelArg& b) {
  return a.storage && a.storage == b.storage && a.offset == b.offset;
}

// The argument block of argument `arg` of a recorded launch, in the capture's arena.
template <typename T>
T* block_of(Capture& c, const Entry& e, std::size_t arg) {
  for (const auto& [i, at] : e.blocks)
    if (i == arg && e.args[i].size == sizeof(T)) return reinterpret_cast<T*>(c.arena_at(at));
  return nullptr;
}

// ---- the elementwise launches folded: relu (x -> out) and relu_grad (x = the gradient,
// y = relu's output -> out), float32, in their 16-byte-chunk form (the chunk count in the
// block after the buffers) or their one-element form (an element a thread).
struct Elementwise {
  std::size_t x, y, out;  // argument indices (y: relu_grad's)
  std::size_t bytes;      // what the launch covers, from x's offset
};

std::optional<Elementwise> elementwise_of(Capture& c, const Entry& e, bool grad) {
  const char* wide = grad ? "binary_w_relu_grad_float32" : "unary_w_relu_float32";
  const char* single = grad ? "binary_v_relu_grad_float32" : "unary_v_relu_float32";
  const std::size_t buffers = grad ? 3 : 2;
  Elementwise w{0, grad ? 1u : 0u, buffers - 1, 0};
  if (e.kernel == wide && e.args.size() == buffers + 1) {
    const auto* chunks = block_of<std::uint32_t>(c, e, buffers);
    if (chunks == nullptr) return std::nullopt;
    w.bytes = std::size_t(*chunks) * 16;
  } else if (e.kernel == single && e.args.size() == buffers && e.dispatch.grid[1] == 1 &&
             e.dispatch.grid[2] == 1) {
    w.bytes = std::size_t(e.dispatch.grid[0]) * sizeof(float);
  } else {
    return std::nullopt;
  }
  for (std::size_t i = 0; i < buffers; ++i)
    if (!e.args[i].storage) return std::nullopt;
  return w;
}

// ---- the producers: where their output is, how big, and how to fold the launch after it.
enum class Fold { relu, relu_mask };

struct Producer {
  std::size_t out;    // argument index of the output buffer
  std::size_t bytes;  // its size
  std::size_t skip;   // a buffer argument it does not read (an unused bias slot), else ~0
};

std::size_t conv_output_bytes(const Conv2dArgs& a) {
  return std::size_t(a.N) * std::size_t(a.C_out) * std::size_t(a.H_out) * std::size_t(a.W_out) *
         sizeof(float);
}

bool is_winograd_output(const std::string& k) {
  return k == "conv2d_winograd_output" || k == "conv2d_winograd4_output";
}

// binary_<layout>_add_float32 (x, y, out[, args]): the elementwise table's add in any layout;
// its add_relu twin is the same launch with relu applied (metal/elementwise_ops.tbl).
constexpr const char* kAdd = "_add_float32";
constexpr const char* kAddRelu = "_add_relu_float32";
bool is_float_add(const std::string& k) {
  const std::size_t n = std::strlen(kAdd);
  return starts_with(k, "binary_") && k.size() > n && k.compare(k.size() - n, n, kAdd) == 0;
}
std::string add_relu_of(const std::string& k) { return k.substr(0, k.size() - std::strlen(kAdd)) + kAddRelu; }

// The bytes an add launch writes, contiguously from its output's offset (each layout of
// ops/elementwise.cpp: one element a thread, 16-byte chunks, rows of chunks, strided);
// 0 where its output is not one contiguous run (then it is not folded).
std::size_t add_output_bytes(Capture& c, const Entry& e) {
  const std::string form = e.kernel.substr(7, e.kernel.size() - 7 - std::strlen(kAdd));
  const Dispatch& d = e.dispatch;
  if (form == "v" || form == "sv" || form == "vs")
    return e.args.size() == 3 && d.grid[1] == 1 && d.grid[2] == 1 ? std::size_t(d.grid[0]) * sizeof(float) : 0;
  if (e.args.size() != 4) return 0;
  if (form == "w") {
    const auto* chunks = block_of<std::uint32_t>(c, e, 3);
    return chunks != nullptr ? std::size_t(*chunks) * 16 : 0;
  }
  if (form == "rw") {  // grid x: the chunks of a row (every one launched)
    const ChunkRowArgs* a = block_of<ChunkRowArgs>(c, e, 3);
    if (a == nullptr || a->row_stride[2] != std::int64_t(d.grid[0])) return 0;
    return std::size_t(a->rows) * d.grid[0] * 16;
  }
  if (form == "r" || form == "s" || form == "g") {  // output strides: row-major, no gaps
    const StridedArgs* a = block_of<StridedArgs>(c, e, 3);
    if (a == nullptr || a->ndim < 1 || a->ndim > FM_MAX_DIMS) return 0;
    std::int64_t expect = 1;
    for (int k = a->ndim - 1; k >= 0; --k) {
      if (a->shape[k] != 1 && a->strides[2][k] != expect) return 0;
      expect *= a->shape[k];
    }
    return std::size_t(expect) * sizeof(float);
  }
  return 0;
}

// conv2d_forward_<tile>(w, x, bias, out, args, flags); the Winograd output transform
// (prod, bias, y, args, flags); max_pool2d_backward_cells(gy, x, grad_in, args); an add.
std::optional<Producer> producer_of(Capture& c, const Entry& e, Fold fold) {
  constexpr std::size_t kNone = ~std::size_t(0);
  if (e.kind != Entry::Kind::kernel) return std::nullopt;
  // conv2d_forward_<tile>, the implicit GEMM (not _direct, nor an instance already _relu).
  const bool gemm = starts_with(e.kernel, "conv2d_forward_") && e.kernel != "conv2d_forward_direct" &&
                    e.kernel.find("_relu") == std::string::npos;
  if (gemm && !c.backend().has_kernel(e.kernel + "_relu")) return std::nullopt;
  if ((gemm && fold == Fold::relu) || is_winograd_output(e.kernel)) {
    const std::size_t args_at = gemm ? 4 : 3, out = gemm ? 3 : 2, bias = gemm ? 2 : 1;
    if (e.args.size() != args_at + 2) return std::nullopt;
    const Conv2dArgs* a = block_of<Conv2dArgs>(c, e, args_at);
    const auto* flags = block_of<std::uint32_t>(c, e, args_at + 1);
    if (a == nullptr || flags == nullptr || (*flags & (FM_CONV_RELU | FM_CONV_RELU_MASK)) != 0)
      return std::nullopt;
    // The mask takes the bias slot: only where no bias is added.
    if (fold == Fold::relu_mask && (*flags & FM_CONV_BIAS) != 0) return std::nullopt;
    return Producer{out, conv_output_bytes(*a), (*flags & FM_CONV_BIAS) != 0 ? kNone : bias};
  }
  if (is_float_add(e.kernel) && fold == Fold::relu && e.args.size() >= 3 && e.args[2].storage &&
      c.backend().has_kernel(add_relu_of(e.kernel))) {
    return Producer{2, add_output_bytes(c, e), kNone};
  }
  if (e.kernel == "max_pool2d_backward_cells" && fold == Fold::relu_mask && e.args.size() == 4) {
    const PoolArgs* a = block_of<PoolArgs>(c, e, 3);
    if (a == nullptr || a->relu_mask != 0) return std::nullopt;
    return Producer{2, std::size_t(a->planes) * std::size_t(a->h) * std::size_t(a->w) * sizeof(float),
                    kNone};
  }
  return std::nullopt;
}

// Rewrites producer p (a copy, to run at the elementwise launch's place) to do the fold.
void apply_fold(Capture& c, Entry& p, const Producer& pr, Fold fold, const Entry& ew,
                const Elementwise& w) {
  p.args[pr.out] = ew.args[w.out];
  if (p.kernel == "max_pool2d_backward_cells") {
    block_of<PoolArgs>(c, p, 3)->relu_mask = 1;
    return;
  }
  if (is_float_add(p.kernel)) {  // the add_relu twin
    p.kernel = add_relu_of(p.kernel);
    return;
  }
  if (!is_winograd_output(p.kernel)) {  // the GEMM forward: its relu instance
    p.kernel += "_relu";
    return;
  }
  const std::size_t args_at = p.args.size() - 2;
  auto* flags = block_of<std::uint32_t>(c, p, args_at + 1);
  if (fold == Fold::relu) {
    *flags |= FM_CONV_RELU;
  } else {
    *flags |= FM_CONV_RELU_MASK;
    p.args[1] = ew.args[w.y];  // the bias slot (Winograd output transform)
  }
}

}  // namespace

std::size_t fuse_capture(Capture& c, const std::vector<std::pair<std::size_t, std::size_t>>& fixed) {
  if (!env::compile_fusion()) return 0;
  std::vector<Entry>& entries = c.entries_to_rewrite();
  const std::size_t n = entries.size();
  std::vector<bool> pinned(n, false);
  for (const auto& [begin, end] : fixed)
    for (std::size_t i = begin; i < end && i < n; ++i) pinned[i] = true;

  // Where each storage is named: an entry index per reference, in order (an entry that
  // names a storage twice appears twice). Rebuilt after each fold.
  std::unordered_map<const Storage*, std::vector<std::size_t>> users;
  auto collect = [&] {
    users.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const Entry& e = entries[i];
      if (e.kind == Entry::Kind::kernel) {
        for (const KernelArg& a : e.args)
          if (a.storage) users[a.storage.get()].push_back(i);
      } else if (e.kind == Entry::Kind::upload && e.dst) {
        users[e.dst.get()].push_back(i);
      }
    }
  };
  collect();
  // Whether storage s is named by an entry strictly between i and j.
  auto used_between = [&](const Storage* s, std::size_t i, std::size_t j) {
    const auto it = users.find(s);
    if (it == users.end()) return false;
    for (std::size_t k : it->second)
      if (k > i && k < j) return true;
    return false;
  };

  std::size_t folded = 0;
  for (std::size_t j = 0; j < n; ++j) {
    Entry& ew = entries[j];
    if (ew.kind != Entry::Kind::kernel || pinned[j]) continue;
    const bool grad = starts_with(ew.kernel, "binary_");
    const std::optional<Elementwise> w = elementwise_of(c, ew, grad);
    if (!w) continue;
    const KernelArg& mid = ew.args[w->x];  // the intermediate
    const Storage* s = mid.storage.get();
    if (s->shared_with_host || s->copied_from != nullptr) continue;
    if (ew.args[w->out].storage.get() == s) continue;  // in place: not an intermediate
    // Held by nothing outside the capture (its references are all the capture's), last
    // named here, once, and just before by the producer (which may also have read it: an
    // add in place). Nothing reads it after, so the producer's write to it can go.
    const std::vector<std::size_t>& named = users[s];
    if (named.size() < 2 || named.back() != j || named[named.size() - 2] == j ||
        mid.storage.use_count() != long(named.size()))
      continue;
    const std::size_t i = named[named.size() - 2];
    if (pinned[i]) continue;
    const Fold fold = grad ? Fold::relu_mask : Fold::relu;
    const std::optional<Producer> pr = producer_of(c, entries[i], fold);
    if (!pr || !same_buffer(entries[i].args[pr->out], mid) || pr->bytes != w->bytes) continue;
    if (grad) {
      // The mask: relu's output, which the pooling backward reads as its x already.
      const KernelArg& y = ew.args[w->y];
      if (entries[i].kernel == "max_pool2d_backward_cells" && !same_buffer(entries[i].args[1], y))
        continue;
      if (y.storage.get() == s) continue;
    }
    // The producer moves to j: nothing between may touch what it reads, and what it will
    // write (the elementwise launch's output) must not be something it reads (a view of
    // it passed as an input would be read while it is written).
    bool clear = true;
    const Storage* dest = ew.args[w->out].storage.get();
    for (std::size_t a = 0; a < entries[i].args.size() && clear; ++a) {
      const KernelArg& arg = entries[i].args[a];
      if (arg.storage && a != pr->out && a != pr->skip)
        clear = !used_between(arg.storage.get(), i, j) && arg.storage.get() != dest;
    }
    if (!clear) continue;
    Entry moved = entries[i];
    apply_fold(c, moved, *pr, fold, ew, *w);
    entries[j] = std::move(moved);
    entries[i].kind = Entry::Kind::fused;
    entries[i].args.clear();
    entries[i].blocks.clear();
    collect();
    ++folded;
  }
  return folded;
}

}  // namespace fm
