"""The public fused attention: F.scaled_dot_product_attention through autograd (gradients
against the float64 reference and finite differences, grouped-query heads, dropout seeds,
random problems, bad arguments) and nn.MultiheadAttention (against NumPy and PyTorch: masks,
options, batch_first), on every device. The kernels themselves: tests/test_attention.py."""
from __future__ import annotations

import math

import numpy as np
import pytest

import fastmetal as fm
from attention_reference import (OP, check, close, rand, random_problem, reference,
                                 softmax_rows)
from helpers import host, needs_torch, torch


# ----------------------------------------------------------------------------- public API
F = fm.nn.functional


def leaves(r, *shapes, dtype=np.float32):
    return [fm.asarray(rand(r, *s).astype(dtype)).requires_grad_() for s in shapes]


def test_functional_gradients_through_autograd(device, rng):
    # Broadcast key/value (one head shared by the batch): the tape sums dk, dv back.
    q, k, v = leaves(rng, (2, 3, 11, 16), (1, 3, 13, 16), (3, 13, 8))
    mask = rng.random((11, 13)) < 0.8
    g = rand(rng, 2, 3, 11, 8)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    out.backward(fm.asarray(g))
    ref = reference(q.numpy(), k.numpy(), v.numpy(), mask, scale=0.3, g=g)
    close(out, ref["out"], ref["out_scale"], "F out")
    close(q.grad, ref["dq"], ref["dq_scale"], "F dq")
    close(k.grad, ref["dk"].sum(axis=0, keepdims=True), ref["dk_scale"].sum(axis=0, keepdims=True),
          "F dk")
    close(v.grad, ref["dv"].sum(axis=0), ref["dv_scale"].sum(axis=0), "F dv")


def test_functional_finite_differences(device, rng):
    q, k, v = (rand(rng, 1, 5, 8) for _ in range(3))
    w = rand(rng, 1, 5, 8)

    def loss(q, k, v):
        return fm.sum(F.scaled_dot_product_attention(q, k, v, is_causal=True) * w)

    grads = fm.grad(loss, argnums=(0, 1, 2))(q, k, v)
    h = 1e-2
    for which, (x, gx) in enumerate(zip((q, k, v), grads)):
        gx = host(gx)
        for idx in [(0, 1, 2), (0, 4, 7), (0, 0, 0), (0, 3, 5)]:
            args = [q, k, v]
            plus, minus = x.copy(), x.copy()
            plus[idx] += h
            minus[idx] -= h
            args[which] = plus
            fp = float(host(loss(*args)))
            args[which] = minus
            fmn = float(host(loss(*args)))
            assert abs((fp - fmn) / (2 * h) - gx[idx]) < 2e-2 * (1 + abs(gx[idx])), (which, idx)


def test_functional_gqa_matches_repeated_heads(device, rng):
    q, k, v = leaves(rng, (2, 6, 9, 16), (2, 2, 12, 16), (2, 2, 12, 8))
    mask = rng.random((2, 6, 9, 12)) < 0.8
    g = rand(rng, 2, 6, 9, 8)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, is_causal=True)
    out.backward(fm.asarray(g))
    kr, vr = (np.repeat(x.numpy(), 3, axis=1) for x in (k, v))
    ref = reference(q.numpy(), kr, vr, mask, causal=True, g=g)
    close(out, ref["out"], ref["out_scale"], "gqa out")
    close(q.grad, ref["dq"], ref["dq_scale"], "gqa dq")
    fold = lambda x: x.reshape(2, 2, 3, *x.shape[2:]).sum(axis=2)  # noqa: E731
    close(k.grad, fold(ref["dk"]), fold(ref["dk_scale"]), "gqa dk")
    close(v.grad, fold(ref["dv"]), fold(ref["dv_scale"]), "gqa dv")
    with pytest.raises(ValueError, match=OP + " with enable_gqa"):
        F.scaled_dot_product_attention(q, k[:, :1].numpy().repeat(4, 1), v, enable_gqa=True)


def test_functional_mask_that_requires_grad_is_refused(device, rng):
    x = rand(rng, 2, 5, 8)
    mask = fm.asarray(rand(rng, 5, 5)).requires_grad_()
    with pytest.raises(RuntimeError, match=OP + " an attn_mask that does not require grad"):
        F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
    with fm.no_grad():
        F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
    out = F.scaled_dot_product_attention(x, x, x, attn_mask=mask.detach())
    close(out, reference(x, x, x, mask.detach().numpy())["out"],
          reference(x, x, x, mask.detach().numpy())["out_scale"], "detached mask")


@pytest.mark.parametrize("seed", range(12))
def test_random_problems(device, seed):
    r = np.random.default_rng(1000 + seed)
    q, k, v, mask, causal, p = random_problem(r)
    check(r, q, k, v, mask, causal, p=p, seed=seed, rel=4e-5)


def test_functional_dropout_seeds(device, rng):
    q, k, v = (rand(rng, 2, 7, 16) for _ in range(3))
    a = host(F.scaled_dot_product_attention(q, k, v, dropout_p=0.4, seed=11))
    ref = reference(q, k, v, p=0.4, seed=11)
    close(a, ref["out"], ref["out_scale"], "dropout out")
    fm.random.seed(3)
    b = host(F.scaled_dot_product_attention(q, k, v, dropout_p=0.4))
    c = host(F.scaled_dot_product_attention(q, k, v, dropout_p=0.4))
    fm.random.seed(3)
    np.testing.assert_array_equal(b, host(F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)))
    assert not np.array_equal(b, c)
    np.testing.assert_array_equal(host(F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)),
                                  host(F.scaled_dot_product_attention(q, k, v)))


@pytest.mark.parametrize("kwargs,err,what", [
    (dict(dropout_p=1.0), ValueError, "dropout_p"), (dict(dropout_p="0.1"), TypeError, "dropout_p"),
    (dict(is_causal=1), TypeError, "is_causal"), (dict(scale="x"), TypeError, "scale"),
    (dict(scale=float("nan")), ValueError, "scale"), (dict(enable_gqa=None), TypeError, "enable_gqa"),
])
def test_functional_bad_arguments(kwargs, err, what):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(err, match=OP + " .*" + what):
        F.scaled_dot_product_attention(x, x, x, **kwargs)


def mha_reference(m, query, key, value, attn_mask=None, key_padding_mask=None, causal=False):
    """float64 multi-head attention from the layer's parameters (batch_first=False layout,
    PyTorch's mask conventions: bool True = may not attend)."""
    sd = {n: np.asarray(a, np.float64) for n, a in m.state_dict().items()}
    E, H = m.embed_dim, m.num_heads
    W, b = sd["in_proj_weight"], sd.get("in_proj_bias", np.zeros(3 * E))
    x = [np.swapaxes(np.asarray(t, np.float64), 0, 1) for t in (query, key, value)]  # (N, T, E)
    proj = [xi @ W[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E] for i, xi in enumerate(x)]
    N = proj[0].shape[0]
    q, k, v = (p.reshape(N, -1, H, E // H).transpose(0, 2, 1, 3) for p in proj)
    L, S = q.shape[2], k.shape[2]
    add = np.zeros((N, H, L, S))
    if attn_mask is not None:
        am = np.where(attn_mask, -np.inf, 0.0) if attn_mask.dtype == np.bool_ else attn_mask
        add = add + (am.reshape(N, H, L, S) if am.ndim == 3 else am)
    if key_padding_mask is not None:
        add = add + np.where(key_padding_mask, -np.inf, 0.0)[:, None, None, :]
    if causal:
        add = add + np.triu(np.full((L, S), -np.inf), 1)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(E // H) + add
    P = softmax_rows(s)
    o = (P @ v).transpose(0, 2, 1, 3).reshape(N, L, E)
    out = o @ sd["out_proj.weight"].T + sd.get("out_proj.bias", np.zeros(E))
    return np.swapaxes(out, 0, 1), P


def test_multihead_attention_against_numpy(device, rng):
    m = fm.nn.MultiheadAttention(16, 4, seed=0)
    assert [n for n, _ in m.named_parameters()] == ["in_proj_weight", "in_proj_bias",
                                                    "out_proj.weight", "out_proj.bias"]
    np.testing.assert_array_equal(m.in_proj_bias.numpy(), 0.0)
    np.testing.assert_array_equal(m.out_proj.bias.numpy(), 0.0)
    bound = math.sqrt(6 / (16 + 48))
    assert np.abs(m.in_proj_weight.numpy()).max() <= bound
    query, key = rand(rng, 7, 3, 16), rand(rng, 9, 3, 16)
    am = rng.random((7, 9)) < 0.3
    am[:, 0] = False  # every row keeps a key (PyTorch's weights path gives NaN otherwise)
    kpm = np.zeros((3, 9), bool)
    kpm[1, 5:] = True
    out, w = m(query, key, key, key_padding_mask=kpm, attn_mask=am)
    want, P = mha_reference(m, query, key, key, am, kpm)
    np.testing.assert_allclose(host(out), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(host(w), P.mean(axis=1), rtol=1e-4, atol=1e-6)
    out, w = m(query, query, query, need_weights=False, is_causal=True)
    assert w is None
    np.testing.assert_allclose(host(out), mha_reference(m, query, query, query, causal=True)[0],
                               rtol=1e-4, atol=1e-5)
    # Unbatched input, a 3-D float mask, per-head weights.
    fmask = rand(rng, 4, 7, 9)
    out, w = m(query[:, 0], key[:, 0], key[:, 0], attn_mask=fmask, average_attn_weights=False)
    want, P = mha_reference(m, query[:, :1], key[:, :1], key[:, :1], fmask[None].reshape(4, 7, 9))
    np.testing.assert_allclose(host(out), want[:, 0], rtol=1e-4, atol=1e-5)
    assert host(w).shape == (4, 7, 9)
    np.testing.assert_allclose(host(w), P[0], rtol=1e-4, atol=1e-6)


def test_multihead_attention_options_and_errors(device, rng):
    m = fm.nn.MultiheadAttention(8, 2, bias=False, batch_first=True, seed=1)
    assert m.in_proj_bias is None and m.out_proj.bias is None
    assert list(m.state_dict()) == ["in_proj_weight", "out_proj.weight"]
    x = rand(rng, 3, 5, 8)
    out, _ = m(x, x, x)
    want, _ = mha_reference(m, np.swapaxes(x, 0, 1), np.swapaxes(x, 0, 1), np.swapaxes(x, 0, 1))
    np.testing.assert_allclose(host(out), np.swapaxes(want, 0, 1), rtol=1e-4, atol=1e-5)
    for kwargs in (dict(embed_dim=10, num_heads=3), dict(embed_dim=8, num_heads=2, dropout=1.0)):
        with pytest.raises(ValueError, match=r"^\[fastmetal\.nn\.MultiheadAttention\] expected"):
            fm.nn.MultiheadAttention(**kwargs)
    with pytest.raises(ValueError, match="attn_mask of shape"):
        m(x, x, x, attn_mask=np.zeros((4, 4), bool))
    with pytest.raises(ValueError, match="key_padding_mask of shape"):
        m(x, x, x, key_padding_mask=np.zeros((3, 4), bool))
    with pytest.raises(ValueError, match="last dim to be embed_dim"):
        m(rand(rng, 3, 5, 7), x, x)
    # Dropout: a new mask per training call, none in eval mode; the weights carry the same mask.
    d = fm.nn.MultiheadAttention(8, 2, dropout=0.5, seed=2)
    y = rand(rng, 5, 2, 8)
    a, wa = d(y, y, y, average_attn_weights=False)
    b, _ = d(y, y, y)
    assert not np.array_equal(host(a), host(b))
    d.eval()
    e, we = d(y, y, y, average_attn_weights=False)
    np.testing.assert_allclose(host(e), mha_reference(d, y, y, y)[0], rtol=1e-4, atol=1e-5)
    kept = host(wa) != 0
    assert 0.3 < kept.mean() < 0.7
    np.testing.assert_allclose(host(wa)[kept], (host(we) * 2)[kept], rtol=1e-5)


@needs_torch
@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention_against_torch(device, rng, batch_first):
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first)
    m = fm.nn.MultiheadAttention(32, 4, batch_first=batch_first, seed=0)
    m.load_state_dict({n: t.detach().numpy() for n, t in tm.state_dict().items()})
    shape = (3, 10, 32) if batch_first else (10, 3, 32)
    kshape = (3, 12, 32) if batch_first else (12, 3, 32)
    query, key, value = rand(rng, *shape), rand(rng, *kshape), rand(rng, *kshape)
    am = rng.random((10, 12)) < 0.3
    am[:, 3] = False
    kpm = rng.random((3, 12)) < 0.2
    kpm[:, 3] = False
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (query, key, value))
    to, tw = tm(tq, tk, tv, key_padding_mask=torch.tensor(kpm), attn_mask=torch.tensor(am))
    g = rand(rng, *to.shape)
    to.backward(torch.tensor(g))
    fq, fk, fv = (fm.asarray(x).requires_grad_() for x in (query, key, value))
    out, w = m(fq, fk, fv, key_padding_mask=kpm, attn_mask=am)
    out.backward(fm.asarray(g))
    np.testing.assert_allclose(host(out), to.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(host(w), tw.detach().numpy(), rtol=1e-4, atol=1e-6)
    for got, t in ((fq.grad, tq), (fk.grad, tk), (fv.grad, tv)):
        np.testing.assert_allclose(host(got), t.grad.numpy(), rtol=1e-4, atol=1e-5)
    for (name, p), (tname, tp) in zip(m.named_parameters(), tm.named_parameters()):
        assert name == tname
        np.testing.assert_allclose(host(p.grad), tp.grad.numpy(), rtol=1e-4, atol=1e-4)
    # A fully masked row: 0 as PyTorch's fused path (need_weights=False) gives it.
    am2 = np.zeros((10, 12), bool)
    am2[4] = True
    to2, _ = tm(tq, tk, tv, attn_mask=torch.tensor(am2), need_weights=False)
    out2, _ = m(query, key, value, attn_mask=am2, need_weights=False)
    np.testing.assert_allclose(host(out2), to2.detach().numpy(), rtol=1e-4, atol=1e-5)


@needs_torch
def test_functional_against_torch_autograd(device, rng):
    for dtype, tol in ((np.float32, 2e-5), (np.float16, 4e-3)):
        q, k, v = leaves(rng, (2, 4, 33, 64), (2, 2, 40, 64), (2, 2, 40, 64), dtype=dtype)
        g = rand(rng, 2, 4, 33, 64).astype(dtype)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(fm.asarray(g))
        tq, tk, tv = (torch.tensor(x.numpy().astype(np.float64), requires_grad=True)
                      for x in (q, k, v))
        to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                              enable_gqa=True)
        to.backward(torch.tensor(g.astype(np.float64)))
        for got, want in ((out, to), (q.grad, tq.grad), (k.grad, tk.grad), (v.grad, tv.grad)):
            want = want.detach().numpy()
            np.testing.assert_allclose(host(got).astype(np.float64), want,
                                       atol=tol * max(1.0, np.abs(want).max()))
