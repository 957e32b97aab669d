"""One training epoch of PyTorch's MNIST example network, fastmetal against PyTorch.

The network of examples/mnist.py, ``fastmetal.models.mnist_cnn`` (conv 1->32, conv 32->64, max-pool, dropout, linear
9216->128, linear 128->10, log-softmax; Adadelta lr 1.0; batch 64) trained for one epoch of
``--samples`` images (default 60,000, MNIST's training set) by fastmetal and by PyTorch with
the same network and optimizer on the same device and the same number of CPU threads, each
in a process of its own (this one starts both). Data: the MNIST training files of ``--data DIR`` when given, else synthetic
MNIST-shaped batches (the step time does not depend on the pixel values); batches are
prepared before the clock starts, so no data loader is timed.

    python -m fastmetal bench mnist [--samples 60000] [--device cpu] [--profile] [--compile]

``--profile`` adds where fastmetal's step time goes: the forward of each layer, backward()
(and of it, autograd's own bookkeeping),
the loss and the optimizer step (median over a few batches).
"""
from __future__ import annotations

import statistics
import time

import numpy as np

import fastmetal as fm

from ..models import mnist_cnn
from ..data.datasets import load_mnist
from . import _epoch
from ._timing import machine_summary

# The seed's reference numbers: PyTorch's MNIST example, seconds per epoch of 60,000 images.
REFERENCE = (("PyTorch, M1 CPU (reference)", 33.4), ("PyTorch, M1 MPS (reference)", 19.6))
BATCH = 64
POOL_BATCHES = 32  # distinct batches cycled through (keeps memory small)


def torch_model(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(128, 10), nn.LogSoftmax(1))


def make_batches(data_dir, seed):
    """POOL_BATCHES (images float32 (64, 1, 28, 28), labels int64 (64,)) pairs."""
    rng = np.random.default_rng(seed)
    n = POOL_BATCHES * BATCH
    if data_dir:
        images, labels = load_mnist(data_dir, train=True)
        pick = rng.permutation(len(labels))[:n]
        images, labels = images[pick], labels[pick].astype(np.int64)
    else:
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n)
    x = ((images.astype(np.float32) / 255 - 0.1307) / 0.3081)[:, None]
    return [(np.ascontiguousarray(x[i:i + BATCH]), labels[i:i + BATCH])
            for i in range(0, len(labels) - BATCH + 1, BATCH)]


def fastmetal_step(device):
    model = mnist_cnn(0, device)
    loss_fn = fm.nn.CrossEntropyLoss()
    opt = fm.nn.optim.Adadelta(model.parameters(), lr=1.0)

    def step(x, y):
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step, model, loss_fn, opt


def torch_step(torch, device):
    torch.manual_seed(0)
    model = torch_model(torch).to(device)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    model.train()

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.nll_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def on_device(batches, device):
    """Images already on the device, as PyTorch's (no host-to-device copy is timed)."""
    return batches if device == "cpu" else [(fm.asarray(x, device=device), y)
                                            for x, y in batches]


def fastmetal_rows(device, batches, samples, compiled=False):
    """fastmetal's rows of the table: (name, seconds, samples); with ``compiled`` also the
    step under fastmetal.compile (images and labels as device Arrays, its inputs)."""
    step, *_ = fastmetal_step(device)
    seconds, done = _epoch.run_epoch(step, on_device(batches, device), samples,
                                     fm.synchronize, BATCH)
    rows = [(f"fastmetal, {device}", seconds, done)]
    if compiled:
        arrays = [(fm.asarray(x, device=device), fm.asarray(y, dtype="int64", device=device))
                  for x, y in batches]
        seconds, done = _epoch.run_epoch(fm.compile(fastmetal_step(device)[0]), arrays,
                                         samples, fm.synchronize, BATCH)
        rows.append((f"fastmetal.compile, {device}", seconds, done))
    return rows


def torch_rows(torch, device, batches, samples, compiled=False):
    """PyTorch's rows of the table, (name, seconds, samples) each: eager, and with
    ``compiled`` torch.compile and torch.compile(mode="reduce-overhead")."""
    tdev, tsync = _epoch.torch_device(torch, device)
    tbatches = [(torch.from_numpy(x).to(tdev), torch.from_numpy(y).to(tdev))
                for x, y in batches]
    seconds, done = _epoch.run_epoch(torch_step(torch, tdev), tbatches, samples, tsync, BATCH)
    rows = [(f"PyTorch {torch.__version__}, {tdev}", seconds, done)]
    if compiled:
        rows += _epoch.torch_compiled_rows(torch, lambda: torch_step(torch, tdev), tbatches,
                                           samples, tsync, BATCH, tdev)
    return rows


def profile_fastmetal(device, batches, repeats=10):
    """Median milliseconds per batch of each layer's forward, the loss, backward() (with the
    tape's own bookkeeping: recording during the forward and walking the graph, apart from
    the vjps' kernels) and the optimizer step."""
    _, model, loss_fn, opt = fastmetal_step(device)
    sync = fm.synchronize
    names = [f"{i}:{type(layer).__name__}" for i, layer in enumerate(model)]
    keys = [f"{n} fwd" for n in names] + ["loss", "backward", "optimizer",
                                           "autograd bookkeeping: recording",
                                           "autograd bookkeeping: graph walk"]
    rows = {k: [] for k in keys}
    for r in range(repeats + 2):
        x, y = batches[r % len(batches)]
        times = {}
        with _epoch.tape_profile() as profile:
            for name, layer in zip(names, model):
                t0 = time.perf_counter()
                x = layer(x)
                sync()
                times[f"{name} fwd"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            loss = loss_fn(x, y)
            sync()
            times["loss"] = time.perf_counter() - t0
            opt.zero_grad()
            t0 = time.perf_counter()
            loss.backward()
            sync()
            times["backward"] = time.perf_counter() - t0
        (times["autograd bookkeeping: recording"],
         times["autograd bookkeeping: graph walk"]) = _epoch.tape_seconds(profile)
        t0 = time.perf_counter()
        opt.step()
        sync()
        times["optimizer"] = time.perf_counter() - t0
        if r >= 2:  # the first two are warm-up
            for k, v in times.items():
                rows[k].append(v)
    return {k: 1e3 * statistics.median(v) for k, v in rows.items()}


def host_vs_device(step, batches, steps=100):
    """(ms a step to queue, ms a step until the device finished): equal when the host is the
    bottleneck, queueing shorter when the device is."""
    for x, y in batches[:3]:
        step(x, y)
    fm.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        x, y = batches[i % len(batches)]
        step(x, y)
    t1 = time.perf_counter()
    fm.synchronize()
    t2 = time.perf_counter()
    return 1e3 * (t1 - t0) / steps, 1e3 * (t2 - t0) / steps


def main(argv=None):
    ap = _epoch.parser("mnist", __doc__, "synthetic MNIST-shaped batches",
                       "fastmetal's time per layer")
    ns = ap.parse_args(argv)
    device, torch = _epoch.setup(ap, ns, BATCH)
    if ns.worker:
        return _epoch.epoch_worker(ns, device, torch, make_batches, fastmetal_rows, torch_rows)
    print(f"MNIST example network, one epoch of {ns.samples:,} samples, batch {BATCH}, "
          f"Adadelta; {'MNIST files in ' + ns.data if ns.data else 'synthetic batches'}")
    print(f"machine: {machine_summary()}\n")
    batches = make_batches(ns.data, 0)

    results = _epoch.epochs_in_processes("mnist", ns, torch)
    _epoch.print_table(results, BATCH, ns.samples, REFERENCE)

    if ns.profile:
        fbatches = on_device(batches, device)
        if device != "cpu":
            queued, finished = host_vs_device(fastmetal_step(device)[0], fbatches)
            print(f"\nfastmetal on {device}: the host queues a step in {queued:.2f} ms, the "
                  f"device finishes one every {finished:.2f} ms (100 steps)")
            if ns.compile:
                arrays = [(x, fm.asarray(y, dtype="int64", device=device)) for x, y in fbatches]
                queued, finished = host_vs_device(fm.compile(fastmetal_step(device)[0]), arrays)
                print(f"fastmetal.compile on {device}: the host queues a step in {queued:.2f} "
                      f"ms, the device finishes one every {finished:.2f} ms (100 steps)")
        _epoch.print_step_profile(profile_fastmetal(device, fbatches), f"fastmetal step on "
                                  f"{device}, per layer (median of 10 batches", 22)
    return results


if __name__ == "__main__":
    main()
