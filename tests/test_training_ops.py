"""max_pool2d, dropout, log_softmax and cross_entropy (metal/training.metal) on every device,
against float64 NumPy references and, where installed, PyTorch autograd."""
from __future__ import annotations

import math

import numpy as np
import pytest

import fastmetal as fm
from helpers import host, needs_torch, torch


# ----------------------------------------------------------------------------- references
def pool_reference(x, k, s, p):
    """float64 max pooling with PyTorch's winner rule; returns (out, winner flat index)."""
    (kh, kw), (sh, sw), (ph, pw) = k, s, p
    *lead, h, w = x.shape
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    planes = x.reshape(-1, h, w).astype(np.float64)
    out = np.empty((planes.shape[0], oh, ow))
    arg = np.empty((planes.shape[0], oh, ow), np.int64)
    for c in range(planes.shape[0]):
        for i in range(oh):
            for j in range(ow):
                y0, x0 = i * sh - ph, j * sw - pw
                best, bi = -np.inf, max(y0, 0) * w + max(x0, 0)
                for yy in range(max(y0, 0), min(y0 + kh, h)):
                    for xx in range(max(x0, 0), min(x0 + kw, w)):
                        v = planes[c, yy, xx]
                        if v > best or np.isnan(v):
                            best, bi = v, yy * w + xx
                out[c, i, j], arg[c, i, j] = best, bi
    return out.reshape(*lead, oh, ow), arg


def pool_backward_reference(g, x, k, s, p):
    _, arg = pool_reference(x, k, s, p)
    *lead, h, w = x.shape
    gi = np.zeros((arg.shape[0], h * w))
    gg = np.asarray(g, np.float64).reshape(arg.shape[0], -1)
    for c in range(arg.shape[0]):
        np.add.at(gi[c], arg[c].ravel(), gg[c])
    return gi.reshape(x.shape)


def philox4x32_10(ctr, key):
    """Philox-4x32-10 in Python integers (Random123's reference algorithm)."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    m = 0xFFFFFFFF
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & m, (p0 >> 32) ^ c3 ^ k1, p0 & m
    return c0, c1, c2, c3


def dropout_mask_reference(n, p, seed):
    thr = math.ceil(p * 2**24)
    words = []
    for g in range((n + 3) // 4):
        words.extend(philox4x32_10((g, 0, 0, 0), (seed & 0xFFFFFFFF, seed >> 32)))
    return np.array([(w >> 8) >= thr for w in words[:n]])


# ----------------------------------------------------------------------------- max_pool2d
POOL_CASES = [
    ((2, 3, 8, 8), 2, None, 0),
    ((1, 2, 7, 9), 3, 2, 1),
    ((2, 1, 6, 5), (3, 2), (1, 2), (1, 0)),
    ((3, 5, 5), 2, 1, 1),          # unbatched, overlapping windows
    ((1, 1, 4, 4), 4, 3, 2),
    ((2, 4, 9, 6), (2, 3), (3, 1), 0),
    ((2, 2, 9, 10), 2, 3, 1),      # disjoint windows with gaps between them
    ((1, 3, 7, 9), 2, None, 0),    # disjoint, odd sizes: last row/column in no window
    ((2, 2, 7, 7), 3, 3, 1),       # disjoint, padded
    ((1, 1, 5, 6), (1, 3), (2, 4), (0, 1)),
]


@pytest.mark.parametrize("case", range(len(POOL_CASES)))
def test_max_pool2d_matches_reference(device, rng, case):
    shape, k, s, p = POOL_CASES[case]
    norm = fm.ops.training._pool_spec(k, s, p, "t")
    x = rng.standard_normal(shape).astype(np.float32)
    y = fm.max_pool2d(x, k, s, p)
    ref, _ = pool_reference(x, *norm)
    np.testing.assert_array_equal(host(y), ref.astype(np.float32))
    g = rng.standard_normal(ref.shape).astype(np.float32)
    gi = fm.max_pool2d_backward(g, x, k, s, p)
    np.testing.assert_allclose(host(gi), pool_backward_reference(g, x, *norm), rtol=1e-6,
                               atol=1e-6)


def test_max_pool2d_ties_and_nan_follow_pytorch_rule(device):
    # Ties: the first maximum in row-major order wins; NaN wins, the last NaN of a window.
    x = np.array([[[[1, 1, 5, 2], [1, 1, 5, 5], [np.nan, 0, 3, np.nan], [7, np.nan, 3, 3]]]],
                 np.float32)
    y = host(fm.max_pool2d(x, 2))
    assert y[0, 0, 0, 0] == 1 and y[0, 0, 0, 1] == 5 and np.isnan(y[0, 0, 1, 0])
    gi = host(fm.max_pool2d_backward(np.ones((1, 1, 2, 2), np.float32), x, 2))
    expect = np.zeros((4, 4), np.float32)
    expect[0, 0] = expect[0, 2] = expect[3, 1] = expect[2, 3] = 1
    np.testing.assert_array_equal(gi[0, 0], expect)


@needs_torch
@pytest.mark.parametrize("case", range(len(POOL_CASES)))
def test_max_pool2d_matches_torch_autograd(device, rng, case):
    shape, k, s, p = POOL_CASES[case]
    x = rng.integers(-3, 4, size=shape).astype(np.float32)  # many ties
    x.flat[rng.integers(0, x.size, 3)] = np.nan
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.max_pool2d(xt, k, s if s is not None else None, p)
    g = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.tensor(g))
    np.testing.assert_array_equal(host(fm.max_pool2d(x, k, s, p)), yt.detach().numpy())
    np.testing.assert_allclose(host(fm.max_pool2d_backward(g, x, k, s, p)), xt.grad.numpy(),
                               rtol=1e-6, atol=1e-6)


def test_max_pool2d_on_device_arrays_stays_there(device, rng):
    x = fm.asarray(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    y = fm.max_pool2d(x, 2)
    assert isinstance(y, fm.Array) and y.device == device and y.shape == (2, 3, 3, 3)
    gi = fm.max_pool2d_backward(fm.ones((2, 3, 3, 3)), x, 2)
    assert isinstance(gi, fm.Array) and gi.device == device


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(kernel_size=0), ValueError, "kernel_size"),
    (dict(kernel_size=2.0), TypeError, "kernel_size"),
    (dict(kernel_size=(2, 2, 2)), ValueError, "kernel_size"),
    (dict(kernel_size=2, stride=0), ValueError, "stride"),
    (dict(kernel_size=3, padding=2), ValueError, "at most half"),
    (dict(kernel_size=2, padding=-1), ValueError, "padding"),
    (dict(kernel_size=True), TypeError, "kernel_size"),
])
def test_max_pool2d_bad_arguments(kwargs, err, match):
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(err, match=r"^\[fastmetal\.max_pool2d\] expected .*" + match):
        fm.max_pool2d(x, **kwargs)


def test_max_pool2d_bad_shapes():
    with pytest.raises(ValueError, match=r"^\[fastmetal\.max_pool2d\] expected a 3-D"):
        fm.max_pool2d(np.zeros((4, 4), np.float32), 2)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.max_pool2d\] expected the padded input"):
        fm.max_pool2d(np.zeros((1, 1, 2, 5), np.float32), 3)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.max_pool2d_backward\] expected grad_output"):
        fm.max_pool2d_backward(np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 4, 4)), 2)
    with pytest.raises(TypeError, match=r"^\[fastmetal\.max_pool2d\]"):
        fm.max_pool2d(np.zeros((1, 1, 4, 4), np.complex64), 2)


# ----------------------------------------------------------------------------- dropout
def test_philox_reference_known_answers():
    # Random123's known-answer vectors for philox4x32_10.
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    m = 0xFFFFFFFF
    assert philox4x32_10((m, m, m, m), (m, m)) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    assert philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
                         (0xA4093822, 0x299F31D0)) == (0xD16CFE09, 0x94FDCCEB, 0x5001E420,
                                                       0x24126EA1)


@pytest.mark.parametrize("n,p,seed", [(1, 0.5, 0), (4, 0.25, 1), (1001, 0.5, 2**40 + 7),
                                      (4099, 0.9, 2**64 - 1), (33, 1e-7, 12345)])
def test_dropout_mask_is_philox_on_every_device(device, rng, n, p, seed):
    x = rng.standard_normal(n).astype(np.float32) + 10  # no zeros in x
    y = host(fm.dropout(x, p, seed=seed))
    keep = dropout_mask_reference(n, p, seed)
    scale = np.float32(1) / np.float32(1 - p)
    np.testing.assert_array_equal(y, np.where(keep, x * scale, np.float32(0)))
    g = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_array_equal(host(fm.dropout_backward(g, p, seed=seed)),
                                  np.where(keep, g * scale, np.float32(0)))


def test_dropout_keep_rate_and_shape(device, rng):
    x = np.ones((64, 32, 12, 12), np.float32)
    y = host(fm.dropout(x, 0.25, seed=3))
    assert y.shape == x.shape
    kept = (y != 0).mean()
    assert abs(kept - 0.75) < 0.005
    np.testing.assert_allclose(np.unique(y), [0, np.float32(1) / np.float32(0.75)])
    # Another seed gives another mask; the same seed the same one.
    assert not np.array_equal(y, host(fm.dropout(x, 0.25, seed=4)))
    np.testing.assert_array_equal(y, host(fm.dropout(x, 0.25, seed=3)))


def test_dropout_identity_cases(device, rng):
    x = rng.standard_normal(10).astype(np.float32)
    assert fm.dropout(x, 0.5, seed=1, training=False) is x
    assert fm.dropout(x, 0.0, seed=1) is x


@needs_torch
def test_dropout_scaling_matches_torch(rng):
    # Same mask, PyTorch's arithmetic: x * (1 / (1 - p)) in float32.
    for p in (0.1, 0.25, 0.3, 0.5, 0.7):
        x = rng.standard_normal(4096).astype(np.float32)
        y = fm.dropout(x, p, seed=5)
        keep = y != 0
        scale = torch.ones(1).div_(1 - p)
        expect = torch.tensor(x) * torch.tensor(keep.astype(np.float32)) * scale
        np.testing.assert_array_equal(y, expect.numpy())


@pytest.mark.parametrize("kwargs,err", [
    (dict(p=1.0, seed=0), ValueError), (dict(p=-0.1, seed=0), ValueError),
    (dict(p="0.5", seed=0), TypeError), (dict(p=0.5, seed=-1), ValueError),
    (dict(p=0.5, seed=2**64), ValueError), (dict(p=0.5, seed=1.0), TypeError),
    (dict(p=0.5, seed=0, training=1), TypeError), (dict(p=True, seed=0), TypeError),
])
def test_dropout_bad_arguments(kwargs, err):
    with pytest.raises(err, match=r"^\[fastmetal\.dropout\] expected"):
        fm.dropout(np.ones(4, np.float32), **kwargs)


def test_dropout_needs_a_seed():
    with pytest.raises(TypeError):
        fm.dropout(np.ones(4, np.float32), 0.5)


# ----------------------------------------------------------------------------- log_softmax
@pytest.mark.parametrize("shape,axis", [((5, 10), -1), ((3, 7), 0), ((2, 4, 3, 5), 1),
                                        ((17,), 0), ((2, 3, 4), -1)])
def test_log_softmax_matches_reference(device, rng, shape, axis):
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    x64 = x.astype(np.float64)
    m = x64.max(axis=axis, keepdims=True)
    ref = x64 - m - np.log(np.exp(x64 - m).sum(axis=axis, keepdims=True))
    y = host(fm.log_softmax(x, axis))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    g = rng.standard_normal(shape).astype(np.float32)
    gref = g - np.exp(ref) * g.astype(np.float64).sum(axis=axis, keepdims=True)
    np.testing.assert_allclose(host(fm.log_softmax_backward(g, y, axis)), gref, rtol=1e-5,
                               atol=1e-5)


@needs_torch
def test_log_softmax_matches_torch_autograd(device, rng):
    x = (rng.standard_normal((8, 10)) * 1e3).astype(np.float32)
    x[0] = [1e30, -1e30, 0, 5, 1e30, 3, 2, 1, 0, -4]
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.log_softmax(xt, 1)
    g = rng.standard_normal((8, 10)).astype(np.float32)
    yt.backward(torch.tensor(g))
    y = fm.log_softmax(x)
    np.testing.assert_allclose(host(y), yt.detach().numpy(), rtol=1e-6, atol=1e-3)
    np.testing.assert_allclose(host(fm.log_softmax_backward(g, y)), xt.grad.numpy(),
                               rtol=1e-5, atol=1e-5)


def test_log_softmax_bad_axis():
    with pytest.raises(ValueError, match=r"^\[fastmetal\.log_softmax\] expected axis"):
        fm.log_softmax(np.zeros((2, 3), np.float32), 2)
    with pytest.raises(TypeError, match=r"^\[fastmetal\.log_softmax\] expected axis"):
        fm.log_softmax(np.zeros((2, 3), np.float32), 1.0)


# ----------------------------------------------------------------------------- cross_entropy
def cross_entropy_reference(x, labels):
    x64 = x.astype(np.float64)
    m = x64.max(axis=1, keepdims=True)
    lsm = x64 - m - np.log(np.exp(x64 - m).sum(axis=1, keepdims=True))
    n = x.shape[0]
    loss = -lsm[np.arange(n), labels].mean()
    grad = np.exp(lsm)
    grad[np.arange(n), labels] -= 1
    return loss, grad / n


def loss_and_grad(x, labels):
    """fm.cross_entropy's loss (0-d Array) and, through autograd, the fused gradient with
    respect to the logits."""
    xa = (x.detach() if isinstance(x, fm.Array) else fm.asarray(x)).requires_grad_()
    loss = fm.cross_entropy(xa, labels)
    assert isinstance(loss, fm.Array) and loss.shape == ()
    loss.backward()
    return loss, xa.grad


@pytest.mark.parametrize("n,c", [(1, 1), (1, 10), (64, 10), (7, 3), (300, 17)])
def test_cross_entropy_matches_reference(device, rng, n, c):
    x = (rng.standard_normal((n, c)) * 5).astype(np.float32)
    labels = rng.integers(0, c, n)
    loss, grad = loss_and_grad(x, labels)
    rl, rg = cross_entropy_reference(x, labels)
    assert host(loss).shape == ()
    np.testing.assert_allclose(float(host(loss)), rl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(grad), rg, rtol=1e-5, atol=1e-7)


@needs_torch
def test_cross_entropy_matches_torch_with_huge_logits(device, rng):
    x = (rng.standard_normal((6, 10)) * 3).astype(np.float32)
    x[0, :] = 1e30
    x[1, 3] = 1e30
    x[2, :] = -1e30
    x[3, 5] = -1e30
    x[4] = np.linspace(-3e38, 3e38, 10, dtype=np.float32)
    labels = np.array([0, 3, 9, 5, 9, 1])
    xt = torch.tensor(x, requires_grad=True)
    lt = torch.nn.functional.cross_entropy(xt, torch.tensor(labels))
    lt.backward()
    loss, grad = loss_and_grad(x, labels)
    assert np.isfinite(lt.item()) and np.isfinite(float(host(loss)))
    np.testing.assert_allclose(float(host(loss)), lt.item(), rtol=1e-6)
    np.testing.assert_allclose(host(grad), xt.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_cross_entropy_on_device_arrays(device, rng):
    x = fm.asarray(rng.standard_normal((4, 10)).astype(np.float32))
    plain = fm.cross_entropy(x, np.array([0, 1, 2, 3], np.int64))  # the loss only
    assert isinstance(plain, fm.Array) and plain.shape == () and plain.device == device
    assert not plain.requires_grad  # nothing recorded for logits that do not require grad
    loss, grad = loss_and_grad(x, np.array([0, 1, 2, 3], np.int64))
    assert isinstance(loss, fm.Array) and isinstance(grad, fm.Array)
    assert loss.device == device and grad.shape == (4, 10) and grad.device == device
    assert float(host(loss)) == float(host(plain))


def test_cross_entropy_takes_int64_array_labels(device, rng):
    """Labels that are an int64 Array on the device (e.g. from argmax) give what NumPy labels
    give; their range is still checked; float Arrays are refused, naming their dtype."""
    x = (rng.standard_normal((9, 5)) * 3).astype(np.float32)
    labels = rng.integers(0, 5, 9)
    loss, grad = loss_and_grad(fm.asarray(x), fm.asarray(labels, dtype="int64"))
    rl, rg = cross_entropy_reference(x, labels)
    np.testing.assert_allclose(float(host(loss)), rl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(grad), rg, rtol=1e-5, atol=1e-7)
    picked = fm.argmax(fm.asarray(x), axis=1)
    np.testing.assert_allclose(float(host(fm.cross_entropy(x, picked))),
                               cross_entropy_reference(x, x.argmax(1))[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"target in \[0, 5\) .*, got 7"):
        fm.cross_entropy(x, fm.asarray(np.array([7] * 9), dtype="int64"))
    with pytest.raises(TypeError, match="got a float32 fastmetal.Array"):
        fm.cross_entropy(x, fm.asarray(labels.astype(np.float32)))


@pytest.mark.parametrize("logits,labels,err,match", [
    (np.zeros((2, 3)), np.array([0, 3]), ValueError, r"target in \[0, 3\) .*, got 3"),
    (np.zeros((2, 3)), np.array([-1, 0]), ValueError, r"target in \[0, 3\) .*, got -1"),
    (np.zeros((2, 3)), np.array([0.0, 1.0]), TypeError, "integer dtype"),
    (np.zeros((2, 3)), np.array([True, False]), TypeError, "integer dtype"),
    (np.zeros((2, 3)), np.array([0, 1, 2]), ValueError, r"target of shape \(2,\)"),
    (np.zeros((2, 3)), np.array([[0, 1]]), ValueError, r"target of shape \(2,\)"),
    (np.zeros(3), np.array([0]), ValueError, r"target of shape \(\)"),  # unbatched (C,)
    (np.zeros(()), np.array(0), ValueError, r"input of shape \(C,\), \(N, C\)"),
    (np.zeros((2, 3)), np.array([2**40, 0]), ValueError, "target in"),
])
def test_cross_entropy_bad_input(logits, labels, err, match):
    with pytest.raises(err, match=r"^\[fastmetal\.cross_entropy\] expected .*" + match):
        fm.cross_entropy(logits, labels)


# ----------------------------------------------------------------------------- NaN logits
def test_nan_logits_give_nan_rows_only(device, rng):
    """A NaN logit (first, inside or last in its row) makes its row's log_softmax, loss and
    gradient NaN, as PyTorch; the other rows are unaffected. (The row maximum uses fmax:
    MSL's max is undefined for NaN.)"""
    x = (rng.standard_normal((5, 6)) * 3).astype(np.float32)
    x[1, 0] = np.nan
    x[2, 3] = np.nan
    x[3, 5] = np.nan
    x[4, :] = np.nan
    nan_rows = [1, 2, 3, 4]
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float64)
        m = x64.max(axis=1, keepdims=True)
        ref = x64 - m - np.log(np.exp(x64 - m).sum(axis=1, keepdims=True))
        labels = np.array([0, 1, 2, 3, 4])
        rl, rg = cross_entropy_reference(x, labels)
    y = host(fm.log_softmax(x, 1))
    assert np.isnan(y[nan_rows]).all()
    np.testing.assert_allclose(y[0], ref[0], rtol=1e-5, atol=1e-5)
    loss, grad = loss_and_grad(x, labels)
    assert np.isnan(float(host(loss))) and np.isnan(rl)
    grad = host(grad)
    assert np.isnan(grad[nan_rows]).all()
    np.testing.assert_allclose(grad[0], rg[0], rtol=1e-5, atol=1e-7)
    if torch is not None:
        yt = torch.log_softmax(torch.tensor(x), 1).numpy()
        np.testing.assert_array_equal(np.isnan(y), np.isnan(yt))


# ----------------------------------------------------------------------------- autograd
def test_autograd_of_the_training_ops_is_their_backward_kernel(device, rng):
    """loss.backward() through max_pool2d, dropout and log_softmax gives what their public
    backward kernels give (the vjps call them)."""
    xh = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    g = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    x = fm.asarray(xh).requires_grad_()
    fm.max_pool2d(x, 3, 2, 1).backward(fm.asarray(g))
    np.testing.assert_array_equal(host(x.grad), host(fm.max_pool2d_backward(g, xh, 3, 2, 1)))

    x = fm.asarray(xh).requires_grad_()
    gd = rng.standard_normal(xh.shape).astype(np.float32)
    fm.dropout(x, 0.3, seed=2**40 + 3).backward(fm.asarray(gd))
    np.testing.assert_array_equal(host(x.grad),
                                  host(fm.dropout_backward(gd, 0.3, seed=2**40 + 3)))

    x = fm.asarray(xh).requires_grad_()
    y = fm.log_softmax(x, 1)
    gl = rng.standard_normal(xh.shape).astype(np.float32)
    y.backward(fm.asarray(gl))
    np.testing.assert_array_equal(host(x.grad),
                                  host(fm.log_softmax_backward(gl, y.detach(), 1)))
