"""fastmetal.compile's step time on a CUDA GPU against FASTMETAL_COMPILE_STREAMS, the number
of streams its CUDA graph is recorded on (1: one chain in the order the ops ran; more: the
step's independent launches side by side, csrc/backend/capture_order.h). This is how the
default (4) was chosen (BENCHMARKS.md, ninth session).

    python benchmarks/compile_streams.py                   # mnist vae resnet, 1 2 4 8
    python benchmarks/compile_streams.py mnist --streams 1 4

Each (model, streams) runs in its own process: fastmetal alone, the `bench` networks' own
training steps (MNIST: Adadelta, batch 64; VAE: Adam, batch 128; ResNet-20: SGD, batch
128) on synthetic batches already on the GPU, compiled, 6 warm-up calls, then the median
of 5 rounds of many steps. `host` is the time to queue a step (the loop without waiting),
`step` the time per step once the GPU is done: a step is device-bound where they differ.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

STEPS = {"mnist": 600, "vae": 800, "resnet": 60}

CHILD = r'''
import json, statistics, sys, time
import numpy as np
import fastmetal as fm
model, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
if model == "mnist":
    from fastmetal.benchmarks.mnist import fastmetal_step
    step = fastmetal_step("cuda")[0]
    batches = [(fm.asarray(rng.standard_normal((64, 1, 28, 28)).astype(np.float32), device="cuda"),
                fm.asarray(rng.integers(0, 10, 64), dtype="int64", device="cuda")) for _ in range(4)]
elif model == "vae":
    from fastmetal.benchmarks.vae import fastmetal_step
    step = fastmetal_step("cuda")
    batches = [(fm.asarray((rng.random((128, 784)) < 0.13).astype(np.float32), device="cuda"),)
               for _ in range(4)]
else:
    from fastmetal.benchmarks.resnet import fastmetal_step
    step = fastmetal_step("cuda")[0]
    batches = [(fm.asarray(rng.standard_normal((128, 3, 32, 32)).astype(np.float32), device="cuda"),
                fm.asarray(rng.integers(0, 10, 128), dtype="int64", device="cuda")) for _ in range(4)]
run = fm.compile(step)
for i in range(6):
    run(*batches[i % 4])
fm.synchronize()
rounds = []
for _ in range(5):
    t0 = time.perf_counter()
    for i in range(n):
        run(*batches[i % 4])
    t1 = time.perf_counter()
    fm.synchronize()
    rounds.append(((t1 - t0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3))
print(json.dumps({"host_ms": statistics.median(r[0] for r in rounds),
                  "step_ms": statistics.median(r[1] for r in rounds)}))
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(STEPS), choices=list(STEPS))
    ap.add_argument("--streams", nargs="+", default=["1", "2", "4", "8"])
    opts = ap.parse_args()
    import fastmetal as fm
    if "cuda" not in fm.devices():
        raise SystemExit("needs a CUDA GPU and fastmetal built with CUDA")
    print(f"{'model':8} {'streams':>7} {'host ms':>9} {'step ms':>9}")
    for model in opts.models:
        for streams in opts.streams:
            env = dict(os.environ, FASTMETAL_COMPILE_STREAMS=streams)
            out = subprocess.run([sys.executable, "-c", CHILD, model, str(STEPS[model])],
                                 env=env, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{model:8} {streams:>7} failed: {out.stderr[-400:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{model:8} {streams:>7} {r['host_ms']:9.3f} {r['step_ms']:9.3f}", flush=True)


if __name__ == "__main__":
    main()
