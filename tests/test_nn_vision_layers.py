"""The public layer of conv_transpose2d, conv1d, avg_pool2d, adaptive_avg_pool2d,
interpolate, embedding and one_hot (``fastmetal.nn.functional``) and their Modules: every
gradient through autograd against the NumPy float64 references of test_conv_transpose.py /
test_pooling.py / test_embedding.py and finite differences (always), and forward and every
gradient against PyTorch where it is installed; Modules' parameter names, shapes and
initialisation as PyTorch's."""
from __future__ import annotations

import math

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from fastmetal.nn import functional as F

from test_conv_transpose import ref_conv_transpose2d, ref_conv_transpose2d_backward
from test_embedding import grad_ref
from test_pooling import (adaptive_backward_ref, adaptive_ref, avg_backward_ref, avg_ref,
                          nearest_backward_ref, nearest_ref)

try:
    import torch
except ImportError:  # the NumPy references and finite differences still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def leaf(a, device):
    return fm.asarray(np.asarray(a, np.float32), device=device).requires_grad_()


def backward_with(out, g):
    """d(sum(out * g)) for each leaf: the vjp of `out` at g."""
    fm.sum(out * fm.asarray(g, device=out.device)).backward()


def close(got, want, scale=None, what=""):
    got = got.numpy() if isinstance(got, fm.Array) else np.asarray(got)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: {got.shape} != {want.shape}"
    bound = 1e-4 * (np.abs(want) if scale is None else scale) + 1e-5
    assert (np.abs(got - want) <= bound).all(), f"{what}: worst {np.abs(got - want).max():.3g}"


# ----------------------------------------------------------------------------- conv_transpose2d
CT_CASES = [
    ((2, 8, 4, 4), (8, 4, 4, 4), dict(stride=2, padding=1)),                  # DCGAN-like
    ((1, 4, 3, 5), (4, 3, 3, 2), dict(stride=(2, 1), padding=(1, 0), output_padding=(1, 0),
                                      groups=2, dilation=(1, 2))),
    ((2, 2, 4, 4), (2, 3, 2, 2), dict(stride=1, dilation=2, output_padding=1)),
]


@pytest.mark.parametrize("case", range(len(CT_CASES)))
def test_conv_transpose2d_autograd(device, case):
    xs, ws, kw = CT_CASES[case]
    r = np.random.default_rng(case)
    x, w = r.standard_normal(xs), r.standard_normal(ws)
    b = r.standard_normal(ws[1] * kw.get("groups", 1))
    X, W, B = leaf(x, device), leaf(w, device), leaf(b, device)
    y = F.conv_transpose2d(X, W, B, **kw)
    x32, w32, b32 = (v.astype(np.float32) for v in (x, w, b))
    close(y, ref_conv_transpose2d(x32, w32, b32, **kw), what="forward")
    g = r.standard_normal(y.shape).astype(np.float32)
    backward_with(y, g)
    rx, rw, rb = ref_conv_transpose2d_backward(g, x32, w32, **kw)
    sx, sw, sb = ref_conv_transpose2d_backward(np.abs(g), np.abs(x32), np.abs(w32), **kw)
    close(X.grad, rx, sx, "grad input")
    close(W.grad, rw, sw, "grad weight")
    close(B.grad, rb, sb, "grad bias")


def test_conv_transpose2d_is_conv2d_input_gradient(device):
    """conv_transpose2d(g, w) equals conv2d's input gradient at g (PyTorch's definition)."""
    r = np.random.default_rng(3)
    x = leaf(r.standard_normal((2, 3, 9, 8)), device)
    w = r.standard_normal((5, 3, 3, 3)).astype(np.float32)
    y = F.conv2d(x, w, stride=2, padding=1)
    g = r.standard_normal(y.shape).astype(np.float32)
    backward_with(y, g)
    t = F.conv_transpose2d(g, w, stride=2, padding=1, output_padding=(0, 1))
    np.testing.assert_allclose(np.asarray(t), x.grad.numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
@pytest.mark.parametrize("case", range(len(CT_CASES)))
def test_conv_transpose2d_against_torch(device, case):
    xs, ws, kw = CT_CASES[case]
    r = np.random.default_rng(10 + case)
    x, w = r.standard_normal(xs).astype(np.float32), r.standard_normal(ws).astype(np.float32)
    b = r.standard_normal(ws[1] * kw.get("groups", 1)).astype(np.float32)
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, w, b))
    ty = torch.nn.functional.conv_transpose2d(tx, tw, tb, **kw)
    X, W, B = leaf(x, device), leaf(w, device), leaf(b, device)
    y = F.conv_transpose2d(X, W, B, **kw)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    g = r.standard_normal(y.shape).astype(np.float32)
    ty.backward(torch.tensor(g))
    backward_with(y, g)
    for mine, theirs in ((X, tx), (W, tw), (B, tb)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- conv1d
def conv1d_ref(x, w, b, stride, padding, dilation, groups):
    N, C, L = x.shape
    Co, cg, k = w.shape
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (padding, padding)))
    Lo = (L + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    y = np.zeros((N, Co, Lo))
    og = Co // groups
    for co in range(Co):
        g = co // og
        for t in range(k):
            taps = xp[:, g * cg:(g + 1) * cg, t * dilation:t * dilation + (Lo - 1) * stride + 1:stride]
            y[:, co] += np.einsum("ncl,c->nl", taps, w[co, :, t])
    return y + (0 if b is None else np.asarray(b, np.float64)[None, :, None])


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(dilation=2, groups=2),
                                dict(padding="same"), dict(stride=(3,), padding=(2,))])
def test_conv1d(device, kw):
    r = np.random.default_rng(len(kw))
    x = r.standard_normal((2, 4, 11)).astype(np.float32)
    w = r.standard_normal((6, 4 // kw.get("groups", 1), 3)).astype(np.float32)
    b = r.standard_normal(6).astype(np.float32)
    X, W, B = leaf(x, device), leaf(w, device), leaf(b, device)
    y = F.conv1d(X, W, B, **kw)
    s, p = kw.get("stride", 1), kw.get("padding", 0)
    s = s[0] if isinstance(s, tuple) else s
    p = 1 if p == "same" else p[0] if isinstance(p, tuple) else p  # "same": k = 3, dilation 1
    d, groups = kw.get("dilation", 1), kw.get("groups", 1)
    close(y, conv1d_ref(x, w, b, s, p, d, groups),
          conv1d_ref(np.abs(x), np.abs(w), np.abs(b), s, p, d, groups), "conv1d forward")
    # Gradients by central differences of the (linear) op: exact up to float32 rounding.
    g = r.standard_normal(y.shape).astype(np.float32)
    backward_with(y, g)
    args = [x, w, b]
    for k, grad in enumerate((X.grad.numpy(), W.grad.numpy(), B.grad.numpy())):
        for _ in range(3):
            i = tuple(int(r.integers(0, n)) for n in args[k].shape)
            sums = []
            for step in (1.0, -1.0):
                moved = [a.copy() for a in args]
                moved[k][i] += step
                sums.append(float(np.sum(np.asarray(F.conv1d(*moved, **kw)) * g)))
            fd = (sums[0] - sums[1]) / 2
            assert abs(fd - grad[i]) <= 1e-3 * (1 + abs(fd)), (k, fd, grad[i])


def test_conv1d_bad_input(device):
    with pytest.raises(ValueError, match=r"\[fastmetal.conv1d\] expected a 3-D input"):
        F.conv1d(np.zeros((1, 2, 3, 4), np.float32), np.zeros((1, 2, 1), np.float32))
    with pytest.raises(ValueError, match=r"\[fastmetal.conv1d\] expected a 3-D weight"):
        F.conv1d(np.zeros((1, 2, 3), np.float32), np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match=r"\[fastmetal.conv1d\] expected stride to be an int or "
                                         r"a 1-tuple"):
        F.conv1d(np.zeros((1, 2, 3), np.float32), np.zeros((1, 2, 1), np.float32), stride=(1, 1))
    with pytest.raises(ValueError, match=r"\[fastmetal.conv1d\] expected an input with "
                                         r"weight.shape\[1\] \* groups"):
        F.conv1d(np.zeros((1, 2, 3), np.float32), np.zeros((1, 3, 1), np.float32))
    with pytest.raises(ValueError, match=r"\[fastmetal.conv1d\] expected the padded input"):
        F.conv1d(np.zeros((1, 2, 3), np.float32), np.zeros((1, 2, 5), np.float32))


@needs_torch
def test_conv1d_against_torch(device):
    r = np.random.default_rng(5)
    x = r.standard_normal((3, 6, 20)).astype(np.float32)
    w = r.standard_normal((4, 3, 5)).astype(np.float32)
    b = r.standard_normal(4).astype(np.float32)
    for kw in (dict(stride=2, padding=2, groups=2), dict(dilation=3, groups=2, padding="same"),
               dict(padding="valid", groups=2)):
        tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, w, b))
        ty = torch.nn.functional.conv1d(tx, tw, tb, **kw)
        X, W, B = leaf(x, device), leaf(w, device), leaf(b, device)
        y = F.conv1d(X, W, B, **kw)
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
        g = r.standard_normal(y.shape).astype(np.float32)
        ty.backward(torch.tensor(g))
        backward_with(y, g)
        for mine, theirs in ((X, tx), (W, tw), (B, tb)):
            np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-4,
                                       atol=1e-4)
    # unbatched
    y = F.conv1d(x[0], w, b, groups=2)
    np.testing.assert_allclose(np.asarray(y), torch.nn.functional.conv1d(
        torch.tensor(x[0]), torch.tensor(w), torch.tensor(b), groups=2).numpy(), atol=1e-4)


# ----------------------------------------------------------------------------- pooling
def test_pooling_autograd(device):
    r = np.random.default_rng(6)
    x = r.standard_normal((2, 3, 9, 7)).astype(np.float32)
    shape = x.shape
    cases = [
        (lambda t: F.avg_pool2d(t, 3, 2, 1), lambda a: avg_ref(a, (3, 3), (2, 2), (1, 1)),
         lambda g: avg_backward_ref(g, shape, (3, 3), (2, 2), (1, 1))),
        (lambda t: F.avg_pool2d(t, (2, 3)), lambda a: avg_ref(a, (2, 3), (2, 3), (0, 0)),
         lambda g: avg_backward_ref(g, shape, (2, 3), (2, 3), (0, 0))),
        (lambda t: F.adaptive_avg_pool2d(t, (4, None)), lambda a: adaptive_ref(a, 4, 7),
         lambda g: adaptive_backward_ref(g, shape, 4, 7)),
        (lambda t: F.adaptive_avg_pool2d(t, 5), lambda a: adaptive_ref(a, 5, 5),
         lambda g: adaptive_backward_ref(g, shape, 5, 5)),
        (lambda t: F.interpolate(t, size=(13, 7)), lambda a: nearest_ref(a, 13, 7),
         lambda g: nearest_backward_ref(g, shape)),
        (lambda t: F.interpolate(t, scale_factor=(1.5, 0.5)),
         lambda a: nearest_ref(a, 13, 3, 1.5, 0.5), lambda g: nearest_backward_ref(g, shape, 1.5, 0.5)),
    ]
    for fn, ref, bref in cases:
        X = leaf(x, device)
        y = fn(X)
        close(y, ref(x.astype(np.float64)), what="forward")
        g = r.standard_normal(y.shape).astype(np.float32)
        backward_with(y, g)
        close(X.grad, bref(g), what="grad")


def test_interpolate_1d_and_errors(device):
    r = np.random.default_rng(7)
    x = r.standard_normal((2, 3, 5)).astype(np.float32)
    X = leaf(x, device)
    y = F.interpolate(X, scale_factor=2.5)
    want = nearest_ref(x[:, :, None, :], 1, 12, None, 2.5)[:, :, 0]
    close(y, want, what="1-D")
    g = r.standard_normal(y.shape).astype(np.float32)
    backward_with(y, g)
    close(X.grad, nearest_backward_ref(g[:, :, None, :], (2, 3, 1, 5), None, 2.5)[:, :, 0],
          what="1-D grad")
    with pytest.raises(ValueError, match=r"\[fastmetal.interpolate\] expected a 4-D input for "
                                         r"mode='bilinear', got shape \(2, 3, 5\)"):
        F.interpolate(x, size=4, mode="bilinear")
    with pytest.raises(ValueError, match=r"\[fastmetal.interpolate\] expected mode to be one of"):
        F.interpolate(x, size=4, mode="trilinear")
    with pytest.raises(ValueError, match=r"expected exactly one of size and scale_factor"):
        F.interpolate(x, size=4, scale_factor=2)
    with pytest.raises(ValueError, match=r"expected size to be one positive int or 1 of them"):
        F.interpolate(x, size=(4, 4))
    with pytest.raises(ValueError, match=r"expected a 3-D or 4-D input"):
        F.interpolate(x[0], size=4)
    with pytest.raises(ValueError, match=r"expected scale_factor to give an output of at least 1"):
        F.interpolate(x, scale_factor=0.1)
    with pytest.raises(ValueError, match=r"\[fastmetal.adaptive_avg_pool2d\] expected "
                                         r"output_size"):
        F.adaptive_avg_pool2d(x, (0, 2))
    with pytest.raises(ValueError, match=r"\[fastmetal.avg_pool2d\] expected padding"):
        F.avg_pool2d(x[None], 2, padding=2)


@needs_torch
@pytest.mark.parametrize("seed", range(4))
def test_pooling_against_torch(device, seed):
    r = np.random.default_rng(20 + seed)
    x = r.standard_normal((2, 3, int(r.integers(5, 12)), int(r.integers(5, 12)))).astype(np.float32)
    TF = torch.nn.functional
    pairs = [
        (lambda t: F.avg_pool2d(t, 3, 1, 1), lambda t: TF.avg_pool2d(t, 3, 1, 1)),
        (lambda t: F.adaptive_avg_pool2d(t, (3, None)), lambda t: TF.adaptive_avg_pool2d(t, (3, None))),
        (lambda t: F.interpolate(t, scale_factor=1.3), lambda t: TF.interpolate(t, scale_factor=1.3)),
        (lambda t: F.interpolate(t, size=(4, 17)), lambda t: TF.interpolate(t, size=(4, 17))),
        (lambda t: nn.Upsample(scale_factor=2)(t), lambda t: torch.nn.Upsample(scale_factor=2)(t)),
        (lambda t: nn.AvgPool2d(2)(t), lambda t: torch.nn.AvgPool2d(2)(t)),
        (lambda t: nn.AdaptiveAvgPool2d(1)(t), lambda t: torch.nn.AdaptiveAvgPool2d(1)(t)),
    ]
    for mine, theirs in pairs:
        X, tx = leaf(x, device), torch.tensor(x, requires_grad=True)
        y, ty = mine(X), theirs(tx)
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-6, atol=1e-6)
        g = r.standard_normal(y.shape).astype(np.float32)
        backward_with(y, g)
        ty.backward(torch.tensor(g))
        np.testing.assert_allclose(X.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- embedding
@pytest.mark.parametrize("padding_idx", [None, 3, -1])
def test_embedding_autograd(device, padding_idx):
    r = np.random.default_rng(8)
    w = r.standard_normal((10, 6)).astype(np.float32)
    ids = r.integers(0, 10, (4, 7))
    ids[0, :3] = 9
    W = leaf(w, device)
    for given in (ids, fm.asarray(ids, dtype="int64", device=device)):
        W.grad = None
        y = F.embedding(given, W, padding_idx=padding_idx)
        np.testing.assert_array_equal(y.numpy(), w[ids])
        g = r.standard_normal(y.shape).astype(np.float32)
        backward_with(y, g)
        pad = None if padding_idx is None else padding_idx % 10
        close(W.grad, grad_ref(g, ids, 10, pad), grad_ref(np.abs(g), ids, 10, pad), "grad")
        if pad is not None:
            assert (W.grad.numpy()[pad] == 0).all()


def test_embedding_errors_and_one_hot(device):
    w = np.zeros((5, 2), np.float32)
    with pytest.raises(ValueError, match=r"\[fastmetal.embedding\] expected padding_idx in "
                                         r"\[-5, 5\)"):
        F.embedding(np.array([0]), w, padding_idx=5)
    with pytest.raises(ValueError, match=r"\[fastmetal.embedding\] expected every id"):
        F.embedding(np.array([7]), w)
    with pytest.raises(TypeError, match=r"\[fastmetal.embedding\] expected input \(the ids\)"):
        F.embedding(fm.asarray([1.0, 2.0]), w)  # a float32 Array
    out = F.one_hot(fm.asarray([[0, 3], [1, 1]], dtype="int64", device=device))
    assert isinstance(out, fm.Array) and out.dtype == np.int64
    np.testing.assert_array_equal(out.numpy(), np.eye(4, dtype=np.int64)[[[0, 3], [1, 1]]])
    with pytest.raises(TypeError, match=r"\[fastmetal.one_hot\] expected num_classes"):
        F.one_hot(np.array([1]), 2.0)


@needs_torch
def test_embedding_against_torch(device):
    r = np.random.default_rng(9)
    ids = r.integers(0, 65, (16, 64))
    torch.manual_seed(0)
    tm = torch.nn.Embedding(65, 64, padding_idx=2)
    m = nn.Embedding(65, 64, padding_idx=2, device=device)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()]
    m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    ty = tm(torch.tensor(ids))
    y = m(ids)
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
    g = r.standard_normal(y.shape).astype(np.float32)
    ty.backward(torch.tensor(g))
    backward_with(y, g)
    np.testing.assert_allclose(m.weight.grad.numpy(), tm.weight.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(F.one_hot(ids).numpy() if isinstance(F.one_hot(ids), fm.Array)
                                  else F.one_hot(ids),
                                  torch.nn.functional.one_hot(torch.tensor(ids)).numpy())


# ----------------------------------------------------------------------------- Modules
def test_module_parameters_and_initialisation(device):
    ct = nn.ConvTranspose2d(6, 8, (4, 3), stride=2, padding=1, output_padding=1, groups=2,
                            device=device)
    assert ct.weight.shape == (6, 4, 4, 3) and ct.bias.shape == (8,)
    bound = 1 / math.sqrt(4 * 4 * 3)  # PyTorch's fan_in of this weight: dim 1 * kH * kW
    assert np.abs(ct.weight.numpy()).max() <= bound and np.abs(ct.bias.numpy()).max() <= bound
    assert np.abs(ct.weight.numpy()).max() > 0.8 * bound
    assert ct.stride == (2, 2) and ct.output_padding == (1, 1) and ct.groups == 2
    c1 = nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2, bias=False, device=device)
    assert c1.weight.shape == (6, 2, 3) and c1.bias is None
    assert c1.stride == (2,) and c1.padding == (1,) and c1.kernel_size == (3,)
    assert np.abs(c1.weight.numpy()).max() <= 1 / math.sqrt(2 * 3)
    e = nn.Embedding(1000, 8, padding_idx=-2, device=device)
    assert e.padding_idx == 998 and (e.weight.numpy()[998] == 0).all()
    vals = np.delete(e.weight.numpy(), 998, axis=0)
    assert abs(vals.mean()) < 0.05 and abs(vals.std() - 1) < 0.05  # N(0, 1)
    assert "ConvTranspose2d(6, 8, kernel_size=(4, 3), stride=(2, 2)" in repr(ct)
    assert "Embedding(1000, 8, padding_idx=998)" in repr(e)
    for bad, msg in ((lambda: nn.ConvTranspose2d(3, 4, 3, groups=2), "in_channels"),
                     (lambda: nn.ConvTranspose2d(4, 4, 3, stride=2, output_padding=2),
                      "output_padding"),
                     (lambda: nn.Conv1d(4, 4, (3, 3)), "kernel_size"),
                     (lambda: nn.Embedding(0, 3), "num_embeddings"),
                     (lambda: nn.Embedding(4, 3, padding_idx=4), "padding_idx"),
                     (lambda: nn.Upsample(), "size and scale_factor"),
                     (lambda: nn.AvgPool2d(2, padding=2), "padding"),
                     (lambda: nn.AdaptiveAvgPool2d((1, 2, 3)), "output_size")):
        with pytest.raises((ValueError, TypeError), match=msg):
            bad()


def test_modules_train_a_step(device):
    """A tiny DCGAN-like generator block: every parameter gets a gradient."""
    model = nn.Sequential(nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1, seed=1),
                          nn.AvgPool2d(2), nn.Upsample(scale_factor=2),
                          nn.AdaptiveAvgPool2d((3, None)))
    emb = nn.Embedding(7, 4, padding_idx=0, seed=2)
    model.to(device)
    emb.to(device)
    ids = np.array([[1, 0], [3, 6]])
    x = emb(ids).reshape(1, 4, 2, 2)
    y = model(x)
    assert y.shape == (1, 3, 3, 4)
    fm.sum(y * y).backward()
    for name, p in [*model.named_parameters(), *emb.named_parameters()]:
        assert p.grad is not None and np.isfinite(p.grad.numpy()).all(), name
    assert (emb.weight.grad.numpy()[0] == 0).all() and (emb.weight.grad.numpy()[[2, 4, 5]] == 0).all()


@needs_torch
def test_conv_modules_against_torch(device):
    r = np.random.default_rng(11)
    pairs = [
        (nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2,
                            dilation=1, device=device),
         torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
         (2, 4, 5, 5)),
        (nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2, device=device),
         torch.nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 9)),
    ]
    for mine, theirs, shape in pairs:
        assert [n for n, _ in mine.named_parameters()] == [n for n, _ in theirs.named_parameters()]
        mine.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
        x = r.standard_normal(shape).astype(np.float32)
        X, tx = leaf(x, device), torch.tensor(x, requires_grad=True)
        y, ty = mine(X), theirs(tx)
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
        g = r.standard_normal(y.shape).astype(np.float32)
        backward_with(y, g)
        ty.backward(torch.tensor(g))
        np.testing.assert_allclose(X.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
        for (n, p), (_, tp) in zip(mine.named_parameters(), theirs.named_parameters()):
            np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-4, atol=1e-4,
                                       err_msg=n)
    # output_size picks output_padding, as PyTorch's
    ct = nn.ConvTranspose2d(2, 2, 3, stride=3, device=device)
    tct = torch.nn.ConvTranspose2d(2, 2, 3, stride=3)
    ct.load_state_dict({k: v.detach().numpy() for k, v in tct.state_dict().items()})
    x = r.standard_normal((1, 2, 4, 4)).astype(np.float32)
    y = ct(fm.asarray(x, device=device), output_size=(13, 14))
    ty = tct(torch.tensor(x), output_size=(13, 14))
    assert y.shape == tuple(ty.shape) == (1, 2, 13, 14)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
