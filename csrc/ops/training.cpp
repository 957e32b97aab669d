#include "ops/training.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backend/native_ops.h"
#include "core/errors.h"
#include "ops/python_op.h"
#include "ops/array_arg.h"
#include "ops/kernel_group.h"

namespace fm {
namespace {


Dispatch grid(Backend& be, const std::string& kernel, std::uint32_t x, std::uint32_t y = 1,
              std::uint32_t z = 1) {
  Dispatch d;
  d.grid[0] = x;
  d.grid[1] = y;
  d.grid[2] = z;
  // The group fills up along y and z too: a 12-wide pooling output in 12-thread groups
  // used 12 of a GPU warp's 32 lanes (max_pool2d on an H200: 31 us for MNIST's layer).
  const std::uint32_t want = std::max<std::uint32_t>(1, be.preferred_group_size(kernel));
  d.group[0] = std::max<std::uint32_t>(1, std::min<std::uint32_t>(want, x));
  d.group[1] = std::max<std::uint32_t>(1, std::min<std::uint32_t>(want / d.group[0], y));
  d.group[2] = std::max<std::uint32_t>(1, std::min<std::uint32_t>(want / (d.group[0] * d.group[1]), z));
  return d;
}

}  // namespace

void launch_max_pool2d(const Array& x, const PoolArgs& a, const Array& out) {
  if (out.size() == 0) return;
  Backend& be = out.backend();
  Dispatch d = grid(be, "max_pool2d_forward", std::uint32_t(a.ow), std::uint32_t(a.oh),
                    std::uint32_t(a.planes));
  d.cost = std::uint64_t(a.kh) * std::uint64_t(a.kw);
  be.launch("max_pool2d_forward", d, {buf(x), buf(out), KernelArg::inline_bytes(&a, sizeof(a))});
}

void launch_max_pool2d_backward(const Array& grad_out, const Array& x, const PoolArgs& a,
                                const Array& grad_in) {
  if (grad_in.size() == 0) return;
  Backend& be = grad_in.backend();
  const std::vector<KernelArg> args = {buf(grad_out), buf(x), buf(grad_in),
                                       KernelArg::inline_bytes(&a, sizeof(a))};
  if (a.sh >= a.kh && a.sw >= a.kw) {  // disjoint windows: one thread per window
    Dispatch d = grid(be, "max_pool2d_backward_cells", std::uint32_t(a.ow), std::uint32_t(a.oh),
                      std::uint32_t(a.planes));
    d.cost = std::uint64_t(a.sh) * std::uint64_t(a.sw) * 2;
    be.launch("max_pool2d_backward_cells", d, args);
    return;
  }
  Dispatch d = grid(be, "max_pool2d_backward", std::uint32_t(a.w), std::uint32_t(a.h),
                    std::uint32_t(a.planes));
  const std::uint64_t wy = std::uint64_t((a.kh + a.sh - 1) / a.sh);
  const std::uint64_t wx = std::uint64_t((a.kw + a.sw - 1) / a.sw);
  d.cost = wy * wx * std::uint64_t(a.kh) * std::uint64_t(a.kw);
  be.launch("max_pool2d_backward", d, args);
}

void launch_dropout(const Array& x, const DropoutArgs& a, const Array& out) {
  if (a.n == 0) return;
  Backend& be = out.backend();
  // A backend's own form of the same mask (the CPU's, with native 64-bit products).
  using NativeDropout = void(const DropoutArgs&, const Array&, const Array&);
  if (auto fast = native<NativeDropout>(be, "dropout_apply")) return fast(a, x, out);
  DropoutArgs k = a;
  k.quads = starts_aligned16(x) && starts_aligned16(out) ? 1u : 0u;
  Dispatch d = grid(be, "dropout_apply", (k.n + 3u) / 4u);
  d.cost = 16;  // ten Philox rounds per four elements
  be.launch("dropout_apply", d, {buf(x), buf(out), KernelArg::inline_bytes(&k, sizeof(k))});
}

namespace {

// The rows along `axis` (already normalised by training.py): outer x n x inner, each
// below 2**31 (the kernels index with 32-bit ints).
SoftmaxRowArgs row_args(const char* op, const Shape& s, std::int64_t axis) {
  const std::int64_t nd = std::int64_t(s.size());
  if (axis < 0 || axis >= nd)
    throw ValueError(message(op, "expected an axis in [0, ", nd, "), got ", axis));
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t d = 0; d < axis; ++d) outer *= s[d];
  for (std::int64_t d = axis + 1; d < nd; ++d) inner *= s[d];
  constexpr std::int64_t kMaxI32 = std::numeric_limits<std::int32_t>::max();
  if (outer > kMaxI32 || inner > kMaxI32 || s[axis] > kMaxI32)
    throw ValueError(message(op, "expected fewer than 2**31 rows, got shape ", shape_str(s)));
  SoftmaxRowArgs a{};
  a.outer = std::int32_t(outer);
  a.n = std::int32_t(s[axis]);
  a.inner = std::int32_t(inner);
  return a;
}

}  // namespace

Array log_softmax(const Array& x, std::int64_t axis) {
  const SoftmaxRowArgs a = row_args("log_softmax", x.shape, axis);
  Array out = Array::empty(x.backend(), x.shape, DType::float32);
  if (out.size() == 0) return out;
  Backend& be = out.backend();
  Dispatch d = grid(be, "log_softmax_forward", std::uint32_t(a.inner), std::uint32_t(a.outer));
  d.cost = std::uint64_t(a.n) * 4;
  be.launch("log_softmax_forward", d, {buf(x), buf(out), KernelArg::inline_bytes(&a, sizeof(a))});
  return out;
}
FM_PYTHON_OP(log_softmax, "_log_softmax(x: Array, axis: int)", "Private: see training.py.");

Array log_softmax_backward(const Array& grad_output, const Array& output, std::int64_t axis) {
  const char* op = "log_softmax_backward";
  if (grad_output.shape != output.shape)
    throw ValueError(message(op, "expected grad_output of the output's shape ",
                             shape_str(output.shape), ", got ", shape_str(grad_output.shape)));
  const SoftmaxRowArgs a = row_args(op, output.shape, axis);
  Array grad_in = Array::empty(output.backend(), output.shape, DType::float32);
  if (grad_in.size() == 0) return grad_in;
  Backend& be = grad_in.backend();
  Dispatch d = grid(be, "log_softmax_backward", std::uint32_t(a.inner), std::uint32_t(a.outer));
  d.cost = std::uint64_t(a.n) * 3;
  be.launch("log_softmax_backward", d,
            {buf(grad_output), buf(output), buf(grad_in), KernelArg::inline_bytes(&a, sizeof(a))});
  return grad_in;
}
FM_PYTHON_OP(log_softmax_backward,
             "_log_softmax_backward(grad_output: Array, output: Array, axis: int)",
             "Private: see training.py.");

void launch_cross_entropy(const Array& logits, const Array& labels, const CrossEntropyArgs& a,
                          const Array& loss, const Array& grad) {
  Backend& be = grad.backend();
  // A backend's own form of the two kernels (the CPU's: vectorised rows, the same mean).
  using NativeCrossEntropy = void(const CrossEntropyArgs&, const Array&, const Array&,
                                  const Array&, const Array&);
  if (auto fast = native<NativeCrossEntropy>(be, "cross_entropy"))
    return fast(a, logits, labels, loss, grad);
  StoragePtr rows = be.allocate(std::size_t(std::max(a.rows, 1)) * sizeof(float));
  // 32 classes or more: a simdgroup of 32 per row, in groups of 8 rows (whole simdgroups).
  const bool simd = a.classes >= 32 && a.rows <= (1 << 26) &&
                    be.max_group_size("cross_entropy_rows_simd") >= 32;
  const std::string kernel = simd ? "cross_entropy_rows_simd" : "cross_entropy_rows";
  Dispatch d = grid(be, kernel, std::uint32_t(a.rows));
  if (simd) {
    d.grid[0] = std::uint32_t(a.rows) * 32u;
    d.group[0] = std::min<std::uint32_t>(256u, be.max_group_size(kernel)) / 32u * 32u;
  }
  d.cost = std::uint64_t(a.classes) * 4;
  be.launch(kernel, d,
            {buf(logits), buf(labels), KernelArg::buffer(rows), buf(grad),
             KernelArg::inline_bytes(&a, sizeof(a))});
  Dispatch one;
  one.grid[0] = one.group[0] = kCrossEntropyMeanThreads;
  one.cost = std::uint64_t(std::max(a.rows, 1));
  be.launch("cross_entropy_mean", one,
            {KernelArg::buffer(rows), buf(loss), KernelArg::inline_bytes(&a, sizeof(a))});
}

namespace {
// The multi-tensor launches' grouping: launch(run) for consecutive runs of `items` (pointers,
// in order), each of at most `slots` items whose weights add up to at most `limit` (an item
// heavier than that goes alone).
template <typename T, typename Weight, typename Launch>
void in_slot_runs(const std::vector<const T*>& items, std::size_t slots, std::uint64_t limit,
                  Weight weight, Launch launch) {
  std::vector<const T*> run;
  std::uint64_t used = 0;
  for (const T* item : items) {
    if (!run.empty() && (run.size() == slots || used + weight(*item) > limit)) {
      launch(run);
      run.clear();
      used = 0;
    }
    run.push_back(item);
    used += weight(*item);
  }
  if (!run.empty()) launch(run);
}
}  // namespace

void launch_optimizer(const char* kind, const std::vector<OptimTensor>& tensors) {
  const std::string kernel = std::string(kind) + "_step";
  std::vector<const OptimTensor*> live;
  for (const OptimTensor& t : tensors)
    if (t.args.n != 0) live.push_back(&t);
  auto launch = [&](const std::vector<const OptimTensor*>& chunk) {
    Backend& be = chunk[0]->param->backend();
    OptimMultiArgs m{};
    m.count = std::uint32_t(chunk.size());
    std::vector<KernelArg> args;
    std::uint32_t at = 0;
    for (std::size_t k = 0; k < FM_OPTIM_SLOTS; ++k) {
      // Unused slots bind slot 0's buffers and own no threads.
      const OptimTensor& t = *chunk[k < chunk.size() ? k : 0];
      m.start[k] = at;
      if (k < chunk.size()) {
        m.slot[k] = t.args;
        at += t.args.n;
      }
      args.push_back(buf(*t.param));
      args.push_back(buf(*t.grad));
      args.push_back(buf(*t.state1));
      args.push_back(buf(t.state2 ? *t.state2 : *t.state1));
    }
    m.start[FM_OPTIM_SLOTS] = at;
    args.push_back(KernelArg::inline_bytes(&m, sizeof(m)));
    Dispatch d = grid(be, kernel, at);
    d.cost = 4;
    be.launch(kernel, d, args);
  };
  in_slot_runs(live, FM_OPTIM_SLOTS, std::numeric_limits<std::uint32_t>::max(),
               [](const OptimTensor& t) { return std::uint64_t(t.args.n); }, launch);
}

// ------------------------------------------------------------------ gradient clipping
namespace {

// A run of one gradient that one slot covers: the kernels index a slot with 32 bits, so a
// gradient of 2**31 elements or more takes several slots, cut at chunk boundaries (the
// partition, hence the result, is the same).
struct GradPiece {
  const Array* grad;
  std::int64_t offset;    // first element
  std::uint32_t n;        // elements
  std::uint32_t part_at;  // its first chunk's pair in the parts buffer
};
constexpr std::int64_t kGradPieceMax = (std::int64_t(1) << 31) / FM_GRAD_CHUNK * FM_GRAD_CHUNK;
constexpr std::uint32_t kGradKernelDtypes = 3;
constexpr DType kGradDtypes[kGradKernelDtypes] = {DType::float32, DType::float16, DType::float64};

std::string grad_kernel(const char* stem, DType t) {
  return std::string(stem) + (t == DType::float16 ? "_float16" : t == DType::float64 ? "_float64" : "_float32");
}

KernelArg piece_buffer(const GradPiece& p) {
  const Array& g = *p.grad;
  return KernelArg::buffer(g.storage, g.byte_offset() + std::size_t(p.offset) * itemsize(g.dtype));
}

std::uint64_t chunks_of(std::uint64_t n) { return (n + FM_GRAD_CHUNK - 1) / FM_GRAD_CHUNK; }

// Threads per group of the one-group-per-chunk kernels: the test override, else one per lane.
std::uint32_t grad_group(Backend& be, const std::string& kernel) {
  const std::uint32_t want = kernel_group_size() != 0 ? kernel_group_size() : FM_GRAD_LANES;
  return std::max<std::uint32_t>(1, std::min({want, be.max_group_size(kernel), 1024u}));
}

// Calls launch(kernel, pieces) for the pieces of each dtype, FM_GRAD_SLOTS (and at most
// `limit` of `weight`) per call, in order.
template <typename Weight, typename Launch>
void by_slots(const std::vector<GradPiece>& pieces, const char* stem, std::uint64_t limit,
              Weight weight, Launch launch) {
  for (DType t : kGradDtypes) {
    const std::string kernel = grad_kernel(stem, t);
    std::vector<const GradPiece*> of_dtype;
    for (const GradPiece& p : pieces)
      if (p.grad->dtype == t) of_dtype.push_back(&p);
    in_slot_runs(of_dtype, FM_GRAD_SLOTS, limit, weight,
                 [&](const std::vector<const GradPiece*>& slots) { launch(kernel, slots); });
  }
}

std::vector<GradPiece> grad_pieces(const std::vector<Array>& grads, std::uint64_t& parts) {
  // The parts buffer is indexed with 32 bits: 2 floats a chunk.
  std::uint64_t elements = 0, chunks = 0;
  for (const Array& g : grads) {
    elements += std::uint64_t(g.size());
    chunks += chunks_of(std::uint64_t(g.size()));
  }
  if (chunks > std::numeric_limits<std::uint32_t>::max() / 2)
    throw ValueError(message("nn.utils.clip_grad_norm_",
                             "expected fewer than 2**43 gradient elements in all, got ", elements));
  std::vector<GradPiece> pieces;
  parts = 0;
  for (const Array& g : grads)
    for (std::int64_t at = 0; at < g.size(); at += kGradPieceMax) {
      const std::int64_t n = std::min(kGradPieceMax, g.size() - at);
      pieces.push_back({&g, at, std::uint32_t(n), std::uint32_t(parts)});
      parts += chunks_of(std::uint64_t(n));
    }
  return pieces;
}

}  // namespace

void launch_grad_norm(const std::vector<Array>& grads, float p, GradNormFinishArgs a,
                      const Array& total, const Array& scale) {
  Backend& be = total.backend();
  // A backend's own loop over the same partition (the CPU's: no emulated barriers).
  using NativeGradNorm = void(const std::vector<Array>&, float, const GradNormFinishArgs&,
                              const Array&, const Array&);
  if (auto fast = native<NativeGradNorm>(be, "grad_norm")) return fast(grads, p, a, total, scale);
  std::uint64_t parts = 0;
  const std::vector<GradPiece> pieces = grad_pieces(grads, parts);
  Array part_buf = Array::empty(be, Shape{std::int64_t(std::max<std::uint64_t>(parts, 1) * 2)},
                                DType::float32);
  const std::uint32_t group = grad_group(be, "grad_norm_parts_float32");
  // Chunks per launch: few enough that the grid (chunks x group threads) fits 32 bits.
  const std::uint64_t max_chunks = std::numeric_limits<std::uint32_t>::max() / group;
  by_slots(pieces, "grad_norm_parts", max_chunks,
           [](const GradPiece& q) { return chunks_of(q.n); },
           [&](const std::string& kernel, const std::vector<const GradPiece*>& slots) {
             GradNormPartsArgs m{};
             m.count = std::uint32_t(slots.size());
             m.mode = a.mode;
             m.p = p;
             std::vector<KernelArg> args;
             std::uint32_t at = 0;
             for (std::size_t k = 0; k < FM_GRAD_SLOTS; ++k) {
               // Unused slots bind slot 0's buffer and own no chunks.
               const GradPiece& q = *slots[k < slots.size() ? k : 0];
               m.chunk_start[k] = at;
               if (k < slots.size()) {
                 m.n[k] = q.n;
                 m.part_at[k] = q.part_at;
                 at += std::uint32_t(chunks_of(q.n));
               }
               args.push_back(piece_buffer(q));
             }
             m.chunk_start[FM_GRAD_SLOTS] = at;
             args.push_back(buf(part_buf));
             args.push_back(KernelArg::inline_bytes(&m, sizeof(m)));
             Dispatch d;
             d.group[0] = group;
             d.grid[0] = at * group;
             d.cost = std::uint64_t(FM_GRAD_CHUNK) / group * 2;
             be.launch(kernel, d, args);
           });
  a.parts = std::uint32_t(parts);
  const std::uint32_t fgroup = grad_group(be, "grad_norm_finish");
  Dispatch d;
  d.group[0] = fgroup;
  d.grid[0] = fgroup;
  d.cost = std::max<std::uint64_t>(1, parts / fgroup) * 2;
  be.launch("grad_norm_finish", d,
            {buf(part_buf), buf(total), buf(scale), KernelArg::inline_bytes(&a, sizeof(a))});
}

void launch_grad_scale(const std::vector<Array>& grads, const Array& scale) {
  Backend& be = scale.backend();
  using NativeGradScale = void(const std::vector<Array>&, const Array&);
  if (auto fast = native<NativeGradScale>(be, "grad_scale")) return fast(grads, scale);
  std::uint64_t parts = 0;
  const std::vector<GradPiece> pieces = grad_pieces(grads, parts);
  by_slots(pieces, "grad_scale_multi", std::numeric_limits<std::uint32_t>::max(),
           [](const GradPiece& q) { return std::uint64_t(q.n); },
           [&](const std::string& kernel, const std::vector<const GradPiece*>& slots) {
             GradScaleArgs m{};
             m.count = std::uint32_t(slots.size());
             std::vector<KernelArg> args;
             std::uint32_t at = 0;
             for (std::size_t k = 0; k < FM_GRAD_SLOTS; ++k) {
               const GradPiece& q = *slots[k < slots.size() ? k : 0];
               m.start[k] = at;
               if (k < slots.size()) at += q.n;
               args.push_back(piece_buffer(q));
             }
             m.start[FM_GRAD_SLOTS] = at;
             args.push_back(buf(scale));
             args.push_back(KernelArg::inline_bytes(&m, sizeof(m)));
             Dispatch d = grid(be, kernel, at);
             be.launch(kernel, d, args);
           });
}

}  // namespace fm
