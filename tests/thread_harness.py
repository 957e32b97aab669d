"""The one way the tests run work from many Python threads at once.

Threads start together (a barrier), every exception is reported with its thread, and a
thread that never finishes fails the test instead of hanging it. fastmetal's kernels are
deterministic, so a threaded result must equal the serial one bit for bit.
"""
from __future__ import annotations

import threading

import numpy as np

JOIN_TIMEOUT_S = 300.0


def run_threads(work, n_threads):
    """Call work(t) for t in range(n_threads), each in its own thread, all released at the
    same moment; return the results in thread order. Re-raises the first exception."""
    barrier = threading.Barrier(n_threads)
    results = [None] * n_threads
    errors = []

    def main(t):
        try:
            barrier.wait()
            results[t] = work(t)
        except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
            errors.append((t, e))
            barrier.abort()

    threads = [threading.Thread(target=main, args=(t,), daemon=True, name=f"fm-test-{t}")
               for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(JOIN_TIMEOUT_S)
    stuck = [th.name for th in threads if th.is_alive()]
    if stuck:
        raise AssertionError(f"threads {stuck} did not finish within {JOIN_TIMEOUT_S} s")
    real = [(t, e) for t, e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real:
        t, e = real[0]
        raise AssertionError(f"thread {t} raised {e!r}") from e
    return results


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def threaded_mismatches(compute, cases, n_threads, rounds):
    """Run compute(*case) for every case serially first, then from `n_threads` threads at
    once, thread t doing `rounds` calls on cases t, t+1, ... (cyclically). Returns the
    (thread, round, case, output) positions where a threaded result differs from the serial
    one (outputs are NumPy-convertible; None must stay None); empty when all agree."""
    expected = [tuple(np.asarray(o) if o is not None else None for o in as_tuple(compute(*c)))
                for c in cases]

    def work(t):
        bad = []
        for r in range(rounds):
            i = (t + r) % len(cases)
            for k, (got, want) in enumerate(zip(as_tuple(compute(*cases[i])), expected[i])):
                same = (got is None and want is None) or (
                    got is not None and want is not None and np.array_equal(np.asarray(got), want))
                if not same:
                    bad.append((t, r, i, k))
        return bad

    return [m for per_thread in run_threads(work, n_threads) for m in per_thread]
