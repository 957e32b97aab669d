"""Reference networks, built once for the examples, benchmarks and tests that train them.

``mnist_cnn`` is PyTorch's MNIST example network (pytorch/examples, mnist/main.py):

    conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, dropout 0.25, flatten,
    linear 9216->128, ReLU, dropout 0.5, linear 128->10, log-softmax

``VAE`` and ``vae_loss`` are PyTorch's variational autoencoder example (pytorch/examples,
vae/main.py):

    fc1 784->400, ReLU, fc21 / fc22 400->20 (mu, logvar), z = mu + eps * exp(logvar / 2),
    fc3 20->400, ReLU, fc4 400->784, sigmoid; loss = BCE (summed) + KL divergence

``resnet20`` is He et al.'s ResNet-20 for CIFAR-10 ("Deep Residual Learning", section 4.2):

    conv 3x3 (in->w), BN, ReLU; 3 stages of 3 basic blocks at w, 2w, 4w channels (the first
    block of stages 2 and 3 has stride 2); global average pool; linear 4w->10.  A basic block:
    conv 3x3, BN, ReLU, conv 3x3, BN, + shortcut, ReLU.  Shortcuts where the shape changes
    are 1x1 convolutions with stride 2 and BN (the paper's option B; option A's zero padding
    has no parameters but needs a strided slice and a channel pad per block).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import nn
from . import random
from .nn.functional import binary_cross_entropy
from .nn import init
from .nn.functional import adaptive_avg_pool2d, relu
from .ops.elementwise import FUNCTIONS as E

__all__ = ["mnist_cnn", "VAE", "vae_loss", "BasicBlock", "ResNet", "resnet20"]


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


class BasicBlock(nn.Module):
    """ResNet's basic block: conv 3x3, BN, ReLU, conv 3x3, BN, plus the shortcut, ReLU. The
    shortcut is the identity, or a strided 1x1 convolution and BN where the shape changes."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1,
                 rng: np.random.Generator | None = None, device: str | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False,
                               rng=rng, device=device)
        self.bn1 = nn.BatchNorm2d(planes, device=device)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False, rng=rng,
                               device=device)
        self.bn2 = nn.BatchNorm2d(planes, device=device)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False, rng=rng,
                          device=device),
                nn.BatchNorm2d(planes, device=device))

    def forward(self, x: Any) -> Any:
        out = relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """The CIFAR ResNets of He et al. (6n + 2 layers): a 3x3 stem, three stages of
    ``num_blocks[i]`` basic blocks at ``width``, ``2 width`` and ``4 width`` channels (strides
    1, 2, 2), global average pooling and a linear classifier. Convolutions are initialised
    with ``kaiming_normal_(mode="fan_out", nonlinearity="relu")`` (torchvision's choice), BN
    with weight 1 and bias 0, the classifier as ``nn.Linear``; all drawn from ``seed``."""

    def __init__(self, num_blocks: tuple[int, int, int] = (3, 3, 3), num_classes: int = 10,
                 in_channels: int = 3, width: int = 16, seed: int = 0,
                 device: str | None = None) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1, bias=False, rng=rng,
                               device=device)
        self.bn1 = nn.BatchNorm2d(width, device=device)
        planes = width
        stages = []
        for i, n in enumerate(num_blocks):
            out_planes = width * 2 ** i
            blocks = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(BasicBlock(planes, out_planes, stride, rng, device))
                planes = out_planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.linear = nn.Linear(planes, num_classes, rng=rng, device=device)
        generator = random.Generator(seed)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu",
                                     generator=generator)

    def forward(self, x: Any) -> Any:
        out = relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = adaptive_avg_pool2d(out, 1)
        return self.linear(out.reshape(out.shape[0], -1))


def resnet20(num_classes: int = 10, in_channels: int = 3, width: int = 16, seed: int = 0,
             device: str | None = None) -> ResNet:
    """ResNet-20 (3 stages of 3 basic blocks; 16/32/64 channels at ``width=16``; 0.27 M
    parameters for CIFAR-10)."""
    return ResNet((3, 3, 3), num_classes, in_channels, width, seed, device)
