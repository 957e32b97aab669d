"""`python -m fastmetal`: show the devices and run a short demo of the headline operations.

    python -m fastmetal                 devices, build info, a quick check and timing of each op
    python -m fastmetal bench [NAME]    full benchmarks: elementwise, fourier, conv2d (default: all)
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time

import numpy as np

import fastmetal as fm

BENCHMARKS = ("elementwise", "fourier", "conv2d")


def _timed(fn, repeats=5):
    fn()
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t0)
    return float(np.median(best))


def demo() -> int:
    from fastmetal.benchmarks._timing import fmt_time, machine_summary
    print(f"fastmetal {fm.__version__}")
    print(f"devices: {fm.devices()} (default: {fm.default_device()}; "
          f"set FASTMETAL_DEVICE or fastmetal.set_default_device to choose)")
    print(f"machine: {machine_summary()}\n")
    rng = np.random.default_rng(0)
    failures = 0

    def report(name, ours, ref_fn, err, t_fm, t_ref, ref_name):
        nonlocal failures
        ok = err < 1e-4
        failures += not ok
        print(f"  {name:<34} max rel err {err:.1e} {'ok ' if ok else 'BAD'}  "
              f"fastmetal {fmt_time(t_fm):>10}  {ref_name} {fmt_time(t_ref):>10}  ({t_ref / t_fm:.1f}x)")

    print("headline operations (checked against NumPy float64, timed against NumPy float32):")
    x = rng.standard_normal(2**22).astype(np.float32)
    got = fm.sigmoid(x)
    ref = 1 / (1 + np.exp(-x.astype(np.float64)))
    report("sigmoid, 2^22 elements", got, None, float(np.max(np.abs(got - ref) / np.abs(ref))),
           _timed(lambda: fm.sigmoid(x)), _timed(lambda: 1 / (1 + np.exp(-x))), "numpy")
    m = x.reshape(4096, 1024)
    row = x[:1024].copy()
    got = fm.add(m, row)
    ref = m.astype(np.float64) + row
    report("broadcast add, 4096x1024 + 1024", got, None,
           float(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30))),
           _timed(lambda: fm.add(m, row)), _timed(lambda: m + row), "numpy")

    try:
        t = np.linspace(-20, 20, 100_000).astype(np.float32)
        k = np.arange(1000)
        a = (1.0 / (1 + k)).astype(np.float32)
        b = (0.5 / (1 + k)).astype(np.float32)
        got = fm.fourier_series(t, a, b)
        tt = t.astype(np.float64)
        ref = a[0] / 2 + sum(a[j] * np.cos(j * tt) + b[j] * np.sin(j * tt) for j in range(1, 1000))
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))

        def np32():
            out = np.full(t.shape, a[0] / 2, np.float32)
            for s in range(0, 1000, 100):
                kk = np.arange(max(s, 1), s + 100, dtype=np.float32)[:, None]
                ph = kk * t[None, :]
                out += (a[max(s, 1):s + 100, None] * np.cos(ph) + b[max(s, 1):s + 100, None] * np.sin(ph)).sum(0)
            return out
        report("fourier_series, 1e5 samples, K=1000", got, None, err,
               _timed(lambda: fm.fourier_series(t, a, b), 3), _timed(np32, 1), "numpy")
    except NotImplementedError as e:
        print(f"  fourier_series: {e}")

    try:
        xin = rng.standard_normal((64, 32, 26, 26)).astype(np.float32)
        w = (rng.standard_normal((64, 32, 3, 3)) * 0.1).astype(np.float32)
        got = fm.conv2d(xin, w)
        # float64 reference through im2col
        cols = np.lib.stride_tricks.sliding_window_view(xin.astype(np.float64), (3, 3), axis=(2, 3))
        ref = np.einsum("nchwij,ocij->nohw", cols, w.astype(np.float64))
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        report("conv2d, 64x32x26x26 * 64x32x3x3", got, None, err,
               _timed(lambda: fm.conv2d(xin, w), 3),
               _timed(lambda: np.einsum("nchwij,ocij->nohw", np.lib.stride_tricks.sliding_window_view(
                   xin, (3, 3), axis=(2, 3)), w, optimize=True), 1), "numpy einsum")
    except NotImplementedError as e:
        print(f"  conv2d: {e}")
    print("\nfull benchmarks: python -m fastmetal bench [elementwise|fourier|conv2d]")
    return 1 if failures else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fastmetal", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command")
    bench = sub.add_parser("bench", help="run benchmarks against NumPy / PyTorch / MLX")
    bench.add_argument("name", nargs="?", choices=(*BENCHMARKS, "all"), default="all")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")
    ns = ap.parse_args(argv)
    if ns.command != "bench":
        return demo()
    names = BENCHMARKS if ns.name == "all" else (ns.name,)
    for name in names:
        module = importlib.import_module(f"fastmetal.benchmarks.{name}")
        module.main(ns.args)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
