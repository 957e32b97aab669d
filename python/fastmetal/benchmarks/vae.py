"""One training epoch of PyTorch's VAE example, fastmetal against PyTorch.

The network and loss of examples/vae.py (``fastmetal.models.VAE`` / ``vae_loss``: 784-400-20
encoder, 20-400-784 decoder, BCE summed + KL; Adam lr 1e-3; batch 128) trained for one epoch
of ``--samples`` images (default 60,000) by fastmetal and by PyTorch with the same model,
loss and optimizer on the same device and the same number of CPU threads, in one run. Data:
the MNIST training files of ``--data DIR`` when given, else synthetic binarised digits (the
step time does not depend on the pixel values); batches are on the device before the clock
starts. Each step draws its eps ~ N(0, 1) on the device (fastmetal.random / torch.randn).
Times are wall-clock seconds of the whole epoch (after 3 warm-up steps), synchronised.

    python -m fastmetal bench vae [--samples 60000] [--device cpu] [--profile]

``--profile`` adds the tape's own time (recording during the forward, walking the graph in
backward) per step.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import fastmetal as fm

from ..models import VAE, vae_loss
from ._timing import machine_summary, torch_or_none

BATCH = 128
POOL_BATCHES = 16  # distinct batches cycled through


def make_batches(data_dir, seed):
    """POOL_BATCHES float32 (128, 784) batches in [0, 1]."""
    rng = np.random.default_rng(seed)
    n = POOL_BATCHES * BATCH
    if data_dir:
        from ..datasets import load_mnist
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


def run_epoch(step, batches, samples, sync):
    """Seconds for ceil(samples / 128) steps, after 3 warm-up steps."""
    for x in batches[:3]:
        step(x)
    sync()
    steps = -(-samples // BATCH)
    start = time.perf_counter()
    for i in range(steps):
        step(batches[i % len(batches)])
    sync()
    return time.perf_counter() - start, steps * BATCH


def tape_time(device, batches, steps=20):
    """Median ms a step the tape itself takes: (recording, graph walk)."""
    from fastmetal import _autograd
    step = fastmetal_step(device)
    rec, walk = [], []
    for i in range(steps + 2):
        _autograd.PROFILE = profile = {}
        try:
            step(batches[i % len(batches)])
        finally:
            _autograd.PROFILE = None
        if i >= 2:
            rec.append(profile.get("record", 0.0))
            walk.append(profile.get("backward", 0.0) - profile.get("vjp", 0.0))
    return 1e3 * float(np.median(rec)), 1e3 * float(np.median(walk))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench vae", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=60_000,
                    help="images in the timed epoch (default 60,000; less for a quick run)")
    ap.add_argument("--device", default=None, help="fastmetal device (default: the default "
                    "device); PyTorch runs on the matching one (cpu, cuda, or mps for metal)")
    ap.add_argument("--data", default=None, help="directory of the MNIST IDX files "
                    "(default: synthetic binarised digits)")
    ap.add_argument("--profile", action="store_true", help="the tape's own time per step")
    ap.add_argument("--no-torch", action="store_true", help="fastmetal only")
    ns = ap.parse_args(argv)
    if ns.samples < BATCH:
        ap.error(f"--samples: expected at least {BATCH}, got {ns.samples}")
    device = ns.device or fm.default_device()
    if device not in fm.devices():
        ap.error(f"--device: expected one of {fm.devices()}, got {device!r}")
    torch = None if ns.no_torch else torch_or_none()
    if torch is not None:
        torch.set_num_threads(fm._core._num_threads())  # the same CPU threads for both
    print(f"VAE example network, one epoch of {ns.samples:,} samples, batch {BATCH}, Adam; "
          f"{'MNIST files in ' + ns.data if ns.data else 'synthetic binarised digits'}")
    print(f"machine: {machine_summary()}\n")
    batches = make_batches(ns.data, 0)

    results = []
    fbatches = [fm.asarray(x, device=device) for x in batches]
    seconds, done = run_epoch(fastmetal_step(device), fbatches, ns.samples, fm.synchronize)
    results.append((f"fastmetal, {device}", seconds, done))
    if torch is not None:
        tdev = {"metal": "mps"}.get(device, device)
        tsync = {"cuda": torch.cuda.synchronize,
                 "mps": getattr(getattr(torch, "mps", None), "synchronize", None)}.get(tdev)
        tbatches = [torch.from_numpy(x).to(tdev) for x in batches]
        seconds, done = run_epoch(torch_step(torch, tdev), tbatches, ns.samples,
                                  tsync or (lambda: None))
        results.append((f"PyTorch {torch.__version__}, {tdev}", seconds, done))

    ours = results[0][1] / results[0][2]
    print(f"{'':34} {'s/epoch (60k)':>14} {'samples/s':>10} {'ms/batch':>9} "
          f"{'fastmetal speed-up':>19}")
    for name, seconds, done in results:
        per = seconds / done
        print(f"{name:34} {60_000 * per:14.1f} {1 / per:10,.0f} {1e3 * BATCH * per:9.2f} "
              f"{per / ours:18.2f}x")
    if ns.samples != 60_000:
        print(f"(measured on {ns.samples:,} samples, scaled to 60,000)")
    if ns.profile:
        record, walk = tape_time(device, fbatches)
        print(f"\nautograd's own work per step (median of 20): recording {record:.2f} ms, "
              f"graph walk {walk:.2f} ms, of {1e3 * BATCH * ours:.2f} ms")
    return results


if __name__ == "__main__":
    main()
