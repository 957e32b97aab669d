"""Thread safety, the GIL, and memory, on every device: many threads at once, and no leaks.
(The backend invariants behind them: test_backend_invariants.py.)"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import fastmetal as fm

from thread_harness import threaded_mismatches


def test_many_threads_get_exact_results(device):
    rng = np.random.default_rng(1)
    inputs = [(rng.standard_normal(s).astype(np.float32),) for s in (10, 1000, 70_000, 300_000)]

    def compute(x):
        return fm.sigmoid(x), fm.add(x, x[::-1]), fm.maximum(x, 0.5)

    assert threaded_mismatches(compute, inputs, n_threads=8, rounds=20) == []


def test_gil_is_released_while_kernels_run(device):
    # Device Arrays, so that only the kernel (no host copy) runs inside the timed calls.
    x = fm.asarray(np.random.default_rng(2).standard_normal(2**24).astype(np.float32))
    out = fm.empty(x.shape)
    t0 = time.perf_counter()
    for _ in range(3):
        fm.gelu(x, out=out)
    kernel_time = (time.perf_counter() - t0) / 3
    stop = threading.Event()
    gaps = []

    def ticker():
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.02)
    for _ in range(5):
        fm.gelu(x, out=out)
    stop.set()
    t.join()
    # With the GIL held, the ticker would stall for a whole kernel; released, it keeps ticking.
    assert max(gaps) < max(0.6 * kernel_time, 0.05), (max(gaps), kernel_time)


def rss_bytes():
    psutil = pytest.importorskip("psutil")
    return psutil.Process().memory_info().rss


@pytest.mark.parametrize("kind", ["numpy", "array"])
def test_no_leak_over_100k_calls(kind, device):
    x = np.ones(64, np.float32)
    y = fm.asarray(x) if kind == "array" else x
    for _ in range(5000):  # warm up caches and pools
        fm.add(y, 1.0)
    before = rss_bytes()
    for _ in range(100_000):
        r = fm.add(y, 1.0)
        r = fm.exp(r)
    grown = rss_bytes() - before
    assert grown < 4 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 1e5 calls"
