"""embedding (a gather of weight rows), its gradient (a deterministic device-side
scatter-add: metal/embedding.metal's radix sort + row sums, and the CPU's counting sort) and
one_hot, through the private _core._embedding / _embedding_backward / _one_hot entries, on
every device, against NumPy references written independently here."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core
from fastmetal.nn import functional as F

from references import msl_kernels_on_cpu

kernels = pytest.fixture(msl_kernels_on_cpu)

try:
    import torch
except ImportError:  # the NumPy references still run
    torch = None


def host(a):
    return a.numpy() if isinstance(a, fm.Array) else np.asarray(a)


def grad_ref(g, ids, rows, padding_idx=None):
    """float64 scatter-add of the output gradient into the rows its ids name."""
    dim = g.shape[-1]
    out = np.zeros((rows, dim))
    np.add.at(out, np.asarray(ids).ravel(), np.asarray(g, np.float64).reshape(np.asarray(ids).size, dim))
    if padding_idx is not None:
        out[padding_idx] = 0
    return out


def grad_in_order(g, ids, rows, padding_idx=None):
    """The float32 sums the kernels promise, bit for bit: row v is 0.0f plus its positions'
    gradient rows in increasing position order."""
    dim = g.shape[-1]
    flat = np.asarray(ids).ravel()
    gg = np.asarray(g, np.float32).reshape(flat.size, dim)
    out = np.zeros((rows, dim), np.float32)
    for p, v in enumerate(flat):
        if v != padding_idx:
            out[v] += gg[p]
    return out


def check_grad(got, g, ids, rows, padding_idx=None):
    got = host(got)
    assert got.dtype == np.float32 and got.shape == (rows, g.shape[-1])
    want = grad_ref(g, ids, rows, padding_idx)
    scale = grad_ref(np.abs(g), ids, rows, padding_idx)
    assert (np.abs(got - want) <= 1e-5 * scale + 1e-6).all()
    np.testing.assert_array_equal(got, grad_in_order(g, ids, rows, padding_idx))


# ----------------------------------------------------------------------------- forward
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_forward(device, dtype):
    r = np.random.default_rng(1)
    weight = (r.standard_normal((17, 5)) * 10).astype(dtype)
    for ids in (r.integers(0, 17, (4, 6)), r.integers(0, 17, 9).astype(np.int32),
                np.array(3, np.int64), r.integers(0, 17, (2, 0, 3)),
                r.integers(0, 17, (3, 2)).astype(np.uint8), [[1, 2], [16, 0]]):
        out = _core._embedding(ids, weight)
        want = weight[np.asarray(ids)]
        # the weight's dtype, whatever it is (API.md's dtype rule)
        assert host(out).dtype == dtype
        np.testing.assert_array_equal(host(out), want)
    # fastmetal Arrays in, an Array of the weight's dtype on the device out
    ids = r.integers(0, 17, (3, 4))
    out = _core._embedding(fm.asarray(ids, dtype="int64"),
                           fm.asarray(weight, dtype=np.dtype(dtype).name))
    assert isinstance(out, fm.Array) and out.device == device and out.dtype == dtype
    np.testing.assert_array_equal(out.numpy(), weight[ids])


def test_forward_bad_input(device):
    w = np.zeros((5, 3), np.float32)
    with pytest.raises(ValueError, match=r"\[fastmetal.embedding\] expected every id in input "
                                         r"to be in \[0, 5\).*got 5"):
        _core._embedding(np.array([0, 5]), w)
    with pytest.raises(ValueError, match=r"got -1"):
        _core._embedding(np.array([[0], [-1]]), w)
    with pytest.raises(TypeError, match=r"\[fastmetal.embedding\] expected input \(the ids\) to "
                                        r"be integers, got dtype float32"):
        _core._embedding(np.array([0.0], np.float32), w)
    with pytest.raises(TypeError, match=r"to be an integer Array or integers, got a float32 Array"):
        _core._embedding(fm.asarray(np.array([0.0], np.float32)), w)
    with pytest.raises(ValueError, match=r"expected a 2-D weight"):
        _core._embedding(np.array([0]), np.zeros(5, np.float32))


# ----------------------------------------------------------------------------- gradient
GRAD_CASES = [
    ((16, 64), 65, 64, None),        # the benchmark's shape
    ((16, 64), 65, 64, 0),
    ((5,), 1, 3, None),              # one row: no radix pass at all
    ((3, 7), 300, 4, 299),           # two passes (rows > 256)
    ((1000,), 7, 2, 3),              # long runs per row, several sort blocks
    ((2, 0), 4, 3, None),            # no ids: a zero gradient
    ((4,), 5, 0, None),              # embedding_dim 0
    ((600,), 70000, 3, 12345),       # three passes (rows > 65536)
]


@pytest.mark.parametrize("case", range(len(GRAD_CASES)))
def test_gradient(device, case):
    shape, rows, dim, padding_idx = GRAD_CASES[case]
    r = np.random.default_rng(case)
    ids = r.integers(0, rows, shape)
    if padding_idx is not None and ids.size:
        ids.flat[::3] = padding_idx  # the padding row is used, and gets nothing
    g = r.standard_normal((*shape, dim)).astype(np.float32)
    got = _core._embedding_backward(g, ids, rows, -1 if padding_idx is None else padding_idx)
    check_grad(got, g, ids, rows, padding_idx)
    # Arrays in: an Array out on the device
    got = _core._embedding_backward(fm.asarray(g), fm.asarray(ids, dtype="int64"), rows,
                                    -1 if padding_idx is None else padding_idx)
    assert isinstance(got, fm.Array) and got.device == device
    check_grad(got, g, ids, rows, padding_idx)


def test_gradient_non_finite(device):
    ids = np.array([1, 1, 2, 0, 2])
    g = np.ones((5, 2), np.float32)
    g[0, 0], g[2, 1], g[4, 1] = np.inf, np.nan, -np.inf
    got = host(_core._embedding_backward(g, ids, 3, -1))
    assert got[1, 0] == np.inf and got[1, 1] == 2 and np.isnan(got[2, 1]) and got[2, 0] == 2


def test_gradient_bad_input(device):
    g = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"\[fastmetal.embedding_backward\] expected every id "
                                         r"in input to be in \[0, 4\)"):
        _core._embedding_backward(g, np.array([0, 4]), 4, -1)
    with pytest.raises(ValueError, match=r"expected padding_idx in \[0, 4\) or -1"):
        _core._embedding_backward(g, np.array([0, 1]), 4, 4)
    with pytest.raises(ValueError, match=r"expected grad_output of shape \(2, 3\)"):
        _core._embedding_backward(np.zeros((3, 3), np.float32), np.array([0, 1]), 4, -1)
    with pytest.raises(ValueError, match=r"expected grad_output of shape input.shape \+ "):
        _core._embedding_backward(np.zeros(3, np.float32), np.array([0, 1]), 4, -1)
    with pytest.raises(ValueError, match=r"expected num_embeddings in \[1, 2\*\*31\)"):
        _core._embedding_backward(g, np.array([0, 1]), 0, -1)


@pytest.mark.parametrize("case", range(len(GRAD_CASES)))
@pytest.mark.parametrize("threads", [0, 1, 37, 256, 1024])
@pytest.mark.cpu_only
def test_msl_kernels_under_the_emulator(kernels, case, threads):
    """The radix sort and row sums (threadgroup memory, barriers) under the fiber emulator at
    group sizes below, at and above the sort block: the same bits as the CPU's own path."""
    shape, rows, dim, padding_idx = GRAD_CASES[case]
    if threads == 1 and np.prod(shape) > 100:
        pytest.skip("one thread per group: only the small cases (slow under the emulator)")
    _core._set_kernel_group_size(threads)
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(case + threads)
    r = np.random.default_rng(case)
    ids = r.integers(0, rows, shape)
    g = r.standard_normal((*shape, dim)).astype(np.float32)
    pad = -1 if padding_idx is None else padding_idx
    got = host(_core._embedding_backward(g, ids, rows, pad))
    check_grad(got, g, ids, rows, padding_idx)
    _core._set_native_cpu(True)
    np.testing.assert_array_equal(got, host(_core._embedding_backward(g, ids, rows, pad)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
@pytest.mark.cpu_only
def test_forward_msl_kernel(kernels, dtype):
    """The lookup's MSL kernel (the CPU otherwise copies rows), for each element width."""
    r = np.random.default_rng(2)
    w = (r.standard_normal((33, 7)) * 100).astype(dtype)
    ids = r.integers(0, 33, (5, 9))
    out = _core._embedding(fm.asarray(ids, dtype="int64"), fm.asarray(w, dtype=dtype))
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.numpy(), w[ids])
    # a non-contiguous weight is gathered first
    wide = fm.asarray(np.repeat(w, 2, axis=1), dtype=dtype)[:, ::2]
    np.testing.assert_array_equal(_core._embedding(ids, wide).numpy(), w[ids])


DIGEST = (
    "import hashlib, numpy as np, fastmetal as fm\n"
    "from fastmetal import _core\n"
    "fm.set_default_device('cpu')\n"
    "_core._set_native_cpu({native})\n"
    "r = np.random.default_rng(5)\n"
    "outs = []\n"
    "for shape, rows, dim in (((16, 64), 65, 64), ((3000,), 70000, 5), ((50, 40), 9, 130)):\n"
    "    ids = r.integers(0, rows, shape)\n"
    "    g = r.standard_normal((*shape, dim)).astype(np.float32)\n"
    "    outs.append(_core._embedding_backward(g, ids, rows, 1))\n"
    "print(hashlib.sha256(b''.join(o.tobytes() for o in outs)).hexdigest())\n")


@pytest.mark.cpu_only
def test_bit_identical_across_thread_counts_and_paths(device):
    """The gradient's bits do not depend on FASTMETAL_NUM_THREADS, nor on the path (the CPU's
    counting sort or the MSL kernels)."""
    digests = set()
    for threads, native in (("1", True), ("2", True), ("3", True), ("2", False)):
        env = dict(os.environ, FASTMETAL_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, "-c", DIGEST.format(native=native)], env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        digests.add(out.stdout.split()[-1])
    assert len(digests) == 1, digests


def test_repeated_runs_identical(device):
    r = np.random.default_rng(9)
    ids = r.integers(0, 40, (8, 300))
    g = r.standard_normal((8, 300, 33)).astype(np.float32)
    first = hashlib.sha256(host(_core._embedding_backward(g, ids, 40, -1)).tobytes()).digest()
    for _ in range(3):
        again = hashlib.sha256(host(_core._embedding_backward(g, ids, 40, -1)).tobytes())
        assert again.digest() == first


# ----------------------------------------------------------------------------- one_hot
def test_one_hot(device):
    r = np.random.default_rng(3)
    for ids, n in ((r.integers(0, 6, (3, 4)), 6), (r.integers(0, 6, 7), 10),
                   (np.array(2), 3), (np.zeros((0, 2), np.int64), 4)):
        got = host(_core._one_hot(ids, n))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.eye(n, dtype=np.int64)[ids])
    ids = np.array([[0, 4], [2, 1]])
    np.testing.assert_array_equal(host(_core._one_hot(fm.asarray(ids, dtype="int64"))),
                                  np.eye(5, dtype=np.int64)[ids])


def test_one_hot_bad_input(device):
    with pytest.raises(ValueError, match=r"\[fastmetal.one_hot\] expected class values smaller "
                                         r"than num_classes = 3, got 3"):
        _core._one_hot(np.array([0, 3]), 3)
    with pytest.raises(ValueError, match=r"expected non-negative class values"):
        _core._one_hot(np.array([0, -1]), 3)
    with pytest.raises(ValueError, match=r"expected num_classes to be given for an empty input"):
        _core._one_hot(np.zeros(0, np.int64), -1)
    with pytest.raises(TypeError, match=r"\[fastmetal.one_hot\] expected input \(the ids\) to be "
                                        r"integers"):
        _core._one_hot(np.array([0.5]), 3)


# ----------------------------------------------------------------------------- PyTorch
@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
def test_against_torch(device):
    r = np.random.default_rng(4)
    ids = r.integers(0, 65, (16, 64))
    w = r.standard_normal((65, 64)).astype(np.float32)
    tw = torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.embedding(torch.tensor(ids), tw, padding_idx=7)
    np.testing.assert_array_equal(host(_core._embedding(ids, w)), ty.detach().numpy())
    g = r.standard_normal(ty.shape).astype(np.float32)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(host(_core._embedding_backward(g, ids, 65, 7)), tw.grad.numpy(),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(host(_core._one_hot(ids, 65)),
                                  torch.nn.functional.one_hot(torch.tensor(ids), 65).numpy())


def renorm_reference(w, ids, max_norm, p):
    """PyTorch's embedding_renorm_ in float64: each distinct picked row longer than max_norm
    scaled by max_norm / (norm + 1e-7)."""
    w = w.astype(np.float64).copy()
    for i in np.unique(ids):
        norm = np.abs(w[i]).max() if np.isinf(p) else (np.abs(w[i]) ** p).sum() ** (1 / p)
        if norm > max_norm:
            w[i] *= max_norm / (norm + 1e-7)
    return w


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_max_norm_shortens_the_picked_rows_in_place(device, norm_type):
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((13, 5)) * 3).astype(np.float32)
    w[4] *= 0.01  # a picked row already short: untouched
    ids = np.array([[1, 2, 2, 4], [12, 1, 0, 4]])
    weight = fm.nn.Parameter(fm.asarray(w, device=device))
    out = F.embedding(fm.asarray(ids, device=device), weight, max_norm=1.5, norm_type=norm_type)
    want = renorm_reference(w, ids, 1.5, norm_type)
    np.testing.assert_allclose(host(weight), want, rtol=2e-6, atol=1e-7)  # in place
    np.testing.assert_allclose(host(out), want[ids], rtol=2e-6, atol=1e-7)
    untouched = np.setdiff1d(np.arange(13), ids)
    np.testing.assert_array_equal(host(weight)[untouched], w[untouched])
    # The gradient is the plain lookup's: one row of g per position, summed per id.
    g = rng.standard_normal(out.shape).astype(np.float32)
    out.backward(fm.asarray(g, device=device))
    check_grad(host(weight.grad), g, ids, 13)
    if torch is not None:
        tw = torch.tensor(w)
        to = torch.nn.functional.embedding(torch.tensor(ids), tw, max_norm=1.5,
                                           norm_type=norm_type)
        np.testing.assert_allclose(host(out), to.numpy(), rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(host(weight), tw.numpy(), rtol=2e-6, atol=1e-7)


def test_ids_out_of_range_are_pytorchs_index_error_and_a_value_error(device):
    w = fm.asarray(np.zeros((4, 2), np.float32), device=device)
    for ids in (np.array([1, 4]), fm.asarray(np.array([-1, 0]), device=device)):
        with pytest.raises(IndexError, match=r"\[fastmetal.embedding\] expected every id") as caught:
            F.embedding(ids, w)
        assert isinstance(caught.value, ValueError)
    if torch is not None:
        with pytest.raises(IndexError):
            torch.nn.functional.embedding(torch.tensor([4]), torch.zeros(4, 2))


def test_embedding_module_max_norm_and_unbuilt_options(device):
    layer = fm.nn.Embedding(20, 6, max_norm=1.0, seed=3, device=device)
    assert "max_norm=1.0" in repr(layer)
    ids = np.array([3, 5, 3, 19])
    out = host(layer(ids))
    np.testing.assert_array_less(np.linalg.norm(out, axis=1), 1.0 + 1e-6)
    assert np.all(np.linalg.norm(host(layer.weight)[[3, 5, 19]], axis=1) <= 1.0 + 1e-6)
    with pytest.raises(NotImplementedError, match=r"scale_grad_by_freq=True is not built"):
        fm.nn.Embedding(4, 2, scale_grad_by_freq=True)
    with pytest.raises(NotImplementedError, match=r"\[fastmetal.embedding\] sparse=True"):
        F.embedding(np.array([0]), layer.weight, sparse=True)
    with pytest.raises(ValueError, match=r"expected max_norm > 0, got -1.0"):
        F.embedding(np.array([0]), layer.weight, max_norm=-1.0)
    with pytest.raises(ValueError, match=r"\[fastmetal.embedding\]"):  # ids checked first
        F.embedding(np.array([20]), layer.weight, max_norm=1.0)
