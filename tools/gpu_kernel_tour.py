#!/usr/bin/env python3
"""Run every kernel family once on a GPU device, small shapes, checked against the CPU backend.

Meant to run under compute-sanitizer (memcheck / racecheck / synccheck) on a machine with an
NVIDIA GPU (tools/gpu_check.sh), or on a Mac with device "metal":

    python tools/gpu_kernel_tour.py [--device cuda]
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
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

    print(f"elementwise on {dev}")
    x = rng.standard_normal((5, 33, 17)).astype(np.float32)
    y = rng.standard_normal((33, 17)).astype(np.float32)
    for name, args in [("exp contiguous", (fm.exp, x)), ("gelu strided", (fm.gelu, x[:, ::-2])),
                       ("add broadcast rows", (fm.add, x, y)), ("maximum transposed", (fm.maximum, x.transpose(2, 0, 1), 0.5)),
                       ("power 5-D", (fm.power, np.abs(rng.standard_normal((2, 3, 4, 5, 6))).astype(np.float32).transpose(4, 3, 2, 1, 0), 1.5))]:
        fn, *a = args
        ok &= close(name, on(dev, fn, *a), on(cpu, fn, *a))

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
        ok &= close(f"forward {c}", out_d, out_c, rtol=1e-4, atol=1e-4)
        go = rng.standard_normal(out_c.shape).astype(np.float32)
        gd = on(dev, fm.conv2d_backward, go, xin, w, **kw)
        gc = on(cpu, fm.conv2d_backward, go, xin, w, **kw)
        for part, g, r in zip(("input", "weight", "bias"), gd, gc):
            ok &= close(f"  grad {part}", g, r, rtol=1e-4, atol=1e-3)
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
