"""Seconds per training batch of PyTorch's MNIST example network (examples/mnist.py):
fastmetal against the same network, optimizer (Adadelta lr 1.0) and batch size (64) in
PyTorch CPU, on the same number of threads, on synthetic batches (no data needed).

Per-epoch time = per-batch time x 938 (60,000 MNIST training images / 64), beside the
reference numbers of the issue: 33.4 s per epoch on an M1 CPU and 19.6 s on M1 MPS
(PyTorch's example). ratio = torch time / fastmetal time, so > 1 means fastmetal is faster.

  python benchmarks/mnist_epoch.py [--batches 20] [--threads 2] [--device cpu]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

BATCHES_PER_EPOCH = 938  # ceil(60000 / 64)
M1_REFERENCE = {"M1 CPU (PyTorch)": 33.4, "M1 MPS (PyTorch)": 19.6}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_batches(step, batches: list[tuple[np.ndarray, np.ndarray]], warmup: int) -> list[float]:
    for x, y in batches[:warmup]:
        step(x, y)
    times = []
    for x, y in batches:
        t0 = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t0)
    return times


def fastmetal_step(device: str):
    import fastmetal as fm

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from mnist import build_net

    net = build_net(device, seed=0)
    opt = fm.nn.optim.Adadelta(net.parameters(), lr=1.0)
    loss_fn = fm.nn.CrossEntropyLoss()

    def step(x, y):
        out = net(fm.asarray(x, device=device))
        loss, grad = loss_fn(out, y)
        opt.zero_grad()
        net.backward(grad)
        opt.step()
        float(loss.numpy() if isinstance(loss, fm.Array) else loss)  # waits for the device
    return step


def torch_step():
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Dropout(0.25), torch.nn.Flatten(),
        torch.nn.Linear(9216, 128), torch.nn.ReLU(), torch.nn.Dropout(0.5),
        torch.nn.Linear(128, 10), torch.nn.LogSoftmax(1))
    opt = torch.optim.Adadelta(net.parameters(), lr=1.0)

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.nll_loss(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        loss.item()
    return step


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=20, help="timed batches per library")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", default="cpu", help="fastmetal device")
    ns = ap.parse_args(argv)
    os.environ["FASTMETAL_NUM_THREADS"] = str(ns.threads)  # before fastmetal is imported

    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((64, 1, 28, 28)).astype(np.float32),
                rng.integers(0, 10, 64).astype(np.int64)) for _ in range(ns.batches)]
    rows = [("fastmetal " + ns.device, time_batches(fastmetal_step(ns.device), batches, ns.warmup))]
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: fastmetal only")
    else:
        torch.set_num_threads(ns.threads)
        rows.append((f"torch {torch.__version__} cpu", time_batches(torch_step(), batches,
                                                                    ns.warmup)))

    print(f"{cpu_model()}, {ns.threads} threads, {ns.batches} batches of 64 (median; "
          f"epoch = {BATCHES_PER_EPOCH} batches)")
    medians = {}
    for name, times in rows:
        medians[name] = statistics.median(times)
        print(f"  {name:28s} {medians[name] * 1e3:8.1f} ms/batch  "
              f"{medians[name] * BATCHES_PER_EPOCH:7.1f} s/epoch")
    for name, seconds in M1_REFERENCE.items():
        print(f"  {name:28s} {seconds / BATCHES_PER_EPOCH * 1e3:8.1f} ms/batch  "
              f"{seconds:7.1f} s/epoch  (reference)")
    if len(rows) == 2:
        print(f"  ratio torch/fastmetal: {medians[rows[1][0]] / medians[rows[0][0]]:.2f}")


if __name__ == "__main__":
    main()
