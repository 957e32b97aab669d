"""`python -m fastmetal`: show the devices and run a short demo of the headline operations.

    python -m fastmetal                 devices, build info, a quick check and timing of each op
    python -m fastmetal info            devices, and why each missing backend is missing
    python -m fastmetal bench [NAME]    full benchmarks: elementwise, fourier, conv2d, matmul, gpu, mnist, vae (default: all)
"""
from __future__ import annotations

import argparse
import importlib
import sys

import numpy as np

import fastmetal as fm

BENCHMARKS = ("elementwise", "fourier", "conv2d", "matmul", "gpu", "mnist", "vae")


def _fourier_case(rng):
    t = np.linspace(-20, 20, 100_000).astype(np.float32)
    k = np.arange(1000)
    a = (1.0 / (1 + k)).astype(np.float32)
    b = (0.5 / (1 + k)).astype(np.float32)
    tt = t.astype(np.float64)
    ref = a[0] / 2 + sum(a[j] * np.cos(j * tt) + b[j] * np.sin(j * tt) for j in range(1, 1000))

    def numpy32():  # the same formula, chunked over terms
        out = np.full(t.shape, a[0] / 2, np.float32)
        for s in range(1, 1000, 100):
            e = min(s + 100, 1000)
            ph = np.arange(s, e, dtype=np.float32)[:, None] * t[None, :]
            out += (a[s:e, None] * np.cos(ph) + b[s:e, None] * np.sin(ph)).sum(0)
        return out
    return lambda: fm.fourier_series(t, a, b), ref, numpy32, "numpy"


def _conv_case(rng):
    x = rng.standard_normal((64, 32, 26, 26)).astype(np.float32)
    w = (rng.standard_normal((64, 32, 3, 3)) * 0.1).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view
    ref = np.einsum("nchwij,ocij->nohw", windows(x.astype(np.float64), (3, 3), axis=(2, 3)),
                    w.astype(np.float64))
    return (lambda: fm.conv2d(x, w), ref,
            lambda: np.einsum("nchwij,ocij->nohw", windows(x, (3, 3), axis=(2, 3)), w, optimize=True),
            "numpy einsum")


def info() -> int:
    """Version, devices, and one line per backend that is not available saying why."""
    from fastmetal.benchmarks._timing import machine_summary
    print(f"fastmetal {fm.__version__}")
    print(f"devices: {fm.devices()} (default: {fm.default_device()}; "
          f"set FASTMETAL_DEVICE or fastmetal.set_default_device to choose)")
    for problem in fm._core._device_problems():
        print(f"unavailable: {problem}")
    print(f"machine: {machine_summary()}")
    return 0


def demo() -> int:
    """Check each headline op against a float64 reference and time it against NumPy."""
    from fastmetal.benchmarks._timing import fmt_time, median_time
    info()
    print()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(2**22).astype(np.float32)
    m, row = x.reshape(4096, 1024), x[:1024].copy()
    cases = {
        "sigmoid, 2^22 elements": (lambda: fm.sigmoid(x), 1 / (1 + np.exp(-x.astype(np.float64))),
                                   lambda: 1 / (1 + np.exp(-x)), "numpy"),
        "broadcast add, 4096x1024 + 1024": (lambda: fm.add(m, row), m.astype(np.float64) + row,
                                            lambda: m + row, "numpy"),
        "fourier_series, 1e5 samples, K=1000": _fourier_case(rng),
        "conv2d, 64x32x26x26 * 64x32x3x3": _conv_case(rng),
    }
    print("headline operations (checked against NumPy float64, timed against NumPy float32):")
    failures = 0
    for name, (ours, ref, peer, peer_name) in cases.items():
        err = float(np.max(np.abs(np.asarray(ours(), np.float64) - ref)) / np.max(np.abs(ref)))
        ok = err < 1e-4
        failures += not ok
        t_fm, t_peer = median_time(ours, 0.2, min_repeats=3), median_time(peer, 0.2, min_repeats=1)
        print(f"  {name:<36} max rel err {err:.1e} {'ok ' if ok else 'BAD'}  fastmetal "
              f"{fmt_time(t_fm):>10}  {peer_name} {fmt_time(t_peer):>10}  ({t_peer / t_fm:.1f}x)")
    print("\nfull benchmarks: python -m fastmetal bench [elementwise|fourier|conv2d|matmul|gpu|mnist|vae]")
    return 1 if failures else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fastmetal", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command")
    sub.add_parser("info", help="devices, and why each missing backend is missing")
    bench = sub.add_parser("bench", help="run benchmarks against NumPy / PyTorch / MLX")
    bench.add_argument("name", nargs="?", choices=(*BENCHMARKS, "all"), default="all")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")
    ns = ap.parse_args(argv)
    if ns.command == "info":
        return info()
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
