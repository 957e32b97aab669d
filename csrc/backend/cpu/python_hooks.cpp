// The CPU backend's private Python hooks (names start with _): its instruction set and
// thread count, the switch between its own conv2d and the MSL kernels, and the CPU conv2d
// algorithms alone, whatever the default device (contiguous float32 NumPy arrays in, new
// NumPy arrays out; shapes are checked so that no call can read or write out of bounds; the
// GIL is released while computing).
#include <pybind11/numpy.h>

#include <string>

#include "../../core/errors.h"
#include "../python_hooks.h"
#include "conv2d_cpu.h"
#include "cpu_kernel_abi.h"
#include "native_ops.h"
#include "thread_pool.h"

namespace fm::cpu {
namespace py = pybind11;
namespace {

using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;

const std::string kOp = "_conv2d_cpu";

void need(bool ok, const std::string& what) {
  if (!ok) throw ValueError(message(kOp, what));
}

void check4(const F32& a, const char* name) {
  need(a.ndim() == 4, std::string("expected a 4-D ") + name + ", got " +
                          std::to_string(a.ndim()) + " dimensions");
}

// Fills and checks the geometry shared by every hook (sizes from the arrays + arguments).
Conv2dArgs make_args(int N, int C_in, int H, int W, int C_out, int kH, int kW, int sh, int sw,
                     int ph, int pw, int dh, int dw, int groups, int H_out, int W_out) {
  need(N >= 0 && C_in >= 1 && H >= 1 && W >= 1 && C_out >= 1 && kH >= 1 && kW >= 1,
       "expected positive sizes");
  need(sh >= 1 && sw >= 1 && dh >= 1 && dw >= 1, "expected stride and dilation >= 1");
  need(ph >= 0 && pw >= 0, "expected padding >= 0");
  need(groups >= 1 && C_in % groups == 0 && C_out % groups == 0,
       "expected groups dividing C_in and C_out");
  // Any H_out >= 1 is memory-safe; the bound only rejects absurd sizes.
  need(H_out >= 1 && W_out >= 1 && (long long)(H_out - 1) * sh <= (long long)H + 2LL * ph + kH * dh &&
           (long long)(W_out - 1) * sw <= (long long)W + 2LL * pw + kW * dw,
       "expected an output size the input can produce");
  return Conv2dArgs{N, C_in, H, W, C_out, kH, kW, groups, H_out, W_out, sh, sw, ph, pw, dh, dw};
}

F32 new4(int a, int b, int c, int d) { return F32({py::ssize_t(a), py::ssize_t(b), py::ssize_t(c), py::ssize_t(d)}); }

void bind_cpu_hooks(py::module_& m) {
  m.def("_cpu_isa", [] { return std::string(kernel_isa()); });
  m.def("_num_threads", [] { return ThreadPool::instance().num_threads(); });

  // Which conv2d the cpu backend runs: "fast" (its own algorithms, conv2d_cpu.h) or
  // "kernels" (the MSL kernels, the GEMMs under the fiber emulator).
  m.def("_set_cpu_conv_path", [](const std::string& path) {
    if (path != "fast" && path != "kernels")
      throw ValueError("[fastmetal._set_cpu_conv_path] expected 'fast' or 'kernels', got '" +
                       path + "'");
    native_conv2d_enabled().store(path == "fast");
  });
  m.def("_cpu_conv_path",
        [] { return std::string(native_conv2d_enabled().load() ? "fast" : "kernels"); });

  // Tests: false runs the reduction and matmul MSL kernels on the cpu device instead of
  // its own algorithms (reduce_cpu.cpp, matmul_cpu.cpp).
  m.def("_set_native_cpu", [](bool enabled) { native_reduce_matmul_enabled().store(enabled); },
        py::arg("enabled"));
  m.def("_native_cpu", [] { return native_reduce_matmul_enabled().load(); });

  m.def(
      "_conv2d_cpu_forward",
      [](F32 x, F32 w, py::object bias_obj, int sh, int sw, int ph, int pw, int dh, int dw,
         int groups, int H_out, int W_out) {
        check4(x, "input");
        check4(w, "weight");
        const Conv2dArgs a = make_args(int(x.shape(0)), int(x.shape(1)), int(x.shape(2)),
                                       int(x.shape(3)), int(w.shape(0)), int(w.shape(2)),
                                       int(w.shape(3)), sh, sw, ph, pw, dh, dw, groups, H_out, W_out);
        need(w.shape(1) == a.C_in / groups, "expected weight.shape[1] == C_in / groups");
        F32 bias;
        if (!bias_obj.is_none()) {
          bias = bias_obj.cast<F32>();
          need(bias.ndim() == 1 && bias.shape(0) == a.C_out, "expected a bias of shape (C_out,)");
        }
        F32 y = new4(a.N, a.C_out, a.H_out, a.W_out);
        const float* b = bias_obj.is_none() ? nullptr : bias.data();
        {
          py::gil_scoped_release release;
          conv2d_forward(a, x.data(), w.data(), b, y.mutable_data());
        }
        return y;
      },
      py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("stride_h"), py::arg("stride_w"),
      py::arg("pad_h"), py::arg("pad_w"), py::arg("dil_h"), py::arg("dil_w"), py::arg("groups"),
      py::arg("H_out"), py::arg("W_out"));

  m.def(
      "_conv2d_cpu_backward_input",
      [](F32 gy, F32 w, int H, int W, int sh, int sw, int ph, int pw, int dh, int dw, int groups) {
        check4(gy, "output gradient");
        check4(w, "weight");
        const Conv2dArgs a = make_args(int(gy.shape(0)), int(w.shape(1)) * groups, H, W,
                                       int(w.shape(0)), int(w.shape(2)), int(w.shape(3)), sh, sw,
                                       ph, pw, dh, dw, groups, int(gy.shape(2)), int(gy.shape(3)));
        need(gy.shape(1) == a.C_out, "expected grad_output.shape[1] == weight.shape[0]");
        F32 gx = new4(a.N, a.C_in, a.H, a.W);
        {
          py::gil_scoped_release release;
          conv2d_backward_input(a, gy.data(), w.data(), gx.mutable_data());
        }
        return gx;
      },
      py::arg("gy"), py::arg("w"), py::arg("H"), py::arg("W"), py::arg("stride_h"),
      py::arg("stride_w"), py::arg("pad_h"), py::arg("pad_w"), py::arg("dil_h"), py::arg("dil_w"),
      py::arg("groups"));

  m.def(
      "_conv2d_cpu_backward_weight",
      [](F32 gy, F32 x, int kH, int kW, int sh, int sw, int ph, int pw, int dh, int dw,
         int groups) {
        check4(gy, "output gradient");
        check4(x, "input");
        const Conv2dArgs a = make_args(int(x.shape(0)), int(x.shape(1)), int(x.shape(2)),
                                       int(x.shape(3)), int(gy.shape(1)), kH, kW, sh, sw, ph, pw,
                                       dh, dw, groups, int(gy.shape(2)), int(gy.shape(3)));
        need(gy.shape(0) == a.N, "expected grad_output.shape[0] == input.shape[0]");
        F32 gw = new4(a.C_out, a.C_in / groups, kH, kW);
        {
          py::gil_scoped_release release;
          conv2d_backward_weight(a, gy.data(), x.data(), gw.mutable_data());
        }
        return gw;
      },
      py::arg("gy"), py::arg("x"), py::arg("kH"), py::arg("kW"), py::arg("stride_h"),
      py::arg("stride_w"), py::arg("pad_h"), py::arg("pad_w"), py::arg("dil_h"), py::arg("dil_w"),
      py::arg("groups"));

  m.def(
      "_conv2d_cpu_backward_bias",
      [](F32 gy) {
        check4(gy, "output gradient");
        Conv2dArgs a{};
        a.N = int(gy.shape(0));
        a.C_out = int(gy.shape(1));
        a.H_out = int(gy.shape(2));
        a.W_out = int(gy.shape(3));
        F32 gb({py::ssize_t(a.C_out)});
        {
          py::gil_scoped_release release;
          conv2d_backward_bias(a, gy.data(), gb.mutable_data());
        }
        return gb;
      },
      py::arg("gy"));
}

const bool registered = register_python_hooks(&bind_cpu_hooks);

}  // namespace

}  // namespace fm::cpu
