"""nn.Linear and a Sequential that contains it (the MNIST network's head), gradients through
autograd (``loss.backward()``, ``p.grad``).

NEEDS fastmetal.linear / fastmetal.linear_backward: without them these tests FAIL (on
purpose: they must not skip silently) with "fastmetal.linear is missing"."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from helpers import host, torch


@pytest.fixture(autouse=True)
def needs_linear():
    missing = [n for n in ("linear", "linear_backward") if not hasattr(fm, n)]
    if missing:
        pytest.fail(f"fastmetal.{missing[0]} is missing (it comes from the branch that adds "
                    "the matmul ops)")


def test_linear_layer_forward_backward(device, rng):
    layer = nn.Linear(7, 5, seed=0, device=device)
    assert layer.weight.shape == (5, 7) and layer.bias.shape == (5,)
    assert layer.weight.device == device and layer.weight.requires_grad
    bound = 1 / np.sqrt(7)
    assert np.abs(host(layer.weight)).max() <= bound and np.abs(host(layer.bias)).max() <= bound
    xh = rng.standard_normal((4, 7)).astype(np.float32)
    x = fm.asarray(xh).requires_grad_()
    w, b = host(layer.weight).astype(np.float64), host(layer.bias).astype(np.float64)
    y = layer(x)
    np.testing.assert_allclose(host(y), xh @ w.T + b, rtol=1e-5, atol=1e-5)
    g = rng.standard_normal((4, 5)).astype(np.float32)
    y.backward(fm.asarray(g))
    np.testing.assert_allclose(host(x.grad), g @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(layer.weight.grad), g.T.astype(np.float64) @ xh, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(host(layer.bias.grad), g.sum(0), rtol=1e-5, atol=1e-5)
    # The functional kernel gives the same gradients.
    fx, fw, fb = fm.linear_backward(fm.asarray(g), fm.asarray(xh), layer.weight.detach())
    for got, want in ((x.grad, fx), (layer.weight.grad, fw), (layer.bias.grad, fb)):
        np.testing.assert_allclose(host(got), host(want), rtol=1e-6, atol=1e-6)
    assert [p is q for p, q in zip(layer.parameters(), [layer.weight, layer.bias])] == [True] * 2
    assert [n for n, _ in layer.named_parameters()] == ["weight", "bias"]


def test_linear_layer_matches_torch_autograd(device, rng):
    if torch is None:
        pytest.skip("PyTorch is not installed")
    layer = nn.Linear(6, 4, seed=3, device=device)
    xh = rng.standard_normal((2, 3, 6)).astype(np.float32)  # leading dimensions too
    x = fm.asarray(xh).requires_grad_()
    labels = np.array([0, 3, 1, 2, 2, 0])
    loss = nn.CrossEntropyLoss()(layer(x).reshape((6, 4)), labels)
    loss.backward()
    tl = torch.nn.Linear(6, 4)
    with torch.no_grad():
        tl.weight.copy_(torch.tensor(host(layer.weight)))
        tl.bias.copy_(torch.tensor(host(layer.bias)))
    tx = torch.tensor(xh, requires_grad=True)
    tloss = torch.nn.functional.cross_entropy(tl(tx).reshape(6, 4), torch.tensor(labels))
    tloss.backward()
    np.testing.assert_allclose(float(host(loss)), tloss.item(), rtol=1e-5)
    np.testing.assert_allclose(host(x.grad), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(layer.weight.grad), tl.weight.grad.numpy(), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(host(layer.bias.grad), tl.bias.grad.numpy(), rtol=1e-5,
                               atol=1e-6)


def test_linear_without_bias(device, rng):
    layer = nn.Linear(3, 2, bias=False, seed=1)
    assert layer.bias is None and len(list(layer.parameters())) == 1
    assert [n for n, _ in layer.named_parameters()] == ["weight"]
    assert list(layer.state_dict()) == ["weight"]
    x = rng.standard_normal((5, 3)).astype(np.float32)
    layer(x).backward(np.ones((5, 2), np.float32))
    np.testing.assert_allclose(host(layer.weight.grad), np.ones((2, 5)) @ x, rtol=1e-5,
                               atol=1e-5)
    assert layer.bias is None


def mnist_like_net(device=None):
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, seed=0, device=device), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.25, seed=1), nn.Flatten(), nn.Linear(36, 16, seed=2, device=device),
        nn.ReLU(), nn.Dropout(0.5, seed=3), nn.Linear(16, 10, seed=4, device=device),
        nn.LogSoftmax(1))


def test_sequential_with_linear_gradient_finite_differences(rng):
    net = mnist_like_net().eval()
    x = rng.standard_normal((3, 1, 8, 8)).astype(np.float32)
    labels = np.array([1, 2, 9])
    loss_fn = nn.CrossEntropyLoss()
    loss_fn(net(x), labels).backward()
    w = net[5].weight
    gw = host(w.grad).copy()

    def loss_at():
        with fm.no_grad():
            return float(host(loss_fn(net(x), labels)))

    eps = 1e-2
    for idx in [(0, 0), (3, 17), (15, 35)]:
        old = float(host(w)[idx])
        with fm.no_grad():
            w[idx] = old + eps
        lp = loss_at()
        with fm.no_grad():
            w[idx] = old - eps
        lm = loss_at()
        with fm.no_grad():
            w[idx] = old
        fd = (lp - lm) / (2 * eps)
        assert abs(fd - gw[idx]) < 2e-3 + 2e-2 * abs(fd), (idx, fd, gw[idx])


def test_mnist_like_training_steps_lower_the_loss(device, rng):
    net = mnist_like_net(device=device)
    opt = nn.optim.Adadelta(net.parameters(), lr=1.0)
    sched = nn.optim.StepLR(opt, step_size=1, gamma=0.7)
    x = rng.standard_normal((32, 1, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 10, 32)
    loss_fn = nn.CrossEntropyLoss()
    net.eval()
    with fm.no_grad():
        first = float(host(loss_fn(net(x), labels)))
    net.train()
    for _ in range(10):
        opt.zero_grad()
        loss_fn(net(x), labels).backward()
        assert all(p.grad is not None for p in net.parameters())
        opt.step()
    sched.step()
    net.eval()
    with fm.no_grad():
        assert float(host(loss_fn(net(x), labels))) < first
    sd = net.state_dict()
    assert sorted(sd) == ["0.bias", "0.weight", "5.bias", "5.weight", "8.bias", "8.weight"]
