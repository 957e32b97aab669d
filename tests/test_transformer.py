"""nn.TransformerEncoderLayer / nn.TransformerEncoder against PyTorch's (eval mode: dropout
off): PyTorch's state_dict loads, outputs and the gradients of every parameter agree, for
both norm_first settings, batch_first both ways, attention and key-padding masks, causal,
relu / gelu / callable activations. Without PyTorch the structure and a NumPy float64
forward of one post-norm layer still run."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from helpers import host, needs_torch, torch

E, H, FF = 16, 4, 24


def _load_from_torch(fl, tl, device):
    fl.load_state_dict({k: fm.asarray(v.detach().numpy(), device=device)
                        for k, v in tl.state_dict().items()})


def _check(fl, tl, x, device, rtol=2e-4, atol=2e-5, **kw):
    """Forward both with the same weights and inputs; sum(out * r) backward; compare."""
    tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    fx = fm.asarray(x, device=device).requires_grad_()
    tx = torch.tensor(x, requires_grad=True)
    fo, to = fl(fx, **kw), tl(tx, **tkw)
    np.testing.assert_allclose(host(fo), to.detach().numpy(), rtol=rtol, atol=atol)
    r = np.random.default_rng(1).standard_normal(tuple(to.shape)).astype(np.float32)
    fm.sum(fo * fm.asarray(r, device=device)).backward()
    (to * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(host(fx.grad), tx.grad.numpy(), rtol=rtol, atol=atol)
    fp, tp = dict(fl.named_parameters()), dict(tl.named_parameters())
    assert set(fp) == set(tp)
    for name, p in tp.items():
        np.testing.assert_allclose(host(fp[name].grad), p.grad.numpy(), rtol=rtol,
                                   atol=atol, err_msg=name)


def test_names_and_shapes_are_pytorchs():
    layer = nn.TransformerEncoderLayer(E, H, FF, seed=0)
    shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    assert shapes == {
        "self_attn.in_proj_weight": (3 * E, E), "self_attn.in_proj_bias": (3 * E,),
        "self_attn.out_proj.weight": (E, E), "self_attn.out_proj.bias": (E,),
        "linear1.weight": (FF, E), "linear1.bias": (FF,), "linear2.weight": (E, FF),
        "linear2.bias": (E,), "norm1.weight": (E,), "norm1.bias": (E,), "norm2.weight": (E,),
        "norm2.bias": (E,)}
    enc = nn.TransformerEncoder(layer, 3, norm=nn.LayerNorm(E))
    keys = list(enc.state_dict())
    assert keys[0] == "layers.0.self_attn.in_proj_weight" and "layers.2.linear2.bias" in keys
    assert "norm.weight" in keys and len(keys) == 3 * len(shapes) + 2
    # Deep copies: the same starting values, separate storage, their own dropout seeds.
    a, b = enc.layers[0].linear1.weight, enc.layers[1].linear1.weight
    np.testing.assert_array_equal(host(a), host(b))
    assert a is not b
    assert enc.layers[0].dropout._next_seed != enc.layers[1].dropout._next_seed
    nobias = nn.TransformerEncoderLayer(E, H, FF, bias=False, seed=0)
    assert not any(k.endswith("bias") for k in nobias.state_dict())


def test_post_norm_layer_matches_numpy(device, rng):
    """One post-norm relu layer, no masks, against a float64 NumPy forward."""
    layer = nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, batch_first=True, seed=3)
    layer.eval()
    x = rng.standard_normal((2, 5, E)).astype(np.float32)
    p = {k: host(v).astype(np.float64) for k, v in layer.state_dict().items()}

    def ln(v, w, b):
        m = v.mean(-1, keepdims=True)
        return (v - m) / np.sqrt(((v - m) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b

    x64 = x.astype(np.float64)
    qkv = x64 @ p["self_attn.in_proj_weight"].T + p["self_attn.in_proj_bias"]
    q, k, v = (t.reshape(2, 5, H, E // H).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, -1))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(E // H)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = (a @ v).transpose(0, 2, 1, 3).reshape(2, 5, E)
    o = o @ p["self_attn.out_proj.weight"].T + p["self_attn.out_proj.bias"]
    h = ln(x64 + o, p["norm1.weight"], p["norm1.bias"])
    f = np.maximum(h @ p["linear1.weight"].T + p["linear1.bias"], 0)
    f = f @ p["linear2.weight"].T + p["linear2.bias"]
    want = ln(h + f, p["norm2.weight"], p["norm2.bias"])
    np.testing.assert_allclose(host(layer(fm.asarray(x, device=device))), want, rtol=1e-4,
                               atol=1e-5)


def test_bad_arguments():
    with pytest.raises(RuntimeError, match=r"\[fastmetal.nn.TransformerEncoderLayer\] "
                                           r"expected activation 'relu', 'gelu'.*'tanh'"):
        nn.TransformerEncoderLayer(E, H, activation="tanh")
    with pytest.raises(ValueError, match="divisible by num_heads"):
        nn.TransformerEncoderLayer(E, 5)
    with pytest.raises(TypeError, match="encoder_layer to be a Module"):
        nn.TransformerEncoder("layer", 2)
    with pytest.raises((TypeError, ValueError), match="num_layers"):
        nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, seed=0), 0)


@needs_torch
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_layer_matches_torch(device, rng, norm_first, batch_first, activation):
    torch.manual_seed(0)
    tl = torch.nn.TransformerEncoderLayer(E, H, FF, dropout=0.1, activation=activation,
                                          batch_first=batch_first, norm_first=norm_first).eval()
    fl = nn.TransformerEncoderLayer(E, H, FF, dropout=0.1, activation=activation,
                                    batch_first=batch_first, norm_first=norm_first, seed=0).eval()
    _load_from_torch(fl, tl, device)
    N, S = 3, 6
    shape = (N, S, E) if batch_first else (S, N, E)
    x = rng.standard_normal(shape).astype(np.float32)
    _check(fl, tl, x, device)
    # Float masks, then bool masks (PyTorch wants both of one type; no row fully masked).
    kpm = np.zeros((N, S), bool)
    kpm[0, -2:] = True
    kpm[2, 0] = True
    bool_mask = rng.random((S, S)) < 0.3
    np.fill_diagonal(bool_mask, False)
    for mask, pad in (((rng.standard_normal((S, S)) * 0.5).astype(np.float32),
                       np.where(kpm, -np.inf, 0.0).astype(np.float32)), (bool_mask, kpm)):
        fl.zero_grad()
        tl.zero_grad()
        _check(fl, tl, x, device, src_mask=mask, src_key_padding_mask=pad)


@needs_torch
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_causal_matches_torch(device, rng, norm_first):
    torch.manual_seed(1)
    tlayer = torch.nn.TransformerEncoderLayer(E, H, FF, activation=torch.nn.functional.gelu,
                                              batch_first=True, norm_first=norm_first)
    tenc = torch.nn.TransformerEncoder(tlayer, 2, norm=torch.nn.LayerNorm(E),
                                       enable_nested_tensor=False).eval()
    flayer = nn.TransformerEncoderLayer(E, H, FF, activation=fm.nn.functional.gelu,
                                        batch_first=True, norm_first=norm_first, seed=1)
    fenc = nn.TransformerEncoder(flayer, 2, norm=nn.LayerNorm(E)).eval()
    _load_from_torch(fenc, tenc, device)
    x = rng.standard_normal((2, 7, E)).astype(np.float32)
    causal = np.triu(np.ones((7, 7), bool), 1)  # True: may not attend
    _check(fenc, tenc, x, device, mask=causal, is_causal=True)
    # is_causal without the mask (fastmetal applies it; PyTorch needs the mask): same output.
    got = fenc(fm.asarray(x, device=device), is_causal=True)
    want = tenc(torch.tensor(x), mask=torch.tensor(causal), is_causal=True)
    np.testing.assert_allclose(host(got), want.detach().numpy(), rtol=2e-4, atol=2e-5)


@needs_torch
def test_unbatched_and_module_activation(device, rng):
    torch.manual_seed(2)
    tl = torch.nn.TransformerEncoderLayer(E, H, FF, activation=torch.nn.GELU(),
                                          norm_first=True).eval()
    fl = nn.TransformerEncoderLayer(E, H, FF, activation=nn.GELU(), norm_first=True,
                                    seed=2).eval()
    _load_from_torch(fl, tl, device)
    _check(fl, tl, rng.standard_normal((5, E)).astype(np.float32), device)


def test_training_mode_dropout_changes_output(device, rng):
    layer = nn.TransformerEncoderLayer(E, H, FF, dropout=0.5, seed=4)
    x = fm.asarray(rng.standard_normal((4, 2, E)).astype(np.float32), device=device)
    a, b = host(layer(x)), host(layer(x))
    assert not np.allclose(a, b)  # a new mask per call
    layer.eval()
    np.testing.assert_array_equal(host(layer(x)), host(layer(x)))


def test_tied_weights_stay_tied_when_moved(device):
    """Module.to moves a Parameter shared by two modules once: after it the two still name
    one Parameter (a GPT's tied embedding and head). On the CPU the move is a no-op."""
    if device == "cpu":
        pytest.skip("needs a second device to move to")
    emb = nn.Embedding(7, 4, device="cpu")
    head = nn.Linear(4, 7, bias=False, device="cpu")
    model = nn.ModuleDict({"emb": emb, "head": head})
    head.weight = emb.weight
    model.to(device)
    assert model["head"].weight is model["emb"].weight and emb.weight.device == device
    assert len(list(model.parameters())) == 1
