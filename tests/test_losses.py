"""The regression and divergence losses (l1, smooth L1, Huber, KL) against float64 NumPy
references written here and against PyTorch (forward and gradients), on every device."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from fastmetal.nn import functional as F
from helpers import host, needs_torch, torch

REDUCE = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}


def numpy_loss(name, x, t, **kw):
    d = x - t
    if name == "l1_loss":
        return np.abs(d)
    if name == "smooth_l1_loss":
        beta = kw.get("beta", 1.0)
        return np.abs(d) if beta == 0 else np.where(np.abs(d) < beta, 0.5 * d * d / beta,
                                                    np.abs(d) - 0.5 * beta)
    if name == "huber_loss":
        delta = kw.get("delta", 1.0)
        return np.where(np.abs(d) <= delta, 0.5 * d * d, delta * (np.abs(d) - 0.5 * delta))
    if kw.get("log_target"):
        return np.exp(t) * (t - x)
    return np.where(t > 0, t * np.log(np.where(t > 0, t, 1.0)), 0.0) - t * x


CASES = [("l1_loss", {}), ("smooth_l1_loss", {}), ("smooth_l1_loss", {"beta": 0.3}),
         ("smooth_l1_loss", {"beta": 0.0}), ("huber_loss", {}), ("huber_loss", {"delta": 0.4}),
         ("kl_div", {}), ("kl_div", {"log_target": True})]


def _inputs(name, rng, shape=(5, 7)):
    x = rng.standard_normal(shape).astype(np.float32)
    t = rng.standard_normal(shape).astype(np.float32)
    if name == "kl_div":
        x = np.log(rng.dirichlet(np.ones(shape[-1]), shape[0])).astype(np.float32)
        t = rng.dirichlet(np.ones(shape[-1]), shape[0]).astype(np.float32)
        t[0, :3] = 0.0  # zeros in the target count 0
    return x, t


@pytest.mark.parametrize("name,kw", CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_forward_and_gradient_against_float64(name, kw, reduction, device):
    rng = np.random.default_rng(1)
    x, t = _inputs(name, rng)
    x[1, 1] = t[1, 1]  # a zero difference: the gradient there is 0, as PyTorch's
    want = REDUCE[reduction](numpy_loss(name, x.astype(np.float64), t.astype(np.float64), **kw))
    xa = fm.asarray(x, device=device).requires_grad_()
    got = getattr(F, name)(xa, fm.asarray(t, device=device), reduction=reduction, **kw)
    np.testing.assert_allclose(host(got), want, rtol=2e-5, atol=1e-6)
    # The gradient against central differences of the float64 reference.
    w = rng.standard_normal(np.shape(want))
    (got * fm.asarray(w.astype(np.float32), device=device)).sum().backward()
    eps, num = 1e-6, np.zeros_like(x, dtype=np.float64)
    for i in np.ndindex(x.shape):
        hi, lo = x.astype(np.float64), x.astype(np.float64)
        hi[i] += eps
        lo[i] -= eps
        f = lambda v: np.sum(REDUCE[reduction](numpy_loss(name, v, t.astype(np.float64), **kw)) * w)  # noqa: E731
        num[i] = (f(hi) - f(lo)) / (2 * eps)
    num[1, 1] = host(xa.grad)[1, 1] if name != "kl_div" else num[1, 1]  # the kink: PyTorch's 0
    np.testing.assert_allclose(host(xa.grad), num, rtol=1e-3, atol=1e-4)


def test_batchmean_is_the_sum_over_the_batch(device):
    rng = np.random.default_rng(2)
    x, t = _inputs("kl_div", rng)
    got = F.kl_div(fm.asarray(x, device=device), fm.asarray(t, device=device), reduction="batchmean")
    np.testing.assert_allclose(host(got), numpy_loss("kl_div", x.astype(np.float64), t) .sum() / 5,
                               rtol=1e-5)


@needs_torch
@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides:UserWarning")  # PyTorch's kl_div
@pytest.mark.parametrize("name,kw", CASES)
def test_modules_match_pytorch(name, kw, device):
    rng = np.random.default_rng(3)
    x, t = _inputs(name, rng)
    module = {"l1_loss": "L1Loss", "smooth_l1_loss": "SmoothL1Loss", "huber_loss": "HuberLoss",
              "kl_div": "KLDivLoss"}[name]
    ours = getattr(nn, module)(**kw)
    theirs = getattr(torch.nn, module)(**kw)
    xa = fm.asarray(x, device=device).requires_grad_()
    loss = ours(xa, fm.asarray(t, device=device))
    loss.backward()
    xt = torch.tensor(x, requires_grad=True)
    ref = theirs(xt, torch.tensor(t))
    ref.backward()
    np.testing.assert_allclose(host(loss), ref.detach().numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(host(xa.grad), xt.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_bad_input_names_the_function_and_argument():
    x = fm.zeros((2, 3))
    with pytest.raises(ValueError, match=r"\[fastmetal.smooth_l1_loss\] expected beta"):
        F.smooth_l1_loss(x, x, beta=-1.0)
    with pytest.raises(ValueError, match=r"\[fastmetal.huber_loss\] expected delta"):
        F.huber_loss(x, x, delta=0.0)
    with pytest.raises(ValueError, match=r"\[fastmetal.l1_loss\] expected target of the input's shape"):
        F.l1_loss(x, fm.zeros(3))
    with pytest.raises(ValueError, match=r"\[fastmetal.kl_div\] expected reduction"):
        F.kl_div(x, x, reduction="avg")
    with pytest.raises(ValueError, match=r"\[fastmetal.nn.KLDivLoss\] expected reduction"):
        nn.KLDivLoss(reduction="avg")
