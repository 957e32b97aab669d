"""The workload fastmetal was made for: expand a Fourier series with many terms on 10^5
samples, then differentiate it — numerically and analytically — and compare with NumPy.

    python examples/fourier_then_differentiate.py [--terms 1000]

Prints time, max error and cosine similarity against a float64 reference for each step.
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np

import fastmetal as fm


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Result and time of the second call (the first warms caches and pools)."""
    fn()
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def report(name: str, got: Any, ref: Any, seconds: float) -> None:
    g, r = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    cos = float(g @ r / (np.linalg.norm(g) * np.linalg.norm(r)))
    print(f"  {name:<40} {seconds * 1e3:9.2f} ms   max err {np.max(np.abs(g - r)):.2e}   cos sim {cos:.12f}")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help keeps the docstring's layout and shows each option's default."""


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--terms", type=int, default=1000, help="Fourier terms K (harmonics 0..K)")
    ap.add_argument("--samples", type=int, default=100_000, help="points on four periods")
    ns = ap.parse_args(argv)
    K, period = ns.terms, 2 * np.pi
    rng = np.random.default_rng(0)
    k = np.arange(K + 1)
    a = (rng.standard_normal(K + 1) / (1 + k) ** 2).astype(np.float32)  # smooth: decays like 1/k^2
    b = (rng.standard_normal(K + 1) / (1 + k) ** 2).astype(np.float32)
    x = np.linspace(0, 4 * period, ns.samples, endpoint=False).astype(np.float32)
    dx = float(x[1] - x[0])

    # float64 references, chunked over terms: f and f'
    x64, w = x.astype(np.float64), 2 * np.pi / period
    f_ref = np.full_like(x64, a[0] / 2.0)
    df_ref = np.zeros_like(x64)
    for s in range(1, K + 1, 200):
        kk = np.arange(s, min(s + 200, K + 1))[:, None]
        ph = kk * w * x64[None, :]
        f_ref += (a[kk] * np.cos(ph) + b[kk] * np.sin(ph)).sum(0)
        df_ref += (kk * w * (b[kk] * np.cos(ph) - a[kk] * np.sin(ph))).sum(0)

    print(f"Fourier series with K={K} terms on {ns.samples} samples (device {fm.default_device()})")
    f, t = timed(lambda: fm.fourier_series(x, a, b, period=period))
    report("fastmetal.fourier_series", f, f_ref, t)

    def numpy32() -> Any:
        out = np.full(x.shape, a[0] / 2, np.float32)
        for s in range(1, K + 1, 200):
            kk = np.arange(s, min(s + 200, K + 1), dtype=np.float32)[:, None]
            ph = kk * np.float32(w) * x[None, :]
            out += (a[s:s + 200, None] * np.cos(ph) + b[s:s + 200, None] * np.sin(ph)).sum(0)
        return out
    f32, t = timed(numpy32)
    report("NumPy float32, same formula", f32, f_ref, t)

    print("derivative f'(x)")
    # On float32 samples this fine a grid, rounding of the samples (not the stencil) limits
    # a numerical derivative; the analytic one below has no such limit.
    d, t = timed(lambda: fm.derivative(f, dx=dx, accuracy=2))
    report("fastmetal.derivative (accuracy 2)", d, df_ref, t)
    g, t = timed(lambda: np.gradient(f32, dx))
    report("numpy.gradient of the float32 series", g, df_ref, t)
    d1, t = timed(lambda: fm.fourier_series(x, a, b, period=period, derivative=1))
    report("fastmetal.fourier_series(derivative=1)", d1, df_ref, t)
    return float(np.max(np.abs(np.asarray(d1, np.float64) - df_ref)))


if __name__ == "__main__":
    main()
