"""The public normalization layer: F.batch_norm, F.group_norm, F.layer_norm, F.rms_norm,
fm.softmax / F.softmax, fm.log_softmax over any dim, fm.logsumexp, their gradients through
autograd, the Modules (BatchNorm1d/2d, LayerNorm, GroupNorm, RMSNorm, Softmax) and Module
buffers (register_buffer, state_dict with PyTorch's keys, load_state_dict, to()).

Against float64 NumPy (the references of test_normalization.py) and finite differences,
always; against PyTorch where it is installed (skipped cleanly otherwise)."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
import fastmetal.nn as nn
import fastmetal.nn.functional as F
from helpers import host, needs_torch, torch
from test_normalization import (bn_backward_ref, bn_ref, close, gn_backward_ref, gn_ref,
                                ln_backward_ref, ln_ref, logsumexp_ref, softmax_backward_ref,
                                softmax_ref)


def leaf(a, device):
    return fm.asarray(np.asarray(a, np.float32), device=device).requires_grad_()


def backward_of(y, g):
    """x.grad etc. after backward of sum(y * g)."""
    fm.sum(y * fm.asarray(g, device=y.device)).backward()


# ============================================================================ functional
@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 5, 5), (2, 4, 7)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_function_and_gradients(device, rng, shape, training):
    C = shape[1]
    x0 = rng.standard_normal(shape).astype(np.float32) * 2 + 1
    w0, b0 = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    rm0, rv0 = rng.standard_normal(C).astype(np.float32), rng.uniform(0.5, 2, C).astype(np.float32)
    x, w, b = leaf(x0, device), leaf(w0, device), leaf(b0, device)
    rm, rv = fm.asarray(rm0.copy(), device=device), fm.asarray(rv0.copy(), device=device)
    y = F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.2, eps=1e-4)
    yr, mr, rr, nrm, nrv = bn_ref(x0, w0, b0, rm0, rv0, training, 0.2, 1e-4)
    close(y.detach(), yr, 4.0 * (1 + np.abs(w0)).reshape((1, C) + (1,) * (len(shape) - 2)),
          np.float32, "y")
    if training:
        close(rm, nrm, 1.0 + np.abs(rm0), np.float32, "running_mean")
        close(rv, nrv, 1.0 + np.abs(rv0), np.float32, "running_var")
    else:
        np.testing.assert_array_equal(host(rm), rm0)
    g = rng.standard_normal(shape).astype(np.float32)
    backward_of(y, g)
    dxr, dwr, dbr, sx, sw, sb = bn_backward_ref(g, x0, w0, mr, rr, training)
    close(x.grad, dxr, sx, np.float32, "dx")
    close(w.grad, dwr, sw, np.float32, "dweight")
    close(b.grad, dbr, sb, np.float32, "dbias")


def test_norm_functions_gradients(device, rng):
    x0 = rng.standard_normal((5, 6, 4)).astype(np.float32)
    g = rng.standard_normal(x0.shape).astype(np.float32)
    w0, b0 = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)
    # layer_norm over two dimensions: weight and bias gradients in normalized_shape
    x, w, b = leaf(x0, device), leaf(w0, device), leaf(b0, device)
    y = F.layer_norm(x, (6, 4), w, b)
    close(y.detach(), ln_ref(x0, 2, w0, b0, 1e-5, False)[0], 4 * (1 + np.abs(w0)), np.float32, "ln y")
    backward_of(y, g)
    dxr, dwr, dbr, sx, sw, sb = ln_backward_ref(g, x0, 2, w0, 1e-5, False)
    close(x.grad, dxr, sx, np.float32, "ln dx")
    close(w.grad, dwr, sw, np.float32, "ln dweight")
    close(b.grad, dbr, sb, np.float32, "ln dbias")
    assert w.grad.shape == (6, 4)
    # rms_norm: eps=None is float32's epsilon
    x, w = leaf(x0, device), leaf(w0[0], device)
    y = F.rms_norm(x, 4, w)
    eps = float(np.finfo(np.float32).eps)
    close(y.detach(), ln_ref(x0, 1, w0[0], None, eps, True)[0], 4 * (1 + np.abs(w0[0])), np.float32, "rms y")
    backward_of(y, g)
    dxr, dwr, _, sx, sw, _ = ln_backward_ref(g, x0, 1, w0[0], eps, True)
    close(x.grad, dxr, sx, np.float32, "rms dx")
    close(w.grad, dwr, sw, np.float32, "rms dweight")
    # group_norm; only the input requires grad (the affine gradients are not computed)
    x = leaf(x0, device)
    wc, bc = fm.asarray(w0[:, 0], device=device), fm.asarray(b0[:, 0], device=device)
    y = F.group_norm(x, 3, wc, bc)
    close(y.detach(), gn_ref(x0, 3, w0[:, 0], b0[:, 0], 1e-5)[0], 4 * (1 + np.abs(w0[:, 0])).reshape(1, 6, 1),
          np.float32, "gn y")
    backward_of(y, g)
    dxr, _, _, sx, _, _ = gn_backward_ref(g, x0, 3, w0[:, 0], 1e-5)
    close(x.grad, dxr, sx, np.float32, "gn dx")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_log_softmax_logsumexp_any_dim(device, rng, dtype):
    x0 = (rng.standard_normal((3, 4, 5)) * 3).astype(dtype)
    g = rng.standard_normal(x0.shape).astype(dtype)
    for dim in (0, 1, 2, -1):
        for fn, log in ((fm.softmax, False), (fm.log_softmax, True)):
            x = fm.asarray(x0, device=device).requires_grad_()
            y = fn(x, dim=dim)
            assert y.dtype == np.dtype(dtype)
            close(y.detach(), softmax_ref(x0, dim, log), 1.0 if log else 0.0, dtype, f"{fn.__name__} {dim}")
            fm.sum(y * fm.asarray(g, device=device)).backward()
            want = softmax_backward_ref(g, host(y.detach()), dim, log)
            close(x.grad, want, 2.0 * np.abs(g).sum(dim, keepdims=True), dtype, f"{fn.__name__} grad {dim}")
    assert F.softmax is fm.softmax
    for axis, keep in ((None, False), (1, True), ((0, 2), False)):
        x = fm.asarray(x0, device=device).requires_grad_()
        out = fm.logsumexp(x, axis=axis, keepdims=keep)
        close(out.detach(), logsumexp_ref(x0, axis, keep), 1.0, dtype, f"logsumexp {axis}")
        fm.sum(out).backward()
        ax = tuple(range(3)) if axis is None else axis
        close(x.grad, softmax_ref(x0.reshape(x0.shape), ax if isinstance(ax, int) else None, False)
              if isinstance(ax, int) else np.exp(x0.astype(np.float64) - logsumexp_ref(x0, ax, True)),
              1.0, dtype, f"logsumexp grad {axis}")


def test_finite_differences(device, rng):
    """The recorded gradients against central differences of the forward (float32, so a
    loose bound: the point is the formula, checked tightly against NumPy above)."""
    cases = [
        ("layer_norm", (4, 6), lambda x, w: F.layer_norm(x, 6, w, None)),
        ("batch_norm", (6, 3, 2), lambda x, w: F.batch_norm(x, None, None, w, None, training=True)),
        ("group_norm", (2, 6, 3), lambda x, w: F.group_norm(x, 2, fm.concatenate([w, w]), None)),
        ("rms_norm", (4, 3), lambda x, w: F.rms_norm(x, 3, w, 1e-5)),
        ("softmax", (4, 3), lambda x, w: fm.softmax(x * w, dim=0)),
    ]
    for name, shape, f in cases:
        x0 = rng.standard_normal(shape).astype(np.float32)
        w0 = rng.uniform(0.5, 1.5, 3 if name in ("batch_norm", "group_norm", "rms_norm", "softmax") else 6
                         ).astype(np.float32)
        g = rng.standard_normal(shape).astype(np.float32)
        x, w = leaf(x0, device), leaf(w0, device)
        backward_of(f(x, w), g)
        for which, base, grad in (("x", x0, x.grad), ("w", w0, w.grad)):
            v = rng.standard_normal(base.shape).astype(np.float32)
            h = 1e-2

            def loss(delta):
                xx = x0 + delta * v if which == "x" else x0
                ww = w0 + delta * v if which == "w" else w0
                with fm.no_grad():
                    y = f(fm.asarray(xx, device=device), fm.asarray(ww, device=device))
                return float(np.sum(host(y).astype(np.float64) * g))
            fd = (loss(h) - loss(-h)) / (2 * h)
            an = float(np.sum(host(grad).astype(np.float64) * v))
            assert abs(fd - an) <= 2e-2 * (1 + abs(an)), (name, which, fd, an)


def test_functional_errors(device):
    x = fm.zeros((2, 3, 4), device=device)
    with pytest.raises(ValueError, match=r"\[fastmetal.layer_norm\] expected the input's last dimensions"):
        F.layer_norm(x, (3,))
    with pytest.raises(ValueError, match=r"\[fastmetal.layer_norm\] expected weight of shape \(4,\)"):
        F.layer_norm(x, 4, fm.ones(5, device=device))
    with pytest.raises(TypeError, match=r"\[fastmetal.rms_norm\] expected normalized_shape"):
        F.rms_norm(x, "4")
    with pytest.raises(ValueError, match=r"\[fastmetal.batch_norm\] expected running_mean of shape \(3,\)"):
        F.batch_norm(x, fm.zeros(4, device=device), fm.ones(4, device=device))
    with pytest.raises(TypeError, match=r"\[fastmetal.batch_norm\] expected training to be True or False"):
        F.batch_norm(x, None, None, training=1)
    with pytest.raises(ValueError, match=r"\[fastmetal.softmax\] expected dim in \[-3, 3\)"):
        fm.softmax(x, dim=3)
    with pytest.raises(ValueError, match=r"\[fastmetal.logsumexp\] expected distinct axes"):
        fm.logsumexp(x, axis=(0, -3))


# ============================================================================ modules
def test_module_buffers_state_dict_and_to(device):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1, device=device)
            self.bn = nn.BatchNorm2d(4, device=device)
            self.register_buffer("scale", np.array([2.0], np.float32))
            self.register_buffer("scratch", np.zeros(2, np.float32), persistent=False)

        def forward(self, x):
            return self.bn(self.conv(x)) * self.scale

    net = Net()
    assert [n for n, _ in net.named_buffers()] == [
        "scale", "scratch", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    assert len(list(net.buffers())) == 5
    assert "bn.running_mean" not in dict(net.named_parameters())
    sd = net.state_dict()
    # PyTorch's order: a module's parameters, its persistent buffers, then its children
    assert list(sd) == ["scale", "conv.weight", "conv.bias", "bn.weight", "bn.bias",
                        "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    assert sd["bn.num_batches_tracked"].dtype == np.int64 and sd["bn.num_batches_tracked"].shape == ()
    x = fm.asarray(np.random.default_rng(1).standard_normal((2, 3, 5, 5)).astype(np.float32),
                   device=device)
    for _ in range(3):
        net(x)
    assert int(host(net.bn.num_batches_tracked)) == 3
    other = Net()
    other.load_state_dict(net.state_dict())
    for (n1, a), (n2, b) in zip(net.state_dict().items(), other.state_dict().items()):
        assert n1 == n2
        np.testing.assert_array_equal(a, b)
    net.eval()
    other.eval()
    np.testing.assert_array_equal(host(net(x)), host(other(x)))
    moved = net.to(device)
    assert moved is net and net.bn.running_mean.device == device
    with pytest.raises(ValueError, match=r"load_state_dict\] expected the keys"):
        other.load_state_dict({k: v for k, v in sd.items() if k != "bn.running_var"})
    with pytest.raises(TypeError, match=r"expected an Array or None for buffer 'scale'"):
        net.scale = [1.0]
    with pytest.raises(KeyError, match=r"already exists"):
        net.register_buffer("conv", None)
    net.scale = None  # a None buffer is skipped, as PyTorch's
    assert "scale" not in net.state_dict()


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm2d_training_steps_then_eval(device, rng, momentum):
    bn = nn.BatchNorm2d(3, momentum=momentum, device=device)
    xs = [rng.standard_normal((4, 3, 5, 5)).astype(np.float32) * (i + 1) + i for i in range(3)]
    rm, rv = np.zeros(3), np.ones(3)
    for i, x0 in enumerate(xs):
        y = bn(fm.asarray(x0, device=device))
        f = momentum if momentum is not None else 1.0 / (i + 1)
        yr, _, _, rm, rv = bn_ref(x0, np.ones(3), np.zeros(3), rm, rv, True, f, 1e-5)
        close(y, yr, 4.0, np.float32, f"step {i}")
    close(bn.running_mean, rm, 1 + np.abs(rm), np.float32, "running_mean")
    close(bn.running_var, rv, 1 + np.abs(rv), np.float32, "running_var")
    bn.eval()
    y = bn(fm.asarray(xs[0], device=device))
    close(y, bn_ref(xs[0], np.ones(3), np.zeros(3), rm, rv, False, 0, 1e-5)[0], 4.0, np.float32, "eval")
    with pytest.raises(ValueError, match=r"\[fastmetal.nn.BatchNorm2d\] expected a 4-D input"):
        bn(fm.zeros((2, 3), device=device))


def test_layers_construct_as_pytorch(device):
    ln = nn.LayerNorm((4, 5), device=device)
    assert [n for n, _ in ln.named_parameters()] == ["weight", "bias"]
    assert ln.weight.shape == (4, 5) and float(host(ln.weight).min()) == 1.0
    assert nn.LayerNorm(4, bias=False).bias is None
    assert nn.LayerNorm(4, elementwise_affine=False).weight is None
    gn = nn.GroupNorm(2, 6)
    assert gn.weight.shape == (6,)
    with pytest.raises(ValueError, match=r"\[fastmetal.nn.GroupNorm\] expected num_groups to divide"):
        nn.GroupNorm(4, 6)
    assert [n for n, _ in nn.RMSNorm(8).named_parameters()] == ["weight"]
    bn = nn.BatchNorm1d(5, affine=False, track_running_stats=False)
    assert list(bn.state_dict()) == [] and bn.weight is None
    y = bn(fm.asarray(np.arange(10, dtype=np.float32).reshape(2, 5)))
    np.testing.assert_allclose(host(y), np.array([[-1.0] * 5, [1.0] * 5]), atol=1e-4)
    bn.eval()  # no running statistics: batch statistics in eval mode too, as PyTorch
    np.testing.assert_allclose(host(bn(fm.asarray(np.arange(10, dtype=np.float32).reshape(2, 5)))),
                               np.array([[-1.0] * 5, [1.0] * 5]), atol=1e-4)
    sm = nn.Softmax(dim=1)
    np.testing.assert_allclose(host(sm(np.zeros((2, 4), np.float32))), np.full((2, 4), 0.25))
    assert "dim=1" in repr(sm) and "BatchNorm1d(5" in repr(bn)


# ============================================================================ against PyTorch
@needs_torch
def test_functional_against_torch(device, rng):
    TF = torch.nn.functional
    x0 = rng.standard_normal((4, 6, 5, 3)).astype(np.float32)
    g = rng.standard_normal(x0.shape).astype(np.float32)
    w0, b0 = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    wl, bl = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    rm0, rv0 = rng.standard_normal(6).astype(np.float32), rng.uniform(0.5, 2, 6).astype(np.float32)

    def both(fm_fn, t_fn, *params):
        fx = leaf(x0, device)
        fp = [leaf(p, device) for p in params]
        fy = fm_fn(fx, *fp)
        gy = g if tuple(fy.shape) == g.shape else rng.standard_normal(fy.shape).astype(np.float32)
        fm.sum(fy * fm.asarray(gy, device=device)).backward()
        tx = torch.tensor(x0, requires_grad=True)
        tp = [torch.tensor(p, requires_grad=True) for p in params]
        ty = t_fn(tx, *tp)
        ty.backward(torch.tensor(gy))
        np.testing.assert_allclose(host(fy.detach()), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
        for a, t in zip([fx, *fp], [tx, *tp]):
            np.testing.assert_allclose(host(a.grad), t.grad.numpy(), rtol=1e-3, atol=1e-3)

    for training in (True, False):
        frm, frv = fm.asarray(rm0.copy(), device=device), fm.asarray(rv0.copy(), device=device)
        trm, trv = torch.tensor(rm0.copy()), torch.tensor(rv0.copy())
        both(lambda x, w, b: F.batch_norm(x, frm, frv, w, b, training, 0.3, 1e-5),
             lambda x, w, b: TF.batch_norm(x, trm, trv, w, b, training, 0.3, 1e-5), w0, b0)
        np.testing.assert_allclose(host(frm), trm.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(host(frv), trv.numpy(), rtol=1e-5, atol=1e-6)
    both(lambda x, w, b: F.group_norm(x, 3, w, b), lambda x, w, b: TF.group_norm(x, 3, w, b), w0, b0)
    both(lambda x, w, b: F.layer_norm(x, (5, 3), w, b),
         lambda x, w, b: TF.layer_norm(x, (5, 3), w, b), wl, bl)
    both(lambda x, w: F.rms_norm(x, (5, 3), w), lambda x, w: TF.rms_norm(x, (5, 3), w), wl)
    for dim in (0, 1, 3):
        both(lambda x: F.softmax(x, dim), lambda x: torch.softmax(x, dim))
        both(lambda x: F.log_softmax(x, dim), lambda x: torch.log_softmax(x, dim))
    both(lambda x: fm.logsumexp(x, axis=(1, 3)), lambda x: torch.logsumexp(x, dim=(1, 3)))


@needs_torch
def test_torch_batchnorm2d_state_dict_loads_and_matches(device, rng):
    tbn = torch.nn.BatchNorm2d(4)
    with torch.no_grad():
        tbn.weight.copy_(torch.tensor(rng.standard_normal(4).astype(np.float32)))
        tbn.bias.copy_(torch.tensor(rng.standard_normal(4).astype(np.float32)))
    xs = [rng.standard_normal((3, 4, 6, 6)).astype(np.float32) * 2 + 1 for _ in range(3)]
    fbn = nn.BatchNorm2d(4, device=device)
    fbn.load_state_dict({k: v.numpy() for k, v in tbn.state_dict().items()})
    for x0 in xs:  # training steps side by side: the same outputs and running statistics
        np.testing.assert_allclose(host(fbn(fm.asarray(x0, device=device))),
                                   tbn(torch.tensor(x0)).detach().numpy(), rtol=1e-4, atol=1e-4)
    tsd, fsd = tbn.state_dict(), fbn.state_dict()
    assert list(tsd) == list(fsd)
    for k in tsd:
        np.testing.assert_allclose(fsd[k], tsd[k].numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    assert fsd["num_batches_tracked"].dtype == np.int64
    # a trained torch model's state loads into a fresh fastmetal one and evaluates the same
    fresh = nn.BatchNorm2d(4, device=device)
    fresh.load_state_dict({k: v.numpy() for k, v in tsd.items()})
    fresh.eval()
    tbn.eval()
    x0 = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(host(fresh(fm.asarray(x0, device=device))),
                               tbn(torch.tensor(x0)).detach().numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
def test_modules_against_torch(device, rng):
    x0 = rng.standard_normal((4, 6, 8)).astype(np.float32)
    pairs = [(nn.LayerNorm(8, device=device), torch.nn.LayerNorm(8)),
             (nn.GroupNorm(3, 6, device=device), torch.nn.GroupNorm(3, 6)),
             (nn.RMSNorm(8, device=device), torch.nn.RMSNorm(8)),
             (nn.BatchNorm1d(6, device=device), torch.nn.BatchNorm1d(6)),
             (nn.Softmax(dim=1), torch.nn.Softmax(dim=1))]
    for fmod, tmod in pairs:
        assert [n for n, _ in fmod.named_parameters()] == [n for n, _ in tmod.named_parameters()]
        assert list(fmod.state_dict()) == list(tmod.state_dict())
        np.testing.assert_allclose(host(fmod(fm.asarray(x0, device=device))),
                                   tmod(torch.tensor(x0)).detach().numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=type(fmod).__name__)
