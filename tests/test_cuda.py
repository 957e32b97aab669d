"""What only the CUDA backend has. Every op, layout, dtype, out= and thread test runs on cuda
through the `device` fixture (tests/conftest.py); this file keeps the CUDA-specific facts:
grids over CUDA's 65535-block limit, results copied to NumPy (device memory is not
host-visible), and sharing memory with PyTorch through __cuda_array_interface__.
Skipped where there is no CUDA device."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif("cuda" not in fm.devices(), reason="no CUDA device")]


def test_grids_beyond_65535_blocks_along_y():
    # 200,000 rows of a 2-D strided op: more than 65535 blocks along y, launched in slabs.
    rng = np.random.default_rng(8)
    tall = rng.standard_normal((200_000, 3)).astype(np.float32)
    a = fm.asarray(tall, device="cuda")
    flipped = fm.asarray(tall[:, ::-1], device="cuda")
    np.testing.assert_array_equal(np.asarray(fm.subtract(flipped, a)), tall[:, ::-1] - tall)
    before = fm.default_device()
    fm.set_default_device("cuda")
    try:  # strided NumPy views go through the n-D kernels, with the same grid
        np.testing.assert_array_equal(fm.subtract(tall[:, ::-1], tall), tall[:, ::-1] - tall)
    finally:
        fm.set_default_device(before)
    out = np.empty((200_000, 3), np.float32)
    assert fm.exp(a, out=out) is out
    np.testing.assert_allclose(out, np.exp(tall.astype(np.float64)), rtol=8 * np.finfo(np.float32).eps)


def test_numpy_results_are_copies_of_device_memory():
    x = np.ones(1000, np.float32)
    a = fm.asarray(x, device="cuda")
    assert a.device == "cuda" and not np.shares_memory(np.asarray(a), x)
    r = fm.exp(a)
    assert isinstance(r, fm.Array) and r.device == "cuda"
    np.testing.assert_allclose(np.asarray(r), np.e, rtol=1e-6)
    with pytest.raises(BufferError):
        memoryview(r)  # no buffer protocol on device memory


def test_cuda_array_interface():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = fm.sqrt(fm.asarray(x, device="cuda"))
    t = torch.as_tensor(a, device="cuda")
    np.testing.assert_allclose(t.cpu().numpy(), np.sqrt(x), rtol=1e-6)
    t.add_(1)  # shares memory with the fastmetal array
    torch.cuda.synchronize()
    np.testing.assert_allclose(np.asarray(a), np.sqrt(x) + 1, rtol=1e-6)
