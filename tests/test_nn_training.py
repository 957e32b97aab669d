"""fastmetal.nn layers besides Conv2d/Linear (ReLU, MaxPool2d, Dropout, Flatten, LogSoftmax,
Sequential, CrossEntropyLoss) with gradients through autograd (``loss.backward()``,
``p.grad``), Module parameters and state dicts, and nn.optim (SGD, Adam, AdamW, Adadelta,
param groups, StepLR) against float64 NumPy formulas and, where installed, torch.optim, on
every device."""
from __future__ import annotations

import io

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from helpers import host, needs_torch, torch


class Params(nn.Module):
    """A module that only holds parameters (for the optimizer tests)."""

    def __init__(self, weight, bias, device=None):
        super().__init__()
        self.weight = nn.Parameter(fm.asarray(np.array(weight, copy=True), device=device))
        self.bias = nn.Parameter(fm.asarray(np.array(bias, copy=True), device=device))


# ----------------------------------------------------------------------------- optimizers
def numpy_steps(kind, hyper, p0, grads):
    """The torch.optim formulas in float64."""
    p = p0.astype(np.float64)
    s1 = np.zeros_like(p)
    s2 = np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        if kind == "adamw":  # decoupled decay, then Adam without the L2 term
            p = p * (1 - hyper.get("lr", 1e-3) * hyper.get("weight_decay", 1e-2))
            g = g.astype(np.float64)
        else:
            g = g.astype(np.float64) + hyper.get("weight_decay", 0.0) * p
        if kind == "sgd":
            mom, damp = hyper.get("momentum", 0.0), hyper.get("dampening", 0.0)
            if mom:
                s1 = g.copy() if t == 1 else mom * s1 + (1 - damp) * g
                g = g + mom * s1 if hyper.get("nesterov") else s1
            p = p - hyper["lr"] * g
        elif kind in ("adam", "adamw"):
            b1, b2 = hyper.get("betas", (0.9, 0.999))
            s1 = b1 * s1 + (1 - b1) * g
            s2 = b2 * s2 + (1 - b2) * g * g
            denom = np.sqrt(s2) / np.sqrt(1 - b2 ** t) + hyper.get("eps", 1e-8)
            p = p - hyper.get("lr", 1e-3) / (1 - b1 ** t) * s1 / denom
        else:
            rho, eps = hyper.get("rho", 0.9), hyper.get("eps", 1e-6)
            s1 = rho * s1 + (1 - rho) * g * g
            delta = np.sqrt(s2 + eps) / np.sqrt(s1 + eps) * g
            s2 = rho * s2 + (1 - rho) * delta * delta
            p = p - hyper.get("lr", 1.0) * delta
    return p


OPTIM_CASES = [
    ("sgd", nn.optim.SGD, dict(lr=0.1)),
    ("sgd", nn.optim.SGD, dict(lr=0.05, momentum=0.9)),
    ("sgd", nn.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=1e-2, dampening=0.1)),
    ("sgd", nn.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True)),
    ("adam", nn.optim.Adam, dict()),
    ("adam", nn.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", nn.optim.AdamW, dict()),
    ("adamw", nn.optim.AdamW, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adadelta", nn.optim.Adadelta, dict()),
    ("adadelta", nn.optim.Adadelta, dict(lr=0.5, rho=0.95, eps=1e-5, weight_decay=1e-3)),
]
TORCH_OPTIM = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "adadelta": "Adadelta"}


def run_fastmetal(cls, hyper, w0, b0, grads, device, params_as="parameters"):
    """Steps of `cls` with the given gradients written into p.grad, the parameters given
    as model.parameters() (a generator), a list, or two param-group dicts."""
    layer = Params(w0, b0, device=device)
    if params_as == "parameters":
        params = layer.parameters()
    elif params_as == "list":
        params = [layer.weight, layer.bias]
    else:
        params = [{"params": [layer.weight]}, {"params": (p for p in [layer.bias])}]
    opt = cls(params, **hyper)
    assert sum(len(g["params"]) for g in opt.param_groups) == 2
    for gw, gb in grads:
        layer.weight.grad = fm.asarray(gw, device=device)
        layer.bias.grad = fm.asarray(gb, device=device)
        opt.step()
    assert set(opt.state) <= {id(layer.weight), id(layer.bias)}
    return host(layer.weight), host(layer.bias)


@pytest.mark.parametrize("case", range(len(OPTIM_CASES)))
@pytest.mark.parametrize("params_as", ["parameters", "list", "groups"])
def test_optimizer_matches_float64_formulas(device, rng, case, params_as):
    kind, cls, hyper = OPTIM_CASES[case]
    w0 = rng.standard_normal((5, 7)).astype(np.float32)
    b0 = rng.standard_normal(5).astype(np.float32)
    grads = [(rng.standard_normal((5, 7)).astype(np.float32),
              rng.standard_normal(5).astype(np.float32)) for _ in range(6)]
    w, b = run_fastmetal(cls, hyper, w0, b0, grads, device, params_as)
    np.testing.assert_allclose(w, numpy_steps(kind, hyper, w0, [g for g, _ in grads]),
                               rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(b, numpy_steps(kind, hyper, b0, [g for _, g in grads]),
                               rtol=2e-5, atol=2e-6)


@needs_torch
@pytest.mark.parametrize("case", range(len(OPTIM_CASES)))
def test_optimizer_matches_torch_optim(device, rng, case):
    kind, cls, hyper = OPTIM_CASES[case]
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    b0 = rng.standard_normal(4).astype(np.float32)
    grads = [(rng.standard_normal((4, 3)).astype(np.float32),
              rng.standard_normal(4).astype(np.float32)) for _ in range(5)]
    w, b = run_fastmetal(cls, hyper, w0, b0, grads, device)
    tw, tb = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    tcls = getattr(torch.optim, TORCH_OPTIM[kind])
    topt = tcls([tw, tb], **hyper)
    for gw, gb in grads:
        tw.grad, tb.grad = torch.tensor(gw), torch.tensor(gb)
        topt.step()
    np.testing.assert_allclose(w, tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, tb.detach().numpy(), rtol=1e-5, atol=1e-6)


# Parameters of one optimizer, several per launch (FM_OPTIM_SLOTS, metal/training_args.h):
# launch boundaries, an empty and a 0-d parameter, a float16 one (updated through float32).
MULTI_SHAPES = [(5, 7), (3,), (), (0,), (40, 33), (1,), (2, 2, 3), (17,)]
MULTI_DTYPES = [np.float32] * 7 + [np.float16]


@pytest.mark.parametrize("case", range(len(OPTIM_CASES)))
def test_multi_tensor_step_matches_each_parameter_alone(device, rng, case):
    """Eight parameters in two param groups of different learning rates: each follows the
    float64 formulas with its own group's hyper-parameters, and equals, bit for bit, the
    same optimizer stepping that parameter alone (a slot mixed up in a launch would not)."""
    kind, cls, hyper = OPTIM_CASES[case]
    lr = hyper.get("lr", 1.0 if kind == "adadelta" else 1e-3)
    hypers = [dict(hyper, lr=lr), dict(hyper, lr=0.3 * lr)]
    split = 5  # params[:5] in the first group
    p0 = [rng.standard_normal(s).astype(d) for s, d in zip(MULTI_SHAPES, MULTI_DTYPES)]
    steps = [[rng.standard_normal(s).astype(d) for s, d in zip(MULTI_SHAPES, MULTI_DTYPES)]
             for _ in range(4)]

    def run(indices, group_of):
        ps = {i: nn.Parameter(fm.asarray(p0[i].copy(), dtype=p0[i].dtype, device=device))
              for i in indices}
        groups = [{"params": [ps[i] for i in indices if group_of(i) == g], **hypers[g]}
                  for g in (0, 1)]
        opt = cls([g for g in groups if g["params"]])
        for grads in steps:
            for i in indices:
                ps[i].grad = fm.asarray(grads[i], dtype=grads[i].dtype, device=device)
            opt.step()
        return {i: host(p) for i, p in ps.items()}

    group_of = lambda i: 0 if i < split else 1  # noqa: E731
    together = run(range(len(MULTI_SHAPES)), group_of)
    for i in range(len(MULTI_SHAPES)):
        alone = run([i], group_of)[i]
        np.testing.assert_array_equal(together[i], alone, err_msg=f"parameter {i}")
        assert together[i].dtype == MULTI_DTYPES[i] and together[i].shape == MULTI_SHAPES[i]
        want = numpy_steps(kind, hypers[group_of(i)], p0[i].astype(np.float32),
                           [g[i].astype(np.float32) for g in steps])
        tol = dict(rtol=2e-5, atol=2e-6) if MULTI_DTYPES[i] == np.float32 else \
            dict(rtol=4e-3, atol=4e-3)
        np.testing.assert_allclose(together[i], want, **tol, err_msg=f"parameter {i}")


def test_optimizer_skips_missing_gradients_and_zero_grad(device, rng):
    layer = Params(np.ones((2, 2), np.float32), np.ones(2, np.float32), device=device)
    opt = nn.optim.SGD(layer.parameters(), lr=0.5)
    assert layer.weight.grad is None and layer.bias.grad is None
    layer.weight.grad = fm.asarray(np.ones((2, 2), np.float32))
    opt.step()
    np.testing.assert_array_equal(host(layer.weight), np.full((2, 2), 0.5, np.float32))
    np.testing.assert_array_equal(host(layer.bias), np.ones(2, np.float32))
    assert id(layer.bias) not in opt.state  # never stepped: no state made for it
    opt.zero_grad()
    assert layer.weight.grad is None and layer.bias.grad is None
    # set_to_none=False: zeros (only where there was a gradient), with the module's too
    layer.weight.grad = fm.ones((2, 2))
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(host(layer.weight.grad), np.zeros((2, 2), np.float32))
    assert layer.bias.grad is None
    layer.bias.grad = fm.ones(2)
    layer.zero_grad()
    assert layer.weight.grad is None and layer.bias.grad is None


def test_optimizer_param_groups_have_their_own_hyper_parameters(device, rng):
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    b0 = rng.standard_normal(3).astype(np.float32)
    layer = Params(w0, b0, device=device)
    opt = nn.optim.SGD([{"params": [layer.weight]},
                        {"params": [layer.bias], "lr": 0.5, "momentum": 0.9}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert opt.param_groups[0]["momentum"] == 0.0 and opt.lr == 0.1
    grads = [(rng.standard_normal((3, 4)).astype(np.float32),
              rng.standard_normal(3).astype(np.float32)) for _ in range(3)]
    for gw, gb in grads:
        layer.weight.grad, layer.bias.grad = fm.asarray(gw), fm.asarray(gb)
        opt.step()
    np.testing.assert_allclose(host(layer.weight),
                               numpy_steps("sgd", dict(lr=0.1), w0, [g for g, _ in grads]),
                               rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(host(layer.bias),
                               numpy_steps("sgd", dict(lr=0.5, momentum=0.9), b0,
                                           [g for _, g in grads]), rtol=2e-5, atol=2e-6)


@needs_torch
def test_step_lr_matches_torch():
    layer = Params(np.ones(3, np.float32), np.ones(1, np.float32))
    opt = nn.optim.Adadelta(layer.parameters(), lr=1.0)
    sched = nn.optim.StepLR(opt, step_size=1, gamma=0.7)
    t = torch.zeros(3, requires_grad=True)
    topt = torch.optim.Adadelta([t], lr=1.0)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=1, gamma=0.7)
    for _ in range(14):
        topt.step()
        tsched.step()
        sched.step()
        assert sched.get_last_lr() == tsched.get_last_lr()
    sched2 = nn.optim.StepLR(nn.optim.SGD(layer.parameters(), lr=1.0), step_size=3, gamma=0.5)
    lrs = []
    for _ in range(7):
        sched2.step()
        lrs.append(sched2.get_last_lr()[0])
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]
    # Every param group is scheduled, each from its own learning rate.
    opt3 = nn.optim.SGD([{"params": [layer.weight]}, {"params": [layer.bias], "lr": 0.2}],
                        lr=1.0)
    sched3 = nn.optim.StepLR(opt3, step_size=2, gamma=0.5)
    t3 = torch.optim.SGD([{"params": [torch.zeros(3, requires_grad=True)]},
                          {"params": [torch.zeros(1, requires_grad=True)], "lr": 0.2}], lr=1.0)
    tsched3 = torch.optim.lr_scheduler.StepLR(t3, step_size=2, gamma=0.5)
    for _ in range(5):
        t3.step()
        tsched3.step()
        sched3.step()
        assert sched3.get_last_lr() == tsched3.get_last_lr()
    assert sched3.get_last_lr() == [0.25, 0.05]


@pytest.mark.parametrize("make,match", [
    (lambda p: nn.optim.SGD(p, lr=-1), r"SGD\] expected lr"),
    (lambda p: nn.optim.SGD(p, lr="1"), r"SGD\] expected lr"),
    (lambda p: nn.optim.SGD(p, lr=0.1, nesterov=True), r"SGD\] expected momentum > 0"),
    (lambda p: nn.optim.Adam(p, betas=(1.0, 0.9)), r"Adam\] expected betas\[0\]"),
    (lambda p: nn.optim.Adam(p, betas=0.9), r"Adam\] expected betas"),
    (lambda p: nn.optim.Adadelta(p, rho=1.5), r"Adadelta\] expected rho"),
    (lambda p: nn.optim.SGD([np.zeros(3)], lr=0.1),
     r"SGD\] expected param_groups\[0\]\['params'\] to hold fastmetal.Arrays, got ndarray"),
    (lambda p: nn.optim.SGD(5, lr=0.1), r"SGD\] expected an iterable"),
    (lambda p: nn.optim.SGD(list(p)[0], lr=0.1), r"SGD\] expected .*got one Array"),
    (lambda p: nn.optim.SGD([], lr=0.1), r"SGD\] expected at least one parameter"),
    (lambda p: nn.optim.SGD([fm.ones(2, dtype="int64")], lr=0.1), r"SGD\] expected float"),
    (lambda p: nn.optim.SGD([{"lr": 0.1}], lr=0.1), r"SGD\] expected every param group"),
    (lambda p: nn.optim.SGD([{"params": p, "foo": 1}], lr=0.1), r"SGD\] expected group options"),
    (lambda p: nn.optim.SGD([list(p)[0]] * 2, lr=0.1), r"SGD\] expected each parameter"),
    (lambda p: nn.optim.StepLR(p, 1), r"StepLR\] expected a fastmetal.optim optimizer"),
    (lambda p: nn.optim.StepLR(nn.optim.SGD(p, lr=1), 0), r"StepLR\] expected step_size"),
])
def test_optimizer_bad_arguments(make, match):
    layer = Params(np.ones(3, np.float32), np.ones(1, np.float32))
    # Optimizers name themselves fastmetal.nn.optim.X (as reached); schedules by their home.
    with pytest.raises((ValueError, TypeError),
                       match=r"^\[fastmetal\.(nn\.)?optim\.(lr_scheduler\.)?" + match):
        make(layer.parameters())


# ----------------------------------------------------------------------------- layers
def test_relu_layer(device, rng):
    xh = rng.standard_normal((3, 4, 5)).astype(np.float32)
    xh[0, 0, :3] = [0.0, -0.0, np.nan]
    x = fm.asarray(xh).requires_grad_()
    layer = nn.ReLU()
    y = layer(x)
    np.testing.assert_array_equal(host(y), host(fm.relu(xh)))
    ok = ~np.isnan(xh)
    np.testing.assert_array_equal(host(y)[ok], np.where(xh > 0, xh, 0).astype(np.float32)[ok])
    g = rng.standard_normal(xh.shape).astype(np.float32)
    y.backward(fm.asarray(g))
    np.testing.assert_array_equal(host(x.grad), np.where(xh <= 0, 0, g).astype(np.float32))


@needs_torch
def test_relu_backward_matches_torch(device, rng):
    xh = rng.standard_normal(50).astype(np.float32)
    xh[:3] = [0.0, -0.0, np.nan]
    xt = torch.tensor(xh, requires_grad=True)
    g = rng.standard_normal(50).astype(np.float32)
    torch.relu(xt).backward(torch.tensor(g))
    x = fm.asarray(xh).requires_grad_()
    nn.ReLU()(x).backward(fm.asarray(g))
    np.testing.assert_array_equal(host(x.grad), xt.grad.numpy())


def test_dropout_layer_train_and_eval(device, rng):
    xh = rng.standard_normal((8, 50)).astype(np.float32) + 5
    x = fm.asarray(xh).requires_grad_()
    layer = nn.Dropout(0.5, seed=7)
    y = layer(x)
    y1 = host(y)
    y.backward(fm.ones((8, 50)))
    gi = host(x.grad)
    np.testing.assert_array_equal(gi != 0, y1 != 0)  # backward uses the forward's mask
    np.testing.assert_array_equal(gi[gi != 0], np.float32(2))  # and its scale
    y2 = host(layer(x))
    assert not np.array_equal(y1 != 0, y2 != 0)  # a new mask per call
    again = nn.Dropout(0.5, seed=7)
    np.testing.assert_array_equal(host(again(xh)), y1)  # the seed fixes the sequence
    layer.eval()
    assert not layer.training and layer(x) is x
    layer.train()
    assert layer.training


def test_flatten_maxpool_logsoftmax_layers(device, rng):
    xh = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    x = fm.asarray(xh).requires_grad_()
    pool, flat, lsm = nn.MaxPool2d(2), nn.Flatten(), nn.LogSoftmax(dim=1)
    y = lsm(flat(pool(x)))
    assert tuple(y.shape) == (2, 12)
    g = rng.standard_normal((2, 12)).astype(np.float32)
    y.backward(fm.asarray(g))
    assert tuple(x.grad.shape) == xh.shape
    # The same chain through the functional backward kernels.
    want = fm.max_pool2d_backward(
        fm.log_softmax_backward(g, y.detach(), 1).reshape((2, 3, 2, 2)), xh, 2)
    np.testing.assert_allclose(host(x.grad), host(want), rtol=1e-6, atol=1e-7)
    xa = fm.asarray(xh)
    ya = flat(xa)
    assert isinstance(ya, fm.Array) and ya.shape == (2, 48)
    np.testing.assert_array_equal(host(ya), xh.reshape(2, 48))


def make_cnn(device=None, seed=0):
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, seed=seed, device=device), nn.ReLU(),
        nn.Conv2d(4, 6, 3, seed=seed + 1, device=device), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25, seed=seed + 2), nn.Flatten(), nn.LogSoftmax(1))


def test_sequential_backward_matches_torch_autograd(device, rng):
    if torch is None:
        pytest.skip("PyTorch is not installed")
    net = make_cnn(device=device)
    xh = rng.standard_normal((3, 1, 8, 8)).astype(np.float32)
    x = fm.asarray(xh).requires_grad_()
    labels = np.array([1, 0, 5])
    out = net(x)
    loss = nn.CrossEntropyLoss()(out, labels)
    assert isinstance(loss, fm.Array) and loss.shape == ()
    loss.backward()
    net[5]._next_seed -= 1  # replay the forward's mask
    with fm.no_grad():
        mask = host(net[5](np.ones((3, 6, 2, 2), np.float32)))
    assert tuple(out.shape) == (3, 24)

    tp = [torch.tensor(host(p), requires_grad=True) for p in net.parameters()]
    xt = torch.tensor(xh, requires_grad=True)
    h = torch.relu(torch.nn.functional.conv2d(xt, tp[0], tp[1]))
    h = torch.relu(torch.nn.functional.conv2d(h, tp[2], tp[3]))
    h = torch.nn.functional.max_pool2d(h, 2) * torch.tensor(mask)
    h = torch.log_softmax(h.flatten(1), 1)
    tl = torch.nn.functional.cross_entropy(h, torch.tensor(labels))
    tl.backward()
    np.testing.assert_allclose(float(host(loss)), tl.item(), rtol=1e-5)
    np.testing.assert_allclose(host(x.grad), xt.grad.numpy(), rtol=1e-4, atol=1e-6)
    for layer, (tw, tb) in ((net[0], tp[:2]), (net[2], tp[2:])):
        np.testing.assert_allclose(host(layer.weight.grad), tw.grad.numpy(), rtol=1e-4,
                                   atol=1e-6)
        np.testing.assert_allclose(host(layer.bias.grad), tb.grad.numpy(), rtol=1e-4,
                                   atol=1e-6)


def test_sequential_gradient_finite_differences(rng):
    """The whole Sequential (eval mode: no dropout) against central differences of its loss."""
    net = make_cnn().eval()
    x = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
    labels = np.array([3, 7])
    loss_fn = nn.CrossEntropyLoss()

    def loss_at(xv):
        with fm.no_grad():
            return float(host(loss_fn(net(xv), labels)))

    xa = fm.asarray(x).requires_grad_()
    loss_fn(net(xa), labels).backward()
    gx = host(xa.grad)
    w = net[0].weight
    gw = host(w.grad).copy()
    eps = 1e-2
    for idx in [(0, 0, 3, 4), (1, 0, 0, 0), (1, 0, 7, 7), (0, 0, 5, 2)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        fd = (loss_at(xp) - loss_at(xm)) / (2 * eps)
        assert abs(fd - gx[idx]) < 2e-3 + 2e-2 * abs(fd), (idx, fd, gx[idx])
    for idx in [(0, 0, 1, 1), (3, 0, 2, 0)]:
        old = float(host(w)[idx])
        with fm.no_grad():
            w[idx] = old + eps
        lp = loss_at(x)
        with fm.no_grad():
            w[idx] = old - eps
        lm = loss_at(x)
        with fm.no_grad():
            w[idx] = old
        fd = (lp - lm) / (2 * eps)
        assert abs(fd - gw[idx]) < 2e-3 + 2e-2 * abs(fd), (idx, fd, gw[idx])


def test_sequential_parameters_zero_grad_train_eval(device):
    import types
    net = make_cnn(device=device)
    assert isinstance(net.parameters(), types.GeneratorType)
    params = list(net.parameters())
    assert len(params) == 4 and all(isinstance(p, fm.Array) for p in params)
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in params)
    assert all(p.device == device for p in params)
    assert params[0] is net[0].weight
    assert [n for n, _ in net.named_parameters()] == ["0.weight", "0.bias", "2.weight",
                                                       "2.bias"]
    net.eval()
    assert not net[5].training and not net.training
    net.train()
    assert net[5].training
    net(np.zeros((1, 1, 8, 8), np.float32)).backward(np.zeros((1, 24), np.float32))
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert net[0].weight.grad is None and net[2].bias.grad is None
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize("on_device", [False, True], ids=["default", "named"])
def test_state_dict_roundtrip_through_savez(device, on_device):
    from collections import OrderedDict
    net = make_cnn(device=device if on_device else None, seed=1)
    sd = net.state_dict()
    assert isinstance(sd, OrderedDict)
    assert list(sd) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in sd.values())
    sd["0.bias"][...] = 0  # copies: the model is untouched
    assert np.any(host(net[0].bias) != 0)
    sd = net.state_dict()
    buf = io.BytesIO()
    np.savez(buf, **sd)
    other = make_cnn(device=device if on_device else None, seed=5)
    weight = other[0].weight
    assert not np.array_equal(host(other[0].weight), sd["0.weight"])
    buf.seek(0)
    with np.load(buf) as f:
        assert other.load_state_dict(f) == ([], [])
    assert other[0].weight is weight  # copied in place (an optimizer keeps working)
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v, sd[k])
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32)
    net.eval(), other.eval()
    np.testing.assert_array_equal(host(net(x)), host(other(x)))


def test_load_state_dict_checks_keys_and_shapes():
    net = make_cnn()
    sd = net.state_dict()
    before = net.state_dict()
    with pytest.raises(ValueError, match=r"^\[fastmetal\.nn\.Sequential\.load_state_dict\] "
                                         r"expected the keys .*missing \['0.bias'\]"):
        net.load_state_dict({k: v for k, v in sd.items() if k != "0.bias"})
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]"):
        net.load_state_dict(dict(sd, extra=np.zeros(1, np.float32)))
    # strict=False loads what is there and says what was not
    half = {"0.weight": np.ones((4, 1, 3, 3), np.float32), "extra": np.zeros(1, np.float32)}
    missing, unexpected = net.load_state_dict(half, strict=False)
    assert missing == ["0.bias", "2.weight", "2.bias"] and unexpected == ["extra"]
    np.testing.assert_array_equal(host(net[0].weight), np.ones((4, 1, 3, 3), np.float32))
    np.testing.assert_array_equal(host(net[2].weight), before["2.weight"])
    sd["0.bias"] = np.zeros(5, np.float32)
    sd["0.weight"] = np.zeros((4, 1, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.nn\.Sequential\.load_state_dict\] "
                                         r"expected 0.bias of shape"):
        net.load_state_dict(sd)
    # checked before anything is written
    np.testing.assert_array_equal(host(net[0].weight), np.ones((4, 1, 3, 3), np.float32))
    with pytest.raises(TypeError, match=r"expected a mapping"):
        net.load_state_dict([1, 2])


def test_optimizer_over_a_sequential_trains(device, rng):
    """A few Adadelta steps on a fixed batch lower the loss (parameters on the device)."""
    net = make_cnn(device=device, seed=3)
    net[5].p = 0.0  # no dropout: the loss is a function of the parameters only
    opt = nn.optim.Adadelta(net.parameters(), lr=1.0)
    sched = nn.optim.StepLR(opt, step_size=1, gamma=0.9)
    x = rng.standard_normal((16, 1, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 24, 16)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = loss_fn(net(x), labels)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(host(loss)))
    assert losses[-1] < losses[0] - 0.05, losses
    assert isinstance(net[0].weight, fm.Array) and net[0].weight.device == device


@pytest.mark.parametrize("make,err,match", [
    (lambda: nn.MaxPool2d(0), ValueError, r"nn\.MaxPool2d\] expected kernel_size"),
    (lambda: nn.Dropout(1.0), ValueError, r"nn\.Dropout\] expected p"),
    (lambda: nn.Flatten(1.5), TypeError, r"nn\.Flatten\] expected start_dim"),
    (lambda: nn.Sequential(nn.ReLU(), 3), TypeError, r"nn\.Sequential\] expected Modules"),
    (lambda: nn.Module()(np.zeros(2)), NotImplementedError, r"nn\.Module\] expected a forward\(\)"),
    (lambda: nn.Linear(0, 3), ValueError, r"nn\.Linear\] expected in_features"),
    (lambda: nn.Linear(2, 3, bias=1), TypeError, r"nn\.Linear\] expected bias"),
    (lambda: nn.ReLU().train(1), TypeError, r"nn\.ReLU\.train\] expected mode"),
    (lambda: setattr(nn.Linear(2, 3), "weight", np.zeros((3, 2))), TypeError,
     r"nn\.Linear\] expected a Parameter or None for parameter 'weight'"),
])
def test_layer_bad_arguments(make, err, match):
    with pytest.raises(err, match=r"^\[fastmetal\." + match):
        make()


def test_flatten_of_device_array_is_a_view_there(device, rng):
    x = fm.asarray(rng.standard_normal((3, 2, 4, 5)).astype(np.float32))
    flat = nn.Flatten()
    y = flat(x)
    assert isinstance(y, fm.Array) and y.device == device and y.shape == (3, 40)
    np.testing.assert_array_equal(host(y), host(x).reshape(3, 40))
    if device in ("cpu", "metal"):
        assert np.shares_memory(np.asarray(y), np.asarray(x))
    xg = x.detach().requires_grad_()
    flat(xg).backward(y)
    assert isinstance(xg.grad, fm.Array) and xg.grad.shape == (3, 2, 4, 5)
    np.testing.assert_array_equal(host(xg.grad), host(x))
    middle = nn.Flatten(1, 2)(x)
    assert middle.shape == (3, 8, 5)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.nn\.Flatten\] expected start_dim"):
        nn.Flatten(3, 1)(x)


# The ops of this suite only (the input itself is the trained parameter); the whole MNIST
# network, conv2d and linear included, is checked in test_mnist_example.py.
TRAIN_SCRIPT = r"""
import hashlib, numpy as np, fastmetal as fm
from fastmetal import nn
rng = np.random.default_rng(2)
inp = nn.Parameter(rng.standard_normal((64, 4, 14, 14)).astype(np.float32))
net = nn.Sequential(nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25, seed=1), nn.Flatten(),
                    nn.LogSoftmax(1))
labels = rng.integers(0, 196, 64)
for opt in (nn.optim.Adadelta([inp]), nn.optim.Adam([inp], lr=0.1),
            nn.optim.SGD([inp], lr=0.1, momentum=0.9)):
    for _ in range(3):
        opt.zero_grad()
        loss = nn.CrossEntropyLoss()(net(inp), labels)
        loss.backward()
        opt.step()
print("RESULT", hashlib.sha256(inp.numpy().tobytes()).hexdigest(), float(loss.item()))
"""


def test_training_is_bitwise_reproducible_whatever_the_cpu_thread_count():
    import os
    import subprocess
    import sys
    outs = []
    for threads in ("1", "3"):
        env = dict(os.environ, FASTMETAL_NUM_THREADS=threads, FASTMETAL_DEVICE="cpu")
        r = subprocess.run([sys.executable, "-c", TRAIN_SCRIPT], env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.split())
    assert outs[0] == outs[1]
