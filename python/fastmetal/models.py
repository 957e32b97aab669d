"""Reference networks, built once for the examples, benchmarks and tests that train them.

``mnist_cnn`` is PyTorch's MNIST example network (pytorch/examples, mnist/main.py):

    conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, dropout 0.25, flatten,
    linear 9216->128, ReLU, dropout 0.5, linear 128->10, log-softmax

``VAE`` and ``vae_loss`` are PyTorch's variational autoencoder example (pytorch/examples,
vae/main.py):

    fc1 784->400, ReLU, fc21 / fc22 400->20 (mu, logvar), z = mu + eps * exp(logvar / 2),
    fc3 20->400, ReLU, fc4 400->784, sigmoid; loss = BCE (summed) + KL divergence
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import nn
from . import random
from .nn.functional import binary_cross_entropy
from .ops.elementwise import FUNCTIONS as E

__all__ = ["mnist_cnn", "VAE", "vae_loss"]


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


class VAE(nn.Module):
    """PyTorch's VAE example network, its parameters drawn from one generator seeded with
    ``seed`` (PyTorch's Linear initialisation), on ``device``."""

    def __init__(self, seed: int = 0, device: str | None = None) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.fc1 = nn.Linear(784, 400, rng=rng, device=device)
        self.fc21 = nn.Linear(400, 20, rng=rng, device=device)
        self.fc22 = nn.Linear(400, 20, rng=rng, device=device)
        self.fc3 = nn.Linear(20, 400, rng=rng, device=device)
        self.fc4 = nn.Linear(400, 784, rng=rng, device=device)
        self.relu = nn.ReLU()
        self.sigmoid = nn.Sigmoid()

    def encode(self, x: Any) -> tuple[Any, Any]:
        h1 = self.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu: Any, logvar: Any, eps: Any = None) -> Any:
        """``mu + eps * exp(logvar / 2)``; ``eps`` drawn from ``fastmetal.random.normal`` on
        mu's device unless given (the tests give it, to follow PyTorch step by step)."""
        if eps is None:
            eps = random.normal(tuple(mu.shape), device=mu.device)
        return mu + eps * _exp(logvar * 0.5)

    def decode(self, z: Any) -> Any:
        return self.sigmoid(self.fc4(self.relu(self.fc3(z))))

    def forward(self, x: Any, eps: Any = None) -> tuple[Any, Any, Any]:
        mu, logvar = self.encode(x.reshape(-1, 784))
        z = self.reparameterize(mu, logvar, eps)
        return self.decode(z), mu, logvar


def _exp(x: Any) -> Any:
    return E["exp"](x)


def vae_loss(recon_x: Any, x: Any, mu: Any, logvar: Any) -> Any:
    """Reconstruction + KL divergence, summed over the batch, as PyTorch's example:
    ``BCE(recon_x, x, reduction="sum") - 0.5 * sum(1 + logvar - mu**2 - exp(logvar))``."""
    bce = binary_cross_entropy(recon_x, x.reshape(-1, 784), reduction="sum")
    kld = (1.0 + logvar - E["square"](mu) - E["exp"](logvar)).sum() * -0.5
    return bce + kld
