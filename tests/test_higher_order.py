"""Higher-order gradients: backward(create_graph=True), autograd.grad(..., create_graph=True)
and fm.grad of fm.grad, against float64 finite differences (the second derivative of every
differentiable elementwise op) and PyTorch (a gradient penalty, a Hessian-vector product).
Where a vjp is not made of differentiable ops, a second-order gradient through it raises
NotImplementedError naming the op: never silent zeros."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.ops.optable import OPS
from helpers import host, needs_torch, torch
from references import numpy_reference

RNG = np.random.default_rng(7)
SECOND = [s for s in OPS if s.differentiable and s.public]
POSITIVE = {"log", "sqrt", "reciprocal", "power", "divide", "log1p", "log2", "log10"}
AWAY_FROM_ZERO = {"relu", "abs", "maximum", "minimum", "hypot", "atan2"}
DOMAINS = {"asin": (-0.8, 0.8), "acos": (-0.8, 0.8), "atanh": (-0.8, 0.8),
           "acosh": (1.3, 3.0), "tan": (-1.1, 1.1)}  # away from the poles


def _sample(name, shape):
    lo, hi = DOMAINS.get(name, (0.5, 2.0) if name in POSITIVE else (-2.0, 2.0))
    x = RNG.uniform(lo, hi, shape)
    if name in AWAY_FROM_ZERO:
        x = np.where(np.abs(x) < 0.1, 0.7, x)
    return x


def _fd_grad(f, xs, k, w, h=1e-5):
    """d/dx_k of sum(w * f(*xs)) in float64 by central differences."""
    g = np.zeros_like(xs[k])
    for idx in np.ndindex(*xs[k].shape):
        hi = [x.copy() for x in xs]
        lo = [x.copy() for x in xs]
        hi[k][idx] += h
        lo[k][idx] -= h
        g[idx] = (np.sum(w * f(*hi)) - np.sum(w * f(*lo))) / (2 * h)
    return g


@pytest.mark.parametrize("spec", SECOND, ids=[s.name for s in SECOND])
def test_second_derivative_of_every_elementwise_op(spec, device):
    ref = lambda *a: numpy_reference(spec, *a)  # noqa: E731
    shape = (2, 3)
    xs = [_sample(spec.name, shape) for _ in range(spec.arity)]
    if spec.name in ("maximum", "minimum"):
        xs[1] = xs[0] + np.where(RNG.uniform(size=shape) > 0.5, 0.3, -0.3)  # no ties
    w, v = RNG.standard_normal(shape), RNG.standard_normal(shape)
    arrays = [fm.asarray(x.astype(np.float32), device=device).requires_grad_() for x in xs]
    out = (fm.ops.elementwise.FUNCTIONS[spec.name](*arrays) *
           fm.asarray(w.astype(np.float32), device=device)).sum()
    (g0,) = fm.autograd.grad(out, arrays[0], create_graph=True)
    # Reference: d/dx_j of sum(v * d/dx_0 sum(w f)), nested float64 central differences.
    first = lambda *a: _fd_grad(ref, list(a), 0, w)  # noqa: E731
    if not g0.requires_grad:  # a first derivative that depends on no input (x + y, -x, ...)
        for j in range(spec.arity):
            np.testing.assert_allclose(_fd_grad(first, xs, j, v, h=1e-4), 0.0, atol=1e-4,
                                       err_msg=f"{spec.name}: its gradient left the graph")
        return
    second = fm.autograd.grad((g0 * fm.asarray(v.astype(np.float32), device=device)).sum(),
                              arrays, allow_unused=True)
    for j, got in enumerate(second):
        want = _fd_grad(first, xs, j, v, h=1e-4)
        got = np.zeros(shape) if got is None else host(got).astype(np.float64)
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=5e-3, atol=5e-3 * scale,
                                   err_msg=f"{spec.name}: d2/dx0 dx{j}")


def test_grad_of_grad(device):
    x0 = np.array([0.3, -1.2, 2.0])
    x = fm.asarray(x0.astype(np.float32), device=device)
    f = lambda v: fm.sum(fm.sin(v) * v)  # noqa: E731
    d1 = fm.grad(f)
    d2 = fm.grad(lambda v: fm.sum(d1(v)))
    d3 = fm.grad(lambda v: fm.sum(d2(v)))
    np.testing.assert_allclose(host(d1(x)), np.cos(x0) * x0 + np.sin(x0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(d2(x)), 2 * np.cos(x0) - x0 * np.sin(x0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(d3(x)), -3 * np.sin(x0) - x0 * np.cos(x0), rtol=1e-4, atol=1e-5)
    # value_and_grad nested: the inner value stays in the graph too.
    vg = fm.value_and_grad(lambda v: fm.value_and_grad(f)(v)[0] * 2.0)
    value, g = vg(x)
    np.testing.assert_allclose(host(g), 2 * (np.cos(x0) * x0 + np.sin(x0)), rtol=1e-5, atol=1e-6)


def test_backward_create_graph_puts_grad_in_the_graph(device):
    x = fm.asarray(np.array([1.0, 2.0], np.float32), device=device).requires_grad_()
    (x * x * x).sum().backward(create_graph=True)
    g = x.grad
    assert g.requires_grad
    np.testing.assert_allclose(host(g), [3.0, 12.0])
    x.grad = None
    g.sum().backward()
    np.testing.assert_allclose(host(x.grad), [6.0, 12.0])  # d/dx sum(3 x^2)


def _mlp(params, x, F):
    w1, b1, w2, b2 = params
    return F.linear(F.tanh(F.linear(x, w1, b1)), w2, b2)


@needs_torch
def test_gradient_penalty_matches_pytorch(device):
    rng = np.random.default_rng(3)
    shapes = [(5, 3), (5,), (1, 5), (1,)]
    values = [rng.standard_normal(s) * 0.7 for s in shapes]
    x0 = rng.standard_normal((4, 3))
    # fastmetal: the penalty ((|d D(x)/dx| - 1)^2).mean() of a WGAN-GP critic
    params = [fm.asarray(v.astype(np.float32), device=device).requires_grad_() for v in values]
    x = fm.asarray(x0.astype(np.float32), device=device).requires_grad_()
    out = _mlp(params, x, fm.nn.functional)
    (gx,) = fm.autograd.grad(out.sum(), x, create_graph=True)
    penalty = ((fm.sqrt((gx * gx).sum(axis=1)) - 1.0) ** 2).mean()
    penalty.backward()
    tparams = [torch.tensor(v, requires_grad=True) for v in values]
    tx = torch.tensor(x0, requires_grad=True)
    tout = _mlp(tparams, tx, torch.nn.functional)
    (tg,) = torch.autograd.grad(tout.sum(), tx, create_graph=True)
    tpen = ((tg.pow(2).sum(1).sqrt() - 1) ** 2).mean()
    tpen.backward()
    np.testing.assert_allclose(host(penalty), tpen.item(), rtol=1e-5)
    for p, tp in zip(params, tparams):
        want = np.zeros(tp.shape) if tp.grad is None else tp.grad.numpy()  # b2: no effect
        got = np.zeros(tp.shape) if p.grad is None else host(p.grad)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@needs_torch
def test_hessian_vector_product_matches_pytorch(device):
    rng = np.random.default_rng(4)
    shapes = [(6, 4), (6,), (2, 6), (2,)]
    values = [rng.standard_normal(s) * 0.5 for s in shapes]
    vecs = [rng.standard_normal(s) for s in shapes]
    x0, y0 = rng.standard_normal((8, 4)), rng.standard_normal((8, 2))
    params = [fm.asarray(v.astype(np.float32), device=device).requires_grad_() for v in values]
    loss = fm.mse_loss(_mlp(params, fm.asarray(x0.astype(np.float32), device=device),
                            fm.nn.functional), fm.asarray(y0.astype(np.float32), device=device))
    grads = fm.autograd.grad(loss, params, create_graph=True)
    dot = sum((g * fm.asarray(v.astype(np.float32), device=device)).sum() for g, v in zip(grads, vecs))
    hvp = fm.autograd.grad(dot, params)
    tparams = [torch.tensor(v, requires_grad=True) for v in values]
    tloss = torch.nn.functional.mse_loss(_mlp(tparams, torch.tensor(x0), torch.nn.functional),
                                         torch.tensor(y0))
    tgrads = torch.autograd.grad(tloss, tparams, create_graph=True)
    thvp = torch.autograd.grad(sum((g * torch.tensor(v)).sum() for g, v in zip(tgrads, vecs)), tparams)
    for h, th in zip(hvp, thvp):
        np.testing.assert_allclose(host(h), th.numpy(), rtol=1e-4, atol=1e-5)


def test_second_order_through_a_kernel_without_gradient_says_so(device):
    x = fm.asarray(RNG.standard_normal((1, 1, 5, 5)).astype(np.float32), device=device).requires_grad_()
    k = fm.asarray(RNG.standard_normal((1, 1, 3, 3)).astype(np.float32), device=device)
    (gx,) = fm.autograd.grad(fm.sum(fm.conv2d(x, k) ** 2), x, create_graph=True)  # first order: fine
    with pytest.raises(NotImplementedError, match=r"got conv2d: its gradient is computed by a kernel"):
        fm.sum(gx * gx).backward()
    (gm,) = fm.autograd.grad(fm.sum(fm.max_pool2d(x * x, 2)), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="got max_pool2d"):
        fm.sum(gm).backward()
