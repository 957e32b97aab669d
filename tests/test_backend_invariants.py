"""The invariants every backend keeps (csrc/backend/backend.h, numbered as there), one test
each, on every device, from many Python threads at once."""
from __future__ import annotations

import gc
import threading

import numpy as np

import fastmetal as fm

from conftest import HOST_VISIBLE
from thread_harness import run_threads, threaded_mismatches

N = 200_000


def test_1_pooled_blocks_never_carry_another_threads_data(device):
    # 8 threads x 20 sigmoid calls on their own 200,000-element arrays: every call takes
    # blocks that other threads have just given back to the pool.
    rng = np.random.default_rng(1)
    cases = [(rng.standard_normal(N).astype(np.float32) * (t + 1),) for t in range(8)]
    assert threaded_mismatches(fm.sigmoid, cases, n_threads=8, rounds=20) == []

    # Temporaries that die while other threads allocate the same sizes.
    def chain(x):
        return fm.add(fm.multiply(fm.asarray(x), 2.0), fm.exp(fm.negative(x)))

    assert threaded_mismatches(chain, cases, n_threads=8, rounds=8) == []


def test_2_synchronize_waits_for_the_work_of_every_thread(device):
    rng = np.random.default_rng(2)
    xs = [fm.asarray(rng.standard_normal(N).astype(np.float32)) for _ in range(6)]
    want = [np.tanh(np.asarray(x, np.float64)).astype(np.float32) for x in xs]
    stop = threading.Event()

    def work(t):
        if t == len(xs):  # one thread only synchronizes, while the others submit
            calls = 0
            while not stop.is_set():
                fm.synchronize()
                calls += 1
            return calls
        results = [fm.tanh(xs[t]) for _ in range(10)]
        fm.synchronize()
        # After synchronize every result of this thread is complete.
        ok = all(np.allclose(np.asarray(r), want[t], rtol=1e-5, atol=1e-6) for r in results)
        return ok

    def main(t):
        try:
            return work(t)
        finally:
            if t != len(xs):
                done.append(t)
                if len(done) == len(xs):
                    stop.set()

    done = []
    results = run_threads(main, len(xs) + 1)
    assert results[:-1] == [True] * len(xs)
    assert results[-1] >= 1
    fm.synchronize()


def test_3_host_data_reaches_the_device_and_results_reach_the_host(device):
    # A fresh host buffer per call, in blocks the pool recycles: a kernel that ran before its
    # input had arrived would see the previous call's values (i - 1) instead of i.
    def work(t):
        wrong = []
        for i in range(30):
            value = np.float32(1000 * t + i)
            got = fm.add(np.full(N // 4, value, np.float32), 0.5)
            if not np.array_equal(np.asarray(got), np.full(N // 4, value + np.float32(0.5))):
                wrong.append(i)
        return wrong

    assert run_threads(work, 8) == [[]] * 8
    # Host writes after the call: a copy (non-host-visible device) keeps the values it was
    # given; shared memory (cpu, metal) sees the write.
    x = np.arange(1000, dtype=np.float32)
    a = fm.asarray(x)
    x[:] = -1.0
    expected = -1.0 if device in HOST_VISIBLE else np.arange(1000, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(fm.add(a, 0.0)), np.broadcast_to(expected, (1000,)))


def test_4_wrapped_host_memory_lives_as_long_as_its_storage(device):
    def work(t):
        # The only reference to each NumPy array is the one asarray wraps or copies.
        arrays = [fm.asarray(np.full(N // 8, float(t * 100 + i), np.float32)) for i in range(10)]
        gc.collect()
        for _ in range(5):  # churn the pool with same-sized blocks
            fm.add(np.zeros(N // 8, np.float32), 1.0)
        return all(np.array_equal(np.asarray(a), np.full(N // 8, float(t * 100 + i), np.float32))
                   for i, a in enumerate(arrays))

    assert run_threads(work, 4) == [True] * 4
    # A result's NumPy view keeps the result's memory alive after the Array is gone.
    view = np.asarray(fm.exp(np.zeros(N, np.float32)))
    gc.collect()
    fm.add(np.full(N, 3.0, np.float32), 1.0)
    np.testing.assert_array_equal(view, np.ones(N, np.float32))
