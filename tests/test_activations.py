"""leaky_relu, elu, silu and dropout2d with their Modules, ModuleDict and Module.apply: against
float64 NumPy (values, gradients by finite differences) and PyTorch where installed."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from fastmetal.nn import functional as F
from helpers import host, needs_torch, torch

RNG = np.random.default_rng(11)


def _ref(name, x, arg):
    if name == "leaky_relu":
        return np.where(x > 0, x, x * arg)
    if name == "elu":
        return np.where(x > 0, x, arg * np.expm1(np.minimum(x, 0)))
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize("name,arg", [("leaky_relu", 0.01), ("leaky_relu", 0.3), ("elu", 1.0),
                                      ("elu", 0.5), ("silu", None)])
def test_values_and_gradients_against_float64(name, arg, device):
    x = RNG.uniform(-3, 3, (4, 5))
    x[0, :3] = [0.0, 80.0, -80.0]  # the kink, and exp's overflow kept out of the gradient
    fn = (lambda a: getattr(F, name)(a)) if arg is None else (lambda a: getattr(F, name)(a, arg))
    xa = fm.asarray(x.astype(np.float32), device=device).requires_grad_()
    out = fn(xa)
    np.testing.assert_allclose(host(out), _ref(name, x, arg), rtol=1e-5, atol=1e-6)
    w = RNG.standard_normal(x.shape)
    (out * fm.asarray(w.astype(np.float32), device=device)).sum().backward()
    h = 1e-6
    num = (_ref(name, x + h, arg) - _ref(name, x - h, arg)) / (2 * h) * w
    grad = host(xa.grad)
    assert np.all(np.isfinite(grad))
    keep = x != 0.0  # at 0 PyTorch's convention, checked below
    np.testing.assert_allclose(grad[keep], num[keep], rtol=1e-4, atol=1e-5)
    if name == "leaky_relu":
        assert grad[0, 0] == pytest.approx(arg * w[0, 0], rel=1e-6)  # slope at 0, as PyTorch
    if name == "elu":
        assert grad[0, 0] == pytest.approx(arg * w[0, 0], rel=1e-6)


@needs_torch
@pytest.mark.parametrize("module,args", [("LeakyReLU", (0.2,)), ("ELU", (0.7,)), ("SiLU", ())])
def test_modules_match_pytorch(module, args, device):
    x = RNG.uniform(-3, 3, (3, 7)).astype(np.float32)
    ours, theirs = getattr(nn, module)(*args), getattr(torch.nn, module)(*args)
    xa = fm.asarray(x, device=device).requires_grad_()
    xt = torch.tensor(x, requires_grad=True)
    ours(xa).sum().backward()
    theirs(xt).sum().backward()
    np.testing.assert_allclose(host(ours(xa)), theirs(xt).detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(xa.grad), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_dropout2d_zeroes_whole_channels_reproducibly(device):
    x = fm.asarray(RNG.uniform(1, 2, (8, 16, 3, 3)).astype(np.float32), device=device)
    fm.manual_seed(3)
    a = host(F.dropout2d(x, 0.25))
    fm.manual_seed(3)
    b = host(F.dropout2d(x, 0.25))
    np.testing.assert_array_equal(a, b)
    ratio = a / host(x)
    per_channel = ratio.reshape(8, 16, 9)
    np.testing.assert_allclose(per_channel.min(axis=2), per_channel.max(axis=2), rtol=1e-6)
    kept = per_channel[:, :, 0]
    assert np.all(np.isclose(kept, 0.0) | np.isclose(kept, 1 / 0.75, rtol=1e-6))
    assert 0.55 < np.mean(kept > 0) < 0.95
    layer = nn.Dropout2d(0.25)
    np.testing.assert_array_equal(host(layer.eval()(x)), host(x))
    with pytest.warns(UserWarning, match="interpreted as shape \\(N, C, L\\)"):
        assert host(F.dropout2d(x[0], 1.0)).max() == 0.0  # 3-D input, p = 1
    with pytest.raises(ValueError, match=r"\[fastmetal.dropout2d\] expected p in \[0, 1\]"):
        F.dropout2d(x, 1.5)
    with pytest.raises(ValueError, match="expected \\(N, C, H, W\\) input \\(at least 2 axes\\), got shape \\(3,\\)"):
        F.dropout2d(x[0, 0, 0], 0.5)


@pytest.mark.parametrize("shape", [(64, 40), (6, 5, 7), (6, 5, 4, 3, 2)])
def test_dropout2d_of_other_ranks_masks_the_first_two_axes_as_pytorch(device, shape):
    # PyTorch takes the first two axes as (sample, channel) whatever the rank, with a
    # warning: a 2-D (N, F) batch is dropped element by element (pytorch/examples mnist_rnn),
    # 3-D input is (N, C, L).
    x = fm.asarray(RNG.uniform(1, 2, shape).astype(np.float32), device=device)
    fm.manual_seed(5)
    with pytest.warns(UserWarning, match="dropout2d: Received a"):
        a = host(F.dropout2d(x, 0.5))
    ratio = (a / host(x)).reshape(shape[0] * shape[1], -1)
    np.testing.assert_allclose(ratio.min(axis=1), ratio.max(axis=1), rtol=1e-6)
    assert np.all(np.isclose(ratio[:, 0], 0.0) | np.isclose(ratio[:, 0], 2.0, rtol=1e-6))
    assert 0 < np.count_nonzero(ratio[:, 0]) < len(ratio)
    if torch is not None:  # PyTorch's mask has the same shape: constant along the rest
        with pytest.warns(UserWarning, match="Received a"):
            t = torch.nn.functional.dropout2d(torch.ones(shape), 0.5).numpy()
        t = t.reshape(shape[0] * shape[1], -1)
        np.testing.assert_array_equal(t.min(axis=1), t.max(axis=1))


def test_module_dict_and_apply():
    d = nn.ModuleDict({"enc": nn.Linear(3, 2), "dec": nn.Linear(2, 3)})
    d["act"] = nn.ReLU()
    assert list(d) == ["enc", "dec", "act"] and "act" in d and len(d) == 3
    assert [n for n, _ in d.named_parameters()] == ["enc.weight", "enc.bias", "dec.weight", "dec.bias"]
    del d["act"]
    assert list(d.keys()) == ["enc", "dec"] and not hasattr(d, "act")
    assert d.pop("dec") is not None and list(d) == ["enc"]
    with pytest.raises(TypeError, match="expected Modules"):
        d["x"] = 3
    seen = []
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Tanh(), nn.Linear(2, 1)))
    assert model.apply(lambda m: seen.append(type(m).__name__)) is model
    assert seen == ["Linear", "Tanh", "Linear", "Sequential", "Sequential"]
    model.apply(lambda m: nn.init.zeros_(m.weight) if isinstance(m, nn.Linear) else None)
    assert all(float(np.abs(host(m.weight)).max()) == 0.0 for m in model.modules()
               if isinstance(m, nn.Linear))
