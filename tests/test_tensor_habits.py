"""PyTorch's tensor habits on fastmetal.Array and PyTorch's function names, beside NumPy's:
each against NumPy float64 (always) and PyTorch (skipped without it), on every device, with
gradients and bad arguments; and PyTorch example-program idioms that run unchanged."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import fastmetal as fm
from helpers import host, needs_torch, torch


def arr(x, device, dtype=np.float32):
    return fm.asarray(np.asarray(x, dtype=dtype), dtype=dtype, device=device)


# ----------------------------------------------------------------------------- size
def test_size_is_numpy_int_and_pytorch_call(device, rng):
    a = arr(rng.standard_normal((2, 3, 4)), device)
    assert a.size == 24 and isinstance(a.size, int) and a.size + 1 == 25
    assert a.size() == (2, 3, 4) and a.size(0) == 2 and a.size(-1) == 4 and a.size(1) == 3
    assert np.size(a) == 24 and len(a) == 2 and range(a.size)[-1] == 23
    assert f"{a.size}" == "24" and repr(a.size) == "24" and np.zeros(a.size).shape == (24,)
    assert pickle.loads(pickle.dumps(a.size)) == 24 and type(pickle.loads(pickle.dumps(a.size))) is int
    assert arr(1.0, device).size() == () and arr(np.zeros((0, 2)), device).size() == (0, 2)
    with pytest.raises(IndexError, match=r"\[fastmetal.Array.size\] expected dim in \[-3, 3\)"):
        a.size(3)
    with pytest.raises(TypeError, match="expected dim to be an int"):
        a.size(1.0)
    assert a.numel() == 24 and a.dim() == 3


# ----------------------------------------------------------------------------- views
def test_view_view_as_and_reshape_as(device, rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    a = arr(x, device)
    np.testing.assert_array_equal(host(a.view(3, 8)), x.reshape(3, 8))
    np.testing.assert_array_equal(host(a.view((2, -1))), x.reshape(2, -1))
    np.testing.assert_array_equal(host(a.view(a.size(0), -1)), x)
    np.testing.assert_array_equal(host(a.view_as(arr(np.zeros(24), device))), x.reshape(-1))
    np.testing.assert_array_equal(host(a.T.reshape_as(a)), x.T.reshape(4, 6))
    with pytest.raises(RuntimeError, match=r"\[fastmetal.Array.view\] expected an Array whose "
                                           r"strides allow shape \(24,\).*use .reshape"):
        a.T.view(-1)
    with pytest.raises(ValueError, match="expected a shape of 24 elements"):
        a.view(5, 5)
    with pytest.raises(TypeError, match="view\\(dtype\\) is not supported"):
        a.view("float16")
    v = a.view(24)  # a view: writes show through
    v[0] = 100.0
    assert host(a)[0, 0] == 100.0


@pytest.mark.parametrize("start,end", [(0, -1), (1, -1), (0, 1), (1, 2), (-2, -1), (2, 2)])
def test_flatten_and_unsqueeze(start, end, device, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    a = arr(x, device)
    want = torch.flatten(torch.tensor(x), start, end).numpy() if torch is not None else \
        x.reshape(x.shape[:start % 3] + (-1,) + x.shape[end % 3 + 1:])
    np.testing.assert_array_equal(host(fm.flatten(a, start, end)), want)
    np.testing.assert_array_equal(host(a.flatten(start, end)), want)
    assert a.flatten().shape == (24,) and fm.flatten(arr(3.0, device)).shape == (1,)
    for d in (0, 1, 3, -1, -4):
        assert a.unsqueeze(d).shape == np.expand_dims(x, d).shape
        assert fm.unsqueeze(a, d).shape == np.expand_dims(x, d).shape
    with pytest.raises(IndexError, match=r"\[fastmetal.unsqueeze\] expected dim in \[-4, 3\]"):
        a.unsqueeze(4)
    with pytest.raises(ValueError, match="expected start_dim <= end_dim"):
        a.flatten(2, 1)


def test_squeeze_expand_t_contiguous(device, rng):
    x = rng.standard_normal((3, 1, 2)).astype(np.float32)
    a = arr(x, device)
    assert a.squeeze(dim=1).shape == (3, 2) and a.squeeze(1).shape == (3, 2)
    assert a.expand(2, 3, 4, 2).shape == (2, 3, 4, 2) and a.expand(-1, 5, -1).shape == (3, 5, 2)
    np.testing.assert_array_equal(host(a.expand(-1, 5, -1)), np.broadcast_to(x, (3, 5, 2)))
    assert a.expand_as(arr(np.zeros((3, 3, 2)), device)).shape == (3, 3, 2)
    with pytest.raises(ValueError, match=r"\[fastmetal.broadcast_to\] expected a shape"):
        a.expand(3, 4, 3)
    np.testing.assert_array_equal(host(a.transpose(0, 2)), np.swapaxes(x, 0, 2))  # PyTorch's
    np.testing.assert_array_equal(host(a.transpose(2, 0, 1)), x.transpose(2, 0, 1))  # NumPy's
    m = arr(x[:, 0], device)
    np.testing.assert_array_equal(host(m.t()), x[:, 0].T)
    assert m.t().contiguous().shape == (2, 3) and m.contiguous() is m
    with pytest.raises(ValueError, match="expected an array of dimension <= 2"):
        a.t()


# ----------------------------------------------------------------------------- reductions
@pytest.mark.parametrize("name", ["sum", "mean", "prod", "max", "min", "var", "std"])
def test_reductions_take_dim_and_keepdim(name, device, rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    a = arr(x, device)
    ref = getattr(np, name)
    # torch.max / min with dim= take one dim (they return indices too)
    for dim in (0, -1) if name in ("max", "min") else (0, -1, (0, 2)):
        want = ref(x.astype(np.float64), axis=dim, keepdims=True)
        got = getattr(a, name)(dim=dim, keepdim=True)
        got = got.values if name in ("max", "min") and isinstance(got, tuple) else got
        np.testing.assert_allclose(host(got), want, rtol=2e-5, atol=1e-6)
        got2 = getattr(fm, name)(a, dim=dim)
        got2 = got2.values if isinstance(got2, tuple) else got2
        np.testing.assert_allclose(host(got2), ref(x.astype(np.float64), axis=dim), rtol=2e-5,
                                   atol=1e-6)
    with pytest.raises(TypeError, match=rf"\[fastmetal.{name}\] expected axis= or dim="):
        getattr(fm, name)(a, axis=0, dim=1)


def test_max_min_with_dim_return_values_and_indices(device, rng):
    x = rng.standard_normal((4, 7)).astype(np.float32)
    a = arr(x, device)
    values, indices = a.max(dim=1)
    np.testing.assert_array_equal(host(values), x.max(1))
    np.testing.assert_array_equal(host(indices), x.argmax(1))
    r = fm.min(a, dim=0, keepdim=True)
    assert r.values.shape == (1, 7) and r.indices.dtype == np.int64
    np.testing.assert_array_equal(host(r.indices), x.argmin(0)[None])
    assert isinstance(a.max(1), fm.Array)  # NumPy's positional axis: the values
    if torch is not None:
        t = torch.tensor(x).max(dim=1)
        np.testing.assert_array_equal(host(indices), t.indices.numpy())


def test_var_std_correction_and_unbiased(device, rng):
    x = rng.standard_normal((5, 6)).astype(np.float32)
    a = arr(x, device)
    for c in (0, 1, 2.5):
        np.testing.assert_allclose(host(fm.var(a, axis=1, correction=c)),
                                   np.var(x.astype(np.float64), axis=1, ddof=c), rtol=1e-5)
        np.testing.assert_allclose(host(a.std(correction=c)),
                                   np.std(x.astype(np.float64), ddof=c), rtol=1e-5)
    np.testing.assert_allclose(host(a.var(dim=0, unbiased=True)), x.var(0, ddof=1), rtol=1e-5)
    with pytest.raises(TypeError, match="expected one of ddof=, correction= and unbiased="):
        fm.var(a, ddof=1, correction=1)
    # The gradient follows correction= (against finite differences of NumPy's var).
    w = a.requires_grad_()
    fm.std(w, axis=1, correction=1).sum().backward()
    xd = x.astype(np.float64)
    want = (xd - xd.mean(1, keepdims=True)) / ((6 - 1) * xd.std(1, ddof=1, keepdims=True))
    np.testing.assert_allclose(host(w.grad), want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_argmax_argmin_dim_keepdim_and_int64(dtype, device, rng):
    x = rng.integers(-5, 5, (3, 8)).astype(dtype)
    x[1, 2] = x[1, 6] = 50  # ties: the first wins
    big = np.array([2**40 + 1, 2**40 + 3, 2**40 + 2, -(2**62)], np.int64)  # not float32-exact
    a = arr(x, device, dtype)
    np.testing.assert_array_equal(host(a.argmax(dim=1)), x.argmax(1))
    np.testing.assert_array_equal(host(a.argmin(dim=0, keepdim=True)), x.argmin(0)[None])
    np.testing.assert_array_equal(host(fm.argmax(a, keepdims=True)),
                                  np.argmax(x, keepdims=True))
    assert int(fm.argmax(a)) == x.argmax() and int(fm.argmin(a)) == x.argmin()
    if dtype == np.int64:
        b = arr(big, device, np.int64)
        assert int(b.argmax()) == 1 and int(b.argmin()) == 3


# ----------------------------------------------------------------------------- methods
UNARY = ["exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu", "sin", "cos", "neg", "floor",
         "ceil", "round", "sign", "log1p", "expm1", "asin", "atan", "sinh", "square"]


@pytest.mark.parametrize("name", UNARY)
def test_elementwise_functions_as_methods(name, device, rng):
    x = rng.uniform(0.1, 0.9, (3, 4)).astype(np.float32)
    a = arr(x, device)
    got = getattr(a, name)()
    fn = {"neg": "negative"}.get(name, name)
    np.testing.assert_array_equal(host(got), host(getattr(fm, fn)(a)))
    if torch is not None:
        np.testing.assert_allclose(host(got), getattr(torch.tensor(x), name)().numpy(),
                                   rtol=3e-6, atol=1e-7)


def test_binary_methods_clamp_and_comparisons(device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y = rng.standard_normal((3, 4)).astype(np.float32)
    a, b = arr(x, device), arr(y, device)
    np.testing.assert_allclose(host(a.pow(2)), x ** 2, rtol=1e-6)
    np.testing.assert_allclose(host(a.add(b)), x + y)
    np.testing.assert_allclose(host(a.mul(b).sub(1).div(2)), (x * y - 1) / 2, rtol=1e-6)
    for name, ref in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less),
                      ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal)):
        np.testing.assert_array_equal(host(getattr(a, name)(b)), ref(x, y).astype(np.float32))
        np.testing.assert_array_equal(host(getattr(a, name)(0.5)), ref(x, 0.5))
    np.testing.assert_array_equal(host(a.clamp(-0.5, 0.5)), np.clip(x, -0.5, 0.5))
    np.testing.assert_array_equal(host(a.clamp(min=0)), np.maximum(x, 0))
    np.testing.assert_array_equal(host(fm.clamp(a, max=0.1)), np.minimum(x, 0.1))
    with pytest.raises(ValueError, match=r"\[fastmetal.clamp\] expected at least one of min"):
        fm.clamp(a)


def test_dtype_methods(device, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32) * 10
    a = arr(x, device)
    assert a.float() is a and a.half().dtype == np.float16 and a.half().float().dtype == np.float32
    np.testing.assert_array_equal(host(a.long()), x.astype(np.int64))
    assert a.long().long().dtype == np.int64
    for name, dtype in (("int", np.int32), ("bool", np.bool_), ("byte", np.uint8),
                        ("double", np.float64)):
        if dtype == np.float64 and device == "metal":
            with pytest.raises(TypeError, match="float64"):
                a.double()
            continue
        got = getattr(a, name)()
        assert got.dtype == dtype
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(host(got), x.astype(np.int64).astype(np.uint8)
                                          if dtype == np.uint8 else x.astype(dtype))
    assert a.to("float16").dtype == np.float16 and a.to(device) is a
    assert a.to(dtype=fm.float16, device=device).dtype == np.float16
    assert a.to(a.long()).dtype == np.int64


def test_cpu_cuda_clone_data_detach(device, rng):
    x = rng.standard_normal(5).astype(np.float32)
    a = arr(x, device).requires_grad_()
    c = a.cpu()
    assert c.device == "cpu" and (c is a) == (device == "cpu")
    if "cuda" not in fm.devices():
        with pytest.raises(RuntimeError, match=r"\[fastmetal.Array.cuda\] expected a cuda device"):
            a.cuda()
    else:
        assert a.cuda().device == "cuda"
    k = a.clone()
    assert k.requires_grad and host(k).tolist() == x.tolist()
    (k * 2).sum().backward()
    np.testing.assert_array_equal(host(a.grad), np.full(5, 2.0, np.float32))
    d = a.data
    assert not d.requires_grad and d.is_leaf
    with fm.no_grad():
        d.fill_(3.0)  # the same memory, as PyTorch's .data
    assert host(a).tolist() == [3.0] * 5
    z = arr(x, device)
    assert z.zero_() is z and host(z).tolist() == [0.0] * 5


def test_split_and_chunk(device, rng):
    x = rng.standard_normal((7, 4)).astype(np.float32)
    a = arr(x, device)
    for size in (1, 2, 3, 7, 10):
        got = a.split(size)
        want = torch.split(torch.tensor(x), size) if torch is not None else \
            [x[i:i + size] for i in range(0, 7, size)]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(host(g), np.asarray(w))
    parts = fm.split(a, [1, 3], dim=1)
    assert [p.shape for p in parts] == [(7, 1), (7, 3)]
    for n in (1, 2, 3, 4, 7, 9):
        got = a.chunk(n)
        want = torch.chunk(torch.tensor(x), n) if torch is not None else None
        if want is not None:
            assert [g.shape for g in got] == [tuple(w.shape) for w in want]
        np.testing.assert_array_equal(np.concatenate([host(g) for g in got]), x)
    with pytest.raises(ValueError, match=r"\[fastmetal.split\] expected section sizes"):
        a.split([2, 2])
    with pytest.raises(ValueError, match=r"\[fastmetal.chunk\] expected chunks > 0"):
        a.chunk(0)
    # Differentiable: the pieces' gradients land in their slices.
    w = arr(x, device).requires_grad_()
    p, q = w.split([3, 4])
    (p.sum() * 2 + q.sum() * 3).backward()
    np.testing.assert_array_equal(host(w.grad), np.repeat([2.0, 3.0], [3, 4])[:, None] *
                                  np.ones((1, 4), np.float32))


def test_mm_matmul_and_format(device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y = rng.standard_normal((4, 2)).astype(np.float32)
    a, b = arr(x, device), arr(y, device)
    np.testing.assert_allclose(host(a.mm(b)), x.astype(np.float64) @ y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(a.matmul(b)), host(a @ b))
    with pytest.raises(ValueError, match=r"\[fastmetal.Array.mm\] expected two 2-D Arrays"):
        a.mm(arr(y[:, 0], device))
    loss = arr(np.float32(0.123456), device)
    assert f"{loss:.4f}" == "0.1235" and f"{loss.item():.4f}" == "0.1235"
    assert f"{arr([2.5], device):.1f}" == "2.5" and "{:>6.2f}".format(loss) == "  0.12"
    assert f"{a}" == str(a)
    with pytest.raises(TypeError, match="expected a one-element Array for format spec"):
        f"{a:.2f}"


# ----------------------------------------------------------------------------- functions
def test_cat_creation_varargs_and_from_numpy(device, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    a = arr(x, device)
    np.testing.assert_array_equal(host(fm.cat([a, a], dim=1)), np.concatenate([x, x], 1))
    np.testing.assert_array_equal(host(fm.cat((a, a))), np.concatenate([x, x]))
    for make, ref in ((fm.zeros, np.zeros), (fm.ones, np.ones)):
        assert make(2, 3).shape == (2, 3) and make((2, 3)).shape == (2, 3)
        assert make([4]).shape == (4,) and make(5).shape == (5,) and make(()).shape == ()
        assert make(2, 3, dtype="float16").dtype == np.float16
        assert make((2, 3), np.int64).dtype == np.int64  # NumPy's positional dtype
        np.testing.assert_array_equal(host(make(2, 2)), ref((2, 2), np.float32))
        assert make(2, requires_grad=True).requires_grad
    assert fm.empty(3, 4).shape == (3, 4) and fm.full((2,), 7).dtype == np.int64
    with pytest.raises(TypeError, match=r"\[fastmetal.zeros\] expected sizes as ints"):
        fm.zeros(2, 3.0)
    labels = np.array([3, 1, 2], np.int64)
    t = fm.from_numpy(labels)
    assert t.dtype == np.int64 and host(t).tolist() == [3, 1, 2]
    assert fm.from_numpy(x.astype(np.float16)).dtype == np.float16
    with pytest.raises(TypeError, match=r"\[fastmetal.from_numpy\] expected a NumPy array of "
                                        r"dtype bool, uint8, int32, int64, float16, float32 or "
                                        r"float64, got int16"):
        fm.from_numpy(np.zeros(2, np.int16))
    with pytest.raises(TypeError, match="expected a numpy.ndarray, got list"):
        fm.from_numpy([1.0])


def test_random_functions(device):
    fm.manual_seed(7)
    a = fm.randn(2, 3)
    fm.manual_seed(7)
    b = fm.randn((2, 3))
    assert a.shape == (2, 3) and a.dtype == np.float32
    np.testing.assert_array_equal(host(a), host(b))  # manual_seed restarts the stream
    fm.manual_seed(7)
    np.testing.assert_array_equal(host(fm.random.normal((2, 3))), host(a))
    u = fm.rand(1000)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0 and abs(float(u.mean()) - 0.5) < 0.05
    r = fm.randint(3, 9, (4000,))
    assert r.dtype == np.int64 and set(np.unique(host(r))) == set(range(3, 9))
    assert fm.randint(5, (3, 2)).shape == (3, 2) and int(fm.randint(5, (50,)).max()) < 5
    z = fm.randn(3, 4, dtype="float16")
    assert fm.randn_like(z).dtype == np.float16 and fm.rand_like(z).shape == (3, 4)
    assert fm.randn(2, requires_grad=True).requires_grad
    with pytest.raises(ValueError, match=r"\[fastmetal.randint\] expected low < high"):
        fm.randint(3, 3, (2,))
    with pytest.raises(TypeError, match=r"\[fastmetal.randn\] expected sizes as ints"):
        fm.randn(2.0)
    with pytest.raises(TypeError, match=r"\[fastmetal.randn_like\] expected a floating Array"):
        fm.randn_like(r)


# ----------------------------------------------------------------------------- examples
def test_pytorch_example_idioms_run_unchanged(device):
    # Lines from pytorch/examples (mnist/main.py's test loop, the training log line, the
    # flattening before a classifier), spelled with fastmetal's import only.
    torch_ = fm  # `import fastmetal as torch`: the lines below are PyTorch's own
    F = fm.nn.functional
    torch_.manual_seed(1)
    data = torch_.randn(8, 1, 4, 4)
    target = torch_.from_numpy(np.array([0, 1, 2, 3, 0, 1, 2, 3], np.int64))
    model = fm.nn.Linear(16, 4)
    x = data.view(data.size(0), -1)
    output = F.log_softmax(model(x), dim=1)
    test_loss = F.nll_loss(output, target, reduction='sum').item()
    pred = output.argmax(dim=1, keepdim=True)
    correct = pred.eq(target.view_as(pred)).sum().item()
    loss = F.nll_loss(output, target)
    line = 'Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
        1, 8, 64, 100. * 8 / 64, loss.item())
    assert line.endswith(f"{loss.item():.6f}") and f"{loss:.4f}" == f"{loss.item():.4f}"
    logp = np.asarray(host(output), np.float64)
    assert correct == int((logp.argmax(1) == host(target)).sum())
    assert abs(test_loss + logp[np.arange(8), host(target)].sum()) < 1e-4
    # torch.flatten(x, 1) and x.flatten(1) before a classifier; torch.cat of features
    feats = torch_.cat([torch_.flatten(data, 1), data.flatten(1)], dim=1)
    assert feats.shape == (8, 32)
    _, predicted = torch_.max(output.detach(), dim=1)
    np.testing.assert_array_equal(host(predicted), logp.argmax(1))


# ------------------------------------------------------------- torch.device, torch.accelerator
def test_device_is_the_name_with_pytorchs_type_and_index(device):
    d = fm.device(device)
    assert d == device and isinstance(d, str) and d.type == device and d.index is None
    assert type(d.type) is str and hash(d) == hash(device)
    d0 = fm.device(f"{device}:0")
    assert d0 == device and d0.index == 0 and repr(d0) == f"device(type='{device}', index=0)"
    assert fm.device(device, 0) == d0 and fm.device(d0) is d0
    with pytest.raises(ValueError, match="PyTorch's 'mps', Apple's GPU, is fastmetal's Metal"):
        fm.device("mps")
    assert pickle.loads(pickle.dumps(d0)) == device and pickle.loads(pickle.dumps(d0)).index == 0
    # Every function that takes a device name takes one, as Module.to and Array.to do.
    x = fm.zeros(3, device=d0)
    assert x.device == device and fm.asarray(np.ones(2, np.float32)).to(d0).device == device
    model = fm.nn.Linear(2, 3).to(fm.device(device))
    assert model.weight.device == device
    np.testing.assert_array_equal(host(fm.ones(2, device=d) + x[:2]), [1.0, 1.0])


def test_device_as_context_sets_the_default_device(device):
    before = fm.default_device()
    with fm.device(device) as d:
        assert d == device and fm.default_device() == device
        assert fm.zeros(2).device == device
        with fm.device("cpu"):
            assert fm.zeros(2).device == "cpu"
        assert fm.default_device() == device
    assert fm.default_device() == before


def test_device_bad_names():
    with pytest.raises(ValueError, match=r"\[fastmetal.device\] expected a device kind .* got 'gpu'"):
        fm.device("gpu")
    with pytest.raises(ValueError, match="one cuda device per process, index 0, got index 1"):
        fm.device("cuda:1")
    with pytest.raises(ValueError, match="non-negative integer index, got 'cpu:-1'"):
        fm.device("cpu:-1")
    with pytest.raises(ValueError, match="the index is given twice"):
        fm.device("cpu:0", 0)
    with pytest.raises(ValueError, match="expected index to be a non-negative int, got True"):
        fm.device("cpu", True)
    with pytest.raises(TypeError, match=r"\[fastmetal.device\] expected a device name, .* got int"):
        fm.device(0)
    # Making one does not ask whether it is present (PyTorch's); using it does.
    absent = [k for k in ("cuda", "metal") if k not in fm.devices()]
    for kind in absent:
        with pytest.raises(ValueError, match=f"unknown or unavailable device '{kind}'"):
            fm.zeros(2, device=fm.device(kind))


def test_accelerator_is_the_first_gpu_of_devices():
    gpus = [d for d in fm.devices() if d != "cpu"]
    acc = fm.accelerator.current_accelerator()
    assert fm.accelerator.is_available() == bool(gpus)
    assert fm.accelerator.device_count() == (1 if gpus else 0)
    assert fm.accelerator.current_device_index() == (0 if gpus else -1)
    if gpus:
        assert isinstance(acc, fm.device) and acc == gpus[0] and acc.type == gpus[0]
        fm.accelerator.synchronize()
        fm.accelerator.synchronize(acc)
    else:
        assert acc is None
        fm.accelerator.synchronize()  # nothing to wait for
    fm.accelerator.synchronize("cpu")


def test_pytorch_examples_device_idiom_runs_unchanged():
    # pytorch/examples mnist/main.py and vae/main.py, as written there (with fm for torch).
    torch_ = fm
    use_accel = torch_.accelerator.is_available()
    if use_accel:
        dev = torch_.accelerator.current_accelerator()
    else:
        dev = torch_.device("cpu")
    model = fm.nn.Linear(4, 2).to(dev)
    data = fm.asarray(np.ones((3, 4), np.float32)).to(dev)
    assert model(data).device == dev.type and dev.type in fm.devices()
