// Python entry points of fused attention (ops/attention.h): _core._sdpa_forward and
// _core._sdpa_backward, wrapped by fastmetal's scaled_dot_product_attention. A bindings file
// rather than FM_PYTHON_OP because the arrays keep their dtype (float16 stays float16) and
// the mask is optional.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/errors.h"
#include "ops/attention.h"
#include "python/bindings.h"
#include "python/pyarray.h"

namespace fm::python {
namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// float64 and integer inputs become float32 (pyarray.h's rules); float16 stays float16. Views
// whose rows are contiguous (a head split (N, T, H, D) seen as (N, H, T, D)) are read in place.
Array operand(py::handle x, Backend& be, const char* arg) {
  const DType t = float_dtype_of(x, kOp, arg);
  Array a = to_array(x, be, kOp, arg, t);
  return sdpa_layout_ok(a) ? a : to_contiguous_array(x, be, kOp, arg, t);
}

SdpaOptions options(bool mask_is_bool, bool is_causal, double scale, std::uint32_t threshold,
                    float drop_scale, std::uint32_t key0, std::uint32_t key1) {
  SdpaOptions o;
  o.mask_kind = mask_is_bool ? FM_SDPA_MASK_BOOL : FM_SDPA_MASK_ADD;
  o.causal = is_causal;
  if (!(scale < 0.0) && !(scale >= 0.0))
    throw ValueError(message(kOp, "expected scale to be a number, got nan"));
  o.scale = scale;
  if (threshold > (1u << 24))
    throw ValueError(message(kOp, "internal: dropout threshold above 2**24"));
  o.threshold = threshold;
  o.drop_scale = drop_scale;
  o.key0 = key0;
  o.key1 = key1;
  return o;
}

py::tuple sdpa_forward_py(py::handle q, py::handle k, py::handle v, py::handle mask,
                          bool mask_is_bool, bool is_causal, double scale,
                          std::uint32_t threshold, float drop_scale, std::uint32_t key0,
                          std::uint32_t key1) {
  std::vector<NamedArg> named = {{"query", q}, {"key", k}, {"value", v}};
  if (!mask.is_none()) named.push_back({"attn_mask", mask});
  Backend& be = pick_backend(kOp, named);
  const Array qa = operand(q, be, "query"), ka = operand(k, be, "key"), va = operand(v, be, "value");
  Array ma;
  if (!mask.is_none()) ma = to_contiguous_array(mask, be, kOp, "attn_mask", DType::float32);
  const SdpaOptions o = options(mask_is_bool, is_causal, scale, threshold, drop_scale, key0, key1);
  std::vector<Array> r;
  {
    py::gil_scoped_release nogil;
    r = sdpa_forward(qa, ka, va, mask.is_none() ? nullptr : &ma, o);
    be.end_op();
  }
  const bool fm_result = any_array({q, k, v, mask});
  return py::make_tuple(wrap_result(std::move(r[0]), fm_result), wrap_result(std::move(r[1]), fm_result));
}

py::tuple sdpa_backward_py(py::handle grad_out, py::handle q, py::handle k, py::handle v,
                           py::handle mask, bool mask_is_bool, bool is_causal, double scale,
                           std::uint32_t threshold, float drop_scale, std::uint32_t key0,
                           std::uint32_t key1, py::handle out, py::handle lse) {
  std::vector<NamedArg> named = {{"grad_output", grad_out}, {"query", q}, {"key", k},
                                 {"value", v}, {"output", out}, {"lse", lse}};
  if (!mask.is_none()) named.push_back({"attn_mask", mask});
  Backend& be = pick_backend(kOp, named);
  const Array qa = operand(q, be, "query"), ka = operand(k, be, "key"), va = operand(v, be, "value");
  const Array ga = operand(grad_out, be, "grad_output"), oa = operand(out, be, "output");
  const Array la = to_contiguous_array(lse, be, kOp, "lse", DType::float32);
  Array ma;
  if (!mask.is_none()) ma = to_contiguous_array(mask, be, kOp, "attn_mask", DType::float32);
  const SdpaOptions o = options(mask_is_bool, is_causal, scale, threshold, drop_scale, key0, key1);
  std::vector<Array> r;
  {
    py::gil_scoped_release nogil;
    r = sdpa_backward(ga, qa, ka, va, mask.is_none() ? nullptr : &ma, oa, la, o);
    be.end_op();
  }
  const bool fm_result = any_array({grad_out, q, k, v, mask, out, lse});
  return py::make_tuple(wrap_result(std::move(r[0]), fm_result), wrap_result(std::move(r[1]), fm_result),
                        wrap_result(std::move(r[2]), fm_result));
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def("_sdpa_forward", &sdpa_forward_py, py::arg("query"), py::arg("key"), py::arg("value"),
        py::arg("attn_mask"), py::arg("mask_is_bool"), py::arg("is_causal"), py::arg("scale"),
        py::arg("threshold"), py::arg("drop_scale"), py::arg("key0"), py::arg("key1"),
        "Private: fused attention forward -> (out, lse); see ops/attention.h.");
  m.def("_sdpa_backward", &sdpa_backward_py, py::arg("grad_output"), py::arg("query"),
        py::arg("key"), py::arg("value"), py::arg("attn_mask"), py::arg("mask_is_bool"),
        py::arg("is_causal"), py::arg("scale"), py::arg("threshold"), py::arg("drop_scale"),
        py::arg("key0"), py::arg("key1"), py::arg("output"), py::arg("lse"),
        "Private: fused attention backward -> (dq, dk, dv) over the broadcast batch shape.");
}

}  // namespace fm::python
