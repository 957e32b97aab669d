"""nn.Conv2d on every device: forward, backward, initialisation like PyTorch, argument checks."""
from __future__ import annotations

import math

import numpy as np
import pytest

import fastmetal as fm

from references import ref_conv2d_backward, assert_close


# ----------------------------------------------------------------------------- nn.Conv2d
def test_conv2d_layer_forward_backward(device):
    r = np.random.default_rng(12)
    layer = fm.nn.Conv2d(4, 6, (3, 2), stride=(1, 2), padding=1, groups=2,
                         seed=3)
    assert layer.weight.shape == (6, 2, 3, 2) and layer.bias.shape == (6,)
    assert layer.weight.dtype == layer.bias.dtype == np.float32
    assert isinstance(layer.weight, fm.nn.Parameter) and layer.weight.requires_grad
    assert layer.weight.device == device  # device=None: the default device
    assert layer.weight.grad is None and layer.bias.grad is None
    xh = r.standard_normal((3, 4, 8, 9)).astype(np.float32)
    x = fm.asarray(xh).requires_grad_()
    kw = dict(stride=(1, 2), padding=1, groups=2)
    y = layer(x)
    assert y.requires_grad
    with fm.no_grad():
        np.testing.assert_array_equal(y, fm.conv2d(xh, layer.weight, layer.bias, **kw))
        np.testing.assert_array_equal(layer.forward(xh), y)
    gy = r.standard_normal(y.shape).astype(np.float32)
    y.backward(fm.asarray(gy))
    w = layer.weight.numpy()
    wx, ww, wb = ref_conv2d_backward(gy, xh, w, **kw)
    sx, sw, sb = ref_conv2d_backward(np.abs(gy), np.abs(xh), np.abs(w), **kw)
    assert_close(x.grad, wx, sx, "layer grad_input")
    assert_close(layer.weight.grad, ww, sw, "layer weight.grad")
    assert_close(layer.bias.grad, wb, sb, "layer bias.grad")
    # A second backward accumulates, as PyTorch.
    first = layer.weight.grad.numpy().copy()
    layer(x).backward(fm.asarray(gy))
    np.testing.assert_allclose(layer.weight.grad.numpy(), 2 * first, rtol=1e-6, atol=1e-6)
    assert "Conv2d(4, 6" in repr(layer)
    assert len(list(layer.parameters())) == 2


@pytest.mark.torch
def test_conv2d_layer_gradients_match_torch_autograd(device):
    torch = pytest.importorskip("torch")
    r = np.random.default_rng(13)
    layer = fm.nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=(1, 2), groups=2, seed=4)
    xh = r.standard_normal((2, 4, 9, 11)).astype(np.float32)
    x = fm.asarray(xh).requires_grad_()
    y = layer(x)
    gy = r.standard_normal(y.shape).astype(np.float32)
    (y * fm.asarray(gy)).sum().backward()
    tw = torch.tensor(layer.weight.numpy(), requires_grad=True)
    tb = torch.tensor(layer.bias.numpy(), requires_grad=True)
    tx = torch.tensor(xh, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=2, padding=1, dilation=(1, 2), groups=2)
    ty.backward(torch.tensor(gy))
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)
    for got, want in ((x.grad, tx.grad), (layer.weight.grad, tw.grad),
                      (layer.bias.grad, tb.grad)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


def test_conv2d_layer_without_bias_and_on_arrays(device):
    layer = fm.nn.Conv2d(3, 5, 3, bias=False, padding="same", seed=0)
    params = list(layer.parameters())
    assert layer.bias is None and len(params) == 1 and params[0] is layer.weight
    assert [n for n, _ in layer.named_parameters()] == ["weight"]
    x = fm.asarray(np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32))
    x.requires_grad_()
    y = layer(x)
    assert isinstance(y, fm.Array) and y.shape == (2, 5, 6, 6)
    y.backward(fm.ones((2, 5, 6, 6)))
    assert isinstance(x.grad, fm.Array) and x.grad.shape == (2, 3, 6, 6)
    assert isinstance(layer.weight.grad, fm.Array) and layer.weight.grad.shape == (5, 3, 3, 3)
    # Parameters on a named device: the same values as on the default device.
    dev = fm.nn.Conv2d(3, 5, 3, seed=0, device=device)
    assert isinstance(dev.weight, fm.Array) and isinstance(dev.bias, fm.Array)
    assert dev.weight.device == dev.bias.device == device
    np.testing.assert_array_equal(np.asarray(dev.weight),
                                  np.asarray(fm.nn.Conv2d(3, 5, 3, seed=0).weight))


def test_conv2d_layer_initialisation_matches_pytorch_statistics():
    # kaiming_uniform_(a=sqrt(5)) -> U(-1/sqrt(fan_in), 1/sqrt(fan_in)), bias likewise.
    layer = fm.nn.Conv2d(64, 128, 3, groups=2, seed=1)
    fan_in = 32 * 9
    bound = 1 / math.sqrt(fan_in)
    w = layer.weight.numpy().astype(np.float64).ravel()
    assert np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.99 * bound
    assert abs(w.mean()) < 4 * bound / math.sqrt(3 * w.size)
    assert abs(w.var() / (bound ** 2 / 3) - 1) < 0.02
    # Uniform: each tenth of the range holds a tenth of the values.
    hist, _ = np.histogram(w, bins=10, range=(-bound, bound))
    assert np.all(np.abs(hist / w.size - 0.1) < 0.01)
    assert np.abs(layer.bias.numpy()).max() <= bound
    # Reproducible from seed / rng; different seeds differ.
    np.testing.assert_array_equal(fm.nn.Conv2d(64, 128, 3, groups=2, seed=1).weight, layer.weight)
    a = fm.nn.Conv2d(4, 4, 3, rng=np.random.default_rng(5))
    b = fm.nn.Conv2d(4, 4, 3, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a.weight, b.weight)
    assert not np.array_equal(fm.nn.Conv2d(4, 4, 3, seed=1).weight.numpy(),
                              fm.nn.Conv2d(4, 4, 3, seed=2).weight.numpy())


@pytest.mark.torch
def test_conv2d_layer_bound_matches_torch():
    torch = pytest.importorskip("torch")
    for args in [(3, 8, 5), (16, 32, (3, 1)), (8, 8, 3)]:
        kwargs = dict(groups=4) if args[0] == 8 else {}
        t = torch.nn.Conv2d(*args, **kwargs)
        ours = fm.nn.Conv2d(*args, **kwargs, seed=0)
        assert ours.weight.shape == tuple(t.weight.shape)
        # Both draw uniformly within the same bound, and reach close to it.
        bound = 1 / math.sqrt(ours.weight[0].size)
        tw = t.weight.detach().numpy()
        for wts in (tw, ours.weight.numpy()):
            assert np.abs(wts).max() <= bound + 1e-7
            assert np.abs(wts).max() > bound * (1 - 8 / wts.size)
        assert np.abs(t.bias.detach().numpy()).max() <= bound + 1e-7


def test_conv2d_layer_bad_arguments(device):
    with pytest.raises(TypeError, match="in_channels"):
        fm.nn.Conv2d(2.0, 4, 3)
    with pytest.raises(ValueError, match="out_channels"):
        fm.nn.Conv2d(2, 0, 3)
    with pytest.raises(TypeError, match="kernel_size"):
        fm.nn.Conv2d(2, 4, True)
    with pytest.raises(ValueError, match="kernel_size"):
        fm.nn.Conv2d(2, 4, (3, 3, 3))
    with pytest.raises(ValueError, match=r"in_channels \(3\) to be divisible by groups \(2\)"):
        fm.nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match=r"out_channels \(3\) to be divisible by groups \(2\)"):
        fm.nn.Conv2d(4, 3, 3, groups=2)
    with pytest.raises(ValueError, match=r"\[fastmetal.nn.Conv2d\] expected stride 1 with"):
        fm.nn.Conv2d(2, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="stride to be positive"):
        fm.nn.Conv2d(2, 4, 3, stride=0)
    with pytest.raises(TypeError, match="bias"):
        fm.nn.Conv2d(2, 4, 3, bias=None)
    with pytest.raises(TypeError, match="rng"):
        fm.nn.Conv2d(2, 4, 3, rng=5)
    with pytest.raises(ValueError, match="at most one of seed and rng"):
        fm.nn.Conv2d(2, 4, 3, seed=1, rng=np.random.default_rng())
    layer = fm.nn.Conv2d(2, 4, 3)
    assert not hasattr(layer, "backward")  # gradients come from loss.backward()
    with pytest.raises(ValueError, match="channels"):
        layer(np.zeros((1, 3, 5, 5), np.float32))
    y = layer(np.zeros((1, 2, 5, 5), np.float32))
    with pytest.raises(ValueError, match="gradient of shape"):
        y.backward(np.zeros((1, 4, 2, 2), np.float32))
