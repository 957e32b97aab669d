"""Reference networks, built once for the examples, benchmarks and tests that train them.

``mnist_cnn`` is PyTorch's MNIST example network (pytorch/examples, mnist/main.py):

    conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, dropout 0.25, flatten,
    linear 9216->128, ReLU, dropout 0.5, linear 128->10, log-softmax
"""
from __future__ import annotations

import numpy as np

from . import nn

__all__ = ["mnist_cnn"]


def mnist_cnn(seed: int, device: str | None = None) -> nn.Sequential:
    """PyTorch's MNIST example network, every parameter and dropout mask drawn from one
    generator seeded with ``seed``; parameters on ``device`` (None: the default device)."""
    rng = np.random.default_rng(seed)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, rng=rng, device=device), nn.ReLU(),
        nn.Conv2d(32, 64, 3, rng=rng, device=device), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25, rng=rng), nn.Flatten(),
        nn.Linear(9216, 128, rng=rng, device=device), nn.ReLU(), nn.Dropout(0.5, rng=rng),
        nn.Linear(128, 10, rng=rng, device=device), nn.LogSoftmax(1))
