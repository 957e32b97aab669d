"""Train a small CNN with fastmetal's conv layers on a synthetic task (no downloads).

Task: 16x16 images that contain either horizontal or vertical stripes (plus noise); the
network has to tell which. Architecture: Conv(1->8, 3x3, pad 1) -> ReLU -> Conv(8->16, 3x3,
stride 2) -> ReLU -> global average pool -> linear -> softmax. Convolutions and activations
run in fastmetal (on the default device: Metal on a Mac); the tiny head is NumPy.

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


def relu_backward(grad: Any, pre: Any) -> Any:
    return np.where(pre > 0, grad, 0.0).astype(np.float32)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help keeps the docstring's layout and shows each option's default."""


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="SGD steps")
    ap.add_argument("--batch", type=int, default=32, help="images per step")
    ap.add_argument("--lr", type=float, default=0.1, help="learning rate")
    ns = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    conv1 = fm.nn.Conv2d(1, 8, 3, padding=1, rng=rng)  # seeded: the same run every time
    conv2 = fm.nn.Conv2d(8, 16, 3, stride=2, rng=rng)
    w_head = (rng.standard_normal((16, 2)) * 0.1).astype(np.float32)
    b_head = np.zeros(2, np.float32)

    t0 = time.perf_counter()
    for step in range(1, ns.steps + 1):
        x, y = make_batch(rng, ns.batch)
        # forward
        h1_pre = np.asarray(conv1(x))
        h1 = fm.relu(h1_pre)
        h2_pre = np.asarray(conv2(h1))
        h2 = fm.relu(h2_pre)
        pooled = h2.mean(axis=(2, 3))                           # (n, 16)
        logits = pooled @ w_head + b_head
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        loss = -np.log(probs[np.arange(len(y)), y] + 1e-12).mean()
        # backward
        g_logits = probs.copy()
        g_logits[np.arange(len(y)), y] -= 1
        g_logits /= len(y)
        g_w, g_b = pooled.T @ g_logits, g_logits.sum(0)
        g_pooled = g_logits @ w_head.T
        g_h2 = np.broadcast_to(g_pooled[:, :, None, None] / (h2.shape[2] * h2.shape[3]), h2.shape)
        g_h1 = relu_backward(np.asarray(conv2.backward(relu_backward(g_h2, h2_pre))), h1_pre)
        conv1.backward(g_h1)
        # SGD
        for layer in (conv1, conv2):
            layer.weight -= ns.lr * layer.weight_grad
            layer.bias -= ns.lr * layer.bias_grad
        w_head -= ns.lr * g_w
        b_head -= ns.lr * g_b
        if step % 50 == 0 or step == 1:
            acc = (probs.argmax(1) == y).mean()
            print(f"step {step:4d}  loss {loss:.4f}  batch accuracy {acc:.2f}")

    x, y = make_batch(rng, 512)
    h = fm.relu(conv2(fm.relu(conv1(x))))
    accuracy = float(((np.asarray(h).mean(axis=(2, 3)) @ w_head + b_head).argmax(1) == y).mean())
    print(f"held-out accuracy {accuracy:.3f} after {ns.steps} steps "
          f"({time.perf_counter() - t0:.1f} s on {fm.default_device()})")
    return accuracy


if __name__ == "__main__":
    main()
