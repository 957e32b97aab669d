"""fastmetal.Array, zero-copy interop, devices, allocation lifetime."""
from __future__ import annotations

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import fastmetal as fm


def test_devices_and_default():
    devs = fm.devices()
    assert devs[-1] == "cpu" and len(set(devs)) == len(devs)
    assert fm.default_device() in devs
    before = fm.default_device()
    try:
        fm.set_default_device("cpu")
        assert fm.default_device() == "cpu"
        with pytest.raises(ValueError, match=r"unknown or unavailable device 'tpu'; available: .*'cpu'"):
            fm.set_default_device("tpu")
        assert fm.default_device() == "cpu"
    finally:
        fm.set_default_device(before)


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_fastmetal_device_environment_variable():
    ok = run_python("import fastmetal as fm; print(fm.default_device())", FASTMETAL_DEVICE="cpu")
    assert ok.returncode == 0 and ok.stdout.strip() == "cpu"
    bad = run_python("import fastmetal as fm\n"
                     "try:\n    fm.default_device()\nexcept ValueError as e:\n    print('VE', e)\n"
                     "fm.set_default_device('cpu'); print(fm.default_device())",
                     FASTMETAL_DEVICE="quantum")
    assert bad.returncode == 0, bad.stderr
    assert "VE [fastmetal] FASTMETAL_DEVICE='quantum' is not an available device; available:" in bad.stdout
    assert bad.stdout.strip().endswith("cpu")


def test_array_properties(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = fm.asarray(x)
    assert isinstance(a, fm.Array)
    assert a.shape == (2, 3, 4) and a.ndim == 3 and a.size == 24 and a.nbytes == 96
    assert a.dtype == np.float32 and a.device == device and len(a) == 2
    assert "fastmetal.Array(" in repr(a) and f"device='{device}'" in repr(a)
    np.testing.assert_array_equal(np.asarray(a), x)
    h = fm.asarray(x, dtype="float16")
    assert h.dtype == np.float16 and h.device == device
    np.testing.assert_array_equal(np.asarray(h), x.astype(np.float16))
    with pytest.raises(TypeError):
        len(fm.asarray(np.float32(1)))


@pytest.mark.host_visible
def test_buffer_protocol(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    mv = memoryview(fm.asarray(x))
    assert mv.format == "f" and mv.shape == (2, 3, 4) and not mv.readonly
    assert memoryview(fm.asarray(x, dtype="float16")).format == "e"


@pytest.mark.host_visible
def test_asarray_shares_memory_both_ways(device):
    x = np.zeros((5, 7), np.float32)
    a = fm.asarray(x)
    view = np.asarray(a)
    assert np.shares_memory(view, x)
    x[2, 3] = 42.0
    assert view[2, 3] == 42.0
    view[0, 0] = -1.0
    assert x[0, 0] == -1.0
    assert np.shares_memory(a.numpy(), x)
    assert np.shares_memory(np.from_dlpack(a), x)
    assert a.__dlpack_device__() == (1, 0)
    # Strided and negative-stride views are shared too.
    s = x[::-2, 1::3]
    sa = fm.asarray(s)
    assert sa.shape == s.shape and np.shares_memory(np.asarray(sa), x)
    np.testing.assert_array_equal(np.asarray(sa), s)
    # asarray of an Array is the same Array; a dtype change copies.
    assert fm.asarray(a) is a
    b = fm.asarray(a, dtype=np.float16)
    assert b is not a and not np.shares_memory(np.asarray(b), x)
    # NumPy's float64 is kept where the device has it (float32 on metal).
    d = fm.asarray(np.ones(3))
    assert d.dtype == (np.float32 if device == "metal" else np.float64)


def test_empty_zeros_ones(device):
    z = fm.zeros((3, 4))
    assert z.shape == (3, 4) and z.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(z), 0)
    o = fm.ones(5, dtype="float16")
    np.testing.assert_array_equal(np.asarray(o), np.ones(5, np.float16))
    e = fm.empty((2, 0, 3))
    assert e.shape == (2, 0, 3) and e.size == 0
    assert fm.zeros(()).shape == ()
    with pytest.raises(ValueError, match=r"\[fastmetal\.zeros\] expected non-negative dimensions, got shape \(2, -1\)"):
        fm.zeros((2, -1))
    with pytest.raises(TypeError, match=r"\[fastmetal\.ones\] expected shape"):
        fm.ones("abc")
    with pytest.raises(TypeError, match=r"\[fastmetal\.empty\] expected one of fastmetal's dtypes "
                                        r"\(bool, uint8, int32, int64, float16, float32, float64\)"):
        fm.empty(3, dtype="int16")
    with pytest.raises(ValueError, match="unknown or unavailable device"):
        fm.zeros(3, device="nope")


@pytest.mark.host_visible
def test_numpy_in_numpy_out_views_the_output_allocation(device):
    x = np.ones(1000, np.float32)
    r = fm.exp(x)
    assert type(r) is np.ndarray
    assert not r.flags.owndata  # a view of fastmetal's allocation ...
    assert r.ctypes.data % 4096 == 0  # ... which is page-aligned
    assert r.flags.writeable and r.flags.c_contiguous


def test_array_in_array_out(device):
    x = np.linspace(-1, 1, 10, dtype=np.float32)
    a = fm.asarray(x)
    r = fm.sigmoid(a)
    assert isinstance(r, fm.Array) and r.device == device
    np.testing.assert_allclose(np.asarray(r), 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)
    mixed = fm.add(x, a)
    assert isinstance(mixed, fm.Array)
    out = fm.empty(10)
    assert fm.multiply(a, 2.0, out=out) is out
    np.testing.assert_array_equal(np.asarray(out), 2 * x)


def test_results_outlive_inputs_and_temporaries(device):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100_000).astype(np.float32)
    expected = np.exp(x.astype(np.float64)).astype(np.float32)
    r = fm.exp(x.copy())  # the input is a temporary that dies at once
    a = fm.asarray(x.copy())
    ra = fm.exp(fm.asarray(x.copy()))
    del a
    gc.collect()
    for _ in range(20):  # churn the allocator with same-sized buffers
        junk = fm.add(np.full(100_000, 7.0, np.float32), 1.0)
        del junk
    np.testing.assert_allclose(r, expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ra), expected, rtol=1e-6)
    view = np.asarray(ra)
    del ra
    gc.collect()
    fm.add(np.zeros(100_000, np.float32), 1.0)
    np.testing.assert_allclose(view, expected, rtol=1e-6)  # the view keeps the Array alive


@pytest.mark.host_visible
def test_allocations_are_reused(device):
    x = np.ones(50_000, np.float32)
    addresses = []
    for _ in range(60):
        r = fm.exp(x)
        addresses.append(r.ctypes.data)
        del r
    # The caching allocator hands back blocks it holds: after a few calls (as many as it
    # caches of this size, which earlier tests decide) no new address appears.
    assert set(addresses[30:]) <= set(addresses[:30])
    assert len(set(addresses)) < 10


def test_arrays_on_the_device_round_trip(device):
    x = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    a = fm.asarray(x, device=device)
    assert a.device == device and fm.zeros(4, device=device).device == device
    np.testing.assert_array_equal(np.asarray(a), x)
    np.testing.assert_array_equal(np.asarray(fm.asarray(x[::-1, ::2])), x[::-1, ::2])
    np.testing.assert_array_equal(np.asarray(fm.ones((2, 2), device=device)), np.ones((2, 2)))
