"""`python -m fastmetal`: show the devices, then check each headline operation against NumPy
float64 and time it against NumPy.

    python -m fastmetal                 what `info` prints, then checks and times each headline op
    python -m fastmetal info            version, devices, why a backend is missing, machine
    python -m fastmetal bench [NAME]    full benchmarks: elementwise, fourier, conv2d, matmul, gpu, mnist, vae, layers, ddp, attention, lstm, gpt, resnet (default: all)
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

import numpy as np

import fastmetal as fm
from fastmetal.benchmarks._timing import fmt_time, machine_summary, median_time

BENCHMARKS = ("elementwise", "fourier", "conv2d", "matmul", "gpu", "mnist", "vae", "layers", "ddp",
              "attention", "lstm", "gpt",
              "resnet")
# A result is "ok" when its largest error, relative to the largest |value| of the float64
# reference, is below this: float32 arithmetic over these sizes stays well inside it.
OK_REL_ERR = 1e-4


def _blas_threads() -> int:
    """The threads NumPy's BLAS uses (its matrix products; NumPy's ufuncs use one):
    threadpoolctl's answer where it is installed, else what the usual variables ask for,
    else one per core (OpenBLAS's and MKL's default)."""
    try:
        from threadpoolctl import threadpool_info
        blas = [p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"]
        if blas:
            return int(blas[0])
    except ImportError:
        pass
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return os.cpu_count() or 1


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
    return lambda: fm.fourier_series(t, a, b), ref, numpy32, "numpy", 1


def _conv_case(rng):
    x = rng.standard_normal((64, 32, 26, 26)).astype(np.float32)
    w = (rng.standard_normal((64, 32, 3, 3)) * 0.1).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view
    ref = np.einsum("nchwij,ocij->nohw", windows(x.astype(np.float64), (3, 3), axis=(2, 3)),
                    w.astype(np.float64))
    return (lambda: fm.conv2d(x, w), ref,
            lambda: np.einsum("nchwij,ocij->nohw", windows(x, (3, 3), axis=(2, 3)), w, optimize=True),
            "numpy einsum", _blas_threads())


def info() -> int:
    """Version, devices, and one line per backend that is not available saying why."""
    print(f"fastmetal {fm.__version__}")
    print(f"devices: {fm.devices()} (default: {fm.default_device()}; "
          f"set FASTMETAL_DEVICE or fastmetal.set_default_device to choose)")
    for problem in fm._core._device_problems():
        print(f"unavailable: {problem}")
    print(f"machine: {machine_summary()}")
    return 0


def demo() -> int:
    """Check each headline op against a float64 reference and time it against NumPy."""
    info()
    print()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(2**22).astype(np.float32)
    m, row = x.reshape(4096, 1024), x[:1024].copy()
    cases = {
        "sigmoid, 2^22 elements": (lambda: fm.sigmoid(x), 1 / (1 + np.exp(-x.astype(np.float64))),
                                   lambda: 1 / (1 + np.exp(-x)), "numpy", 1),
        "broadcast add, 4096x1024 + 1024": (lambda: fm.add(m, row), m.astype(np.float64) + row,
                                            lambda: m + row, "numpy", 1),
        "fourier_series, 1e5 samples, K=1000": _fourier_case(rng),
        "conv2d, 64x32x26x26 * 64x32x3x3": _conv_case(rng),
    }
    device = fm.default_device()
    print("headline operations, checked against NumPy float64 and timed against NumPy float32:")
    print(f"  ok: max |error| / max |float64 result| < {OK_REL_ERR:.0e} (else BAD); times: medians "
          "of repeated calls, each side as it runs by default;")
    print(f"  threads: fastmetal's CPU backend {fm._core._num_threads()}, NumPy's ufuncs 1, "
          f"NumPy's einsum (BLAS) {_blas_threads()}; in brackets: fastmetal's device, NumPy's "
          "threads")
    failures = 0
    for name, (ours, ref, peer, peer_name, peer_threads) in cases.items():
        err = float(np.max(np.abs(np.asarray(ours(), np.float64) - ref)) / np.max(np.abs(ref)))
        ok = err < OK_REL_ERR
        failures += not ok
        t_fm, t_peer = median_time(ours, 0.2, min_repeats=3), median_time(peer, 0.2, min_repeats=1)
        print(f"  {name:<36} max rel err {err:.1e} {'ok ' if ok else 'BAD'}  fastmetal "
              f"{fmt_time(t_fm):>10} ({device})  {peer_name} {fmt_time(t_peer):>10} "
              f"({peer_threads} thread{'s' if peer_threads != 1 else ''})  ({t_peer / t_fm:.1f}x)")
    print("\nfull benchmarks: python -m fastmetal bench [elementwise|fourier|conv2d|matmul|gpu|mnist|vae|layers|ddp|attention|lstm|gpt|resnet]")
    return 1 if failures else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fastmetal", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command")
    sub.add_parser("info", help="version, devices, why each missing backend is missing, machine "
                   "(no checks; plain `python -m fastmetal` adds them)")
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
