"""Timing helpers shared by the benchmarks: medians of repeats, optional peers."""
from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable


def median_time(fn: Callable[[], object], budget_s: float = 0.3, min_repeats: int = 5,
                max_repeats: int = 200) -> float:
    """Median wall time of fn() in seconds, after one warm-up call.

    Repeats until `budget_s` is spent (at least `min_repeats` times): the machines this runs
    on are shared and noisy, so the median, not the mean, is reported.
    """
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_repeats and (len(times) < min_repeats or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def mlx_or_none():
    """mlx.core on its CPU device, or None."""
    try:
        import mlx.core as mx
        mx.set_default_device(mx.cpu)
    except Exception:  # not installed, or no usable build on this platform
        return None
    return mx


def machine_summary() -> str:
    import numpy as np

    import fastmetal as fm
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    parts = [f"{cpu}, {os.cpu_count()} cores", f"fastmetal {fm.__version__} "
             f"(default device {fm.default_device()}, CPU ISA {fm._core._cpu_isa()}, "
             f"{fm._core._num_threads()} threads, CPU conv path {fm._core._cpu_conv_path()})",
             f"numpy {np.__version__}"]
    torch = torch_or_none()
    if torch is not None:
        parts.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    mx = mlx_or_none()
    if mx is not None:
        import importlib.metadata as md
        parts.append(f"mlx {md.version('mlx')} (cpu)")
    return "; ".join(parts)


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_ratio(peer: float | None, ours: float) -> str:
    return "-" if peer is None else f"{peer / ours:.2f}x"
