"""fastmetal.compile on the benchmarks' models: ResNet-20 (BatchNorm in training mode, SGD
with momentum and weight decay), a 2-layer nn.LSTM (SGD) and the small GPT of bench gpt
(embeddings, causal attention, LayerNorm, AdamW, clip_grad_norm_).

Each runs a few steps eagerly and compiled, from the same weights on the same batches: the
compiled step must be traced (no CompileWarning: nothing in it falls back to eager) and give
the same bits as eager: losses, parameters, buffers (BatchNorm's running statistics and
num_batches_tracked) and optimizer state. Then what an out-of-range token id does inside a
compiled step (the kernels check it on the device: a row of NaN, nothing added to the
gradient, no host read and no out-of-bounds access), while eagerly it stays a ValueError.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from fastmetal.benchmarks import gpt as bench_gpt
from fastmetal.models import resnet20
from references import msl_kernels_on_cpu

kernels = pytest.fixture(msl_kernels_on_cpu)


def _state(model, opt):
    """Every parameter and buffer (state_dict), and every Array of the optimizer's state."""
    out = {k: np.array(v) for k, v in model.state_dict().items()}
    for i, st in enumerate(opt.state.values()):
        for k, v in st.items():
            out[f"opt.{i}.{k}"] = np.array(v) if isinstance(v, fm.Array) else v
    return out


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _steps(step, batches, compiled):
    """Losses (host copies) of step over batches; compiled: under fm.compile, which must trace
    it once and never fall back to eager."""
    run = fm.compile(step) if compiled else step
    with warnings.catch_warnings():
        warnings.simplefilter("error", fm.CompileWarning)
        losses = [np.array(run(*b)) for b in batches]
    if compiled:
        assert run.traces == 1
    return losses


def _resnet_run(device, compiled, steps=4):
    model = resnet20(num_classes=5, width=4, seed=3, device=device)
    opt = fm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    rng = np.random.default_rng(0)
    batches = [(fm.asarray(rng.standard_normal((6, 3, 8, 8)).astype(np.float32), device=device),
                fm.asarray(rng.integers(0, 5, 6), dtype="int64", device=device))
               for _ in range(steps)]
    return _steps(step, batches, compiled), _state(model, opt), len(list(model.parameters()))


def test_resnet20_step_bit_identical(device):
    eager_losses, eager_state, _ = _resnet_run(device, compiled=False)
    losses, state, n_params = _resnet_run(device, compiled=True)
    np.testing.assert_array_equal(np.array(losses), np.array(eager_losses))
    _same(state, eager_state)
    # BatchNorm's buffers moved with every step (4 updates, the same bits as eagerly), and
    # every parameter has its momentum buffer.
    assert state["bn1.num_batches_tracked"] == 4
    assert not np.array_equal(state["bn1.running_mean"], np.zeros(4, np.float32))
    assert sum(k.endswith("momentum_buffer") for k in state) == n_params


def _lstm_run(device, compiled, steps=4):
    lstm = nn.LSTM(6, 8, 2, seed=0, device=device)
    head = nn.Linear(8, 3, seed=1, device=device)
    model = nn.ModuleList([lstm, head])
    opt = fm.optim.SGD(model.parameters(), lr=0.05)
    mse = nn.MSELoss()

    def step(x, y):
        out, _ = lstm(x)
        loss = mse(head(out), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    rng = np.random.default_rng(1)
    batches = [(fm.asarray(rng.standard_normal((5, 3, 6)).astype(np.float32), device=device),
                fm.asarray(rng.standard_normal((5, 3, 3)).astype(np.float32), device=device))
               for _ in range(steps)]
    return _steps(step, batches, compiled), _state(model, opt)


def test_lstm_step_bit_identical(device):
    eager_losses, eager_state = _lstm_run(device, compiled=False)
    losses, state = _lstm_run(device, compiled=True)
    np.testing.assert_array_equal(np.array(losses), np.array(eager_losses))
    _same(state, eager_state)


GPT_CFG = {"vocab": 11, "context": 8, "d_model": 16, "layers": 2, "heads": 2, "batch": 3,
           "batches": 4}


def _gpt(device):
    """bench gpt's model (its weights) with its AdamW and step, at a small size."""
    model = bench_gpt._classes(nn, nn.functional, np.arange)(*bench_gpt._dims(GPT_CFG))
    model.load_state_dict(bench_gpt._weights(model))
    model.to(device)
    params = list(model.parameters())
    opt = fm.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                          {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                         lr=1e-2, betas=(0.9, 0.95))

    def step(x, y):
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        fm.nn.utils.clip_grad_norm_(params, 0.5)  # a small max: the clipping scales
        opt.step()
        return loss
    return model, opt, step


def _gpt_batches(device):
    return [(fm.asarray(x, dtype="int64", device=device), fm.asarray(y, dtype="int64",
                                                                     device=device))
            for x, y in bench_gpt._batches(GPT_CFG)]


def _gpt_run(device, compiled):
    model, opt, step = _gpt(device)
    return _steps(step, _gpt_batches(device), compiled), _state(model, opt)


def test_gpt_step_bit_identical(device):
    eager_losses, eager_state = _gpt_run(device, compiled=False)
    losses, state = _gpt_run(device, compiled=True)
    np.testing.assert_array_equal(np.array(losses), np.array(eager_losses))
    _same(state, eager_state)  # AdamW's moments and step counts included
    assert losses[-1] < losses[0]


def test_gpt_bad_token_id_inside_compile(device):
    """Eagerly a bad id is a ValueError; in a replayed step the kernels check the ids on the
    device: the loss (and through it the parameters) become NaN, nothing is read out of
    bounds, and the step stays compiled."""
    model, opt, step = _gpt(device)
    batches = _gpt_batches(device)
    x, y = bench_gpt._batches(GPT_CFG)[0]
    for bad in (GPT_CFG["vocab"], -1):
        ids = x.copy()
        ids[1, 2] = bad
        with pytest.raises(ValueError, match=r"\[fastmetal.embedding\] expected every id in "
                                             r"input to be in \[0, 11\)"):
            model(fm.asarray(ids, dtype="int64", device=device), batches[0][1])
    run = fm.compile(step)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fm.CompileWarning)
        good = [float(run(*b)) for b in batches[:3]]  # eager, traced, replayed
        assert run.traces == 1 and all(np.isfinite(good))
        ids = x.copy()
        ids[1, 2] = GPT_CFG["vocab"] + 1000
        loss = run(fm.asarray(ids, dtype="int64", device=device), batches[0][1])
    assert np.isnan(float(loss))
    assert np.isnan(np.array(model.tok_emb.weight)).all()  # clipped NaN gradient -> NaN weights


def _lookup_and_grad(device, rows, ids_list, dim=3):
    """A compiled lookup and weight gradient, traced on in-range ids, replayed on each of
    ids_list: (outputs, gradients) of the replays."""
    rng = np.random.default_rng(4)
    w = fm.asarray(rng.standard_normal((rows, dim)).astype(np.float32), device=device)
    w.requires_grad = True
    n = len(ids_list[0])
    g = fm.asarray(rng.standard_normal((n, dim)).astype(np.float32), device=device)

    @fm.compile
    def f(ids):
        out = nn.functional.embedding(ids, w)
        (gw,) = fm.autograd.grad(out, [w], g)
        return out, gw

    good = fm.asarray(np.arange(n) % rows, dtype="int64", device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fm.CompileWarning)
        f(good)
        f(good)
        results = [f(fm.asarray(ids, dtype="int64", device=device)) for ids in ids_list]
    assert f.traces == 1
    return np.array(w), np.array(g), [(np.array(o), np.array(gw)) for o, gw in results]


def _check_lookup_and_grad(device, rows, ids_list):
    w, g, results = _lookup_and_grad(device, rows, ids_list)
    for ids, (out, gw) in zip(ids_list, results):
        ids = np.asarray(ids)
        ok = (ids >= 0) & (ids < rows)
        np.testing.assert_array_equal(out[ok], w[ids[ok]])
        assert np.isnan(out[~ok]).all()
        want = np.zeros_like(w, dtype=np.float64)
        np.add.at(want, ids[ok], g[ok].astype(np.float64))  # bad positions add nothing
        np.testing.assert_allclose(gw, want, rtol=1e-6, atol=1e-6)


# 256 rows: a bad id's sort key (256) needs a ninth bit, a second radix pass.
BAD_ID_CASES = [(11, [[0, 3, 11, 10, -1, 3, 7], [5, -7, 2, 2, 10, 999, 0]]),
                (256, [[255, 0, 256, 17, 255, -3, 4], [1, 2, 3, 4, 5, 6, 1 << 40]])]


@pytest.mark.parametrize("rows, ids_list", BAD_ID_CASES)
def test_embedding_out_of_range_ids_in_replay(device, rows, ids_list):
    _check_lookup_and_grad(device, rows, ids_list)


@pytest.mark.parametrize("rows, ids_list", BAD_ID_CASES)
@pytest.mark.cpu_only
def test_embedding_out_of_range_ids_in_replay_msl_kernels(kernels, rows, ids_list):
    """The same with the MSL kernels (the GPUs' lookup and radix sort) under the emulator."""
    _check_lookup_and_grad("cpu", rows, ids_list)


def _lookup_per_dtype(device, dtype):
    """The lookup moves elements as bits of their width: an out-of-range id's row is the
    dtype's NaN (0 for an integer weight)."""
    w = np.arange(15).reshape(5, 3).astype(dtype)
    wa = fm.asarray(w, dtype=dtype, device=device)
    f = fm.compile(lambda ids: nn.functional.embedding(ids, wa))
    good = fm.asarray(np.array([4, 0, 1, 2]), dtype="int64", device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fm.CompileWarning)
        f(good)
        f(good)
        out = np.array(f(fm.asarray(np.array([4, 5, -1, 2]), dtype="int64", device=device)))
    assert f.traces == 1
    np.testing.assert_array_equal(out[[0, 3]], w[[4, 2]])
    if dtype == "int64":
        np.testing.assert_array_equal(out[1:3], 0)
    else:
        assert np.isnan(out[1:3].astype(np.float32)).all()


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_embedding_out_of_range_ids_in_replay_per_dtype(device, dtype):
    _lookup_per_dtype(device, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
@pytest.mark.cpu_only
def test_embedding_out_of_range_ids_in_replay_per_dtype_msl_kernel(kernels, dtype):
    _lookup_per_dtype("cpu", dtype)
