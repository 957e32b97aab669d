#!/usr/bin/env python3
"""Run every kernel family once on a GPU device, small shapes, checked against the CPU backend.

Meant to run under compute-sanitizer (memcheck / racecheck / synccheck) on a machine with an
NVIDIA GPU (tools/gpu/gpu_check.sh), or on a Mac with device "metal":

    python tools/gpu/gpu_kernel_tour.py [--device cuda]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import fastmetal as fm


def close(name, got, ref, rtol=2e-5, atol=2e-5):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    err = np.max(np.abs(got - ref) / (atol + rtol * np.abs(ref))) if ref.size else 0.0
    ok = bool(err <= 1.0) and got.shape == ref.shape
    print(f"  {'ok ' if ok else 'BAD'} {name:<48} scaled err {err:.3g}")
    return ok


def conv2d_tour(dev, cpu, on, rng) -> bool:
    """Every conv2d kernel on `dev` against the CPU: the forced GEMM tiles, and the Winograd
    path (FASTMETAL_CONV_ALGO=winograd) with every GEMM tile and split-K."""
    import os
    ok = True
    print(f"conv2d on {dev}")
    cases = [dict(N=2, Ci=3, Co=5, H=11, W=9, k=(3, 3), stride=1, padding=1, dilation=1, groups=1),
             dict(N=1, Ci=4, Co=8, H=10, W=13, k=(3, 2), stride=2, padding=(1, 0), dilation=1, groups=2),
             dict(N=2, Ci=6, Co=6, H=9, W=9, k=(3, 3), stride=1, padding="same", dilation=2, groups=6),
             dict(N=3, Ci=16, Co=24, H=12, W=12, k=(1, 1), stride=1, padding=0, dilation=1, groups=1),
             dict(N=2, Ci=8, Co=4, H=14, W=14, k=(4, 4), stride=1, padding="same", dilation=1, groups=1),
             dict(N=4, Ci=40, Co=48, H=13, W=11, k=(3, 3), stride=1, padding=1, dilation=1, groups=1),
             dict(N=2, Ci=64, Co=80, H=17, W=15, k=(3, 3), stride=2, padding=1, dilation=1, groups=1)]
    for c in cases:
        xin = rng.standard_normal((c["N"], c["Ci"], c["H"], c["W"])).astype(np.float32)
        w = rng.standard_normal((c["Co"], c["Ci"] // c["groups"], *c["k"])).astype(np.float32)
        bias = rng.standard_normal(c["Co"]).astype(np.float32)
        kw = dict(stride=c["stride"], padding=c["padding"], dilation=c["dilation"], groups=c["groups"])
        out_d = on(dev, fm.conv2d, xin, w, bias, **kw)
        out_c = on(cpu, fm.conv2d, xin, w, bias, **kw)
        # The host's own algorithm: 3x3 stride-1 layers take Winograd F(4x4, 3x3) on a
        # discrete GPU, whose error is bounded relative to the tile's magnitudes, not each
        # output's (tests/test_conv2d_winograd.py says why): atol from the largest output.
        ok &= close(f"forward {c}", out_d, out_c, rtol=1e-4,
                    atol=1e-4 * max(1.0, float(np.max(np.abs(out_c)))))
        go = rng.standard_normal(out_c.shape).astype(np.float32)
        gd = on(dev, fm.conv2d_backward, go, xin, w, **kw)
        gc = on(cpu, fm.conv2d_backward, go, xin, w, **kw)
        for part, g, r in zip(("input", "weight", "bias"), gd, gc):
            ok &= close(f"  grad {part}", g, r, rtol=1e-4, atol=1e-3)

    print(f"conv2d GEMM tiles on {dev} (each tile's kernels, forced; implicit GEMM forced)")
    saved_tile = os.environ.get("FASTMETAL_CONV_TILE")
    saved_algo = os.environ.get("FASTMETAL_CONV_ALGO")
    os.environ["FASTMETAL_CONV_ALGO"] = "gemm"
    try:
        for tile in ("128x128", "64x128", "64x64", "32x64"):
            os.environ["FASTMETAL_CONV_TILE"] = tile
            for c in [dict(N=2, Ci=20, Co=70, H=9, W=11, k=(3, 3), stride=1, padding=1, groups=1),
                      dict(N=3, Ci=9, Co=12, H=10, W=7, k=(3, 2), stride=(2, 1), padding=(1, 0), groups=3)]:
                xin = rng.standard_normal((c["N"], c["Ci"], c["H"], c["W"])).astype(np.float32)
                w = rng.standard_normal((c["Co"], c["Ci"] // c["groups"], *c["k"])).astype(np.float32)
                bias = rng.standard_normal(c["Co"]).astype(np.float32)
                kw = dict(stride=c["stride"], padding=c["padding"], groups=c["groups"])
                out_c = on(cpu, fm.conv2d, xin, w, bias, **kw)
                ok &= close(f"{tile} forward {c['Ci']}->{c['Co']}", on(dev, fm.conv2d, xin, w, bias, **kw),
                            out_c, rtol=1e-4, atol=1e-4)
                go = rng.standard_normal(out_c.shape).astype(np.float32)
                gd = on(dev, fm.conv2d_backward, go, xin, w, **kw)
                gc = on(cpu, fm.conv2d_backward, go, xin, w, **kw)
                for part, g, r in zip(("input", "weight", "bias"), gd, gc):
                    ok &= close(f"  {tile} grad {part}", g, r, rtol=1e-4, atol=1e-3)
    finally:
        for key, value in (("FASTMETAL_CONV_TILE", saved_tile), ("FASTMETAL_CONV_ALGO", saved_algo)):
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    print(f"conv2d split-K of both gradients on {dev} (forced split counts)")
    saved_splits = os.environ.get("FASTMETAL_CONV_SPLITS")
    try:
        for splits in ("2", "5"):
            os.environ["FASTMETAL_CONV_SPLITS"] = splits
            xin = rng.standard_normal((2, 24, 9, 10)).astype(np.float32)
            w = rng.standard_normal((72, 24, 1, 1)).astype(np.float32)
            go = rng.standard_normal((2, 72, 9, 10)).astype(np.float32)
            gd = on(dev, fm.conv2d_backward, go, xin, w)
            gc = on(cpu, fm.conv2d_backward, go, xin, w)
            for part, g, r in zip(("input", "weight", "bias"), gd, gc):
                ok &= close(f"  1x1 splits {splits} grad {part}", g, r, rtol=1e-4, atol=1e-3)
    finally:
        if saved_splits is None:
            os.environ.pop("FASTMETAL_CONV_SPLITS", None)
        else:
            os.environ["FASTMETAL_CONV_SPLITS"] = saved_splits

    print(f"conv2d Winograd on {dev} (forced; every GEMM tile, split-K)")
    saved = {k: os.environ.get(k) for k in ("FASTMETAL_CONV_ALGO", "FASTMETAL_CONV_TILE",
                                            "FASTMETAL_CONV_SPLITS")}
    try:
        for algo, tile, splits in (("winograd", "", ""), ("winograd", "128x128", ""),
                                   ("winograd", "64x128", "3"), ("winograd", "64x64", ""),
                                   ("winograd", "32x64", "2"), ("winograd4", "", ""),
                                   ("winograd4", "128x128", ""), ("winograd4", "64x128", "3"),
                                   ("winograd4", "32x64", "")):
            os.environ["FASTMETAL_CONV_ALGO"] = algo
            os.environ["FASTMETAL_CONV_TILE"] = tile
            os.environ["FASTMETAL_CONV_SPLITS"] = splits
            for c in [dict(N=2, Ci=20, Co=70, H=9, W=11, padding=1),
                      dict(N=1, Ci=33, Co=17, H=8, W=7, padding=0),
                      dict(N=3, Ci=16, Co=40, H=13, W=6, padding=(2, 1)),
                      dict(N=2, Ci=24, Co=130, H=5, W=5, padding=3)]:
                xin = rng.standard_normal((c["N"], c["Ci"], c["H"], c["W"])).astype(np.float32)
                w = rng.standard_normal((c["Co"], c["Ci"], 3, 3)).astype(np.float32)
                bias = rng.standard_normal(c["Co"]).astype(np.float32)
                kw = dict(padding=c["padding"])
                out_c = on(cpu, fm.conv2d, xin, w, bias, **kw)
                # Winograd rounds differently from the CPU's direct sums: errors bounded
                # relative to the largest magnitude (tests/test_conv2d_winograd.py says why;
                # F(4x4, 3x3) rounds more than F(2x2, 3x3)).
                big = lambda r: 1e-4 * max(1.0, float(np.max(np.abs(r))))  # noqa: E731
                ok &= close(f"{algo} {tile or 'auto'} forward {c}",
                            on(dev, fm.conv2d, xin, w, bias, **kw), out_c, rtol=1e-4, atol=big(out_c))
                go = rng.standard_normal(out_c.shape).astype(np.float32)
                gd = on(dev, fm.conv2d_backward, go, xin, w, **kw)
                gc = on(cpu, fm.conv2d_backward, go, xin, w, **kw)
                for part, g, r in zip(("input", "weight", "bias"), gd, gc):
                    ok &= close(f"  {algo} {tile or 'auto'} splits {splits or 'auto'} grad {part}",
                                g, r, rtol=1e-4, atol=big(r))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", choices=("conv2d",), default=None,
                    help="only the conv2d kernels (implicit GEMM tiles and Winograd)")
    ns = ap.parse_args(argv)
    if ns.device not in fm.devices():
        print(f"no {ns.device} device; have {fm.devices()}")
        return 2
    dev, cpu = ns.device, "cpu"
    rng = np.random.default_rng(0)
    ok = True

    def on(device, fn, *args, **kw):
        fm.set_default_device(device)
        try:
            r = fn(*args, **kw)
            return tuple(np.asarray(v) if v is not None else None for v in r) if isinstance(r, tuple) else np.asarray(r)
        finally:
            fm.set_default_device(cpu)

    if ns.only == "conv2d":
        ok = conv2d_tour(dev, cpu, on, rng)
        print("ALL OK" if ok else "FAILURES")
        return 0 if ok else 1

    print(f"elementwise on {dev}")
    x = rng.standard_normal((5, 33, 17)).astype(np.float32)
    y = rng.standard_normal((33, 17)).astype(np.float32)
    for name, args in [("exp contiguous", (fm.exp, x)), ("gelu strided", (fm.gelu, x[:, ::-2])),
                       ("add broadcast rows", (fm.add, x, y)), ("maximum transposed", (fm.maximum, x.transpose(2, 0, 1), 0.5)),
                       ("power 5-D", (fm.power, np.abs(rng.standard_normal((2, 3, 4, 5, 6))).astype(np.float32).transpose(4, 3, 2, 1, 0), 1.5))]:
        fn, *a = args
        ok &= close(name, on(dev, fn, *a), on(cpu, fn, *a))
    # the wide kernels: 16-byte chunks (unary_w/binary_w, tails by *_v) and rows (binary_rw)
    z = rng.standard_normal((7, 4104)).astype(np.float16)
    for name, args in [("sigmoid wide float16", (fm.sigmoid, z)), ("gelu wide float32", (fm.gelu, x)),
                       ("add rows of chunks float16", (fm.add, z[:, :4096], z[:1, 8:4104]))]:
        fn, *a = args
        ok &= close(name, on(dev, fn, *a), on(cpu, fn, *a), rtol=2e-3, atol=1e-3)

    print(f"numerics on {dev}")
    f2 = rng.standard_normal((40, 50)).astype(np.float32)
    t = np.linspace(-30, 30, 5000).astype(np.float32)
    a = rng.standard_normal(300).astype(np.float32) / np.arange(1, 301)
    b = rng.standard_normal(300).astype(np.float32) / np.arange(1, 301)
    for name, fn, args, kw in [
        ("gradient 2-D edge_order 2", fm.gradient, (f2, 0.5, np.cumsum(rng.random(50) + 0.1)), {"edge_order": 2}),
        ("derivative order 2 accuracy 8", fm.derivative, (f2,), {"dx": 0.1, "order": 2, "accuracy": 8, "axis": 0}),
        ("fourier_series K=300", fm.fourier_series, (t, a, b), {"period": 7.0}),
        ("fourier_series derivative=2", fm.fourier_series, (t, a, b), {"derivative": 2}),
    ]:
        got, ref = on(dev, fn, *args, **kw), on(cpu, fn, *args, **kw)
        if isinstance(got, tuple):
            for i, (g, r) in enumerate(zip(got, ref)):
                ok &= close(f"{name} [{i}]", g, r, rtol=1e-4, atol=1e-3)
        else:
            ok &= close(name, got, ref, rtol=1e-4, atol=1e-3 * max(1.0, float(np.max(np.abs(ref)))))

    ok &= conv2d_tour(dev, cpu, on, rng)

    print(f"reductions on {dev}")
    r3 = rng.standard_normal((7, 300, 45)).astype(np.float32)
    big = rng.standard_normal(100_003).astype(np.float32)
    for name, fn, arr, kw in [
        ("sum all, 100003 (two-pass simd + threadgroup)", fm.sum, big, {}),
        ("sum axis 1", fm.sum, r3, {"axis": 1}),
        ("mean axis 2 keepdims", fm.mean, r3, {"axis": 2, "keepdims": True}),
        ("var axis 0 ddof 1", fm.var, r3, {"axis": 0, "ddof": 1}),
        ("std all", fm.std, r3, {}),
        ("max axis 1", fm.max, r3, {"axis": 1}),
        ("min all, 100003", fm.min, big, {}),
        ("argmax axis 2", fm.argmax, r3, {"axis": 2}),
        ("argmin all, 100003", fm.argmin, big, {}),
    ]:
        ok &= close(name, on(dev, fn, arr, **kw), on(cpu, fn, arr, **kw), rtol=1e-4, atol=1e-4)

    from fastmetal import _core  # threadgroups of 37: a partial last simdgroup
    saved_group = _core._kernel_group_size()
    _core._set_kernel_group_size(37)
    try:
        for name, fn, kw in [("sum axis 1, groups of 37", fm.sum, {"axis": 1}),
                             ("max axis 0, groups of 37", fm.max, {"axis": 0}),
                             ("argmin axis 1, groups of 37", fm.argmin, {"axis": 1})]:
            ok &= close(name, on(dev, fn, r3, **kw), on(cpu, fn, r3, **kw), rtol=1e-4, atol=1e-4)
    finally:
        _core._set_kernel_group_size(saved_group)

    print(f"matmul on {dev}")
    for m, k, n in [(1, 1, 1), (37, 53, 29), (128, 256, 96), (65, 300, 130)]:
        a_ = rng.standard_normal((m, k)).astype(np.float32)
        b_ = rng.standard_normal((k, n)).astype(np.float32)
        ok &= close(f"matmul {m}x{k}x{n}", on(dev, fm.matmul, a_, b_), a_.astype(np.float64) @ b_,
                    rtol=1e-4, atol=1e-4 * np.sqrt(k))
    xl = rng.standard_normal((33, 70)).astype(np.float32)
    wl = rng.standard_normal((19, 70)).astype(np.float32)
    bl = rng.standard_normal(19).astype(np.float32)
    ok &= close("linear", on(dev, fm.linear, xl, wl, bl), on(cpu, fm.linear, xl, wl, bl), rtol=1e-4, atol=1e-3)
    gl = rng.standard_normal((33, 19)).astype(np.float32)
    for part, g, r in zip(("input", "weight", "bias"), on(dev, fm.linear_backward, gl, xl, wl),
                          on(cpu, fm.linear_backward, gl, xl, wl)):
        ok &= close(f"  linear grad {part}", g, r, rtol=1e-4, atol=1e-3)

    print(f"training kernels on {dev}")
    img = rng.standard_normal((3, 4, 11, 13)).astype(np.float32)
    for ks, st, pd in [(2, None, 0), (3, 2, 1), (3, 1, 1)]:
        fo = on(dev, fm.max_pool2d, img, ks, st, pd)
        ok &= close(f"max_pool2d k{ks} s{st} p{pd}", fo, on(cpu, fm.max_pool2d, img, ks, st, pd))
        gpool = rng.standard_normal(fo.shape).astype(np.float32)
        ok &= close(f"  max_pool2d_backward k{ks} s{st} p{pd}",
                    on(dev, fm.max_pool2d_backward, gpool, img, ks, st, pd),
                    on(cpu, fm.max_pool2d_backward, gpool, img, ks, st, pd))
    logits = (rng.standard_normal((37, 300)) * 3).astype(np.float32)
    labels = rng.integers(0, 300, 37)
    ls_d, ls_c = on(dev, fm.log_softmax, logits), on(cpu, fm.log_softmax, logits)
    ok &= close("log_softmax rows of 300", ls_d, ls_c, rtol=1e-5, atol=1e-5)
    gls = rng.standard_normal(logits.shape).astype(np.float32)
    ok &= close("log_softmax_backward", on(dev, fm.log_softmax_backward, gls, ls_c),
                on(cpu, fm.log_softmax_backward, gls, ls_c), rtol=1e-4, atol=1e-4)
    ok &= close("log_softmax axis 0", on(dev, fm.log_softmax, logits, 0), on(cpu, fm.log_softmax, logits, 0),
                rtol=1e-5, atol=1e-5)
    def loss_and_grad(lg, lb):  # the fused kernel's loss and gradient, through autograd
        x = fm.asarray(lg).requires_grad_()
        loss = fm.cross_entropy(x, lb)
        loss.backward()
        return loss, x.grad
    for part, g, r in zip(("loss", "grad"), on(dev, loss_and_grad, logits, labels),
                          on(cpu, loss_and_grad, logits, labels)):
        ok &= close(f"cross_entropy {part}", g, r, rtol=1e-5, atol=1e-6)
    drop = rng.standard_normal((50, 77)).astype(np.float32)
    ok &= close("dropout p=0.3", on(dev, fm.dropout, drop, 0.3, seed=5), on(cpu, fm.dropout, drop, 0.3, seed=5))
    ok &= close("dropout_backward p=0.3", on(dev, fm.dropout_backward, drop, 0.3, seed=5),
                on(cpu, fm.dropout_backward, drop, 0.3, seed=5))
    for opt_name, kw in [("SGD", {"lr": 0.1, "momentum": 0.9}), ("Adam", {"lr": 0.01}),
                         ("Adadelta", {"lr": 1.0})]:
        results = []
        for device in (dev, cpu):
            fm.set_default_device(device)
            try:
                param = fm.nn.Parameter(fm.asarray(drop.copy()))
                param.grad = fm.asarray(np.cos(drop))
                opt = getattr(fm.nn.optim, opt_name)([param], **kw)
                for _ in range(3):
                    opt.step()
                results.append(np.asarray(param))
            finally:
                fm.set_default_device(cpu)
        ok &= close(f"optimizer {opt_name} 3 steps", results[0], results[1], rtol=1e-5, atol=1e-6)
    gr = rng.standard_normal((40, 41)).astype(np.float32)
    outs = []
    for device in (dev, cpu):  # ReLU's gradient kernel (the op table's relu_grad), via autograd
        fm.set_default_device(device)
        try:
            x = fm.asarray(drop[:40, :41]).requires_grad_()
            fm.nn.ReLU()(x).backward(fm.asarray(gr))
            outs.append(np.asarray(x.grad))
        finally:
            fm.set_default_device(cpu)
    ok &= close("relu gradient", outs[0], outs[1])
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
