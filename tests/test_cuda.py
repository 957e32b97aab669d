"""The CUDA backend: the same kernels on an NVIDIA GPU. Skipped where there is none."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal._optable import OPS

from references import numpy_reference

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif("cuda" not in fm.devices(), reason="no CUDA device")]

RTOL = 8 * np.finfo(np.float32).eps


def check(got, ref, rtol=RTOL, dtype=np.float32):
    got = np.asarray(got)
    with np.errstate(all="ignore"):
        want = ref.astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=4 * np.finfo(dtype).tiny, equal_nan=True)


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_every_op_on_cuda(spec):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((37, 301)) * 5).astype(np.float32)
    y = (rng.random((37, 301)) * 3 + 0.1).astype(np.float32)
    args = (x,) if spec.arity == 1 else (y, x)
    dev = [fm.asarray(a, device="cuda") for a in args]
    got = getattr(fm, spec.name)(*dev)
    assert isinstance(got, fm.Array) and got.device == "cuda"
    check(got, numpy_reference(spec, *(a.astype(np.float64) for a in args)))
    # float16 on the GPU
    got16 = getattr(fm, spec.name)(*(fm.asarray(a, dtype="float16", device="cuda") for a in args))
    ref16 = numpy_reference(spec, *(a.astype(np.float16).astype(np.float64) for a in args))
    check(got16, ref16, rtol=2e-3, dtype=np.float16)


def test_layouts_on_cuda():
    rng = np.random.default_rng(8)
    fm.set_default_device("cuda")
    try:
        x = rng.standard_normal((40, 1, 70)).astype(np.float32)[:, :, ::-1]
        y = rng.standard_normal((33, 70)).astype(np.float32)
        check(fm.add(x, y), x.astype(np.float64) + y)                      # strided 3-D
        z = rng.standard_normal((3, 4, 5, 6, 7)).astype(np.float32).transpose(4, 2, 0, 3, 1)
        check(fm.multiply(z, 2.5), z.astype(np.float64) * 2.5)              # general n-D
        w = rng.standard_normal(1_000_003).astype(np.float32)
        check(fm.maximum(w, w[::-1]), np.maximum(w, w[::-1]).astype(np.float64))
        tall = rng.standard_normal((200_000, 3)).astype(np.float32)        # > 65535 blocks in y
        check(fm.subtract(tall[:, ::-1], tall), tall[:, ::-1].astype(np.float64) - tall)
        out = np.empty((200_000, 3), np.float32)
        assert fm.exp(tall, out=out) is out                                 # copied back
        check(out, np.exp(tall.astype(np.float64)))
        dev_out16 = fm.empty((200_000, 3), dtype="float16", device="cuda")
        assert fm.exp(fm.asarray(tall), out=dev_out16) is dev_out16       # cast into a device Array
        check(dev_out16, np.exp(tall.astype(np.float64)), rtol=2e-3, dtype=np.float16)
        e = fm.exp(np.ones((0, 3), np.float32))
        assert e.shape == (0, 3)
    finally:
        fm.set_default_device("cpu")


def test_cuda_array_interface():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = fm.sqrt(fm.asarray(x, device="cuda"))
    t = torch.as_tensor(a, device="cuda")
    np.testing.assert_allclose(t.cpu().numpy(), np.sqrt(x), rtol=1e-6)
    t.add_(1)  # shares memory with the fastmetal array
    np.testing.assert_allclose(np.asarray(a), np.sqrt(x) + 1, rtol=1e-6)
