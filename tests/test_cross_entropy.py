"""fastmetal.cross_entropy / nll_loss and nn.CrossEntropyLoss / NLLLoss with PyTorch's full
semantics: (N, C), (N, C, d1, ...) and unbatched (C,) inputs, class-index targets with
weight and ignore_index (the mean divides by the weights of the counted targets),
label_smoothing, class-probability targets, reductions, gradients. Checked against a NumPy
float64 reference (always) and PyTorch (where installed), on every device."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from helpers import host, needs_torch, torch


def _log_softmax64(x, axis=1):
    x = x.astype(np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def reference(x, t, weight=None, ignore_index=-100, reduction="mean", smoothing=0.0,
              log_probs=False):
    """PyTorch's cross_entropy (nll_loss when log_probs) in float64, class-index targets,
    x (N, C, d...) and t (N, d...)."""
    logp = x.astype(np.float64) if log_probs else _log_softmax64(x)
    C = x.shape[1]
    w = np.ones(C) if weight is None else weight.astype(np.float64)
    valid = t != ignore_index
    tc = np.where(valid, t, 0)
    picked = np.take_along_axis(logp, tc[:, None], axis=1)[:, 0]
    nll = -w[tc] * picked * valid
    smooth = -(logp * w.reshape((1, C) + (1,) * (x.ndim - 2))).sum(1) * valid
    loss = (1 - smoothing) * nll + smoothing / C * smooth
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    with np.errstate(all="ignore"):
        return loss.sum() / (w[tc] * valid).sum()


def _run(fn, x, *args, device, reduction="mean", **kw):
    a = fm.asarray(x, device=device).requires_grad_()
    loss = fn(a, *args, reduction=reduction, **kw)
    # A non-uniform upstream gradient for "none": the chain rule, not just the sum.
    up = np.linspace(0.5, 1.5, max(loss.size, 1)).reshape(loss.shape).astype(np.float32)
    (fm.sum(loss * fm.asarray(up, device=device)) if reduction == "none" else loss).backward()
    return host(loss), host(a.grad), up


def _grad_reference(x, t, up, **kw):
    """Central differences of the float64 reference (small shapes only)."""
    g = np.zeros(x.shape)
    x64 = x.astype(np.float64)
    flat, gflat = x64.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + 1e-6
        hi = (reference(x64, t, **kw) * up).sum()
        flat[i] = old - 1e-6
        lo = (reference(x64, t, **kw) * up).sum()
        flat[i] = old
        gflat[i] = (hi - lo) / 2e-6
    return g


@pytest.mark.parametrize("shape", [(6, 5), (3, 4, 5), (2, 3, 2, 3)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_cross_entropy_matches_numpy(device, rng, shape, reduction, weighted, smoothing):
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    t = rng.integers(0, shape[1], (shape[0],) + shape[2:])
    t.flat[::3] = -100  # some ignored
    w = rng.uniform(0.2, 2.0, shape[1]).astype(np.float32) if weighted else None
    loss, grad, up = _run(fm.cross_entropy, x, t, weight=w, device=device, reduction=reduction,
                          label_smoothing=smoothing)
    kw = dict(weight=w, reduction=reduction, smoothing=smoothing)
    np.testing.assert_allclose(loss, reference(x, t, **kw), rtol=2e-5, atol=1e-6)
    up = up if reduction == "none" else 1.0
    np.testing.assert_allclose(grad, _grad_reference(x, t, up, **kw), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_matches_numpy(device, rng, reduction):
    x = _log_softmax64(rng.standard_normal((3, 4, 5))).astype(np.float32)
    t = rng.integers(0, 4, (3, 5))
    t[0, 1] = 2  # the ignored class is a valid index too: ignore wins
    w = rng.uniform(0.2, 2.0, 4).astype(np.float32)
    loss, grad, up = _run(fm.nll_loss, x, t, w, 2, device=device, reduction=reduction)
    np.testing.assert_allclose(loss, reference(x, t, w, 2, reduction, log_probs=True),
                               rtol=2e-5, atol=1e-6)
    want = np.zeros(x.shape)
    valid = t != 2
    n, d = np.nonzero(valid)
    scale = 1.0 if reduction != "mean" else 1.0 / (w[t] * valid).sum()
    u = up if reduction == "none" else np.ones(t.shape)
    want[n, t[n, d], d] = -w[t[n, d]] * scale * u[n, d]
    np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


def test_plain_case_keeps_the_fused_kernel_and_agrees(device, rng):
    """(N, C) with no weight/ignored/smoothing takes the fused kernel; the general road (one
    ignored-free weight of ones) gives the same loss and gradient."""
    x = rng.standard_normal((7, 6)).astype(np.float32)
    t = rng.integers(0, 6, 7)
    for reduction in ("mean", "sum"):
        l1, g1, _ = _run(fm.cross_entropy, x, t, device=device, reduction=reduction)
        l2, g2, _ = _run(fm.cross_entropy, x, t, np.ones(6, np.float32), device=device,
                         reduction=reduction)
        np.testing.assert_allclose(l1, l2, rtol=1e-5)
        np.testing.assert_allclose(g1, g2, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(l1, reference(x, t, reduction=reduction), rtol=1e-5)


def test_unbatched_and_array_targets(device, rng):
    x = rng.standard_normal(5).astype(np.float32)
    for reduction in ("mean", "sum", "none"):
        got = host(fm.cross_entropy(fm.asarray(x, device=device), 3, reduction=reduction))
        assert got.shape == ()
        np.testing.assert_allclose(got, -_log_softmax64(x, 0)[3], rtol=1e-5)
    x2 = rng.standard_normal((4, 3, 6)).astype(np.float32)
    t2 = rng.integers(0, 3, (4, 6))
    got = fm.cross_entropy(fm.asarray(x2, device=device),
                           fm.asarray(t2, dtype="int64", device=device), label_smoothing=0.1)
    np.testing.assert_allclose(host(got), reference(x2, t2, smoothing=0.1), rtol=1e-5)


def test_all_ignored_gives_nan_mean_and_zero_gradient(device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = np.full(3, -100)
    for smoothing in (0.0, 0.2):
        loss, grad, _ = _run(fm.cross_entropy, x, t, device=device, label_smoothing=smoothing)
        assert np.isnan(loss)
        assert (grad == 0).all()
    loss, grad, _ = _run(fm.cross_entropy, x, t, device=device, reduction="sum")
    assert loss == 0 and (grad == 0).all()
    # An empty batch: nan mean as PyTorch.
    assert np.isnan(host(fm.cross_entropy(np.zeros((0, 4), np.float32), np.zeros(0, int))))


def test_probability_targets(device, rng):
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    p = rng.dirichlet(np.ones(4), (3, 2)).transpose(0, 2, 1).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 4).astype(np.float32)
    for reduction in ("mean", "sum", "none"):
        got, grad, up = _run(fm.cross_entropy, x, p, w, device=device, reduction=reduction,
                             label_smoothing=0.2)
        q = p * 0.8 + 0.2 / 4
        want = -(_log_softmax64(x) * q * w[None, :, None]).sum(1)
        want = {"none": want, "sum": want.sum(), "mean": want.mean()}[reduction]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
        # d/dx of -sum_c w_c q_c log softmax_c = softmax * sum_c(w q) - w q
        s = np.exp(_log_softmax64(x))
        wq = q * w[None, :, None]
        u = up[:, None, :] if reduction == "none" else (1.0 / 6 if reduction == "mean" else 1.0)
        np.testing.assert_allclose(grad, (s * wq.sum(1, keepdims=True) - wq) * u,
                                   rtol=1e-4, atol=1e-6)
    with pytest.raises(RuntimeError, match=r"\[fastmetal.cross_entropy\] expected ignore_index"):
        fm.cross_entropy(x, p, ignore_index=0)


@pytest.mark.parametrize("call,err,match", [
    (lambda: fm.cross_entropy(np.zeros((2, 3)), np.array([0, 3])), IndexError,
     r"target in \[0, 3\) \(or ignore_index=-100\), got 3"),
    (lambda: fm.cross_entropy(np.zeros((2, 3, 4)), np.full((2, 4), -1)), IndexError,
     r"target in \[0, 3\).*got -1"),
    (lambda: fm.cross_entropy(np.zeros((2, 3)), np.array([0, 5]), ignore_index=5,
                              weight=np.ones(2)), ValueError, r"weight .* shape \(3,\)"),
    (lambda: fm.nll_loss(np.zeros((2, 3)), np.array([0, 7]), ignore_index=1), IndexError,
     r"target in \[0, 3\).*got 7"),
    (lambda: fm.cross_entropy(np.zeros((2, 3)), np.array([0, 1]), label_smoothing=1.5),
     ValueError, "label_smoothing"),
    (lambda: fm.cross_entropy(np.zeros((2, 3)), np.array([0, 1]), reduction="avg"),
     ValueError, "reduction"),
    (lambda: fm.cross_entropy(np.zeros((2, 3)), np.array([0, 1]), ignore_index=1.5),
     TypeError, "ignore_index"),
    (lambda: fm.cross_entropy(np.zeros((2, 3, 4)), np.zeros((2, 3), int)), ValueError,
     r"target of shape \(2, 4\)"),
    (lambda: fm.cross_entropy(np.zeros((2, 3)), np.zeros((2, 4), np.float32)), TypeError,
     "integer dtype"),
    (lambda: fm.nll_loss(np.zeros(()), 0), ValueError, "input of shape"),
])
def test_bad_arguments_are_named(call, err, match):
    with pytest.raises(err, match=r"^\[fastmetal\.(cross_entropy|nll_loss)\] expected .*" + match):
        call()


def test_targets_out_of_range_are_pytorchs_index_error_and_a_value_error(device):
    # PyTorch raises IndexError here; fastmetal raised ValueError before: both catch it.
    x = fm.asarray(np.zeros((2, 3), np.float32), device=device)
    for target in (np.array([0, 3]), fm.asarray(np.array([0, 3]), device=device)):
        for call in (lambda: fm.cross_entropy(x, target), lambda: fm.nll_loss(x, target),
                     lambda: nn.CrossEntropyLoss(label_smoothing=0.1)(x, target)):
            with pytest.raises(IndexError, match=r"target|labels") as caught:
                call()
            assert isinstance(caught.value, ValueError)
            assert type(caught.value) is fm._core.IndexOutOfRange
    if torch is not None:
        with pytest.raises(IndexError):
            torch.nn.functional.cross_entropy(torch.zeros(2, 3), torch.tensor([0, 3]))


def test_modules_take_the_arguments(device, rng):
    x = rng.standard_normal((5, 4)).astype(np.float32)
    t = rng.integers(0, 4, 5)
    t[1] = 0
    w = rng.uniform(0.5, 2, 4).astype(np.float32)
    fn = nn.CrossEntropyLoss(weight=w, ignore_index=0, reduction="sum", label_smoothing=0.1)
    np.testing.assert_allclose(host(fn(fm.asarray(x, device=device), t)),
                               reference(x, t, w, 0, "sum", 0.1), rtol=1e-5)
    assert "label_smoothing=0.1" in repr(fn) and "ignore_index=0" in repr(fn)
    logp = _log_softmax64(x).astype(np.float32)
    np.testing.assert_allclose(host(nn.NLLLoss(w, 0, "none")(fm.asarray(logp, device=device), t)),
                               reference(logp, t, w, 0, "none", log_probs=True), rtol=1e-5)


@needs_torch
@pytest.mark.parametrize("shape", [(8, 5), (2, 5, 3, 2), (5,)])
def test_against_torch(device, rng, shape):
    F = torch.nn.functional
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    tshape = () if len(shape) == 1 else (shape[0],) + shape[2:]
    C = shape[0] if len(shape) == 1 else shape[1]
    t = np.asarray(rng.integers(0, C, tshape))
    if t.ndim:
        t.flat[1] = 1
    w = rng.uniform(0.2, 2.0, C).astype(np.float32)
    for kw in (dict(), dict(weight=w, ignore_index=1, label_smoothing=0.15),
               dict(ignore_index=1, reduction="sum"), dict(weight=w, reduction="none",
                                                            label_smoothing=0.4)):
        a = fm.asarray(x, device=device).requires_grad_()
        loss = fm.cross_entropy(a, t, **kw)
        fm.sum(loss * loss).backward()
        tx = torch.tensor(x, requires_grad=True)
        tkw = dict(kw, weight=torch.tensor(w)) if "weight" in kw else kw
        tl = F.cross_entropy(tx, torch.tensor(t), **tkw)
        (tl * tl).sum().backward()
        np.testing.assert_allclose(host(loss), tl.detach().numpy(), rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(host(a.grad), tx.grad.numpy(), rtol=1e-4, atol=1e-6)
        tn = F.nll_loss(F.log_softmax(tx.detach(), 0 if len(shape) == 1 else 1),
                        torch.tensor(t), weight=tkw.get("weight"),
                        ignore_index=kw.get("ignore_index", -100),
                        reduction=kw.get("reduction", "mean"))
        got = fm.nll_loss(fm.log_softmax(fm.asarray(x, device=device), 0 if len(shape) == 1
                                         else 1), t, w if "weight" in kw else None,
                          kw.get("ignore_index", -100), kw.get("reduction", "mean"))
        np.testing.assert_allclose(host(got), tn.numpy(), rtol=2e-5, atol=1e-6)


def test_cpu_fast_path_matches_the_msl_kernels(rng):
    """The CPU's own fused cross-entropy (vectorised rows) against the MSL kernels under the
    emulator (the GPUs' code): loss and gradient, NaN rows, huge logits, C from 1 to 300,
    rows past the mean kernel's 256 threads."""
    from fastmetal import _core
    before = _core._native_cpu()
    try:
        for rows, classes in ((5, 1), (7, 10), (3, 300), (64, 33), (600, 7)):
            x = (rng.standard_normal((rows, classes)) * 4).astype(np.float32)
            x[0, 0] = 1e30
            if 3 < rows <= 64:  # the 600-row case keeps a finite mean to compare
                x[2, -1] = np.nan
            labels = rng.integers(0, classes, rows).astype(np.int32)
            outs = {}
            for native in (False, True):
                _core._set_native_cpu(native)
                loss, grad = _core._cross_entropy(x, labels)
                outs[native] = (np.asarray(loss), np.asarray(grad))
            for a, b in zip(outs[False], outs[True]):
                np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-7)
            if 3 < rows <= 64:
                assert np.isnan(outs[True][1][2]).all() and np.isfinite(outs[True][1][3]).all()
    finally:
        _core._set_native_cpu(before)


def test_many_classes_agree_on_both_roads(device, rng):
    """Past FUSED_MAX_CLASSES a GPU takes log_softmax + gather instead of the fused kernel;
    both roads give PyTorch's loss and gradient (here against the float64 reference)."""
    from fastmetal.ops.losses import FUSED_MAX_CLASSES
    classes = FUSED_MAX_CLASSES + 7
    x = (rng.standard_normal((6, classes)) * 3).astype(np.float32)
    t = rng.integers(0, classes, 6)
    for reduction in ("mean", "sum"):
        loss, grad, _ = _run(fm.cross_entropy, x, t, device=device, reduction=reduction)
        np.testing.assert_allclose(loss, reference(x, t, reduction=reduction), rtol=2e-5)
        p = np.exp(_log_softmax64(x))
        p[np.arange(6), t] -= 1
        np.testing.assert_allclose(grad, p / (6 if reduction == "mean" else 1), rtol=1e-4,
                                   atol=1e-7)
