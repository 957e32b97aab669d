#include "ops/recurrent.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>

#include "backend/backend.h"
#include "backend/capture.h"
#include "core/errors.h"
#include "ops/array_arg.h"
#include "ops/convert.h"
#include "ops/matmul.h"
#include "ops/python_op.h"
#include "recurrent_args.h"

namespace fm {
namespace {

using i64 = std::int64_t;

struct Dims {
  i64 T, B, H;
};

// The dtype the gate kernels compute in: the operands', float32 (the float kernels) or
// float64 (their _float64 instances, on devices with double). The Python layer converts
// and checks the user's arrays first; this guards the private entry points.
DType compute_dtype(const char* op, std::initializer_list<const Array*> operands) {
  const DType t = (*operands.begin())->dtype;
  bool same = true;
  for (const Array* a : operands) same = same && a->dtype == t;
  if (!same || (t != DType::float32 && t != DType::float64)) {
    std::string got;
    for (const Array* a : operands) got += std::string(got.empty() ? "" : ", ") + dtype_name(a->dtype);
    throw TypeError(message(op, "expected float32 or float64 operands of one dtype, got ", got));
  }
  Backend& be = (*operands.begin())->backend();
  if (t == DType::float64 && !be.has_float64())
    throw TypeError(message(op, "expected a dtype device '", be.name(), "' has, got float64 ",
                            "(Apple GPUs have no double: use float32 there, or device='cpu' ",
                            "for float64)"));
  return t;
}

// The gate kernel of `base` for dtype t (metal/recurrent.metal's instance names).
std::string kernel_name(const char* base, DType t) {
  return t == DType::float64 ? std::string(base) + "_float64" : std::string(base);
}

// The shapes every layer function takes (the Python layer checks the user's arguments with
// PyTorch's messages first; these guard the private entry points).
Dims check(const char* op, const Array& xg, i64 gates, const Array& h0, const Array& w_hh,
           const Array& b_hh) {
  if (xg.ndim() != 3 || h0.ndim() != 2 || h0.shape[1] < 1 || xg.shape[1] != h0.shape[0] ||
      xg.shape[2] != gates * h0.shape[1])
    throw ValueError(message(op, "expected xg (T, B, ", gates, " * H) and h0 (B, H), got ",
                             shape_str(xg.shape), " and ", shape_str(h0.shape)));
  const i64 H = h0.shape[1];
  if (w_hh.shape != Shape{gates * H, H} || b_hh.shape != Shape{gates * H})
    throw ValueError(message(op, "expected w_hh (", gates * H, ", ", H, ") and b_hh (",
                             gates * H, ",), got ", shape_str(w_hh.shape), " and ",
                             shape_str(b_hh.shape)));
  constexpr i64 kMax = std::numeric_limits<std::int32_t>::max();
  if (xg.shape[1] > kMax || H > kMax / 4)
    throw ValueError(message(op, "expected fewer than 2**31 rows and units, got ",
                             shape_str(xg.shape)));
  return {xg.shape[0], xg.shape[1], H};
}

// Rows [first, first + shape) of a contiguous array, as a contiguous view.
Array part(const Array& a, i64 first, const Shape& shape) {
  Array v = a;
  v.offset = a.offset + first;
  v.shape = shape;
  v.strides = contiguous_strides(shape);
  return v;
}

// W_hh^T as a view (w_hh is contiguous (G * H, H)): each step's product h_{t-1} @ W_hh^T goes
// through one RepeatedMatmul per layer call, which packs it once for the backend's GEMM.
Array transposed(const Array& w) {
  Array v = w;
  v.shape = {w.shape[1], w.shape[0]};
  v.strides = {1, w.shape[1]};
  return v;
}

// The slot of y holding the state after time t, and the one before it.
i64 slot_out(i64 t, bool reverse) { return reverse ? t : t + 1; }
i64 slot_prev(i64 t, bool reverse) { return reverse ? t + 1 : t; }
// Time of the s-th step taken (forward: 0, 1, ...; reverse: T - 1, T - 2, ...).
i64 time_of(i64 s, i64 T, bool reverse) { return reverse ? T - 1 - s : s; }

void launch_step(const std::string& kernel, const Dims& d, std::uint64_t cost, bool relu,
                 std::vector<KernelArg> args) {
  RecurrentArgs a{};
  a.batch = std::int32_t(d.B);
  a.hidden = std::int32_t(d.H);
  a.relu = relu ? 1 : 0;
  args.push_back(KernelArg::inline_bytes(&a, sizeof a));
  Backend& be = *args[0].storage->backend;
  Dispatch g;
  g.grid[0] = std::uint32_t(d.H);
  g.grid[1] = std::uint32_t(d.B);
  g.group[0] = std::max<std::uint32_t>(1, std::min<std::uint32_t>(be.preferred_group_size(kernel),
                                                                  std::uint32_t(d.H)));
  g.cost = cost;
  be.launch(kernel, g, args);
}

}  // namespace

std::vector<Array> lstm_layer(const Array& xg, const Array& h0, const Array& c0,
                              const Array& w_hh, const Array& b_hh, bool reverse) {
  const char* op = "lstm_layer";
  const Dims d = check(op, xg, 4, h0, w_hh, b_hh);
  if (c0.shape != h0.shape)
    throw ValueError(message(op, "expected c0 of h0's shape ", shape_str(h0.shape), ", got ",
                             shape_str(c0.shape)));
  const DType dt = compute_dtype(op, {&xg, &w_hh, &b_hh});
  Backend& be = xg.backend();
  const i64 T = d.T, B = d.B, H = d.H, BH = B * H;
  Array y = Array::empty(be, {2, T + 1, B, H}, dt, op);
  Array gates = Array::empty(be, {T, B, 4 * H}, dt, op);
  if (BH == 0) return {y, gates};
  const i64 c_base = (T + 1) * BH, s0 = reverse ? T : 0;
  launch_convert(h0, part(y, s0 * BH, {B, H}));
  launch_convert(c0, part(y, c_base + s0 * BH, {B, H}));
  Array hg = Array::empty(be, {B, 4 * H}, dt, op);
  const RepeatedMatmul h_wt(op, part(y, s0 * BH, {B, H}), transposed(w_hh), hg);
  const std::string kernel = kernel_name("lstm_gates_forward", dt);
  for (i64 s = 0; s < T; ++s) {
    const i64 t = time_of(s, T, reverse), so = slot_out(t, reverse), sp = slot_prev(t, reverse);
    h_wt(part(y, sp * BH, {B, H}), hg);
    launch_step(kernel, d, 24, false,
                {buf(part(xg, t * 4 * BH, {B, 4 * H})), buf(hg), buf(b_hh),
                 buf(part(y, c_base + sp * BH, {B, H})), buf(part(y, so * BH, {B, H})),
                 buf(part(y, c_base + so * BH, {B, H})), buf(part(gates, t * 4 * BH, {B, 4 * H}))});
  }
  return {y, gates};
}
FM_PYTHON_OP_FLOAT64(lstm_layer,
             "_lstm_layer(xg: Array, h0: Array, c0: Array, w_hh: Array, b_hh: Array, "
             "reverse: bool)",
             "Private: see ops/recurrent.py.");

std::vector<Array> lstm_layer_backward(const Array& grad, const Array& y, const Array& gates,
                                       const Array& w_hh, bool reverse) {
  const char* op = "lstm_layer_backward";
  if (y.ndim() != 4 || y.shape[0] != 2 || grad.shape != y.shape || gates.ndim() != 3 ||
      gates.shape[0] + 1 != y.shape[1] || gates.shape[1] != y.shape[2] ||
      gates.shape[2] != 4 * y.shape[3] || w_hh.shape != Shape{4 * y.shape[3], y.shape[3]})
    throw ValueError(message(op, "expected grad and y (2, T + 1, B, H), gates (T, B, 4H) and "
                                 "w_hh (4H, H), got ", shape_str(grad.shape), ", ",
                             shape_str(y.shape), ", ", shape_str(gates.shape), ", ",
                             shape_str(w_hh.shape)));
  const DType dt = compute_dtype(op, {&grad, &y, &gates, &w_hh});
  const Dims d{gates.shape[0], y.shape[2], y.shape[3]};
  const i64 T = d.T, B = d.B, H = d.H, BH = B * H, c_base = (T + 1) * BH;
  Backend& be = y.backend();
  Array dxg = Array::empty(be, {T, B, 4 * H}, dt, op);
  Array dh = Array::empty(be, {B, H}, dt, op);
  Array dc = Array::empty(be, {B, H}, dt, op);
  fill_zero(dh);
  fill_zero(dc);
  if (BH == 0) return {dxg, dh, dc};
  const std::string kernel = kernel_name("lstm_gates_backward", dt);
  const RepeatedMatmul dg_w(op, part(dxg, 0, {B, 4 * H}), w_hh, dh);
  for (i64 s = T - 1; s >= 0; --s) {
    const i64 t = time_of(s, T, reverse), so = slot_out(t, reverse), sp = slot_prev(t, reverse);
    const Array dg = part(dxg, t * 4 * BH, {B, 4 * H});
    launch_step(kernel, d, 24, false,
                {buf(part(grad, so * BH, {B, H})), buf(dh), buf(part(grad, c_base + so * BH, {B, H})),
                 buf(dc), buf(part(gates, t * 4 * BH, {B, 4 * H})),
                 buf(part(y, c_base + sp * BH, {B, H})), buf(part(y, c_base + so * BH, {B, H})),
                 buf(dg)});
    dg_w(dg, dh);
  }
  return {dxg, dh, dc};
}
FM_PYTHON_OP_FLOAT64(lstm_layer_backward,
             "_lstm_layer_backward(grad: Array, y: Array, gates: Array, w_hh: Array, "
             "reverse: bool)",
             "Private: see ops/recurrent.py.");

std::vector<Array> gru_layer(const Array& xg, const Array& h0, const Array& w_hh,
                             const Array& b_hh, bool reverse) {
  const char* op = "gru_layer";
  const Dims d = check(op, xg, 3, h0, w_hh, b_hh);
  const DType dt = compute_dtype(op, {&xg, &w_hh, &b_hh});
  Backend& be = xg.backend();
  const i64 T = d.T, B = d.B, H = d.H, BH = B * H;
  Array y = Array::empty(be, {T + 1, B, H}, dt, op);
  Array saved = Array::empty(be, {T, B, 4 * H}, dt, op);
  if (BH == 0) return {y, saved};
  launch_convert(h0, part(y, (reverse ? T : 0) * BH, {B, H}));
  Array hg = Array::empty(be, {B, 3 * H}, dt, op);
  const RepeatedMatmul h_wt(op, part(y, 0, {B, H}), transposed(w_hh), hg);
  const std::string kernel = kernel_name("gru_gates_forward", dt);
  for (i64 s = 0; s < T; ++s) {
    const i64 t = time_of(s, T, reverse), so = slot_out(t, reverse), sp = slot_prev(t, reverse);
    const Array hp = part(y, sp * BH, {B, H});
    h_wt(hp, hg);
    launch_step(kernel, d, 20, false,
                {buf(part(xg, t * 3 * BH, {B, 3 * H})), buf(hg), buf(b_hh), buf(hp),
                 buf(part(y, so * BH, {B, H})), buf(part(saved, t * 4 * BH, {B, 4 * H}))});
  }
  return {y, saved};
}
FM_PYTHON_OP_FLOAT64(gru_layer,
             "_gru_layer(xg: Array, h0: Array, w_hh: Array, b_hh: Array, reverse: bool)",
             "Private: see ops/recurrent.py.");

std::vector<Array> gru_layer_backward(const Array& grad, const Array& y, const Array& saved,
                                      const Array& w_hh, bool reverse) {
  const char* op = "gru_layer_backward";
  if (y.ndim() != 3 || grad.shape != y.shape || saved.ndim() != 3 ||
      saved.shape[0] + 1 != y.shape[0] || saved.shape[1] != y.shape[1] ||
      saved.shape[2] != 4 * y.shape[2] || w_hh.shape != Shape{3 * y.shape[2], y.shape[2]})
    throw ValueError(message(op, "expected grad and y (T + 1, B, H), saved (T, B, 4H) and "
                                 "w_hh (3H, H), got ", shape_str(grad.shape), ", ",
                             shape_str(y.shape), ", ", shape_str(saved.shape), ", ",
                             shape_str(w_hh.shape)));
  const DType dt = compute_dtype(op, {&grad, &y, &saved, &w_hh});
  const Dims d{saved.shape[0], y.shape[1], y.shape[2]};
  const i64 T = d.T, B = d.B, H = d.H, BH = B * H;
  Backend& be = y.backend();
  Array dxg = Array::empty(be, {T, B, 3 * H}, dt, op);
  Array dhg = Array::empty(be, {T, B, 3 * H}, dt, op);
  Array dh = Array::empty(be, {B, H}, dt, op);
  Array dh_direct = Array::empty(be, {B, H}, dt, op);
  fill_zero(dh);
  fill_zero(dh_direct);
  if (BH == 0) return {dxg, dhg, dh, dh_direct};
  const std::string kernel = kernel_name("gru_gates_backward", dt);
  const RepeatedMatmul dg_w(op, part(dhg, 0, {B, 3 * H}), w_hh, dh);
  for (i64 s = T - 1; s >= 0; --s) {
    const i64 t = time_of(s, T, reverse), so = slot_out(t, reverse), sp = slot_prev(t, reverse);
    const Array dhg_t = part(dhg, t * 3 * BH, {B, 3 * H});
    launch_step(kernel, d, 20, false,
                {buf(part(grad, so * BH, {B, H})), buf(dh), buf(dh_direct),
                 buf(part(saved, t * 4 * BH, {B, 4 * H})), buf(part(y, sp * BH, {B, H})),
                 buf(part(dxg, t * 3 * BH, {B, 3 * H})), buf(dhg_t)});
    dg_w(dhg_t, dh);
  }
  return {dxg, dhg, dh, dh_direct};
}
FM_PYTHON_OP_FLOAT64(gru_layer_backward,
             "_gru_layer_backward(grad: Array, y: Array, saved: Array, w_hh: Array, "
             "reverse: bool)",
             "Private: see ops/recurrent.py.");

Array rnn_layer(const Array& xg, const Array& h0, const Array& w_hh, const Array& b_hh,
                bool reverse, bool relu) {
  const char* op = "rnn_layer";
  const Dims d = check(op, xg, 1, h0, w_hh, b_hh);
  const DType dt = compute_dtype(op, {&xg, &w_hh, &b_hh});
  Backend& be = xg.backend();
  const i64 T = d.T, B = d.B, H = d.H, BH = B * H;
  Array y = Array::empty(be, {T + 1, B, H}, dt, op);
  if (BH == 0) return y;
  launch_convert(h0, part(y, (reverse ? T : 0) * BH, {B, H}));
  Array hg = Array::empty(be, {B, H}, dt, op);
  const RepeatedMatmul h_wt(op, part(y, 0, {B, H}), transposed(w_hh), hg);
  const std::string kernel = kernel_name("rnn_gates_forward", dt);
  for (i64 s = 0; s < T; ++s) {
    const i64 t = time_of(s, T, reverse), so = slot_out(t, reverse), sp = slot_prev(t, reverse);
    h_wt(part(y, sp * BH, {B, H}), hg);
    launch_step(kernel, d, 8, relu,
                {buf(part(xg, t * BH, {B, H})), buf(hg), buf(b_hh), buf(part(y, so * BH, {B, H}))});
  }
  return y;
}
FM_PYTHON_OP_FLOAT64(rnn_layer,
             "_rnn_layer(xg: Array, h0: Array, w_hh: Array, b_hh: Array, reverse: bool, "
             "relu: bool)",
             "Private: see ops/recurrent.py.");

std::vector<Array> rnn_layer_backward(const Array& grad, const Array& y, const Array& w_hh,
                                      bool reverse, bool relu) {
  const char* op = "rnn_layer_backward";
  if (y.ndim() != 3 || y.shape[0] < 1 || grad.shape != y.shape ||
      w_hh.shape != Shape{y.shape[2], y.shape[2]})
    throw ValueError(message(op, "expected grad and y (T + 1, B, H) and w_hh (H, H), got ",
                             shape_str(grad.shape), ", ", shape_str(y.shape), ", ",
                             shape_str(w_hh.shape)));
  const DType dt = compute_dtype(op, {&grad, &y, &w_hh});
  const Dims d{y.shape[0] - 1, y.shape[1], y.shape[2]};
  const i64 T = d.T, B = d.B, H = d.H, BH = B * H;
  Backend& be = y.backend();
  Array dxg = Array::empty(be, {T, B, H}, dt, op);
  Array dh = Array::empty(be, {B, H}, dt, op);
  fill_zero(dh);
  if (BH == 0) return {dxg, dh};
  const std::string kernel = kernel_name("rnn_gates_backward", dt);
  const RepeatedMatmul dg_w(op, part(dxg, 0, {B, H}), w_hh, dh);
  for (i64 s = T - 1; s >= 0; --s) {
    const i64 t = time_of(s, T, reverse), so = slot_out(t, reverse);
    const Array dpre = part(dxg, t * BH, {B, H});
    launch_step(kernel, d, 8, relu,
                {buf(part(grad, so * BH, {B, H})), buf(dh), buf(part(y, so * BH, {B, H})),
                 buf(dpre)});
    dg_w(dpre, dh);
  }
  return {dxg, dh};
}
FM_PYTHON_OP_FLOAT64(rnn_layer_backward,
             "_rnn_layer_backward(grad: Array, y: Array, w_hh: Array, reverse: bool, relu: bool)",
             "Private: see ops/recurrent.py.");

}  // namespace fm
