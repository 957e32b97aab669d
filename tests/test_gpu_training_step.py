"""What keeps a training step on a GPU short, checked for correctness on every device: the
long-K products of a Linear layer (run as split-K on the MSL GEMM) and a backward pass that
skips the gradient nobody needs (the network's input)."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm


@pytest.mark.parametrize("m,k,n", [(64, 9216, 128), (7, 4096, 10), (33, 3000, 64),
                                   (64, 2047, 128), (1, 8192, 1)])
def test_linear_with_a_long_reduction_matches_float64(device, m, k, n):
    rng = np.random.default_rng(m + k + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    got = np.asarray(fm.linear(fm.asarray(x, device=device), fm.asarray(w, device=device),
                               fm.asarray(b, device=device)))
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
    # matmul of a transposed view goes the same way
    got = np.asarray(fm.matmul(fm.asarray(x, device=device), fm.asarray(w, device=device).T))
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def _net(device):
    nn = fm.nn
    rng = np.random.default_rng(5)
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 8, rng=rng, device=device), nn.ReLU(),
                         nn.Linear(8, 3, rng=rng, device=device))


def test_sequential_backward_without_the_input_gradient(device):
    """An input that does not require grad gets no gradient (its vjp is skipped), and the
    parameters' gradients are bitwise those of a pass that computes the input's too."""
    x = np.random.default_rng(6).standard_normal((4, 6, 6)).astype(np.float32)
    grad = np.random.default_rng(7).standard_normal((4, 3)).astype(np.float32)
    full, skip = _net(device), _net(device)
    xf = fm.asarray(x, device=device).requires_grad_()
    full(xf).backward(fm.asarray(grad, device=device))
    xs = fm.asarray(x, device=device)
    skip(xs).backward(fm.asarray(grad, device=device))
    assert xs.grad is None and not xs.requires_grad
    assert xf.grad is not None and xf.grad.shape == (4, 6, 6) and xf.grad.device == device
    pa, pb = dict(full.named_parameters()), dict(skip.named_parameters())
    assert list(pa) == list(pb) == ["1.weight", "1.bias", "3.weight", "3.bias"]
    for name in pa:
        assert pa[name].grad is not None and pb[name].grad is not None, name
        np.testing.assert_array_equal(np.asarray(pa[name].grad), np.asarray(pb[name].grad))


def test_conv2d_backward_without_the_input_gradient(device):
    rng = np.random.default_rng(8)
    conv = fm.nn.Conv2d(1, 4, 3, rng=rng, device=device)
    xh = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    g = fm.asarray(rng.standard_normal((2, 4, 6, 6)).astype(np.float32), device=device)
    x = fm.asarray(xh, device=device).requires_grad_()
    conv(x).backward(g)
    gx, gw, gb = np.asarray(x.grad), np.asarray(conv.weight.grad), np.asarray(conv.bias.grad)
    assert gx.shape == (2, 1, 8, 8)
    # The functional kernel gives the same gradients.
    fx, fw, fb = fm.conv2d_backward(g, fm.asarray(xh, device=device), conv.weight.detach())
    np.testing.assert_array_equal(np.asarray(fx), gx)
    np.testing.assert_array_equal(np.asarray(fw), gw)
    np.testing.assert_array_equal(np.asarray(fb), gb)
    # Again, the input without requires_grad: no input gradient, the same parameter ones.
    conv.zero_grad()
    assert conv.weight.grad is None and conv.bias.grad is None
    x2 = fm.asarray(xh, device=device)
    conv(x2).backward(g)
    assert x2.grad is None
    np.testing.assert_array_equal(np.asarray(conv.weight.grad), gw)
    np.testing.assert_array_equal(np.asarray(conv.bias.grad), gb)


def test_bench_mnist_runs_a_short_epoch(device, capsys):
    from fastmetal.benchmarks import mnist
    args = ["--samples", "64", "--no-torch", "--device", device]
    if device != "cpu":  # the host-vs-device line and the per-layer profile (fast on a GPU)
        args.append("--profile")
    results = mnist.main(args)
    out = capsys.readouterr().out
    assert results[0][0] == f"fastmetal, {device}" and results[0][2] == 64
    assert f"fastmetal, {device}" in out
    if device != "cpu":
        assert "the host queues a step in" in out and "backward" in out and "recording" in out
