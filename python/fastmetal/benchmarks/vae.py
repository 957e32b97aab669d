"""One training epoch of PyTorch's VAE example, fastmetal against PyTorch.

The network and loss of examples/vae.py (``fastmetal.models.VAE`` / ``vae_loss``: 784-400-20
encoder, 20-400-784 decoder, BCE summed + KL; Adam lr 1e-3; batch 128) trained for one epoch
of ``--samples`` images (default 60,000) by fastmetal and by PyTorch with the same model,
loss and optimizer on the same device and the same number of CPU threads, each in a process
of its own (this one starts both). Data:
the MNIST training files of ``--data DIR`` when given, else synthetic binarised digits (the
step time does not depend on the pixel values); batches are on the device before the clock
starts. Each step draws its eps ~ N(0, 1) on the device (fastmetal.random / torch.randn).
Times are wall-clock seconds of the whole epoch (after 3 warm-up steps), synchronised.

    python -m fastmetal bench vae [--samples 60000] [--device cpu] [--profile] [--compile]

``--profile`` adds the tape's own time (recording during the forward, walking the graph in
backward) per step.
"""
from __future__ import annotations

import numpy as np

import fastmetal as fm

from ..models import VAE, vae_loss
from ..data.datasets import load_mnist
from . import _epoch
from ._timing import machine_summary

BATCH = 128
POOL_BATCHES = 16  # distinct batches cycled through


def make_batches(data_dir, seed):
    """POOL_BATCHES float32 (128, 784) batches in [0, 1]."""
    rng = np.random.default_rng(seed)
    n = POOL_BATCHES * BATCH
    if data_dir:
        images, _ = load_mnist(data_dir, train=True)
        images = images[rng.permutation(len(images))[:n]].reshape(n, 784) / np.float32(255)
    else:  # binarised blobs: each image a random set of strokes
        images = (rng.random((n, 784)) < 0.13).astype(np.float32)
    return [np.ascontiguousarray(images[i:i + BATCH], dtype=np.float32)
            for i in range(0, n, BATCH)]


def fastmetal_step(device):
    fm.random.seed(0)
    model = VAE(0, device)
    opt = fm.nn.optim.Adam(model.parameters(), lr=1e-3)

    def step(x):
        recon, mu, logvar = model(x)
        loss = vae_loss(recon, x, mu, logvar)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step


def torch_step(torch, device):
    nn = torch.nn
    torch.manual_seed(0)
    layers = nn.ModuleDict({"fc1": nn.Linear(784, 400), "fc21": nn.Linear(400, 20),
                            "fc22": nn.Linear(400, 20), "fc3": nn.Linear(20, 400),
                            "fc4": nn.Linear(400, 784)}).to(device)
    opt = torch.optim.Adam(layers.parameters(), lr=1e-3)
    F = torch.nn.functional

    def step(x):
        h = F.relu(layers["fc1"](x))
        mu, logvar = layers["fc21"](h), layers["fc22"](h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        recon = torch.sigmoid(layers["fc4"](F.relu(layers["fc3"](z))))
        loss = F.binary_cross_entropy(recon, x, reduction="sum") - \
            0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step


def fastmetal_rows(device, batches, samples, compiled=False):
    """fastmetal's rows of the table: (name, seconds, samples); with ``compiled`` also the
    step under fastmetal.compile."""
    fbatches = [(fm.asarray(x, device=device),) for x in batches]
    seconds, done = _epoch.run_epoch(fastmetal_step(device), fbatches, samples,
                                     fm.synchronize, BATCH)
    rows = [(f"fastmetal, {device}", seconds, done)]
    if compiled:
        seconds, done = _epoch.run_epoch(fm.compile(fastmetal_step(device)), fbatches, samples,
                                         fm.synchronize, BATCH)
        rows.append((f"fastmetal.compile, {device}", seconds, done))
    return rows


def torch_rows(torch, device, batches, samples, compiled=False):
    """PyTorch's rows of the table, (name, seconds, samples) each: eager, and with
    ``compiled`` torch.compile and torch.compile(mode="reduce-overhead")."""
    tdev, tsync = _epoch.torch_device(torch, device)
    tbatches = [(torch.from_numpy(x).to(tdev),) for x in batches]
    seconds, done = _epoch.run_epoch(torch_step(torch, tdev), tbatches, samples, tsync, BATCH)
    rows = [(f"PyTorch {torch.__version__}, {tdev}", seconds, done)]
    if compiled:
        rows += _epoch.torch_compiled_rows(torch, lambda: torch_step(torch, tdev), tbatches,
                                           samples, tsync, BATCH, tdev)
    return rows


def tape_time(device, batches, steps=20):
    """Median ms a step the tape itself takes: (recording, graph walk)."""
    step = fastmetal_step(device)
    rec, walk = [], []
    for i in range(steps + 2):
        with _epoch.tape_profile() as profile:
            step(*batches[i % len(batches)])
        if i >= 2:
            record, graph_walk = _epoch.tape_seconds(profile)
            rec.append(record)
            walk.append(graph_walk)
    return 1e3 * float(np.median(rec)), 1e3 * float(np.median(walk))


def main(argv=None):
    ap = _epoch.parser("vae", __doc__, "synthetic binarised digits",
                       "the tape's own time per step")
    ns = ap.parse_args(argv)
    device, torch = _epoch.setup(ap, ns, BATCH)
    if ns.worker:
        return _epoch.epoch_worker(ns, device, torch, make_batches, fastmetal_rows, torch_rows)
    print(f"VAE example network, one epoch of {ns.samples:,} samples, batch {BATCH}, Adam; "
          f"{'MNIST files in ' + ns.data if ns.data else 'synthetic binarised digits'}")
    print(f"machine: {machine_summary()}\n")
    batches = make_batches(ns.data, 0)

    results = _epoch.epochs_in_processes("vae", ns, torch)

    ours = _epoch.print_table(results, BATCH, ns.samples)
    if ns.profile:
        record, walk = tape_time(device, [(fm.asarray(x, device=device),) for x in batches])
        print(f"\nautograd's own work per step (median of 20): recording {record:.2f} ms, "
              f"graph walk {walk:.2f} ms, of {1e3 * BATCH * ours:.2f} ms")
    return results


if __name__ == "__main__":
    main()
