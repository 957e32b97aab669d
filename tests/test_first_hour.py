"""What a new user meets in the first hour: no crash on huge shapes, no write into memory
Python says is immutable, no silent wrong answer, configuration that is not understood is
said so, and error messages are one line that says what to do."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

import fastmetal as fm
from conftest import HOST_VISIBLE


# ------------------------------------------------------------------ sizes that overflow
@pytest.mark.parametrize("shape", [(2**62,), (2**61,), (2**32, 2**32), (0, 2**62, 2**62),
                                   (3, 2**61)])
@pytest.mark.parametrize("make", ["empty", "zeros", "ones"])
def test_shapes_whose_byte_count_overflows_raise_value_error(device, make, shape):
    with pytest.raises(ValueError, match=rf"\[fastmetal\.{make}\] expected an array of at most "
                                         r"2\*\*63 - 1 bytes, got shape"):
        getattr(fm, make)(shape)


@pytest.mark.parametrize("shape", [(2**60,), (2**40,), (2**20, 2**20)])
def test_shapes_larger_than_the_device_raise_memory_error(device, shape):
    with pytest.raises(MemoryError, match=r"\[fastmetal\]"):
        fm.zeros(shape)


def test_op_on_a_huge_zero_size_request_does_not_crash():
    # The original report: zeros((2**62,)) had nbytes == 0 and sigmoid of it died of SIGFPE.
    code = ("import fastmetal as fm\n"
            "try:\n    fm.sigmoid(fm.zeros((2**62,)))\nexcept ValueError as e:\n    print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_broadcast_result_too_large_raises_before_launching(device):
    x = np.broadcast_to(np.float32(1), (2**20, 1))
    y = np.broadcast_to(np.float32(2), (1, 2**21))
    with pytest.raises(MemoryError):
        fm.add(x, y)
    x = np.broadcast_to(np.float32(1), (2**40, 1))
    y = np.broadcast_to(np.float32(2), (1, 2**40))
    with pytest.raises(ValueError, match="at most 2\\*\\*63 - 1 bytes"):
        fm.add(x, y)


# ------------------------------------------------------------------ read-only memory
def read_only_sources():
    buf = bytes(16)
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    return {
        "bytes": (buf, lambda: np.frombuffer(buf, np.float32)),
        "read-only ndarray": (ro, lambda: ro),
        "read-only memoryview": (buf, lambda: np.asarray(memoryview(buf).cast("f"))),
        "broadcast view": (None, lambda: np.broadcast_to(np.float32(1), (4,))),
    }


@pytest.mark.parametrize("source", list(read_only_sources()))
def test_asarray_of_read_only_memory_is_read_only(device, source):
    owner, make = read_only_sources()[source]
    before = bytes(owner) if isinstance(owner, bytes) else None
    a = fm.asarray(make())
    if device in HOST_VISIBLE:  # views of device memory; elsewhere these are host copies
        assert memoryview(a).readonly
        assert not np.asarray(a).flags.writeable
        assert not a.numpy().flags.writeable
    with pytest.raises(ValueError, match=r"\[fastmetal\.exp\] expected a writeable out, got a "
                                         r"read-only array"):
        fm.exp(a, out=a)
    with pytest.raises(ValueError, match=r"\[fastmetal\.add\] expected a writeable out"):
        fm.add(a, 1.0, out=a)
    if device in HOST_VISIBLE:
        with pytest.raises(ValueError):
            np.asarray(a)[...] = 5
    if before is not None:
        assert owner == before
    assert fm.exp(a).shape == a.shape  # reading is fine


def test_original_report_bytes_object_is_not_changed(device):
    buf = bytes(16)
    a = fm.asarray(np.frombuffer(buf, np.float32))
    with pytest.raises(ValueError):
        fm.exp(a, out=a)
    assert buf == bytes(16)


def test_read_only_numpy_out_is_refused(device):
    x = np.ones(4, np.float32)
    out = np.zeros(4, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        fm.exp(x, out=out)
    assert not out.any()


def test_writable_zero_stride_out_is_never_a_valid_output(device):
    x = np.arange(4, dtype=np.float32)
    base = np.zeros(1, np.float32)
    out = np.lib.stride_tricks.as_strided(base, shape=(4,), strides=(0,), writeable=True)
    with pytest.raises(ValueError, match="zero-stride"):
        fm.exp(x, out=out)
    assert base[0] == 0
    if device not in HOST_VISIBLE:
        return  # fm.asarray(out) copies there: the Array is not a view of `base`
    a_out = fm.asarray(out)  # writable per NumPy, but its elements share memory
    with pytest.raises(ValueError, match="zero-stride"):
        fm.negative(x, out=a_out)
    assert base[0] == 0


def test_out_with_strides_that_are_not_whole_elements_is_written(device):
    raw = np.zeros(4 * 5 + 1, np.uint8)
    out = np.lib.stride_tricks.as_strided(raw[1:].view(np.uint8), shape=(4,), strides=(5,))
    out = out.view(np.dtype([("f", "<f4"), ("pad", "u1")]))["f"] if False else \
        np.ndarray((4,), np.float32, buffer=raw, offset=1, strides=(5,))
    x = np.arange(4, dtype=np.float32)
    fm.negative(x, out=out)
    np.testing.assert_array_equal(out, -x)


@pytest.mark.host_visible
def test_writable_sources_stay_writable(device):
    x = np.zeros(4, np.float32)
    a = fm.asarray(x)
    assert not memoryview(a).readonly
    fm.exp(a, out=a)
    np.testing.assert_array_equal(x, np.ones(4, np.float32))
    assert np.asarray(fm.asarray(np.frombuffer(bytearray(16), np.float32))).flags.writeable


# ------------------------------------------------------------------ conv2d message
def test_conv2d_padding_message_prints_both_axes_not_garbage(device):
    msgs = set()
    for _ in range(3):
        with pytest.raises(ValueError) as e:
            fm.conv2d(np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32),
                      padding=2**30)
        msgs.add(str(e.value))
    assert msgs == {"[fastmetal.conv2d] expected the padded input to fit 32-bit indices, got "
                    "input shape (1, 1, 4, 4) with padding (1073741824, 1073741824)"}


# ------------------------------------------------------------------ fourier_series range
def exact_fourier(x: float, a, b, period: float) -> float:
    """The series with each phase k x / period reduced exactly (fractions)."""
    u = Fraction(x) / Fraction(period)
    total = float(a[0]) / 2
    for k in range(1, len(a)):
        t = k * u
        t -= math.floor(t)
        total += a[k] * math.cos(2 * math.pi * float(t)) + b[k] * math.sin(2 * math.pi * float(t))
    return total


@pytest.mark.parametrize("period", [2 * math.pi, 1.0, 0.001])
def test_fourier_series_is_exact_over_its_whole_supported_range(device, period):
    rng = np.random.default_rng(7)
    a, b = rng.uniform(-1, 1, 9), rng.uniform(-1, 1, 9)
    limit = fm.ops.numerics.FOURIER_MAX_PERIODS * period
    x = np.concatenate([rng.uniform(-1, 1, 64) * limit,
                        rng.uniform(-1, 1, 64) * limit / 1e3,
                        [limit, -limit, 0.0]]).astype(np.float32)
    x = x[np.abs(x.astype(np.float64)) <= limit]
    got = fm.fourier_series(x, a, b, period=period)
    want = np.array([exact_fourier(float(v), a, b, period) for v in x])
    scale = np.sum(np.abs(a)) + np.sum(np.abs(b))
    assert np.max(np.abs(got - want)) <= 5e-7 * scale


@pytest.mark.parametrize("x", [1e12, -1e15, 3e38, 2**21 * 2 * math.pi])
def test_fourier_series_beyond_its_range_raises_stating_the_range(device, x):
    with pytest.raises(ValueError, match=r"\[fastmetal\.fourier_series\] expected finite x with "
                                         r"\|x\| <= 2\*\*20 \* period"):
        fm.fourier_series(np.array([0.5, x], np.float32), [0, 1], [0, 1])
    with pytest.raises(ValueError, match="2\\*\\*20"):
        fm.fourier_series(fm.asarray(np.array([x], np.float32)), [0, 1], [0, 1])


def test_fourier_series_non_finite_x_still_gives_nan(device):
    y = fm.fourier_series(np.array([np.inf, np.nan, -np.inf, 1.0], np.float32), [0, 1], [0, 1])
    assert np.isnan(y[:3]).all() and np.isfinite(y[3])


# ------------------------------------------------------------------ environment variables
BAD_CONFIG = [
    ("FASTMETAL_NUM_THREADS", "abc", "an integer from 1 to 1024"),
    ("FASTMETAL_NUM_THREADS", "0", "an integer from 1 to 1024"),
    ("FASTMETAL_NUM_THREADS", "-1", "an integer from 1 to 1024"),
    ("FASTMETAL_NUM_THREADS", "4abc", "an integer from 1 to 1024"),
    ("FASTMETAL_DEVICE", "gpu", "accepted values: metal, cuda, cpu"),
    ("FASTMETAL_CPU_ISA", "avx9", "accepted values: base"),
    ("FASTMETAL_SDPA_FORWARD", "fast", "accepted values: tiled, classic"),
    ("FASTMETAL_SDPA_BACKWARD", "fast", "accepted values: tiled, classic"),
    ("FASTMETAL_COMPILE_FUSION", "yes", "accepted values: 1, 0"),
    ("FASTMETAL_COMPILE_STREAMS", "0", "accepted values: 1, 2, 3, 4, 5, 6, 7, 8"),
]


@pytest.mark.parametrize("name,value,accepted", BAD_CONFIG)
def test_configuration_not_understood_gives_one_warning_naming_it(name, value, accepted):
    code = ("import warnings\nwarnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    import fastmetal as fm\n"
            "print(len(w)); print(w[0].category.__name__ if w else ''); print(w[0].message if w else '')\n"
            "fm.set_default_device('cpu'); import numpy as np\n"
            "print(float(fm.sigmoid(np.zeros(1))[0]))\n")
    env = {**os.environ, name: value}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    count, category, message, result = r.stdout.strip().split("\n")
    assert count == "1" and category == "RuntimeWarning"
    assert f"{name}='{value}'" in message and accepted in message
    assert result == "0.5"


def test_valid_configuration_gives_no_warning():
    env = {**os.environ, "FASTMETAL_NUM_THREADS": "1", "FASTMETAL_CPU_ISA": "base",
           "FASTMETAL_DEVICE": "cpu"}
    r = subprocess.run([sys.executable, "-W", "error", "-c",
                        "import fastmetal as fm; print(fm._core._num_threads(), fm._core._cpu_isa())"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["1", "base"], r.stderr


# ------------------------------------------------------------------ one-line messages
class NotAnArray:
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("first line\n\nAt:\n  some traceback line")


@pytest.mark.parametrize("call", [
    lambda v: fm.sigmoid(v), lambda v: fm.add(v, 1.0), lambda v: fm.gradient(v),
    lambda v: fm.derivative(v), lambda v: fm.fourier_series(v, [0, 1], [0, 1]),
    lambda v: fm.conv2d(v, np.ones((1, 1, 1, 1), np.float32)), lambda v: fm.asarray(v)])
def test_messages_are_one_line(call):
    with pytest.raises(TypeError) as e:
        call(NotAnArray())
    assert "\n" not in str(e.value) and str(e.value).startswith("[fastmetal.")
    assert "first line" in str(e.value)


def test_tensor_that_requires_grad_is_told_to_detach():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    t = torch.ones(3, requires_grad=True)
    for call in (fm.sigmoid, fm.gradient, fm.derivative, fm.asarray):
        with pytest.raises(TypeError) as e:
            call(t)
        assert "\n" not in str(e.value) and ".detach()" in str(e.value), str(e.value)
    np.testing.assert_allclose(fm.sigmoid(t.detach()), 1 / (1 + np.exp(-1.0)), rtol=1e-6)
