"""fastmetal.nn.init against PyTorch's formulas (gains, bounds, standard deviations), and
fm.random.seed / fm.manual_seed making initialisation and dropout reproducible on every
device (each layer once drew from an unseeded NumPy generator)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from fastmetal.nn import init
from helpers import host, needs_torch, torch

NONLINEARITIES = ["linear", "conv2d", "sigmoid", "tanh", "relu", "leaky_relu", "selu"]


@needs_torch
@pytest.mark.parametrize("name", NONLINEARITIES)
def test_calculate_gain_is_pytorchs(name):
    assert init.calculate_gain(name) == pytest.approx(torch.nn.init.calculate_gain(name))
    if name == "leaky_relu":
        assert init.calculate_gain(name, 0.2) == pytest.approx(
            torch.nn.init.calculate_gain(name, 0.2))


def _std_bound(kind, shape, **kw):
    fan_in = shape[1] * math.prod(shape[2:])
    fan_out = shape[0] * math.prod(shape[2:])
    if kind == "xavier_uniform_":
        return None, kw.get("gain", 1.0) * math.sqrt(6 / (fan_in + fan_out))
    if kind == "xavier_normal_":
        return kw.get("gain", 1.0) * math.sqrt(2 / (fan_in + fan_out)), None
    fan = fan_in if kw.get("mode", "fan_in") == "fan_in" else fan_out
    gain = math.sqrt(2.0 / (1 + kw.get("a", 0.0) ** 2))  # leaky_relu, PyTorch's default
    if kind == "kaiming_uniform_":
        return None, gain * math.sqrt(3.0 / fan)
    return gain / math.sqrt(fan), None


@pytest.mark.parametrize("kind,kw", [
    ("xavier_uniform_", {}), ("xavier_uniform_", {"gain": 2.0}), ("xavier_normal_", {}),
    ("kaiming_uniform_", {}), ("kaiming_uniform_", {"a": math.sqrt(5)}),
    ("kaiming_normal_", {"mode": "fan_out"}),
])
def test_the_weight_initialisers_draw_pytorchs_distributions(kind, kw, device):
    shape = (128, 64, 3, 3)
    w = fm.zeros(shape, device=device)
    assert getattr(init, kind)(w, **kw) is w
    values = host(w).astype(np.float64)
    std, bound = _std_bound(kind, shape, **kw)
    if bound is not None:
        assert values.min() >= -bound and values.max() <= bound
        assert values.std() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    else:
        assert abs(values.mean()) < 0.01 * std * 10 and values.std() == pytest.approx(std, rel=0.02)


def test_the_simple_fills(device):
    w = fm.zeros((50, 40), device=device)
    init.uniform_(w, -2.0, 3.0)
    v = host(w)
    assert v.min() >= -2.0 and v.max() < 3.0 and v.mean() == pytest.approx(0.5, abs=0.05)
    init.normal_(w, 1.0, 0.5)
    assert host(w).mean() == pytest.approx(1.0, abs=0.02) and host(w).std() == pytest.approx(0.5, rel=0.03)
    init.trunc_normal_(w, 0.0, 1.0, -0.5, 1.5)
    assert host(w).min() >= -0.5 and host(w).max() <= 1.5 and np.unique(host(w)).size > 1900
    np.testing.assert_array_equal(host(init.constant_(w, 0.25)), np.full((50, 40), 0.25, np.float32))
    np.testing.assert_array_equal(host(init.zeros_(w)), 0.0)
    np.testing.assert_array_equal(host(init.ones_(w)), 1.0)


def test_a_parameter_is_filled_in_place_outside_the_graph():
    lin = nn.Linear(3, 2)
    before = lin.weight
    init.kaiming_normal_(lin.weight)
    assert lin.weight is before and lin.weight.requires_grad and lin.weight.is_leaf


def test_the_draws_are_seeded_by_fastmetal_random(device):
    a, b = fm.zeros((4, 5), device=device), fm.zeros((4, 5), device=device)
    fm.manual_seed(7)
    init.xavier_uniform_(a)
    fm.random.seed(7)
    init.xavier_uniform_(b)
    np.testing.assert_array_equal(host(a), host(b))
    init.xavier_uniform_(b)  # the stream moved on
    assert not np.array_equal(host(a), host(b))
    g = fm.random.Generator(11)
    init.normal_(a, generator=g)
    np.testing.assert_array_equal(host(a), host(fm.random.normal((4, 5), generator=fm.random.Generator(11),
                                                                 device=device)))


def test_seeding_makes_layers_and_dropout_reproducible(device):
    def build():
        model = nn.Sequential(nn.Linear(6, 5, device=device), nn.Dropout(0.5),
                              nn.Conv2d(1, 2, 3, device=device))
        x = fm.ones((3, 6), device=device)
        return model, host(model[1](model[0](x)))
    fm.manual_seed(123)
    m1, out1 = build()
    fm.manual_seed(123)
    m2, out2 = build()
    for (n1, p1), (n2, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        assert n1 == n2
        np.testing.assert_array_equal(host(p1), host(p2))
    np.testing.assert_array_equal(out1, out2)
    fm.manual_seed(124)
    m3, out3 = build()
    assert not np.array_equal(host(m3[0].weight), host(m1[0].weight))
    # A layer's own seed still draws from NumPy, whatever fastmetal.random's state.
    np.testing.assert_array_equal(host(nn.Linear(6, 5, seed=1).weight),
                                  host(nn.Linear(6, 5, seed=1).weight))


def test_bad_input_names_the_function():
    with pytest.raises(TypeError, match=r"\[fastmetal.nn.init.uniform_\] expected a float"):
        init.uniform_(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="fan in and fan out"):
        init.xavier_uniform_(fm.zeros(3))
    with pytest.raises(ValueError, match="mode 'fan_in' or 'fan_out'"):
        init.kaiming_uniform_(fm.zeros((2, 2)), mode="fan")
    with pytest.raises(ValueError, match="nonlinearity among"):
        init.calculate_gain("swish")
    with pytest.raises(ValueError, match="a < b"):
        init.trunc_normal_(fm.zeros(3), a=1.0, b=0.0)
