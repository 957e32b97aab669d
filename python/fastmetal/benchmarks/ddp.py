"""Data-parallel throughput: samples/s of DistributedDataParallel training on 1 process and
on N (``python -m fastmetal.distributed.run``), same model and per-process batch.

    python -m fastmetal bench ddp [--nproc 2] [--device cpu] [--model mnist_cnn|mlp]
                                  [--batch 64] [--steps 20] [--torch]

Each configuration is one launch: every rank builds the model (``mnist_cnn``: PyTorch's
MNIST network; ``mlp``: 784-1024-1024-10, more gradient per FLOP), wraps it in DDP and
runs ``--warmup`` steps, then ``--steps`` timed steps (Adadelta, synthetic MNIST-shaped
batches prepared before the clock starts); a barrier closes each timed step, and rank 0
reports the median step. samples/s = per-process batch x processes / step time; scaling
efficiency = speedup / processes. On the CPU, N processes split the cores
(FASTMETAL_NUM_THREADS = cores / N, as the launcher sets), so 1 process with every core is
the baseline and little speedup is to be expected; on GPUs (``--device cuda --nproc N``, one
GPU per rank, NCCL through CuPy) it measures how much of the step the averaging costs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import fastmetal as fm

from ..models import mnist_cnn
from ._timing import machine_summary


def build(model: str, seed: int) -> fm.nn.Module:
    if model == "mnist_cnn":
        return mnist_cnn(seed)
    rng = np.random.default_rng(seed)
    return fm.nn.Sequential(fm.nn.Flatten(), fm.nn.Linear(784, 1024, rng=rng), fm.nn.ReLU(),
                            fm.nn.Linear(1024, 1024, rng=rng), fm.nn.ReLU(),
                            fm.nn.Linear(1024, 10, rng=rng))


def worker(ns: argparse.Namespace) -> None:
    """One rank of a launch: time DDP steps, rank 0 writes the result to ns.out."""
    dist = fm.distributed
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = fm.nn.parallel.DistributedDataParallel(build(ns.model, 0))
    opt = fm.optim.Adadelta(ddp.parameters(), lr=1.0)
    rng = np.random.default_rng(rank)
    batches = [(rng.standard_normal((ns.batch, 1, 28, 28)).astype(np.float32),
                rng.integers(0, 10, ns.batch)) for _ in range(4)]
    flag = fm.zeros((1,))
    times = []
    for i in range(ns.warmup + ns.steps):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        loss = fm.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        fm.synchronize()
        dist.all_reduce(flag)  # every rank's step has ended
        if i >= ns.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        step = statistics.median(times)
        with open(ns.out, "w") as f:
            json.dump({"world": world, "step_s": step, "backend": dist.get_backend(),
                       "device": fm.default_device(),
                       "threads": os.environ.get("FASTMETAL_NUM_THREADS", "all")}, f)
    dist.destroy_process_group()


def torch_worker(ns: argparse.Namespace) -> None:
    """The same protocol with PyTorch's DistributedDataParallel (NCCL on cuda, Gloo on the
    CPU), started by fastmetal's launcher (torchrun's environment; its own port)."""
    import torch  # optional: only where --torch asks for it
    import torch.distributed as tdist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = ns.device == "cuda"
    tdist.init_process_group(
        "nccl" if cuda else "gloo", rank=rank, world_size=world,
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT']) + 1}")
    if not cuda:
        torch.set_num_threads(int(os.environ.get("FASTMETAL_NUM_THREADS", os.cpu_count() or 1)))
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    nn = torch.nn
    if ns.model == "mnist_cnn":
        net = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, 128),
                            nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10), nn.LogSoftmax(1))
    else:
        net = nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                            nn.ReLU(), nn.Linear(1024, 10))
    ddp = nn.parallel.DistributedDataParallel(net.to(dev), device_ids=[0] if cuda else None)
    opt = torch.optim.Adadelta(ddp.parameters(), lr=1.0)
    rng = np.random.default_rng(rank)
    batches = [(rng.standard_normal((ns.batch, 1, 28, 28)).astype(np.float32),
                rng.integers(0, 10, ns.batch)) for _ in range(4)]
    flag = torch.zeros(1, device=dev)
    times = []
    for i in range(ns.warmup + ns.steps):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddp(torch.from_numpy(x).to(dev)),
                                                 torch.from_numpy(y).to(dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        tdist.all_reduce(flag)  # every rank's step has ended
        if cuda:
            torch.cuda.synchronize()
        if i >= ns.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(ns.out, "w") as f:
            json.dump({"world": world, "step_s": statistics.median(times),
                       "backend": tdist.get_backend(), "device": ns.device,
                       "threads": os.environ.get("FASTMETAL_NUM_THREADS", "all")}, f)
    tdist.destroy_process_group()


def launch(n: int, ns: argparse.Namespace, library: str = "fastmetal") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "fastmetal.distributed.run", "--nproc-per-node", str(n),
               "--device", ns.device, "-m", "fastmetal.benchmarks.ddp", "--worker",
               "--model", ns.model, "--batch", str(ns.batch), "--steps", str(ns.steps),
               "--warmup", str(ns.warmup), "--out", out,
               "--device", ns.device] + (["--torch-worker"] if library == "torch" else [])
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"[fastmetal bench ddp] the launch of {n} processes failed "
                             f"(exit {result.returncode}):\n{result.stderr[-3000:]}")
        with open(out) as f:
            return dict(json.load(f))


def main(argv: list | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench ddp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2, help="processes of the parallel run")
    ap.add_argument("--device", default=fm.default_device(), help=f"one of {fm.devices()}")
    ap.add_argument("--model", choices=("mnist_cnn", "mlp"), default="mnist_cnn")
    ap.add_argument("--batch", type=int, default=64, help="samples per process per step")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--torch", action="store_true",
                    help="also time PyTorch's DistributedDataParallel (same model, batches, "
                         "optimizer and protocol), each launch in its own processes")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.worker:
        (torch_worker if ns.torch_worker else worker)(ns)
        return
    if ns.nproc < 1 or ns.batch < 1 or ns.steps < 1:
        ap.error("--nproc, --batch and --steps must be >= 1")
    params = sum(int(p.size) for p in build(ns.model, 0).parameters())
    print(f"DistributedDataParallel throughput: {ns.model} ({params:,} parameters), batch "
          f"{ns.batch} per process, {ns.steps} timed steps, device {ns.device}")
    print(f"machine: {machine_summary()}")
    libraries = ["fastmetal"] + (["torch"] if ns.torch else [])
    print("| library | processes | engine | threads each | global batch | step (median) "
          "| samples/s | speedup | efficiency |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for library in libraries:
        rows = [launch(n, ns, library) for n in sorted({1, ns.nproc})]
        base = ns.batch / rows[0]["step_s"]
        for r in rows:
            rate = ns.batch * r["world"] / r["step_s"]
            print(f"| {library} | {r['world']} | {r['backend']} | {r['threads']} | "
                  f"{ns.batch * r['world']} | {r['step_s'] * 1e3:.1f} ms | {rate:,.0f} | "
                  f"{rate / base:.2f}x | {rate / base / r['world']:.0%} |")


if __name__ == "__main__":
    main()
