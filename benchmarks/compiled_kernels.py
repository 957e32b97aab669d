"""The kernels of fastmetal's compiled MNIST training step on a CUDA GPU, as torch.profiler
sees them (CUDA activity): the device time per step by kernel, or one replay's kernels in
time order with their grids. This is how the fusion pass's gains and the step's remaining
kernels were measured (docs/BENCHMARKS.md, eighth session).

    python benchmarks/compiled_kernels.py            # device time per step, by kernel
    python benchmarks/compiled_kernels.py --timeline # one replay, in order, with grids
    FASTMETAL_COMPILE_FUSION=0 python benchmarks/compiled_kernels.py   # without the fusions
    FASTMETAL_COMPILE_STREAMS=1 python benchmarks/compiled_kernels.py  # one chain

The replay's graph runs independent kernels side by side (FASTMETAL_COMPILE_STREAMS, default
4), and kernels that share the GPU each take longer: per-kernel times are each kernel's own
only with FASTMETAL_COMPILE_STREAMS=1; the timeline's span is the step's time either way.

Needs a CUDA build of fastmetal and PyTorch with CUDA (its profiler only; the step is
fastmetal's alone): the MNIST example network, Adadelta, batch 64, synthetic batch.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np


def mnist_step(fm):
    """fastmetal.compile of `bench mnist`'s training step, and a batch on the GPU."""
    from fastmetal.benchmarks.mnist import fastmetal_step
    step = fastmetal_step("cuda")[0]
    rng = np.random.default_rng(0)
    x = fm.asarray(rng.standard_normal((64, 1, 28, 28)).astype(np.float32), device="cuda")
    y = fm.asarray(rng.integers(0, 10, 64), dtype="int64", device="cuda")
    return fm.compile(step), (x, y)


def by_kernel(fm, torch, step, args, reps=20, rows=40):
    from torch.profiler import ProfilerActivity, profile
    for _ in range(5):
        step(*args)
    fm.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            step(*args)
        fm.synchronize()
        torch.cuda.synchronize()
    ka = p.key_averages()
    total = sum(k.device_time_total for k in ka) / reps
    launches = sum(k.count for k in ka if k.device_time_total > 0) / reps
    print(f"kernels {total:.1f} us a step, {launches:.0f} launches")
    for k in sorted(ka, key=lambda k: -k.device_time_total)[:rows]:
        if k.device_time_total > 0:
            print(f"{k.device_time_total / reps:9.1f} us {k.count / reps:5.1f}x  {k.key[:90]}")


def timeline(fm, torch, step, args):
    """One replay's device work in time order: start, duration, the gap before, grid."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(10):
        step(*args)
    fm.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        step(*args)
        fm.synchronize()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        p.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    dims: dict = {}
    for e in events:
        a = e.get("args", {})
        if "grid" in a:
            dims.setdefault(e["name"], []).append((a["grid"], a["block"]))
    ev = sorted((e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    if not ev:
        print("no device activity recorded")
        return
    t0 = prev = ev[0].time_range.start
    busy, seen = 0.0, {}
    for e in ev:
        start, dur = e.time_range.start, e.time_range.end - e.time_range.start
        busy += dur
        i = seen.get(e.name, 0)
        seen[e.name] = i + 1
        grid = dims.get(e.name, [])
        grid = grid[i] if i < len(grid) else ""
        name = e.name.replace("fm::cuda_kernels::k_", "").split("(")[0]
        print(f"{start - t0:8.1f} +{dur:6.1f} gap {start - prev:5.1f}  {name[:48]:48s} {grid}")
        prev = e.time_range.end
    print(f"{len(ev)} activities, span {prev - t0:.1f} us, busy {busy:.1f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeline", action="store_true", help="one replay's kernels in order")
    opts = ap.parse_args()
    import fastmetal as fm
    try:
        import torch
    except ImportError:
        raise SystemExit("needs PyTorch (its profiler)")
    if not torch.cuda.is_available() or "cuda" not in fm.devices():
        raise SystemExit("needs a CUDA GPU, fastmetal built with CUDA and PyTorch with CUDA")
    step, args = mnist_step(fm)
    (timeline if opts.timeline else by_kernel)(fm, torch, step, args)


if __name__ == "__main__":
    main()
