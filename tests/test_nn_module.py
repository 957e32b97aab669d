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
from helpers import host, skip_without_float64, torch

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


# --------------------------------------------------------------------- dtypes of a Module
class _Tied(nn.Module):
    """A tied weight, an integer buffer (BatchNorm's num_batches_tracked), a float buffer."""

    def __init__(self, device=None):
        super().__init__()
        self.a = nn.Linear(3, 3, seed=0, device=device)
        self.b = nn.Linear(3, 3, seed=1, device=device)
        self.b.weight = self.a.weight
        self.bn = nn.BatchNorm1d(3)
        if device is not None:
            self.bn.to(device)

    def forward(self, x):
        return self.b(self.bn(self.a(x)))


def _dtypes(m):
    return {k: str(v.dtype) for k, v in m.state_dict().items()}


def test_dtype_aliases_are_pytorchs():
    assert fm.double == fm.float64 and fm.float == fm.float32 and fm.half == fm.float16
    assert fm.long == fm.int64 and fm.int == fm.int32
    assert all(isinstance(d, np.dtype) for d in (fm.double, fm.float, fm.half, fm.long, fm.int))


def test_zeros_with_dtype_double(device):
    skip_without_float64(device)
    z = fm.zeros(2, 51, dtype=fm.double, device=device)
    assert z.dtype == np.float64 and z.shape == (2, 51) and not host(z).any()
    assert fm.zeros((2, 3), dtype=fm.half).dtype == np.float16


def test_module_double_float_half_convert_floating_state_only(device):
    skip_without_float64(device)
    m = _Tied(device)
    before = {k: v.copy() for k, v in m.state_dict().items()}
    m.a.weight.grad = fm.ones((3, 3), device=device)
    assert m.double() is m
    assert _dtypes(m) == {**{k: "float64" for k in before}, "bn.num_batches_tracked": "int64"}
    assert m.b.weight is m.a.weight  # tied weights stay one Parameter
    assert [n for n, _ in m.named_parameters()] == ["a.weight", "a.bias", "b.bias", "bn.weight",
                                                    "bn.bias"]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in m.parameters())
    assert m.a.weight.grad.dtype == np.float64  # the gradient follows, as PyTorch's
    assert {p.device for p in m.parameters()} == {device}
    for k, v in m.state_dict().items():  # float32 -> float64 is exact
        np.testing.assert_array_equal(v, before[k].astype(v.dtype), err_msg=k)
    out = m.b(m.a(fm.ones((4, 3), dtype=fm.double, device=device)))  # (batch_norm: float32)
    assert out.dtype == np.float64
    assert m.float() is m and set(_dtypes(m).values()) == {"float32", "int64"}
    assert m.half() is m and set(_dtypes(m).values()) == {"float16", "int64"}
    assert m.b.weight is m.a.weight


@pytest.mark.parametrize("how", ["to(dtype)", "to(device, dtype)", "to(dtype=)",
                                 "to(device=, dtype=)", "to(array)", "type(dtype)"])
def test_module_to_dtype_forms(device, how):
    skip_without_float64(device)
    m = _Tied(device)
    call = {"to(dtype)": lambda: m.to(fm.float64),
            "to(device, dtype)": lambda: m.to(device, fm.double),
            "to(dtype=)": lambda: m.to(dtype=fm.double),
            "to(device=, dtype=)": lambda: m.to(device=device, dtype="float64"),
            "to(array)": lambda: m.to(fm.zeros(1, dtype=fm.double, device=device)),
            "type(dtype)": lambda: m.type(fm.double)}[how]
    assert call() is m
    # type() converts every parameter and buffer, integer ones too (PyTorch's Module.type);
    # to() the floating-point ones only.
    nbt = "float64" if how == "type(dtype)" else "int64"
    assert _dtypes(m)["bn.num_batches_tracked"] == nbt
    assert {d for k, d in _dtypes(m).items() if k != "bn.num_batches_tracked"} == {"float64"}
    assert m.b.weight is m.a.weight


def test_module_to_and_type_refuse_what_pytorch_refuses():
    m = _Tied()
    with pytest.raises(TypeError, match=r"\[fastmetal.nn._Tied.to\] expected a floating-point "
                                        r"dtype .*got int64"):
        m.to(fm.int64)
    with pytest.raises(ValueError, match=r"expected a device this fastmetal has \(.*cpu.*\) "
                                         r"or a dtype, got 'nonsense'"):
        m.to("nonsense")
    with pytest.raises(TypeError, match="expected dtype"):
        m.to(3)
    with pytest.raises(TypeError, match="expected device=, dtype= or non_blocking="):
        m.to(memory_format=None)
    with pytest.raises(RuntimeError, match=r"\[fastmetal.nn._Tied.type\] expected a floating"):
        m.type(fm.int32)
    assert _dtypes(m)["a.weight"] == "float32"  # nothing was converted
    bn = nn.BatchNorm1d(2)
    bn.weight, bn.bias = None, None
    del bn.weight, bn.bias
    assert bn.type(fm.int64) is bn  # buffers only: PyTorch converts them all


def test_module_cpu_and_cuda():
    m = _Tied()
    assert m.cpu() is m and {p.device for p in m.parameters()} == {"cpu"}
    assert m.to("cpu:0") is m and m.to(fm.device("cpu"), fm.double).a.weight.dtype == fm.double
    assert {p.device for p in m.parameters()} == {"cpu"} and m.b.weight is m.a.weight
    if "cuda" in fm.devices():
        assert m.cuda() is m and {p.device for p in m.parameters()} == {"cuda"}
        assert m.cpu() is m and m.b.weight is m.a.weight
    else:
        with pytest.raises(RuntimeError, match=r"\[fastmetal.nn._Tied.cuda\] expected a cuda "
                                               r"device, got none"):
            m.cuda()
    with pytest.raises(ValueError, match="expected device None or 0"):
        m.cuda(3)


def _regression(device, dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((32, 3))
    y = x @ np.array([[1.5], [-2.0], [0.25]]) + 0.125
    return (fm.asarray(x, dtype=dtype, device=device), fm.asarray(y, dtype=dtype, device=device),
            x, y)


def test_training_after_double_sgd_follows_the_float64_formula(device):
    """SGD with momentum on a .double() model: every step's parameters equal the float64
    NumPy formulas to rounding (a float32 update would be ~1e-7 off)."""
    skip_without_float64(device)
    model = nn.Linear(3, 1, seed=3, device=device).double()
    fx, fy, x, y = _regression(device, fm.double)
    w, b = host(model.weight).copy(), host(model.bias).copy()
    opt = nn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    bw = bb = None
    for _ in range(5):
        opt.zero_grad()
        loss = fm.mse_loss(model(fx), fy)
        assert loss.dtype == np.float64
        loss.backward()
        opt.step()
        r = 2 * (x @ w.T + b - y) / y.size
        gw, gb = r.T @ x + 0.01 * w, r.sum(0) + 0.01 * b
        bw, bb = (gw, gb) if bw is None else (0.9 * bw + gw, 0.9 * bb + gb)
        w, b = w - 0.05 * bw, b - 0.05 * bb
        np.testing.assert_allclose(host(model.weight), w, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(host(model.bias), b, rtol=1e-13, atol=1e-15)
    assert model.weight.dtype == np.float64 and opt.state[id(model.weight)]["momentum_buffer"]\
        .dtype == np.float64


def test_training_after_double_lbfgs_reaches_double_precision(device):
    """LBFGS on a .double() least-squares model: the loss falls below 1e-16 (float32's
    stalls near 3e-14) and the weights are within 1e-8 of the exact solution, the
    vectors and the recursion staying in double (PyTorch float64 stops at the same point,
    6.2e-9 from the solution, after 14 iterations)."""
    skip_without_float64(device)
    model = nn.Linear(3, 1, seed=3, device=device).double()
    fx, fy, x, y = _regression(device, fm.double)
    opt = nn.optim.LBFGS(model.parameters(), lr=1.0, max_iter=50, tolerance_grad=1e-14,
                         tolerance_change=1e-16)

    def closure():
        opt.zero_grad()
        loss = fm.mse_loss(model(fx), fy)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    np.testing.assert_allclose(host(model.weight), [[1.5, -2.0, 0.25]], rtol=0, atol=1e-8)
    np.testing.assert_allclose(host(model.bias), [0.125], rtol=0, atol=1e-8)
    assert float(closure().item()) < 1e-16 and model.weight.dtype == np.float64


def test_optimizers_without_a_float64_update_refuse_float64(device):
    skip_without_float64(device)
    model = nn.Linear(3, 1, seed=3, device=device).double()
    with pytest.raises(TypeError, match=r"\[fastmetal.nn.optim.Adam\] expected float32 or "
                                        r"float16 parameters \(float64 ones: SGD and LBFGS\)"):
        nn.optim.Adam(model.parameters())


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("optimizer", ["SGD", "LBFGS"])
def test_training_after_double_follows_torch(device, optimizer):
    """An LSTMCell + Linear model (time_sequence_prediction's, small) after .double(): the
    same losses as PyTorch float64 step by step, to ~1e-12."""
    skip_without_float64(device)
    torch.manual_seed(0)

    def build(lib, nn_):
        class Seq(nn_.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn_.LSTMCell(1, 6)
                self.linear = nn_.Linear(6, 1)

            def forward(self, inp):
                h = lib.zeros(inp.size(0), 6, dtype=lib.double)
                c = lib.zeros(inp.size(0), 6, dtype=lib.double)
                outs = []
                for x_t in inp.split(1, dim=1):
                    h, c = self.lstm(x_t, (h, c))
                    outs += [self.linear(h)]
                return lib.cat(outs, dim=1)
        return Seq()

    tm = build(torch, torch.nn)
    tm.double()
    fmm = build(fm, nn)
    fmm.double()
    fmm.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    if device != "cpu":
        fmm.to(device)
    data = np.sin(np.arange(4 * 9).reshape(4, 9) / 3.0)
    tin, tout = torch.from_numpy(data[:, :-1]), torch.from_numpy(data[:, 1:])
    fin = fm.asarray(data[:, :-1], dtype=fm.double, device=device)
    fout = fm.asarray(data[:, 1:], dtype=fm.double, device=device)
    make = {"SGD": lambda lib, m: lib.optim.SGD(m.parameters(), lr=0.5, momentum=0.5),
            "LBFGS": lambda lib, m: lib.optim.LBFGS(m.parameters(), lr=0.8, max_iter=4)}
    topt, fopt = make[optimizer](torch, tm), make[optimizer](fm, fmm)
    for _ in range(3):
        losses = []
        for lib, m, opt, i, o in ((torch, tm, topt, tin, tout), (fm, fmm, fopt, fin, fout)):
            def closure(lib=lib, m=m, opt=opt, i=i, o=o):
                opt.zero_grad()
                loss = lib.nn.functional.mse_loss(m(i), o)
                loss.backward()
                return loss
            losses.append(float(opt.step(closure).item()))
        assert losses[1] == pytest.approx(losses[0], rel=1e-12, abs=1e-15)
    for k, v in tm.state_dict().items():
        np.testing.assert_allclose(fmm.state_dict()[k], v.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=k)
