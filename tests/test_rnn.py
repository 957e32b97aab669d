"""The recurrent layers (nn.RNN, nn.LSTM, nn.GRU and their cells; ops/recurrent.py over the
fused gate kernels of metal/recurrent.metal): against a float64 NumPy reference (outputs,
final states) and its finite differences (every parameter's and the inputs' gradients),
which always run, and against PyTorch (outputs, h_n / c_n and every gradient, for every
layer type x num_layers 1/2 x bidirectional x batch_first, sequence lengths 1 and 33, empty
and unbatched inputs; the cells; a PyTorch state_dict loaded), on every device."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from helpers import host, needs_torch, skip_without_float64, torch
from references import msl_kernels_on_cpu

kernels = pytest.fixture(msl_kernels_on_cpu)

MODES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


@pytest.fixture(autouse=True, scope="module")
def _torch_on_one_thread():
    """The references are small ops: PyTorch's thread team only waits on them (the example's
    20 steps took 39 s instead of 4 on a loaded 2-core machine)."""
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make(mode, *args, **kwargs):
    if mode.startswith("RNN"):
        kwargs["nonlinearity"] = "relu" if mode == "RNN_RELU" else "tanh"
        return nn.RNN(*args, **kwargs)
    return getattr(nn, mode)(*args, **kwargs)


# ------------------------------------------------------------------------ float64 reference
def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def ref_cell(mode, x, h, c, w_ih, w_hh, b_ih, b_hh):
    """One step, PyTorch's formulas, in float64. x (B, I), h and c (B, H)."""
    xg = x @ w_ih.T + (0 if b_ih is None else b_ih)
    hg = h @ w_hh.T + (0 if b_hh is None else b_hh)
    if mode == "LSTM":
        i, f, g, o = np.split(xg + hg, 4, axis=1)
        c = _sig(f) * c + _sig(i) * np.tanh(g)
        return _sig(o) * np.tanh(c), c
    if mode == "GRU":
        xr, xz, xn = np.split(xg, 3, axis=1)
        hr, hz, hn = np.split(hg, 3, axis=1)
        r, z = _sig(xr + hr), _sig(xz + hz)
        n = np.tanh(xn + r * hn)
        return (1 - z) * n + z * h, None
    pre = xg + hg
    return (np.maximum(pre, 0) if mode == "RNN_RELU" else np.tanh(pre)), None


def ref_forward(mode, params, x, h0, c0, num_layers, bidirectional):
    """x (T, B, I) -> (out (T, B, D*H), h_n, c_n) in float64; params by PyTorch's names."""
    D = 2 if bidirectional else 1
    hn, cn = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(D):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            w = [params.get(k + sfx) for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            k = layer * D + d
            h, c = h0[k], (None if c0 is None else c0[k])
            seq = [None] * x.shape[0]
            steps = range(x.shape[0] - 1, -1, -1) if d else range(x.shape[0])
            for t in steps:
                h, c = ref_cell(mode, x[t], h, c, *w)
                seq[t] = h
            outs.append(np.stack(seq))
            hn.append(h)
            cn.append(c)
        x = np.concatenate(outs, axis=2)
    return x, np.stack(hn), (np.stack(cn) if mode == "LSTM" else None)


def params64(m):
    return {k: host(v).astype(np.float64) for k, v in m.state_dict().items()}


def fm_loss(mode, m, x, h0, c0, R):
    """A loss that reaches every output: sum(out * R_out) + sum(h_n * R_h) (+ c_n)."""
    hx = (h0, c0) if mode == "LSTM" else h0
    out, st = m(x, hx)
    h, c = st if mode == "LSTM" else (st, None)
    loss = (out * R[0]).sum() + (h * R[1]).sum()
    if c is not None:
        loss = loss + (c * R[2]).sum()
    return out, h, c, loss


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (2, True)])
def test_against_float64_reference_and_finite_differences(device, mode, num_layers,
                                                          bidirectional):
    rng = np.random.default_rng(hash((mode, num_layers)) % 2**32)
    T, B, I, H = 4, 2, 3, 5
    D = 2 if bidirectional else 1
    m = make(mode, I, H, num_layers=num_layers, bidirectional=bidirectional, seed=1)
    x = rng.standard_normal((T, B, I))
    h0 = rng.standard_normal((num_layers * D, B, H))
    c0 = rng.standard_normal((num_layers * D, B, H)) if mode == "LSTM" else None
    R = [rng.standard_normal(s) for s in ((T, B, D * H), (num_layers * D, B, H),
                                          (num_layers * D, B, H))]
    fx, fh = fm.asarray(x.astype(np.float32)), fm.asarray(h0.astype(np.float32))
    fc = None if c0 is None else fm.asarray(c0.astype(np.float32))
    for a in (fx, fh) + ((fc,) if fc is not None else ()):
        a.requires_grad = True
    out, h, c, loss = fm_loss(mode, m, fx, fh, fc, [fm.asarray(r.astype(np.float32)) for r in R])
    loss.backward()
    P = params64(m)
    want = ref_forward(mode, P, x, h0, c0, num_layers, bidirectional)
    np.testing.assert_allclose(host(out), want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(host(h), want[1], rtol=1e-4, atol=1e-5)
    if mode == "LSTM":
        np.testing.assert_allclose(host(c), want[2], rtol=1e-4, atol=1e-5)

    def ref_loss(P, x, h0, c0):
        o, hn, cn = ref_forward(mode, P, x, h0, c0, num_layers, bidirectional)
        return (o * R[0]).sum() + (hn * R[1]).sum() + (0 if cn is None else (cn * R[2]).sum())

    def check(got, arr, f, what):
        flat = [np.unravel_index(i, arr.shape) for i in
                rng.choice(arr.size, size=min(arr.size, 12), replace=False)]
        want_g = fd64(f, arr, flat)
        got_g = np.array([got[i] for i in flat])
        np.testing.assert_allclose(got_g, want_g, rtol=2e-3, atol=2e-4, err_msg=what)

    grads = {k: host(p.grad) for k, p in m.named_parameters()}
    for k in P:
        check(grads[k], P[k], lambda: ref_loss(P, x, h0, c0), k)
    check(host(fx.grad), x, lambda: ref_loss(P, x, h0, c0), "input")
    check(host(fh.grad), h0, lambda: ref_loss(P, x, h0, c0), "h0")
    if mode == "LSTM":
        check(host(fc.grad), c0, lambda: ref_loss(P, x, h0, c0), "c0")


@pytest.mark.cpu_only
def grads_match_the_native_road(m, fx, out, rtol, atol):
    """The gradients of sum(out ** 2) (out = m(fx), run through the MSL kernels) equal the
    same backward through the CPU's GEMM to rtol / atol (the `kernels` fixture restores the
    setting)."""
    (out ** 2).sum().backward()
    grads = [host(fx.grad)] + [host(p.grad) for p in m.parameters()]
    fm._core._set_native_cpu(True)
    m.zero_grad()
    fx.grad = None
    (m(fx)[0] ** 2).sum().backward()
    for a, b in zip(grads, [host(fx.grad)] + [host(p.grad) for p in m.parameters()]):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_msl_products_under_the_emulator(kernels, mode):
    """The per-step products through the MSL matmul kernels (what a GPU runs: W_hh^T a
    transposed view, the states views of one array) instead of the CPU's GEMM."""
    rng = np.random.default_rng(2)
    m = make(mode, 3, 4, num_layers=2, bidirectional=True, seed=4)
    x = rng.standard_normal((5, 2, 3))
    fx = fm.asarray(x.astype(np.float32))
    fx.requires_grad = True
    out, st = m(fx)
    want = ref_forward(mode, params64(m), x, np.zeros((4, 2, 4)),
                       np.zeros((4, 2, 4)) if mode == "LSTM" else None, 2, True)
    np.testing.assert_allclose(host(out), want[0], rtol=1e-4, atol=1e-5)
    grads_match_the_native_road(m, fx, out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH"])
def test_cells_against_float64_reference(device, mode):
    rng = np.random.default_rng(7)
    B, I, H = 3, 4, 5
    cls = {"LSTM": nn.LSTMCell, "GRU": nn.GRUCell, "RNN_TANH": nn.RNNCell}[mode]
    m = cls(I, H, seed=3)
    x, h, c = (rng.standard_normal(s) for s in ((B, I), (B, H), (B, H)))
    P = params64(m)
    want = ref_cell(mode, x, h, c if mode == "LSTM" else None, P["weight_ih"], P["weight_hh"],
                    P["bias_ih"], P["bias_hh"])
    f32 = [fm.asarray(a.astype(np.float32)) for a in (x, h, c)]
    got = m(f32[0], (f32[1], f32[2]) if mode == "LSTM" else f32[1])
    if mode == "LSTM":
        np.testing.assert_allclose(host(got[0]), want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(host(got[1]), want[1], rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_allclose(host(got), want[0], rtol=1e-5, atol=1e-6)


def test_seeded_initialisation_is_reproducible_and_pytorch_shaped():
    fm.manual_seed(5)
    a = nn.LSTM(3, 8, num_layers=2, bidirectional=True)
    fm.manual_seed(5)
    b = nn.LSTM(3, 8, num_layers=2, bidirectional=True)
    names = [n for n, _ in a.named_parameters()]
    assert names[:4] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
    assert names[4] == "weight_ih_l0_reverse" and names[-1] == "bias_hh_l1_reverse"
    assert a.weight_ih_l1.shape == (32, 16) and a.weight_hh_l0.shape == (32, 8)
    bound = 1 / np.sqrt(8)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(host(p), host(q), err_msg=n)
        assert np.abs(host(p)).max() <= bound
    assert np.std(host(a.weight_hh_l0)) > bound / 3  # drawn, not zeros
    assert len(list(nn.GRU(3, 4, bias=False).named_parameters())) == 2
    assert repr(nn.LSTM(3, 4, 2, dropout=0.5)) == "LSTM(3, 4, num_layers=2, dropout=0.5)"


def test_dropout_between_layers_in_training_only(device):
    rng = np.random.default_rng(0)
    x = fm.asarray(rng.standard_normal((6, 2, 3)).astype(np.float32))
    m = nn.GRU(3, 16, num_layers=2, dropout=0.5, seed=11)
    m.eval()
    P = params64(m)
    want = ref_forward("GRU", P, host(x).astype(np.float64), np.zeros((2, 2, 16)), None, 2, False)
    np.testing.assert_allclose(host(m(x)[0]), want[0], rtol=1e-4, atol=1e-5)
    m.train()
    y1 = m(x)[0]
    y2 = m(x)[0]
    assert not np.allclose(host(y1), want[0], atol=1e-3)  # a mask was applied
    assert not np.allclose(host(y1), host(y2))            # a fresh mask each call
    # Layer 0's output as the reference gives it, masked as fm.dropout masks it, then layer 1.
    m2 = nn.GRU(3, 16, num_layers=2, dropout=0.5, seed=11)
    seed = m2._next_seed
    layer0 = ref_forward("GRU", {k: v for k, v in P.items() if k.endswith("l0")},
                         host(x).astype(np.float64), np.zeros((1, 2, 16)), None, 1, False)[0]
    mask = host(fm.dropout(fm.ones(layer0.shape), 0.5, seed=seed))
    P1 = {k.replace("l1", "l0"): v for k, v in P.items() if k.endswith("l1")}
    want1 = ref_forward("GRU", P1, layer0 * mask, np.zeros((1, 2, 16)), None, 1, False)[0]
    np.testing.assert_allclose(host(m2(x)[0]), want1, rtol=1e-4, atol=1e-5)
    loss = (m2(x)[0] ** 2).sum()
    loss.backward()
    assert np.isfinite(host(m2.weight_ih_l0.grad)).all()
    m3 = nn.GRU(3, 16, num_layers=2, dropout=1.0, seed=11)  # p = 1: layer 1 sees zeros
    want3 = ref_forward("GRU", P1, np.zeros_like(layer0), np.zeros((1, 2, 16)), None, 1, False)[0]
    np.testing.assert_allclose(host(m3(x)[0]), want3, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------- errors
def test_bad_arguments_raise_pytorchs_errors():
    with pytest.raises(ValueError, match="dropout"):
        nn.LSTM(3, 4, dropout=1.5)
    with pytest.raises(ValueError, match="dropout"):
        nn.GRU(3, 4, dropout=True)
    with pytest.raises(ValueError, match="hidden_size"):
        nn.LSTM(3, 0)
    with pytest.raises(TypeError, match="hidden_size"):
        nn.LSTM(3, 2.0)
    with pytest.raises(ValueError, match="num_layers"):
        nn.GRU(3, 4, num_layers=0)
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(TypeError, match="batch_first"):
        nn.RNN(3, 4, batch_first=1)
    with pytest.warns(UserWarning, match="num_layers=1"):
        nn.LSTM(3, 4, dropout=0.2)
    m = nn.LSTM(3, 4)
    with pytest.raises(RuntimeError, match=r"input_size = 3, got 5"):
        m(np.zeros((2, 1, 5), np.float32))
    with pytest.raises(ValueError, match=r"2-D \(unbatched\) or 3-D, got a 4-D"):
        m(np.zeros((2, 1, 3, 1), np.float32))
    with pytest.raises(RuntimeError, match="sequence length larger than 0"):
        m(np.zeros((0, 2, 3), np.float32))
    h = np.zeros((1, 2, 4), np.float32)
    with pytest.raises(RuntimeError, match=r"hx\[0\] \(h_0\) of shape \(1, 2, 4\).*got \(1, 2, 5\)"):
        m(np.zeros((5, 2, 3), np.float32), (np.zeros((1, 2, 5), np.float32), h))
    with pytest.raises(RuntimeError, match=r"hx\[1\] \(c_0\) of shape"):
        m(np.zeros((5, 2, 3), np.float32), (h, np.zeros((1, 3, 4), np.float32)))
    with pytest.raises(RuntimeError, match="3-D for batched"):
        m(np.zeros((5, 2, 3), np.float32), (h[0], h[0]))
    with pytest.raises(TypeError, match=r"tuple \(h_0, c_0\)"):
        m(np.zeros((5, 2, 3), np.float32), h)
    g = nn.GRU(3, 4)
    with pytest.raises(RuntimeError, match=r"expected hx of shape \(1, 2, 4\).*got \(2, 2, 4\)"):
        g(np.zeros((5, 2, 3), np.float32), np.zeros((2, 2, 4), np.float32))
    with pytest.raises(RuntimeError, match="2-D for unbatched"):
        g(np.zeros((5, 3), np.float32), np.zeros((1, 1, 4), np.float32))
    cell = nn.LSTMCell(3, 4)
    with pytest.raises(RuntimeError, match="input_size = 3, got 5"):
        cell(np.zeros((2, 5), np.float32))
    with pytest.raises(RuntimeError, match=r"hx\[0\] \(h_0\) of shape \(2, 4\).*got \(3, 4\)"):
        cell(np.zeros((2, 3), np.float32), (np.zeros((3, 4)), np.zeros((2, 4))))
    with pytest.raises(ValueError, match="1-D .*or 2-D, got a 3-D"):
        nn.GRUCell(3, 4)(np.zeros((1, 2, 3), np.float32))


def test_second_order_gradient_through_the_layer_is_refused():
    m = nn.RNN(2, 3)
    x = fm.asarray(np.ones((3, 1, 2), np.float32))
    x.requires_grad = True
    (gx,) = fm.autograd.grad(m(x)[0].sum(), [x], create_graph=True)
    with pytest.raises(NotImplementedError, match="rnn_layer"):
        gx.sum().backward()


# ------------------------------------------------------------------------------- PyTorch
def torch_model(mode, *args, **kwargs):
    if mode.startswith("RNN"):
        kwargs["nonlinearity"] = "relu" if mode == "RNN_RELU" else "tanh"
        return torch.nn.RNN(*args, **kwargs)
    return getattr(torch.nn, mode)(*args, **kwargs)


def load_from_torch(m, tm):
    m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})


def compare(got, want, what, rtol=1e-4):
    want = want.detach().numpy()
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(host(got), want, rtol=rtol, atol=rtol * scale, err_msg=what)


# Every layer type x num_layers x bidirectional x batch_first x length; relu once per length
# (the rest of its road is tanh's).
CONFIGS = [(mode, L, bi, bf, T, B) for mode in ("LSTM", "GRU", "RNN_TANH") for L in (1, 2)
           for bi in (False, True) for bf in (False, True) for T, B in ((1, 3), (33, 2))] + \
          [("RNN_RELU", 2, True, True, T, B) for T, B in ((1, 3), (33, 2))]


@needs_torch
@pytest.mark.parametrize("mode,num_layers,bidirectional,batch_first,T,B", CONFIGS)
def test_against_pytorch(device, mode, num_layers, bidirectional, batch_first, T, B):
    torch.manual_seed(T * 7 + num_layers)
    I, H = 5, 6
    D = 2 if bidirectional else 1
    tm = torch_model(mode, I, H, num_layers=num_layers, bidirectional=bidirectional,
                     batch_first=batch_first)
    m = make(mode, I, H, num_layers=num_layers, bidirectional=bidirectional,
             batch_first=batch_first)
    load_from_torch(m, tm)
    shape = (B, T, I) if batch_first else (T, B, I)
    x = torch.randn(*shape, requires_grad=True)
    h0 = torch.randn(num_layers * D, B, H, requires_grad=True)
    c0 = torch.randn(num_layers * D, B, H, requires_grad=True)
    R = [torch.randn(*s) for s in (((B, T, D * H) if batch_first else (T, B, D * H)),
                                   (num_layers * D, B, H), (num_layers * D, B, H))]
    if mode == "LSTM":
        out, (hn, cn) = tm(x, (h0, c0))
        loss = (out * R[0]).sum() + (hn * R[1]).sum() + (cn * R[2]).sum()
    else:
        out, hn = tm(x, h0)
        cn = None
        loss = (out * R[0]).sum() + (hn * R[1]).sum()
    loss.backward()
    arrs = [fm.asarray(t.detach().numpy()) for t in (x, h0, c0)]
    for a in arrs:
        a.requires_grad = True
    fout, fh, fc, floss = fm_loss(mode, m, arrs[0], arrs[1], arrs[2] if mode == "LSTM" else None,
                                  [fm.asarray(r.numpy()) for r in R])
    floss.backward()
    compare(fout, out, "output")
    assert fout.shape == tuple(out.shape)
    compare(fh, hn, "h_n")
    if cn is not None:
        compare(fc, cn, "c_n")
    compare(arrs[0].grad, x.grad, "input.grad", 2e-4)
    compare(arrs[1].grad, h0.grad, "h0.grad", 2e-4)
    if mode == "LSTM":
        compare(arrs[2].grad, c0.grad, "c0.grad", 2e-4)
    for name, p in tm.named_parameters():
        compare(getattr(m, name).grad, p.grad, name + ".grad", 2e-4)


@needs_torch
@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH"])
def test_unbatched_empty_batch_no_hx_and_no_bias_against_pytorch(device, mode):
    torch.manual_seed(3)
    tm = torch_model(mode, 4, 5, num_layers=2, bias=False, bidirectional=True)
    m = make(mode, 4, 5, num_layers=2, bias=False, bidirectional=True)
    load_from_torch(m, tm)
    for shape in ((7, 4), (7, 0, 4), (7, 3, 4)):
        x = torch.randn(*shape, requires_grad=True)
        out, st = tm(x)
        hn = st[0] if mode == "LSTM" else st
        (out.sum() + hn.sum()).backward()
        fx = fm.asarray(x.detach().numpy())
        fx.requires_grad = True
        fout, fst = m(fx)
        fhn = fst[0] if mode == "LSTM" else fst
        assert fout.shape == tuple(out.shape) and fhn.shape == tuple(hn.shape)
        (fout.sum() + fhn.sum()).backward()
        compare(fout, out, f"output {shape}")
        compare(fhn, hn, f"h_n {shape}")
        compare(fx.grad, x.grad, f"input.grad {shape}", 2e-4)
        for name, p in tm.named_parameters():
            compare(getattr(m, name).grad, p.grad, f"{name}.grad {shape}", 2e-4)
            p.grad = None
        m.zero_grad()


@needs_torch
@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"])
@pytest.mark.parametrize("shape", [(3, 4), (4,), (0, 4)])
def test_cells_against_pytorch(device, mode, shape):
    torch.manual_seed(1)
    names = {"LSTM": "LSTMCell", "GRU": "GRUCell", "RNN_TANH": "RNNCell", "RNN_RELU": "RNNCell"}
    kw = {"nonlinearity": "relu"} if mode == "RNN_RELU" else {}
    tm = getattr(torch.nn, names[mode])(4, 5, **kw)
    m = getattr(nn, names[mode])(4, 5, **kw)
    load_from_torch(m, tm)
    x = torch.randn(*shape, requires_grad=True)
    hshape = shape[:-1] + (5,)
    h = torch.randn(*hshape, requires_grad=True)
    c = torch.randn(*hshape, requires_grad=True)
    fx, fh, fc = (fm.asarray(t.detach().numpy()) for t in (x, h, c))
    for a in (fx, fh, fc):
        a.requires_grad = True
    if mode == "LSTM":
        h1, c1 = tm(x, (h, c))
        fh1, fc1 = m(fx, (fh, fc))
        ((h1 * 2).sum() + (c1 ** 2).sum()).backward()
        ((fh1 * 2).sum() + (fc1 ** 2).sum()).backward()
        compare(fc1, c1, "c'")
        compare(fc.grad, c.grad, "c.grad")
    else:
        h1 = tm(x, h)
        fh1 = m(fx, fh)
        (h1 ** 2).sum().backward()
        (fh1 ** 2).sum().backward()
    compare(fh1, h1, "h'")
    assert fh1.shape == tuple(h1.shape)
    compare(fx.grad, x.grad, "input.grad")
    compare(fh.grad, h.grad, "h.grad")
    for name, p in tm.named_parameters():
        compare(getattr(m, name).grad, p.grad, name + ".grad")
    no_hx = m(fx)  # hx=None: zeros, as PyTorch
    want = tm(x)
    compare(no_hx[0] if mode == "LSTM" else no_hx, want[0] if mode == "LSTM" else want, "hx=None")


# ------------------------------------------------------------------ examples/lstm.py
def _example():
    import importlib.util
    from conftest import REPO
    spec = importlib.util.spec_from_file_location("lstm_example", REPO / "examples" / "lstm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SMALL = ["--hidden", "64", "--embed", "32", "--seq-len", "32", "--batch-size", "16",
         "--lr", "1e-2", "--dropout", "0", "--max-chars", "100000", "--quiet"]


def test_lstm_example_learns_the_stdlib_text():
    """300 steps (about 5 s of CPU on a 2-core machine): the validation loss falls from
    ln(vocabulary) ~ 4.5 nats/char, past the unigram entropy (~3.2), below 2.0."""
    history = _example().main(SMALL + ["--epochs", "3", "--steps-per-epoch", "100"])
    assert history["train"][0] > 4.0
    assert history["val"][-1] < 2.0, history["val"]


@needs_torch
def test_lstm_example_follows_pytorch_for_20_steps():
    """The same weights (fastmetal's, loaded into the same network in PyTorch) and the same
    batches: Adam + clip_grad_norm_ give losses within 1e-3 relative for 20 steps."""
    ex = _example()
    args = ex.parser().parse_args(SMALL)
    parts = ex.build(args)
    model = parts["model"]

    class Twin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(len(parts["chars"]), args.embed)
            self.lstm = torch.nn.LSTM(args.embed, args.hidden, num_layers=args.layers,
                                      batch_first=True)
            self.head = torch.nn.Linear(args.hidden, len(parts["chars"]))

        def forward(self, ids):
            return self.head(self.lstm(self.embed(ids))[0])

    _follow(ex, parts, args, Twin())


def _follow(ex, parts, args, twin):
    model = parts["model"]
    twin.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    opt = torch.optim.Adam(twin.parameters(), lr=args.lr)
    batches = ex.Batches(parts["train"].ids, args.batch_size, args.seq_len, args.seed)
    for step in range(20):
        ours = ex.train_step(parts, args.clip).item()
        x, y = (torch.tensor(a) for a in batches.next())
        logits = twin(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), args.clip)
        opt.step()
        assert abs(ours - loss.item()) <= 1e-3 * abs(loss.item()), (step, ours, loss.item())


def test_lstm_example_help_shows_every_default():
    import subprocess
    import sys
    from conftest import REPO
    r = subprocess.run([sys.executable, str(REPO / "examples" / "lstm.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    blocks = r.stdout.split("options:", 1)[1].split("\n  --")[1:]
    assert len(blocks) > 10
    for block in blocks:
        assert "(default: " in " ".join(block.split()), block


def _lstm_run(device, compiled, steps=4):
    fm.manual_seed(2)
    m = nn.LSTM(3, 8, num_layers=2, dropout=0.3, bidirectional=True, device=device)
    head = nn.Linear(16, 2, device=device)
    opt = fm.optim.SGD(list(m.parameters()) + list(head.parameters()), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        out, (h, c) = m(x)
        loss = ((head(out) - y) ** 2).mean() + (c ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    run = fm.compile(step) if compiled else step
    rng = np.random.default_rng(0)
    losses = [float(run(fm.asarray(rng.standard_normal((5, 2, 3)).astype(np.float32),
                                   device=device),
                        fm.asarray(rng.standard_normal((5, 2, 2)).astype(np.float32),
                                   device=device))) for _ in range(steps)]
    return losses, {k: np.array(v) for k, v in m.state_dict().items()}, run


def test_lstm_training_step_replays_bit_identical_under_compile(device):
    """fastmetal.compile records the layer loops' launches, native products and zero fills,
    and the dropout keys between layers: a replayed step equals the eager one bit for bit."""
    eager_losses, eager_params, _ = _lstm_run(device, compiled=False)
    losses, params, run = _lstm_run(device, compiled=True)
    assert run.traces == 1
    assert losses == eager_losses
    for k in params:
        np.testing.assert_array_equal(params[k], eager_params[k], err_msg=k)


# ------------------------------------------------------------------------------- float64
# After .double() a layer computes in double (the gate kernels' _float64 instances, the
# double GEMM): against the NumPy float64 reference and its finite differences to ~1e-9
# (float32's tolerances are 1e-4), and against PyTorch float64 to ~1e-12.
CELLS = {"LSTM": "LSTMCell", "GRU": "GRUCell", "RNN_TANH": "RNNCell", "RNN_RELU": "RNNCell"}


def make_cell(mode, *args, **kwargs):
    if mode.startswith("RNN"):
        kwargs["nonlinearity"] = "relu" if mode == "RNN_RELU" else "tanh"
    return getattr(nn, CELLS[mode])(*args, **kwargs)


def f64(a, device):
    arr = fm.asarray(np.asarray(a, np.float64), dtype=np.float64, device=device)
    arr.requires_grad = True
    return arr


def fd64(f, a, picks, eps=1e-6):
    """Central differences of the float64 reference: O(eps^2) truncation, ~1e-10 rounding."""
    out = []
    for idx in picks:
        old = a[idx]
        a[idx] = old + eps
        up = f()
        a[idx] = old - eps
        down = f()
        a[idx] = old
        out.append((up - down) / (2 * eps))
    return np.array(out)


def test_lstm_cell_float64_forward_and_backward_against_numpy(device):
    """Always runs (no PyTorch): LSTMCell.double() in double, its outputs to ~1e-14 of the
    NumPy float64 formulas and every gradient (input, h, c, the four parameters) within
    1e-8 of central differences of the reference (float32 could not get within 1e-4)."""
    skip_without_float64(device)
    rng = np.random.default_rng(64)
    B, I, H = 3, 4, 5
    m = nn.LSTMCell(I, H, seed=2).double()
    assert {p.dtype for p in m.parameters()} == {np.dtype(np.float64)}
    x, h, c = (rng.standard_normal(s) for s in ((B, I), (B, H), (B, H)))
    R = [rng.standard_normal((B, H)) for _ in range(2)]
    fx, fh, fc = (f64(a, device) for a in (x, h, c))
    h1, c1 = m(fx, (fh, fc))
    assert h1.dtype == np.float64 and c1.dtype == np.float64
    P = params64(m)
    args = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    want = ref_cell("LSTM", x, h, c, *(P[k] for k in args))
    np.testing.assert_allclose(host(h1), want[0], rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(host(c1), want[1], rtol=1e-13, atol=1e-14)
    ((h1 * fm.asarray(R[0], dtype=np.float64)).sum()
     + (c1 * fm.asarray(R[1], dtype=np.float64)).sum()).backward()

    def loss():
        hn, cn = ref_cell("LSTM", x, h, c, *(P[k] for k in args))
        return (hn * R[0]).sum() + (cn * R[1]).sum()

    for got, arr, what in [(fx.grad, x, "input"), (fh.grad, h, "h"), (fc.grad, c, "c")] + \
            [(getattr(m, k).grad, P[k], k) for k in args]:
        assert got.dtype == np.float64, what
        picks = [np.unravel_index(i, arr.shape) for i in range(arr.size)]
        np.testing.assert_allclose(np.array([host(got)[i] for i in picks]), fd64(loss, arr, picks),
                                   rtol=1e-7, atol=1e-8, err_msg=what)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (2, True)])
def test_layers_float64_against_numpy_and_finite_differences(device, mode, num_layers,
                                                            bidirectional):
    skip_without_float64(device)
    rng = np.random.default_rng(hash((mode, num_layers, 64)) % 2**32)
    T, B, I, H = 3, 2, 3, 4
    D = 2 if bidirectional else 1
    m = make(mode, I, H, num_layers=num_layers, bidirectional=bidirectional, seed=5).double()
    x = rng.standard_normal((T, B, I))
    h0 = rng.standard_normal((num_layers * D, B, H))
    c0 = rng.standard_normal((num_layers * D, B, H)) if mode == "LSTM" else None
    R = [rng.standard_normal(s) for s in ((T, B, D * H), (num_layers * D, B, H),
                                          (num_layers * D, B, H))]
    fx, fh = f64(x, device), f64(h0, device)
    fc = None if c0 is None else f64(c0, device)
    out, h, c, loss = fm_loss(mode, m, fx, fh, fc,
                              [fm.asarray(r, dtype=np.float64) for r in R])
    assert out.dtype == np.float64 and h.dtype == np.float64
    loss.backward()
    P = params64(m)
    want = ref_forward(mode, P, x, h0, c0, num_layers, bidirectional)
    np.testing.assert_allclose(host(out), want[0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(host(h), want[1], rtol=1e-12, atol=1e-13)
    if mode == "LSTM":
        np.testing.assert_allclose(host(c), want[2], rtol=1e-12, atol=1e-13)

    def ref_loss():
        o, hn, cn = ref_forward(mode, P, x, h0, c0, num_layers, bidirectional)
        return (o * R[0]).sum() + (hn * R[1]).sum() + (0 if cn is None else (cn * R[2]).sum())

    checks = [(host(p.grad), P[k], k) for k, p in m.named_parameters()]
    checks += [(host(fx.grad), x, "input"), (host(fh.grad), h0, "h0")]
    if mode == "LSTM":
        checks.append((host(fc.grad), c0, "c0"))
    for got, arr, what in checks:
        picks = [np.unravel_index(i, arr.shape) for i in
                 rng.choice(arr.size, size=min(arr.size, 8), replace=False)]
        np.testing.assert_allclose(np.array([got[i] for i in picks]), fd64(ref_loss, arr, picks),
                                   rtol=1e-7, atol=1e-8, err_msg=what)


@pytest.mark.cpu_only
def test_float64_msl_products_under_the_emulator(kernels):
    """float64 through the MSL kernels a GPU with double runs (matmul_float64 and the gate
    kernels' _float64 instances, W_hh^T a transposed view) instead of the CPU's GEMM: the
    same results as the native road to rounding, both at the float64 reference. Small: the
    tiled GEMM's barriers run under the fiber emulator."""
    rng = np.random.default_rng(3)
    m = nn.LSTM(3, 4, bidirectional=True, seed=4).double()
    x = rng.standard_normal((3, 2, 3))
    fx = f64(x, "cpu")
    out, _ = m(fx)
    want = ref_forward("LSTM", params64(m), x, np.zeros((2, 2, 4)), np.zeros((2, 2, 4)), 1, True)
    np.testing.assert_allclose(host(out), want[0], rtol=1e-12, atol=1e-13)
    grads_match_the_native_road(m, fx, out, rtol=1e-12, atol=1e-13)


def test_float64_layers_check_the_dtype_of_input_and_states(device):
    skip_without_float64(device)
    lstm = nn.LSTM(3, 4, seed=1).double()
    x32 = fm.zeros((2, 1, 3))
    with pytest.raises(ValueError, match=r"\[fastmetal.nn.LSTM\] expected input of the "
                                         r"parameters' dtype float64, got float32"):
        lstm(x32)
    with pytest.raises(ValueError, match="float32, got float64"):
        nn.GRU(3, 4, seed=1)(fm.zeros((2, 1, 3), dtype=np.float64))
    with pytest.raises(RuntimeError,
                       match=r"\[fastmetal.nn.LSTM\] expected h_0 of the parameters' dtype"):
        lstm(x32.double(), (fm.zeros((1, 1, 4)), fm.zeros((1, 1, 4), dtype=np.float64)))
    cell = nn.GRUCell(3, 4, seed=1).double()
    with pytest.raises(RuntimeError, match=r"\[fastmetal.nn.GRUCell\] expected input of the "
                                           r"parameters' dtype float64"):
        cell(fm.zeros((2, 3)))
    with pytest.raises(RuntimeError, match="expected hx of the parameters' dtype float32"):
        nn.RNNCell(3, 4, seed=1)(fm.zeros((2, 3)), fm.zeros((2, 4), dtype=np.float64))
    # NumPy input (and lists) are converted to the parameters' dtype, as before for float32.
    out, _ = lstm(np.zeros((2, 1, 3), np.float32))
    assert out.dtype == np.float64
    assert nn.LSTM(3, 4, seed=1)(np.zeros((2, 1, 3)))[0].dtype == np.float32
    mixed = nn.LSTM(3, 4, seed=1)
    mixed.weight_hh_l0 = nn.Parameter(mixed.weight_hh_l0.double())
    with pytest.raises(TypeError, match="expected float32 or float64 parameters of one dtype"):
        mixed(x32)
    with pytest.raises(TypeError, match=r"got \['float16'\]"):
        nn.RNNCell(3, 4, seed=1).half()(fm.zeros((2, 3), dtype=np.float16))
    with pytest.raises(TypeError, match="expected float32 or float64 operands of one dtype"):
        fm._core._rnn_layer(fm.zeros((1, 1, 4)), fm.zeros((1, 4)),
                            fm.zeros((4, 4), dtype=np.float64), fm.zeros(4), False, False)


def test_float64_is_refused_where_the_device_has_no_double(device):
    """Apple GPUs have no double: .double() is the TypeError every float64 request gives
    there, raised before any parameter is converted."""
    if fm._core._device_capabilities(device)["float64"]:
        pytest.skip(f"{device} has float64 (the refusal is metal's)")
    m = nn.LSTMCell(3, 4, device=device)
    before = [p for p in m.parameters()]
    with pytest.raises(TypeError, match="Apple GPUs have no double"):
        m.double()
    assert [p for p in m.parameters()] == before and m.weight_ih.dtype == np.float32
    with pytest.raises(TypeError):
        fm.zeros(2, 3, dtype=fm.double, device=device)


@needs_torch
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("num_layers,bidirectional,batch_first", [(1, False, False),
                                                                  (2, True, True)])
def test_layers_float64_against_pytorch(device, mode, num_layers, bidirectional, batch_first):
    skip_without_float64(device)
    torch.manual_seed(3)
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)
    if mode.startswith("RNN"):
        tm = torch.nn.RNN(3, 5, nonlinearity="relu" if mode == "RNN_RELU" else "tanh", **kw)
    else:
        tm = getattr(torch.nn, mode)(3, 5, **kw)
    tm = tm.double()
    m = make(mode, 3, 5, **kw).double()
    load_from_torch(m, tm)
    D = 2 if bidirectional else 1
    x = torch.randn(*((2, 6, 3) if batch_first else (6, 2, 3)), dtype=torch.float64,
                    requires_grad=True)
    h = torch.randn(num_layers * D, 2, 5, dtype=torch.float64, requires_grad=True)
    c = torch.randn(num_layers * D, 2, 5, dtype=torch.float64, requires_grad=True)
    fx, fh, fc = (f64(t.detach().numpy(), device) for t in (x, h, c))
    if mode == "LSTM":
        out, (hn, cn) = tm(x, (h, c))
        fout, (fhn, fcn) = m(fx, (fh, fc))
        (out.sin().sum() + (hn * 3).sum() + (cn ** 2).sum()).backward()
        (fm.sin(fout).sum() + (fhn * 3).sum() + (fcn ** 2).sum()).backward()
        compare(fcn, cn, "c_n", 1e-12)
        compare(fc.grad, c.grad, "c0.grad", 1e-11)
    else:
        out, hn = tm(x, h)
        fout, fhn = m(fx, fh)
        (out.sin().sum() + (hn * 3).sum()).backward()
        (fm.sin(fout).sum() + (fhn * 3).sum()).backward()
    assert fout.dtype == np.float64 and fx.grad.dtype == np.float64
    compare(fout, out, "output", 1e-12)
    compare(fhn, hn, "h_n", 1e-12)
    compare(fx.grad, x.grad, "input.grad", 1e-11)
    compare(fh.grad, h.grad, "h0.grad", 1e-11)
    for name, p in tm.named_parameters():
        compare(getattr(m, name).grad, p.grad, name + ".grad", 1e-11)


@needs_torch
@pytest.mark.parametrize("mode", list(MODES))
def test_cells_float64_against_pytorch(device, mode):
    skip_without_float64(device)
    torch.manual_seed(4)
    kw = {"nonlinearity": "relu"} if mode == "RNN_RELU" else {}
    tm = getattr(torch.nn, CELLS[mode])(4, 5, **kw).double()
    m = make_cell(mode, 4, 5).double()
    load_from_torch(m, tm)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    h = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    c = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    fx, fh, fc = (f64(t.detach().numpy(), device) for t in (x, h, c))
    if mode == "LSTM":
        h1, c1 = tm(x, (h, c))
        fh1, fc1 = m(fx, (fh, fc))
        ((h1 * 2).sum() + (c1 ** 2).sum()).backward()
        ((fh1 * 2).sum() + (fc1 ** 2).sum()).backward()
        compare(fc1, c1, "c'", 1e-13)
        compare(fc.grad, c.grad, "c.grad", 1e-12)
    else:
        h1 = tm(x, h)
        fh1 = m(fx, fh)
        (h1 ** 2).sum().backward()
        (fh1 ** 2).sum().backward()
    assert fh1.dtype == np.float64
    compare(fh1, h1, "h'", 1e-13)
    compare(fx.grad, x.grad, "input.grad", 1e-12)
    compare(fh.grad, h.grad, "h.grad", 1e-12)
    for name, p in tm.named_parameters():
        compare(getattr(m, name).grad, p.grad, name + ".grad", 1e-12)
    no_hx = m(fx)  # hx=None: float64 zeros
    want = tm(x)
    compare(no_hx[0] if mode == "LSTM" else no_hx, want[0] if mode == "LSTM" else want,
            "hx=None", 1e-13)


# ------------------------------------------------------------------ the per-step product
# (M, K, N): the bench's forward and backward step (32 x 256 @ 256 x 1024, 32 x 1024 @
# 1024 x 256: two K blocks), few rows (the dot path for W^T, not packed), K past one block
# with partial panels, a product split over the threads by rows, tiny ones, one column.
STEP_SHAPES = [(32, 256, 1024), (32, 1024, 256), (3, 130, 40), (7, 513, 33), (50, 600, 70),
               (1, 3, 5), (6, 1, 17), (64, 64, 1), (0, 4, 5)]


@pytest.mark.parametrize("transpose_b", [True, False])
def test_per_step_product_equals_matmul_bit_for_bit(device, transpose_b):
    """A layer's per-step products (h_{t-1} @ W_hh^T, dg_t @ W_hh) go through one
    RepeatedMatmul (ops/matmul.h), which packs the weight once for the CPU's GEMM: each
    product equals fm.matmul's bit for bit (the same FMA chain per element) and float64
    NumPy within float32 rounding, NaN and inf included."""
    rng = np.random.default_rng(7)
    for M, K, N in STEP_SHAPES:
        a = rng.standard_normal((3, M, K)).astype(np.float32)
        if M > 1:
            a[1, 1, 0] = np.nan
            a[2, 0, K - 1] = np.inf
        w = rng.standard_normal((N, K) if transpose_b else (K, N)).astype(np.float32)
        fa, fw = fm.asarray(a), fm.asarray(w)
        got = host(fm._core._matmul_repeated(fa, fw, transpose_b))
        assert got.shape == (3, M, N)
        wt = fw.T if transpose_b else fw
        for s in range(3):
            np.testing.assert_array_equal(got[s], host(fm.matmul(fa[s], wt)),
                                          err_msg=f"{(M, K, N)} step {s}")
        w64 = (w.T if transpose_b else w).astype(np.float64)
        with np.errstate(invalid="ignore"):
            want = a.astype(np.float64) @ w64
            scale = np.abs(a.astype(np.float64)) @ np.abs(w64)
        ok = np.isfinite(want)
        np.testing.assert_array_equal(got[~ok], want[~ok].astype(np.float32))  # NaN, inf
        assert (np.abs(got[ok] - want[ok]) <= 1e-4 * scale[ok] + 1e-6).all(), (M, K, N)


def test_per_step_product_float64_and_bad_arguments(device):
    """float64 (the double GEMM, not packed) against NumPy; wrong shapes and mixed dtypes
    raise the op's errors."""
    skip_without_float64(device)
    rng = np.random.default_rng(8)
    a = rng.standard_normal((2, 5, 9))
    w = rng.standard_normal((6, 9))
    got = host(fm._core._matmul_repeated(fm.asarray(a), fm.asarray(w), True))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, a @ w.T, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"matmul_repeated\] expected a \(S, M, K\)"):
        fm._core._matmul_repeated(fm.asarray(a), fm.asarray(w), False)
    with pytest.raises(TypeError, match=r"matmul_repeated\] expected a and b of one dtype"):
        fm._core._matmul_repeated(fm.asarray(a), fm.asarray(w.astype(np.float32)), True)
