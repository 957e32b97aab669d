"""nn.Module as PyTorch's: registration, names, state dicts, modes, devices; optimizers on
any iterable or param groups; each bug of the issue that asked for autograd has its test;
a PyTorch-style model (skip connection, a layer used twice, two heads) gets torch's
gradients."""
from __future__ import annotations

import gc
from collections import OrderedDict

import numpy as np
import psutil
import pytest

import fastmetal as fm
from fastmetal import nn

RNG = np.random.default_rng(7)


class TwoHeads(nn.Module):
    """A skip connection, one Linear and one ReLU used twice, two heads."""

    def __init__(self, device=None):
        super().__init__()
        self.inp = nn.Linear(6, 8, seed=1, device=device)
        self.shared = nn.Linear(8, 8, seed=2, device=device)
        self.act = nn.ReLU()
        self.head_a = nn.Sequential(nn.Linear(8, 3, seed=3, device=device), nn.Tanh())
        self.head_b = nn.Linear(8, 2, seed=4, device=device)

    def forward(self, x):
        h = self.act(self.inp(x))
        h = h + self.act(self.shared(h))  # skip connection
        h = self.act(self.shared(h))      # the same layer again
        return self.head_a(h), self.head_b(h)


def _loss(model, x, labels, target):
    a, b = model(x)
    return fm.cross_entropy(a, labels) + fm.mse_loss(fm.sigmoid(b), target)


# ----------------------------------------------------------------------------- the bugs
def test_sequential_named_parameters_works():
    model = nn.Sequential(nn.Linear(3, 4, seed=0), nn.ReLU(), nn.Linear(4, 2, seed=1))
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight",
                                                        "2.bias"]


def test_nested_sequential_state_dict_keys_are_unique_and_round_trip():
    make = lambda seed: nn.Sequential(  # noqa: E731
        nn.Sequential(nn.Linear(3, 4, seed=seed), nn.ReLU()),
        nn.Sequential(nn.Linear(4, 4, seed=seed + 1), nn.Linear(4, 2, seed=seed + 2)))
    a, b = make(0), make(10)
    sd = a.state_dict()
    assert len(sd) == 6 == len(set(sd))
    assert list(sd) == ["0.0.weight", "0.0.bias", "1.0.weight", "1.0.bias", "1.1.weight",
                        "1.1.bias"]
    b.load_state_dict(sd)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb
        np.testing.assert_array_equal(pa.numpy(), pb.numpy())


def test_conv2d_is_a_module():
    conv = nn.Conv2d(2, 3, 3, seed=0)
    assert isinstance(conv, nn.Module)
    assert list(conv.state_dict()) == ["weight", "bias"]
    assert [n for n, _ in conv.named_parameters()] == ["weight", "bias"]
    conv.eval()
    assert not conv.training
    conv(np.ones((1, 2, 5, 5), np.float32)).sum().backward()
    assert conv.weight.grad is not None
    conv.zero_grad()
    assert conv.weight.grad is None


def test_one_relu_instance_used_twice_gives_correct_gradients():
    relu = nn.ReLU()
    lin = nn.Linear(4, 4, seed=0)
    x = fm.asarray(RNG.standard_normal((3, 4)).astype(np.float32)).requires_grad_()
    relu(lin(relu(x))).sum().backward()
    w = lin.weight.numpy().astype(np.float64)
    xv = x.numpy().astype(np.float64)
    h = np.maximum(xv, 0)
    pre = h @ w.T + lin.bias.numpy()
    gx = ((pre > 0) * 1.0) @ w * (xv > 0)
    np.testing.assert_allclose(x.grad.numpy(), gx, rtol=1e-5, atol=1e-6)


def test_subclass_holding_layers_has_their_parameters():
    model = TwoHeads()
    names = [n for n, _ in model.named_parameters()]
    assert names == ["inp.weight", "inp.bias", "shared.weight", "shared.bias",
                     "head_a.0.weight", "head_a.0.bias", "head_b.weight", "head_b.bias"]
    assert len(list(model.parameters())) == 8


def test_optimizers_take_lists_sums_of_lists_and_param_groups():
    a, b = nn.Linear(3, 2, seed=0), nn.Linear(2, 1, seed=1)
    for params in (list(a.parameters()), list(a.parameters()) + list(b.parameters()),
                   [{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.5}]):
        opt = nn.optim.SGD(params, lr=0.1)
        for p in a.parameters():
            p.grad = fm.ones(p.shape)
        before = a.weight.numpy().copy()
        opt.step()
        np.testing.assert_allclose(a.weight.numpy(), before - 0.1)
    groups = [{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.5}]
    opt = nn.optim.Adam(groups, lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    with pytest.raises(ValueError, match="empty"):
        nn.optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="fastmetal.Arrays"):
        nn.optim.SGD([np.zeros(3)], lr=0.1)
    with pytest.raises(ValueError, match="once"):
        nn.optim.SGD(list(a.parameters()) * 2, lr=0.1)


# ----------------------------------------------------------------------------- Module behaviour
def test_train_eval_recursive_and_dropout_follows():
    model = nn.Sequential(nn.Linear(4, 4, seed=0), nn.Dropout(0.5, seed=0))
    x = np.ones((2, 4), np.float32)
    model.eval()
    assert not model[1].training
    with fm.no_grad():
        np.testing.assert_array_equal(model(x).numpy(), model[0](x).numpy())
    model.train()
    assert model[1].training


def test_load_state_dict_strict_checks_before_writing():
    model = nn.Sequential(nn.Linear(3, 2, seed=0))
    before = model.state_dict()
    bad = OrderedDict(before)
    bad["0.extra"] = np.zeros(1)
    with pytest.raises(ValueError, match="unexpected"):
        model.load_state_dict(bad)
    wrong = OrderedDict(before)
    wrong["0.bias"] = np.zeros(5)
    wrong["0.weight"] = np.zeros((2, 3))
    with pytest.raises(ValueError, match="shape"):
        model.load_state_dict(wrong)
    np.testing.assert_array_equal(model[0].weight.numpy(), before["0.weight"])  # untouched
    missing, unexpected = model.load_state_dict({"0.weight": np.ones((2, 3))}, strict=False)
    assert missing == ["0.bias"] and unexpected == []
    np.testing.assert_array_equal(model[0].weight.numpy(), np.ones((2, 3)))


def test_load_state_dict_keeps_the_optimizer_working():
    model = nn.Linear(2, 1, seed=0)
    opt = nn.optim.SGD(model.parameters(), lr=1.0)
    model.load_state_dict({"weight": np.zeros((1, 2)), "bias": np.zeros(1)})
    model(np.ones((1, 2), np.float32)).sum().backward()
    opt.step()
    np.testing.assert_allclose(model.weight.numpy(), [[-1.0, -1.0]])


def test_parameter_and_shared_parameters():
    p = nn.Parameter(np.ones(3))
    assert isinstance(p, nn.Parameter) and isinstance(p, fm.Array) and p.requires_grad
    assert not isinstance(fm.ones(3), nn.Parameter)

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3, seed=0)
            self.b = nn.Linear(3, 3, seed=1)
            self.b.weight = self.a.weight

    assert [n for n, _ in Tied().named_parameters()] == ["a.weight", "a.bias", "b.bias"]


def test_module_to_device(device):
    model = TwoHeads(device="cpu").to(device)
    assert {p.device for p in model.parameters()} == {device}
    x = fm.asarray(RNG.standard_normal((5, 6)).astype(np.float32), device=device)
    _loss(model, x, np.array([0, 1, 2, 0, 1]), np.zeros((5, 2), np.float32)).backward()
    assert all(p.grad.device == device for p in model.parameters())


def test_clip_grad_norm(device):
    a = fm.asarray(np.zeros(3, np.float32), device=device).requires_grad_()
    b = fm.asarray(np.zeros(4, np.float32), device=device).requires_grad_()
    a.grad = fm.asarray(np.array([3.0, 0, 0], np.float32), device=device)
    b.grad = fm.asarray(np.array([0, 4.0, 0, 0], np.float32), device=device)
    norm = nn.utils.clip_grad_norm_([a, b], 1.0)
    assert norm.item() == pytest.approx(5.0)
    np.testing.assert_allclose(a.grad.numpy(), [0.6, 0, 0], rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), [0, 0.8, 0, 0], rtol=1e-5)
    assert nn.utils.clip_grad_norm_([a, b], 10.0).item() == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(a.grad.numpy(), [0.6, 0, 0], rtol=1e-5)  # under the max: kept


def test_adamw_decouples_weight_decay(device):
    p = fm.asarray(np.array([1.0, -2.0], np.float32), device=device).requires_grad_()
    p.grad = fm.asarray(np.array([0.5, 0.5], np.float32), device=device)
    nn.optim.AdamW([p], lr=0.1, weight_decay=0.1).step()
    # m = 0.05, v = 0.00025; bias-corrected step = lr * 0.5 / (0.5 + eps) = 0.1
    np.testing.assert_allclose(p.numpy(), np.array([1.0, -2.0]) * (1 - 0.01) - 0.1, rtol=1e-5)


# ----------------------------------------------------------------------------- against torch
def test_pytorch_style_model_gets_torch_gradients(device):
    torch = pytest.importorskip("torch")
    model = TwoHeads(device=device)
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    labels = np.array([0, 2, 1, 1, 0])
    target = RNG.uniform(0, 1, (5, 2)).astype(np.float32)
    _loss(model, fm.asarray(x, device=device), labels, target).backward()

    tp = {n: torch.tensor(p.numpy(), requires_grad=True) for n, p in model.named_parameters()}
    lin = lambda h, n: h @ tp[n + ".weight"].T + tp[n + ".bias"]  # noqa: E731
    h = torch.relu(lin(torch.tensor(x), "inp"))
    h = h + torch.relu(lin(h, "shared"))
    h = torch.relu(lin(h, "shared"))
    a, b = torch.tanh(lin(h, "head_a.0")), lin(h, "head_b")
    loss = torch.nn.functional.cross_entropy(a, torch.tensor(labels)) + \
        torch.nn.functional.mse_loss(torch.sigmoid(b), torch.tensor(target))
    loss.backward()
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tp[n].grad.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=n)


def test_losses_match_torch(device):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    p = RNG.uniform(0.01, 0.99, (4, 5)).astype(np.float32)
    p[0, :2] = [0.0, 1.0]  # saturated: PyTorch's clamp
    z = (RNG.standard_normal((4, 5)) * 30).astype(np.float32)
    t = RNG.uniform(0, 1, (4, 5)).astype(np.float32)
    w = RNG.uniform(0.5, 2, (5,)).astype(np.float32)
    for red in ("mean", "sum", "none"):
        cases = [
            (fm.binary_cross_entropy, F.binary_cross_entropy, p, dict(weight=w)),
            (fm.binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits, z,
             dict(weight=w, pos_weight=w)),
            (fm.binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits, z, {}),
            (fm.mse_loss, F.mse_loss, z, {}),
        ]
        for ours, theirs, inp, kw in cases:
            a = fm.asarray(inp, device=device).requires_grad_()
            loss = ours(a, t, reduction=red, **kw)
            ti = torch.tensor(inp, requires_grad=True)
            tkw = {k: torch.tensor(v) for k, v in kw.items()}
            tl = theirs(ti, torch.tensor(t), reduction=red, **tkw)
            np.testing.assert_allclose(loss.numpy(), tl.detach().numpy(), rtol=1e-5, atol=1e-5)
            loss.sum().backward()
            tl.sum().backward()
            np.testing.assert_allclose(a.grad.numpy(), ti.grad.numpy(), rtol=1e-4, atol=1e-6,
                                       err_msg=f"{ours.__name__} {red}")


def test_nll_loss_matches_numpy(device):
    lp = fm.log_softmax(fm.asarray(RNG.standard_normal((4, 3)).astype(np.float32),
                                   device=device))
    lp.requires_grad_(False)
    x = lp.detach().requires_grad_()
    labels = np.array([2, 0, 1, 1])
    loss = fm.nll_loss(x, labels)
    assert loss.item() == pytest.approx(-x.numpy()[np.arange(4), labels].mean(), rel=1e-6)
    loss.backward()
    want = np.zeros((4, 3))
    want[np.arange(4), labels] = -0.25
    np.testing.assert_allclose(x.grad.numpy(), want)


def test_loss_bad_arguments():
    with pytest.raises(ValueError, match="reduction"):
        fm.binary_cross_entropy(np.ones(3) * 0.5, np.ones(3), reduction="avg")
    with pytest.raises(ValueError, match="target of the input's shape"):
        fm.binary_cross_entropy(np.ones(3) * 0.5, np.ones(4))
    with pytest.raises(ValueError, match="in \\[0, 3\\)"):
        fm.nll_loss(np.zeros((2, 3), np.float32), np.array([0, 3]))


# ----------------------------------------------------------------------------- memory
def test_training_loop_memory_stays_flat():
    model = nn.Sequential(nn.Linear(32, 64, seed=0), nn.ReLU(), nn.Linear(64, 10, seed=1))
    opt = nn.optim.Adam(model.parameters(), lr=1e-3)
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    y = RNG.integers(0, 10, 16)

    def steps(n):
        for _ in range(n):
            loss = fm.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    steps(500)
    gc.collect()
    before = psutil.Process().memory_info().rss
    steps(10_000)
    gc.collect()
    grown = psutil.Process().memory_info().rss - before
    assert grown < 8 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 10^4 steps"
