"""fastmetal.optim against PyTorch: RMSprop, Adagrad and LBFGS step for step; every optimizer
on float16 parameters (PyTorch's results within float16 rounding); step(closure);
state_dict / load_state_dict (a resumed run equals an uninterrupted one, bit for bit); and
every learning-rate schedule's sequence. NumPy references where PyTorch is absent."""
from __future__ import annotations

import math

import numpy as np
import pytest

import fastmetal as fm
from helpers import host, needs_torch, torch

OPTIMIZERS = [("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
              ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
              ("Adam", dict(lr=1e-2, weight_decay=0.1)), ("AdamW", dict(lr=1e-2)),
              ("Adadelta", dict(lr=1.0)), ("RMSprop", dict(lr=1e-2)),
              ("RMSprop", dict(lr=1e-2, momentum=0.9, centered=True, weight_decay=0.1)),
              ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.05,
                               initial_accumulator_value=0.1))]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(OPTIMIZERS)]


def _grads(seed, n, shape, dtype):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]


def _run_fm(name, kw, w0, grads, device):
    # A copy: on host-visible devices asarray shares w0's memory, which step() updates.
    p = fm.nn.Parameter(fm.asarray(w0.copy(), dtype=w0.dtype, device=device))
    opt = getattr(fm.optim, name)([p], **kw)
    for g in grads:
        p.grad = fm.asarray(g, dtype=g.dtype, device=device)
        opt.step()
    return host(p), opt


@needs_torch
@pytest.mark.parametrize("name,kw", OPTIMIZERS, ids=IDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_optimizers_follow_pytorch(name, kw, dtype, device):
    w0 = np.random.default_rng(1).standard_normal((3, 5)).astype(dtype)
    grads = _grads(2, 6, (3, 5), dtype)
    ours, _ = _run_fm(name, kw, w0, grads, device)
    tp = torch.nn.Parameter(torch.tensor(w0))
    topt = getattr(torch.optim, name)([tp], **kw)
    for g in grads:
        tp.grad = torch.tensor(g)
        topt.step()
    assert ours.dtype == dtype
    # float16: our state and arithmetic are float32 (PyTorch's per-op float16 rounding
    # differs by a few float16 ulps over six steps).
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=4e-3, atol=4e-3)
    np.testing.assert_allclose(ours.astype(np.float64), tp.detach().numpy().astype(np.float64), **tol)


@pytest.mark.parametrize("name,kw", OPTIMIZERS, ids=IDS)
def test_state_dict_resumes_bit_for_bit(name, kw, device):
    w0 = np.random.default_rng(3).standard_normal(7).astype(np.float32)
    grads = _grads(4, 6, 7, np.float32)
    straight, _ = _run_fm(name, kw, w0, grads, device)
    half, opt = _run_fm(name, kw, w0, grads[:3], device)
    saved = opt.state_dict()
    assert set(saved) == {"state", "param_groups"} and saved["param_groups"][0]["params"] == [0]
    p = fm.nn.Parameter(fm.asarray(half.copy(), device=device))
    resumed = getattr(fm.optim, name)([p], **kw)
    resumed.load_state_dict(saved)
    for g in grads[3:]:
        p.grad = fm.asarray(g, device=device)
        resumed.step()
    np.testing.assert_array_equal(host(p), straight)
    with pytest.raises(ValueError, match="expected 1 param groups of \\[1\\] parameters"):
        resumed.load_state_dict({"state": {}, "param_groups": []})


def test_step_with_closure_returns_its_loss(device):
    p = fm.nn.Parameter(fm.asarray(np.array([2.0, -1.0], np.float32), device=device))
    opt = fm.optim.SGD([p], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss
    loss = opt.step(closure)
    assert float(loss.item()) == 5.0
    np.testing.assert_allclose(host(p), [1.0, -0.5])  # p - 0.25 * 2p


@needs_torch
@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True:UserWarning")
@pytest.mark.parametrize("history", [3, 100])
def test_lbfgs_follows_pytorch(history, device):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((12, 4)).astype(np.float32), rng.standard_normal(12).astype(np.float32)
    p = fm.nn.Parameter(fm.zeros(4, device=device))
    tp = torch.nn.Parameter(torch.zeros(4))
    opt = fm.optim.LBFGS([p], lr=0.5, max_iter=8, history_size=history)
    topt = torch.optim.LBFGS([tp], lr=0.5, max_iter=8, history_size=history)
    fa, fb = fm.asarray(a, device=device), fm.asarray(b, device=device)

    def closure():
        opt.zero_grad()
        loss = fm.sum((fm.matmul(fa, p) - fb) ** 2) + fm.sum(fm.sin(p)) * 0.1
        loss.backward()
        return loss

    def tclosure():
        topt.zero_grad()
        loss = ((torch.tensor(a) @ tp - torch.tensor(b)) ** 2).sum() + torch.sin(tp).sum() * 0.1
        loss.backward()
        return loss
    for _ in range(3):
        ours, theirs = opt.step(closure), topt.step(tclosure)
        assert float(ours.item()) == pytest.approx(float(theirs.detach()), rel=1e-5)
    np.testing.assert_allclose(host(p), tp.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_lbfgs_refuses_what_it_does_not_do():
    p = fm.nn.Parameter(fm.zeros(2))
    with pytest.raises(ValueError, match="strong_wolfe' is not implemented"):
        fm.optim.LBFGS([p], line_search_fn="strong_wolfe")
    with pytest.raises(ValueError, match="expected a closure"):
        fm.optim.LBFGS([p]).step()


SCHEDULES = [
    ("StepLR", (3, 0.5), {}), ("MultiStepLR", ([2, 5, 5, 9], 0.5), {}),
    ("ExponentialLR", (0.9,), {}), ("CosineAnnealingLR", (7, 0.01), {}),
    ("LambdaLR", (lambda e: 0.95 ** e,), {}), ("LinearLR", (0.2, 0.9, 6), {}),
    ("OneCycleLR", (1.0,), dict(total_steps=31)),
    ("OneCycleLR", (1.0,), dict(total_steps=31, three_phase=True, anneal_strategy="linear")),
]


@needs_torch
@pytest.mark.parametrize("name,args,kw", SCHEDULES, ids=[f"{s[0]}-{i}" for i, s in enumerate(SCHEDULES)])
@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_schedules_give_pytorchs_sequence(name, args, kw, optimizer):
    okw = dict(momentum=0.9) if optimizer == "SGD" else {}
    p, tp = fm.nn.Parameter(fm.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = getattr(fm.optim, optimizer)([p], lr=0.1, **okw)
    topt = getattr(torch.optim, optimizer)([tp], lr=0.1, **okw)
    sched = getattr(fm.optim.lr_scheduler, name)(opt, *args, **kw)
    tsched = getattr(torch.optim.lr_scheduler, name)(topt, *args, **kw)
    key = "momentum" if optimizer == "SGD" else "betas"
    for _ in range(30):
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        assert sched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-12)
        assert opt.param_groups[0][key] == pytest.approx(topt.param_groups[0][key], rel=1e-12)


@needs_torch
def test_reduce_on_plateau_gives_pytorchs_sequence():
    metrics = list(np.r_[np.linspace(1, 0.5, 8), np.full(25, 0.5), np.linspace(0.5, 0.2, 5)])
    p, tp = fm.nn.Parameter(fm.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt, topt = fm.optim.SGD([p], lr=0.1), torch.optim.SGD([tp], lr=0.1)
    kw = dict(patience=2, cooldown=1, factor=0.5, min_lr=0.01)
    sched = fm.optim.lr_scheduler.ReduceLROnPlateau(opt, **kw)
    tsched = torch.optim.lr_scheduler.ReduceLROnPlateau(topt, **kw)
    for m in metrics:
        sched.step(m)
        tsched.step(m)
        assert opt.param_groups[0]["lr"] == pytest.approx(topt.param_groups[0]["lr"], rel=1e-12)


def test_cosine_schedule_against_its_formula():
    # The closed form (no PyTorch needed) over the first half-period.
    p = fm.nn.Parameter(fm.zeros(2))
    opt = fm.optim.SGD([p], lr=0.1)
    sched = fm.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=0.001)
    for t in range(1, 11):
        opt.step()
        sched.step()
        want = 0.001 + (0.1 - 0.001) * (1 + math.cos(math.pi * t / 10)) / 2
        assert sched.get_last_lr()[0] == pytest.approx(want, rel=1e-9)


def test_schedules_refuse_bad_arguments():
    opt = fm.optim.SGD([fm.nn.Parameter(fm.zeros(1))], lr=0.1)
    with pytest.raises(TypeError, match="expected a fastmetal.optim optimizer"):
        fm.optim.lr_scheduler.StepLR(object(), 2)
    with pytest.raises(ValueError, match="anneal_strategy"):
        fm.optim.lr_scheduler.OneCycleLR(opt, 1.0, total_steps=5, anneal_strategy="exp")
    with pytest.raises(ValueError, match="total_steps, or epochs"):
        fm.optim.lr_scheduler.OneCycleLR(opt, 1.0)
    with pytest.raises(ValueError, match="factor < 1"):
        fm.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=2.0)
