"""What only the CUDA backend has. Every op, layout, dtype, out= and thread test runs on cuda
through the `device` fixture (tests/conftest.py); this file keeps the CUDA-specific facts:
grids over CUDA's 65535-block limit, results copied to NumPy (device memory is not
host-visible), and sharing memory with PyTorch and CuPy through __cuda_array_interface__ and
DLPack.
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


def test_dlpack_export_shares_device_memory():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = fm.sqrt(fm.asarray(x, device="cuda"))  # queued work: the export must wait for it
    assert a.__dlpack_device__() == (2, 0)
    t = torch.from_dlpack(a)
    assert t.device.type == "cuda" and tuple(t.shape) == (3, 4) and t.dtype == torch.float32
    np.testing.assert_allclose(t.cpu().numpy(), np.sqrt(x), rtol=1e-6)
    t.add_(1)  # the same memory
    torch.cuda.synchronize()
    np.testing.assert_allclose(np.asarray(a), np.sqrt(x) + 1, rtol=1e-6)
    # a strided view keeps its strides (in elements); the tensor outlives the Array object
    v = a[:, 1::2]
    tv = torch.from_dlpack(v)
    assert tuple(tv.stride()) == (4, 2)
    del a, v
    np.testing.assert_allclose(tv.cpu().numpy(), (np.sqrt(x) + 1)[:, 1::2], rtol=1e-6)
    # every dtype fastmetal keeps on the device
    for dt, tdt in ((np.float16, torch.float16), (np.int64, torch.int64)):
        d = fm.asarray(np.arange(5).astype(dt), device="cuda", dtype=dt)
        td = torch.from_dlpack(d)
        assert td.dtype == tdt and td.cpu().numpy().tolist() == np.arange(5).astype(dt).tolist()
    # what DLPack cannot carry is a BufferError, not garbage
    b = fm.asarray(x, device="cuda")
    with pytest.raises(BufferError, match="negative strides"):
        b[::-1].__dlpack__()
    with pytest.raises(BufferError, match="copy=True"):
        b.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="dl_device"):
        b.__dlpack__(dl_device=(1, 0))
    # an unconsumed capsule frees its tensor (and its reference to the Array) when dropped
    import sys  # noqa: PLC0415
    before = sys.getrefcount(b)
    cap = b.__dlpack__()
    assert sys.getrefcount(b) == before + 1
    del cap
    assert sys.getrefcount(b) == before


def test_dlpack_export_to_cupy():
    cupy = pytest.importorskip("cupy")
    x = np.linspace(-1, 1, 10, dtype=np.float32)
    a = fm.exp(fm.asarray(x, device="cuda"))
    c = cupy.from_dlpack(a)
    np.testing.assert_allclose(cupy.asnumpy(c), np.exp(x), rtol=1e-6)
    c *= 2  # the same memory
    cupy.cuda.runtime.deviceSynchronize()
    np.testing.assert_allclose(np.asarray(a), 2 * np.exp(x), rtol=1e-6)
