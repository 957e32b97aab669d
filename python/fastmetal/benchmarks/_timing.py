"""The benchmarks' shared timer (time_calls: medians of interleaved repeats), machine
summary, optional peers and formatting."""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

import fastmetal as fm


@dataclass
class Timing:
    median: float     # median wall time of one call, seconds
    cpu: float        # least process CPU time of one call (all threads), seconds
    result: object    # what the last call returned


def time_calls(fns: dict[str, Callable[[], object]], budget_s: float = 0.3, min_rounds: int = 5,
               max_rounds: int = 200, once_over_s: float | None = None) -> dict[str, Timing]:
    """The one timer of every benchmark: {name: Timing} of each fn() after one warm-up call.

    Several functions are timed in interleaved rounds (one call of each per round), so that
    load from other processes on a shared, noisy machine falls on each alike; rounds go on
    until about budget_s per function is spent (at least min_rounds, at most max_rounds) and
    the median, not the mean, is reported. A function whose warm-up call took longer than
    once_over_s is not repeated: that call's time is its result.
    """
    timings: dict[str, Timing] = {}
    walls: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    results: dict[str, object] = {}
    for name, fn in fns.items():
        t0, c0 = time.perf_counter(), time.process_time()
        results[name] = fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if once_over_s is not None and wall > once_over_s:
            timings[name] = Timing(wall, cpu, results[name])
        else:
            walls[name], cpus[name] = [], []
    start = time.perf_counter()
    rounds = 0
    while walls and rounds < max_rounds and (
            rounds < min_rounds or time.perf_counter() - start < budget_s * len(walls)):
        for name in walls:
            t0, c0 = time.perf_counter(), time.process_time()
            results[name] = fns[name]()
            walls[name].append(time.perf_counter() - t0)
            cpus[name].append(time.process_time() - c0)
        rounds += 1
    for name in walls:
        timings[name] = Timing(statistics.median(walls[name]), min(cpus[name]), results[name])
    return {name: timings[name] for name in fns}


def median_time(fn: Callable[[], object], budget_s: float = 0.3, min_repeats: int = 5,
                max_repeats: int = 200) -> float:
    """Median wall time of fn() in seconds (time_calls of one function)."""
    return time_calls({"fn": fn}, budget_s, min_repeats, max_repeats)["fn"].median


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
