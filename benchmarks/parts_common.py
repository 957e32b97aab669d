"""What the per-part CPU studies (lstm_parts.py, gpt_parts.py) share: medians of interleaved
repeats, and running the script once per library, each in a process of its own on the CPU
with the same threads."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def median_ms(fns: dict, repeats: int) -> dict:
    """Median milliseconds of each callable, the callables interleaved in every repeat."""
    for f in fns.values():
        f()
    times: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def run_children(script: str, argv: list, threads: int) -> dict:
    """`script --child LIB *argv` for fastmetal and torch, each in its own process on the CPU
    (also where fastmetal's default device is a GPU), `threads` threads each: their JSON lines,
    by library ({} where a child failed, with its last error line printed)."""
    env = dict(os.environ, FASTMETAL_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               FASTMETAL_DEVICE="cpu")
    res = {}
    for lib in ("fastmetal", "torch"):
        r = subprocess.run([sys.executable, script, "--child", lib, *argv],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(f"{lib} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
            res[lib] = {}
            continue
        res[lib] = json.loads(r.stdout.strip().splitlines()[-1])
    return res
