"""Train a small CNN with fastmetal's conv layers on a synthetic task (no downloads).

Task: 16x16 images that contain either horizontal or vertical stripes (plus noise); the
network has to tell which. Architecture: Conv(1->8, 3x3, pad 1) -> ReLU -> Conv(8->16, 3x3,
stride 2) -> ReLU -> global average pool -> linear -> cross-entropy. Convolutions and activations
run in fastmetal (on the default device: Metal on a Mac), trained with loss.backward() and SGD.

    python examples/train_small_cnn.py [--steps 200]
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import fastmetal as fm


def make_batch(rng: np.random.Generator, n: int) -> tuple[Any, Any]:
    labels = rng.integers(0, 2, n)
    phase = rng.integers(0, 4, n)
    coords = np.arange(16)
    stripes = ((coords[None, :] + phase[:, None]) % 4 < 2).astype(np.float32)  # (n, 16)
    images = np.where(labels[:, None, None] == 0, stripes[:, :, None], stripes[:, None, :])
    images = images + 0.3 * rng.standard_normal((n, 16, 16)).astype(np.float32)
    return images[:, None].astype(np.float32), labels


class StripeNet(fm.nn.Module):
    """Conv(1->8, 3x3, pad 1) -> ReLU -> Conv(8->16, 3x3, stride 2) -> ReLU -> global average
    pool -> Linear(16 -> 2): a PyTorch-style model, its gradients from loss.backward()."""

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self.conv1 = fm.nn.Conv2d(1, 8, 3, padding=1, rng=rng)  # seeded: the same run every time
        self.conv2 = fm.nn.Conv2d(8, 16, 3, stride=2, rng=rng)
        self.head = fm.nn.Linear(16, 2, rng=rng)
        self.relu = fm.nn.ReLU()  # one instance, used twice

    def forward(self, x: Any) -> Any:
        h = self.relu(self.conv2(self.relu(self.conv1(x))))
        return self.head(h.mean(axis=(2, 3)))


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="training steps (default: 200)")
    ap.add_argument("--batch", type=int, default=32, help="batch size (default: 32)")
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default: 0.1)")
    ns = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    model = StripeNet(rng)
    optimizer = fm.optim.SGD(model.parameters(), lr=ns.lr)
    loss_fn = fm.nn.CrossEntropyLoss()

    t0 = time.perf_counter()
    for step in range(1, ns.steps + 1):
        x, y = make_batch(rng, ns.batch)
        logits = model(x)
        loss = loss_fn(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == 1:
            acc = (logits.numpy().argmax(1) == y).mean()
            print(f"step {step:4d}  loss {loss.item():.4f}  batch accuracy {acc:.2f}")

    x, y = make_batch(rng, 512)
    with fm.no_grad():
        accuracy = float((model(x).numpy().argmax(1) == y).mean())
    print(f"held-out accuracy {accuracy:.3f} after {ns.steps} steps "
          f"({time.perf_counter() - t0:.1f} s on {fm.default_device()})")
    return accuracy


if __name__ == "__main__":
    main()
