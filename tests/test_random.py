"""fastmetal.random: the streams against a NumPy reference of the same Philox and transforms
(bit for bit for uniform and Bernoulli, within an ulp or so for normal), the distributions
(mean, variance, Kolmogorov–Smirnov), the same numbers on every device, for any number of
threads and threadgroup size, reseeding, and the errors of bad arguments."""
from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core
from references import msl_kernels_on_cpu

kernels = pytest.fixture(msl_kernels_on_cpu)

M32 = np.uint64(0xFFFFFFFF)


# ----------------------------------------------------------------------------- reference
def philox_words(seed: int, counter: int, n: int) -> np.ndarray:
    """Words 0 .. n-1 of the stream: word i is word i % 4 of Philox-4x32-10 of the counter
    (b, b >> 32, 0, 0), b = counter + i // 4, under the key (seed % 2**32, seed // 2**32).
    Vectorised over blocks with uint64 products (exact: 32 x 32 bits)."""
    b = np.uint64(counter) + np.arange(-(-n // 4), dtype=np.uint64)
    c0, c1 = b & M32, b >> np.uint64(32)
    c2 = c3 = np.zeros_like(b)
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & M32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & M32)
    return np.stack([c0, c1, c2, c3], axis=1).reshape(-1)[:n]


def test_numpy_philox_matches_the_known_answers():
    # Random123's vector for counter 0, key 0 (the scalar reference in test_training_ops.py
    # checks the others); block 1 of seed 0 is the counter (1, 0, 0, 0).
    assert [hex(w) for w in philox_words(0, 0, 4)] == [
        "0x6627e8d5", "0xe169c58d", "0xbc57ac4c", "0x9b00dbd8"]
    from test_training_ops import philox4x32_10
    seed, counter = 2**40 + 12345, 2**32 - 1  # the block counter carries into word 1
    words = philox_words(seed, counter, 12)
    for j in range(3):
        b = counter + j
        expect = philox4x32_10((b & 0xFFFFFFFF, b >> 32, 0, 0), (seed & 0xFFFFFFFF, seed >> 32))
        assert tuple(int(w) for w in words[4 * j:4 * j + 4]) == expect


def uniform_reference(words, low=0.0, high=1.0, bits=24):
    u = (words >> np.uint64(32 - bits)).astype(np.float64) * 2.0**-bits
    low32, range32 = np.float32(low), np.float32(high - low)
    # fma(u, range, low): the product is exact in float64, and so is the sum for the ranges
    # tested here, so one rounding to float32, as the kernel's fma.
    return (u * np.float64(range32) + np.float64(low32)).astype(np.float32)


def normal_reference(seed, counter, n, mean=0.0, std=1.0):
    """Box–Muller of the kernel in float64: element i of the draw from the words (2k, 2k + 1),
    k = i // 2 (whole blocks: an odd n uses half a pair), u1 = ((w >> 8) + 1) / 2**24,
    u2 = (w >> 8) / 2**24, z = sqrt(-2 ln u1) (cos, sin)(2 pi u2)."""
    w = (philox_words(seed, counter, 4 * -(-n // 4)) >> np.uint64(8)).astype(np.float64)
    u1, u2 = (w[0::2] + 1.0) * 2.0**-24, w[1::2] * 2.0**-24
    radius = np.sqrt(-2.0 * np.log(u1))
    z = np.stack([radius * np.cos(2 * np.pi * u2), radius * np.sin(2 * np.pi * u2)], axis=1)
    return (mean + std * z.reshape(-1))[:n]


def bernoulli_reference(words, p):
    return ((words >> np.uint64(8)) < math.ceil(p * 2**24)).astype(np.float32)


def host(a) -> np.ndarray:
    assert isinstance(a, fm.Array)  # the draws return Arrays on every device
    return a.numpy()  # a view on host-visible devices, else a copy


# Sizes around the four-per-thread packing, and one big enough to spread over threads.
SIZES = [(1,), (3,), (4,), (5,), (2, 3, 7), (1001,), (64, 1024)]


# ----------------------------------------------------------------------------- streams
@pytest.mark.parametrize("shape", SIZES, ids=str)
def test_uniform_is_the_philox_stream_bit_for_bit(device, shape):
    g = fm.random.Generator(2**33 + 5)
    n, blocks = math.prod(shape), -(-math.prod(shape) // 4)
    a = fm.random.uniform(shape, generator=g)
    assert a.device == device and a.shape == shape and a.dtype == np.float32
    np.testing.assert_array_equal(host(a).reshape(-1), uniform_reference(philox_words(2**33 + 5, 0, n)))
    # The next draw starts at the next block: the counter moved by ceil(n / 4).
    assert g.counter == blocks
    b = fm.random.uniform(shape, -2.0, 3.0, generator=g)
    ref = uniform_reference(philox_words(2**33 + 5, blocks, n), -2.0, 3.0)
    np.testing.assert_array_equal(host(b).reshape(-1), ref)


@pytest.mark.parametrize("shape", SIZES, ids=str)
def test_bernoulli_is_the_philox_stream_bit_for_bit(device, shape):
    g = fm.random.Generator(77)
    n = math.prod(shape)
    for k, p in enumerate([0.5, 0.1, 1e-7, 0.0, 1.0, 0.999999]):
        a = fm.random.bernoulli(p, shape, generator=g)
        ref = bernoulli_reference(philox_words(77, k * -(-n // 4), n), p)
        np.testing.assert_array_equal(host(a).reshape(-1), ref)


@pytest.mark.parametrize("shape", SIZES, ids=str)
def test_normal_is_box_muller_of_the_philox_stream(device, shape):
    g = fm.random.Generator(9)
    n = math.prod(shape)
    a = fm.random.normal(shape, generator=g)
    # Within 4 ulps of float64 (5.6e-7 at most over 4M samples); |z| <= 5.77.
    np.testing.assert_allclose(host(a).reshape(-1), normal_reference(9, 0, n), rtol=1e-6,
                               atol=1e-6)
    b = fm.random.normal(shape, 0.5, 3.0, generator=g)
    np.testing.assert_allclose(host(b).reshape(-1), normal_reference(9, g.counter // 2, n, 0.5, 3.0),
                               rtol=1e-6, atol=3e-6)


def test_bernoulli_is_dropouts_mask(device):
    # One Philox (metal/philox.h) for both: from counter 0, bernoulli(p) is 1 exactly where
    # dropout with the same seed and p drops.
    for seed, p in [(0, 0.5), (2**40 + 3, 0.1), (2**64 - 1, 0.9)]:
        dropped = host(fm.dropout(fm.ones(4099), p, seed=seed)) == 0
        b = host(fm.random.bernoulli(p, 4099, generator=fm.random.Generator(seed)))
        np.testing.assert_array_equal(b, dropped.astype(np.float32))


@pytest.mark.cpu_only
def test_dropouts_msl_kernel_still_matches_its_cpu_fast_path(request):
    # philox.h (the rounds written out for the CPU's vectoriser) against the CPU's own
    # Philox in csrc/backend/cpu/isa/dropout.cpp.
    x = np.random.default_rng(1).standard_normal(10007).astype(np.float32) + 10
    fast = fm.dropout(x, 0.3, seed=2**35 + 77)
    request.getfixturevalue("kernels")  # from here on the MSL kernels run on the CPU
    assert not _core._native_cpu()
    np.testing.assert_array_equal(fm.dropout(x, 0.3, seed=2**35 + 77), fast)


def test_float16_draws_round_the_float32_stream(device):
    g, g16 = fm.random.Generator(3), fm.random.Generator(3)
    z = host(fm.random.normal((1000,), 1.0, 2.0, generator=g))
    z16 = fm.random.normal((1000,), 1.0, 2.0, dtype="float16", generator=g16)
    assert z16.dtype == np.float16 and z16.device == device
    np.testing.assert_array_equal(host(z16), z.astype(np.float16))
    # uniform in float16 uses 11 bits, so every value is exact and below 1.0
    u16 = host(fm.random.uniform(50000, dtype=np.float16, generator=g16))
    words = philox_words(3, g16.counter - 12500, 50000)
    np.testing.assert_array_equal(u16, uniform_reference(words, bits=11).astype(np.float16))
    assert u16.max() < 1.0 and u16.min() >= 0.0
    b16 = host(fm.random.bernoulli(0.3, (7, 9), dtype="float16", generator=g16))
    assert b16.dtype == np.float16 and set(np.unique(b16)) <= {0.0, 1.0}


def test_the_same_numbers_on_every_device(device):
    # Each device against the cpu (on the cpu this checks the cpu against itself), bit for
    # bit: integers, exact operations and explicit fmas only (random.metal).
    def draws(dev):
        g = fm.random.Generator(2024)
        return [fm.random.uniform((257, 31), generator=g, device=dev),
                fm.random.normal((257, 31), generator=g, device=dev),
                fm.random.bernoulli(0.3, (257, 31), generator=g, device=dev)]
    here, cpu = draws(device), draws("cpu")
    assert [a.device for a in here] == [device] * 3
    for a, b in zip(here, cpu):
        np.testing.assert_array_equal(host(a), host(b))


@pytest.mark.parametrize("group", [1, 3, 32, 256])
def test_the_same_numbers_for_any_threadgroup_size(device, group):
    def draws():
        g = fm.random.Generator(11)
        return [host(fm.random.uniform(10007, generator=g)),
                host(fm.random.normal(10007, generator=g)),
                host(fm.random.bernoulli(0.7, 10007, generator=g))]
    expect = draws()
    saved = _core._kernel_group_size()
    _core._set_kernel_group_size(group)
    try:
        got = draws()
    finally:
        _core._set_kernel_group_size(saved)
    for a, b in zip(got, expect):
        np.testing.assert_array_equal(a, b)


@pytest.mark.cpu_only
def test_the_same_numbers_for_any_number_of_cpu_threads_and_instruction_set():
    # Thread counts, and the CPU's per-ISA kernel variants (the normals' polynomials are
    # explicit fmas, so SSE2's emulated fma and AVX's hardware one agree here).
    from test_cpu_isa import supported_isas
    code = ("import hashlib, fastmetal as fm\n"
            "fm.random.seed(123)\n"
            "outs = [fm.random.normal((1000, 1000)), fm.random.uniform((3, 100003), -1, 1),\n"
            "        fm.random.bernoulli(0.25, 999999)]\n"
            "h = hashlib.sha256()\n"
            "[h.update(o.numpy().tobytes()) for o in outs]\n"
            "print(h.hexdigest())\n")
    runs = [("1", None), ("2", None), ("3", None)] + [("2", isa) for isa in supported_isas()]
    digests = {}
    for threads, isa in runs:
        env = dict(os.environ, FASTMETAL_NUM_THREADS=threads, FASTMETAL_DEVICE="cpu")
        env.pop("FASTMETAL_CPU_ISA", None)
        if isa:
            env["FASTMETAL_CPU_ISA"] = isa
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        digests[(threads, isa)] = out.stdout.split()[-1]  # (an editable build may print before)
    # ... and the same as in this process (its own thread count).
    fm.random.seed(123)
    outs = [fm.random.normal((1000, 1000), device="cpu"),
            fm.random.uniform((3, 100003), -1, 1, device="cpu"),
            fm.random.bernoulli(0.25, 999999, device="cpu")]
    h = hashlib.sha256()
    for o in outs:
        h.update(o.numpy().tobytes())
    digests["here"] = h.hexdigest()
    assert len(set(digests.values())) == 1, digests


# ----------------------------------------------------------------------------- generators
def test_seed_restarts_the_default_stream_and_draws_advance_it(device):
    fm.random.seed(5)
    a, b = host(fm.random.normal((4, 5))), host(fm.random.normal((4, 5)))
    assert not np.array_equal(a, b)  # each draw is new
    fm.random.seed(5)
    np.testing.assert_array_equal(host(fm.random.normal((4, 5))), a)
    np.testing.assert_array_equal(host(fm.random.normal((4, 5))), b)
    fm.random.seed(6)
    assert not np.array_equal(host(fm.random.normal((4, 5))), a)
    # The default stream is Generator(seed) drawn in the same order.
    fm.random.seed(5)
    g = fm.random.Generator(5)
    for draw in (lambda **k: fm.random.uniform(9, **k), lambda **k: fm.random.normal(6, **k),
                 lambda **k: fm.random.bernoulli(0.5, (2, 2), **k)):
        np.testing.assert_array_equal(host(draw()), host(draw(generator=g)))


def test_explicit_generators_are_independent_of_the_default(device):
    fm.random.seed(1)
    first = host(fm.random.uniform(8))
    fm.random.seed(1)
    g = fm.random.Generator(1)
    fm.random.uniform(100, generator=g)  # does not move the default stream
    np.testing.assert_array_equal(host(fm.random.uniform(8)), first)
    assert g.counter == 25 and g.seed == 1
    assert g.manual_seed(1) is g and g.counter == 0
    np.testing.assert_array_equal(host(fm.random.uniform(8, generator=g)), first)
    assert repr(g) == "fastmetal.random.Generator(seed=1, counter=2)"


def test_draws_from_many_threads_share_one_stream_without_overlap():
    # Each draw reserves its blocks under the generator's lock: the threads' draws together
    # are the serial stream's blocks, each used once, whatever the interleaving.
    from thread_harness import run_threads
    g = fm.random.Generator(99)
    parts = run_threads(lambda t: [host(fm.random.uniform(4 * (t + 1), generator=g))
                                   for _ in range(25)], 4)
    assert g.counter == 25 * (1 + 2 + 3 + 4)
    drawn = np.sort(np.concatenate([np.concatenate(p) for p in parts]))
    serial = host(fm.random.uniform(4 * g.counter, generator=fm.random.Generator(99)))
    np.testing.assert_array_equal(drawn, np.sort(serial))


def test_consecutive_draws_continue_one_stream():
    # Draws whose sizes are multiples of 4 concatenate to one draw of the total size.
    g1, g2 = fm.random.Generator(8), fm.random.Generator(8)
    parts = [host(fm.random.uniform(n, generator=g1)) for n in (4, 12, 8)]
    np.testing.assert_array_equal(np.concatenate(parts), host(fm.random.uniform(24, generator=g2)))
    # A size that is not a multiple of 4 leaves the rest of its last block unused.
    g1.manual_seed(8)
    fm.random.uniform(5, generator=g1)
    assert g1.counter == 2


def test_shapes_devices_and_empty_draws(device):
    g = fm.random.Generator(4)
    assert fm.random.normal(3, generator=g).shape == (3,)
    assert fm.random.normal([2, 3], generator=g).shape == (2, 3)
    assert fm.random.normal(np.int64(2), generator=g).shape == (2,)
    scalar = fm.random.uniform((), generator=g)
    assert scalar.shape == () and 0.0 <= float(host(scalar)) < 1.0
    before = g.counter
    empty = fm.random.bernoulli(0.5, (0, 3), generator=g)
    assert empty.shape == (0, 3) and empty.device == device and g.counter == before
    assert fm.random.uniform(2, device="cpu").device == "cpu"
    assert fm.random.uniform(2).device == fm.default_device() == device


# ----------------------------------------------------------------------------- distributions
def ks_statistic(x: np.ndarray, cdf) -> float:
    """Kolmogorov–Smirnov D = sup |F_n - F| of the sample x against the CDF."""
    x = np.sort(np.asarray(x, np.float64))
    f = cdf(x)
    n = len(x)
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - f), np.max(f - (i - 1) / n)))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def normal_cdf(x):
    return 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))


# D above this rejects at the 0.1% level (asymptotic: 1.949 / sqrt(n)).
def ks_critical(n):
    return 1.949 / math.sqrt(n)


def test_normal_mean_variance_and_ks(device):
    n = 200_000
    g = fm.random.Generator(31337)
    z = host(fm.random.normal(n, generator=g)).astype(np.float64)
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1.0) < 5 * math.sqrt(2.0 / n)
    assert ks_statistic(z, normal_cdf) < ks_critical(n)
    # The KS check can fail: a shifted or widened sample is rejected.
    assert ks_statistic(z + 0.02, normal_cdf) > ks_critical(n)
    assert ks_statistic(z * 1.02, normal_cdf) > ks_critical(n)
    # The two normals of a pair (cos, sin of one angle) and neighbours are uncorrelated.
    assert abs(np.corrcoef(z[0::2], z[1::2])[0, 1]) < 5 / math.sqrt(n / 2)
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 5 / math.sqrt(n)
    # mean and std scale it.
    y = host(fm.random.normal(n, -3.0, 0.5, generator=g)).astype(np.float64)
    assert abs(y.mean() + 3.0) < 5 * 0.5 / math.sqrt(n)
    assert abs(y.std() - 0.5) < 5 * 0.5 * math.sqrt(0.5 / n)
    assert ks_statistic((y + 3.0) / 0.5, normal_cdf) < ks_critical(n)


def test_uniform_and_bernoulli_distributions(device):
    n = 200_000
    g = fm.random.Generator(2718)
    u = host(fm.random.uniform(n, generator=g)).astype(np.float64)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 0.002
    assert ks_statistic(u, lambda x: np.clip(x, 0, 1)) < ks_critical(n)
    v = host(fm.random.uniform(n, 2.0, 6.0, generator=g)).astype(np.float64)
    assert v.min() >= 2.0 and v.max() < 6.0
    assert ks_statistic(v, lambda x: np.clip((x - 2.0) / 4.0, 0, 1)) < ks_critical(n)
    for p in (0.01, 0.3, 0.5, 0.95):
        b = host(fm.random.bernoulli(p, n, generator=g))
        assert set(np.unique(b)) <= {0.0, 1.0}
        assert abs(b.mean() - p) < 5 * math.sqrt(p * (1 - p) / n)
    assert host(fm.random.bernoulli(0.0, 1000, generator=g)).max() == 0.0
    assert host(fm.random.bernoulli(1.0, 1000, generator=g)).min() == 1.0


# ----------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("call,err,text", [
    (lambda: fm.random.normal((-1, 2)), ValueError, r"expected shape as a tuple of non-negative ints, got \(-1, 2\)"),
    (lambda: fm.random.normal((2.0,)), TypeError, r"expected shape as a tuple of non-negative ints, got \(2\.0,\)"),
    (lambda: fm.random.normal("3"), TypeError, r"expected shape as a tuple"),
    (lambda: fm.random.normal(None), TypeError, r"expected shape as a tuple"),
    (lambda: fm.random.normal((True, 2)), TypeError, r"expected shape as a tuple"),
    (lambda: fm.random.normal((2**62,)), ValueError, r"expected at most 4 \* \(2\*\*32 - 1\) elements"),
    (lambda: fm.random.uniform((2**17, 2**17, 2)), ValueError, r"expected at most 4 \* \(2\*\*32 - 1\)"),
    (lambda: fm.random.normal(3, std=-1.0), ValueError, r"expected std >= 0, got -1\.0"),
    (lambda: fm.random.normal(3, std=float("nan")), ValueError, r"expected std to be finite"),
    (lambda: fm.random.normal(3, mean=float("inf")), ValueError, r"expected mean to be finite"),
    (lambda: fm.random.normal(3, mean=1e39), ValueError, r"expected mean to be finite in float32"),
    (lambda: fm.random.normal(3, mean="0"), TypeError, r"expected mean to be a real number"),
    (lambda: fm.random.normal(3, std=True), TypeError, r"expected std to be a real number"),
    (lambda: fm.random.normal(3, dtype="float64"), TypeError, r"expected dtype float32 or float16, got 'float64'"),
    (lambda: fm.random.normal(3, dtype="int64"), TypeError, r"expected dtype float32 or float16"),
    (lambda: fm.random.normal(3, dtype="nope"), TypeError, r"expected dtype float32 or float16"),
    (lambda: fm.random.normal(3, device="nope"), ValueError, r"expected device to be one of"),
    (lambda: fm.random.normal(3, device=0), TypeError, r"expected device to be a device name"),
    (lambda: fm.random.normal(3, generator=np.random.default_rng(0)), TypeError,
     r"expected generator to be a fastmetal\.random\.Generator or None"),
    (lambda: fm.random.uniform(3, 1.0, 0.0), ValueError, r"expected low <= high, got low=1\.0, high=0\.0"),
    (lambda: fm.random.uniform(3, -3e38, 3e38), ValueError, r"expected high - low to fit in float32"),
    (lambda: fm.random.uniform(3, high=float("nan")), ValueError, r"expected high to be finite"),
    (lambda: fm.random.uniform(3, dtype=np.int32), TypeError, r"expected dtype float32 or float16"),
    (lambda: fm.random.bernoulli(1.5, 3), ValueError, r"expected p to be a float in \[0, 1\], got 1\.5"),
    (lambda: fm.random.bernoulli(-0.1, 3), ValueError, r"expected p to be a float in \[0, 1\]"),
    (lambda: fm.random.bernoulli(float("nan"), 3), ValueError, r"expected p to be a float in \[0, 1\]"),
    (lambda: fm.random.bernoulli(True, 3), TypeError, r"expected p to be a float in \[0, 1\]"),
    (lambda: fm.random.bernoulli("0.5", 3), TypeError, r"expected p to be a float in \[0, 1\]"),
    (lambda: fm.random.bernoulli(0.5, (3, -1)), ValueError, r"expected shape as a tuple"),
])
def test_bad_arguments(call, err, text):
    op = call.__code__.co_names[2]  # the lambda's first names are fm, random, <function>
    with pytest.raises(err, match=rf"^\[fastmetal\.random\.{op}\] {text}"):
        call()


@pytest.mark.parametrize("call,err,text", [
    (lambda: fm.random.seed(-1), ValueError,
     r"^\[fastmetal\.random\.seed\] expected seed to be an int in \[0, 2\*\*64\), got -1"),
    (lambda: fm.random.seed(2**64), ValueError, r"^\[fastmetal\.random\.seed\] expected seed"),
    (lambda: fm.random.seed(1.0), TypeError, r"^\[fastmetal\.random\.seed\] expected seed"),
    (lambda: fm.random.seed(True), TypeError, r"^\[fastmetal\.random\.seed\] expected seed"),
    (lambda: fm.random.Generator("1"), TypeError, r"^\[fastmetal\.random\.Generator\] expected seed"),
    (lambda: fm.random.Generator(1).manual_seed(-5), ValueError,
     r"^\[fastmetal\.random\.Generator\.manual_seed\] expected seed"),
])
def test_bad_seeds(call, err, text):
    with pytest.raises(err, match=text):
        call()


def test_seeds_use_all_64_bits():
    # Seeds that differ only in the high word give different streams.
    a = host(fm.random.uniform(8, generator=fm.random.Generator(7)))
    b = host(fm.random.uniform(8, generator=fm.random.Generator(7 + 2**32)))
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(b, uniform_reference(philox_words(7 + 2**32, 0, 8)))


def test_an_exhausted_generator_says_so():
    g = fm.random.Generator(0)
    g._counter = 2**63 - 2
    with pytest.raises(OverflowError, match=r"^\[fastmetal\.random\.uniform\] expected a generator"):
        fm.random.uniform(100, generator=g)
    assert g.counter == 2**63 - 2  # nothing was taken


def test_private_entry_points_check_their_arguments():
    out = fm.zeros(4, device="cpu")
    with pytest.raises(ValueError, match=r"^\[fastmetal\.random\.uniform\] expected key words"):
        _core._random_uniform(out, -1, 0, 0, 0.0, 1.0, 24)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.random\.normal\] expected a counter >= 0"):
        _core._random_normal(out, 0, 0, -1, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.random\.bernoulli\] expected a threshold"):
        _core._random_bernoulli(out, 0, 0, 0, 2**24 + 1)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.random\.uniform\] expected bits"):
        _core._random_uniform(out, 0, 0, 0, 0.0, 1.0, 25)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.random\.uniform\] expected finite low"):
        _core._random_uniform(out, 0, 0, 0, -3e38, 3e38, 24)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.random\.normal\] expected finite mean"):
        _core._random_normal(out, 0, 0, 0, 1e39, 1.0)
    with pytest.raises(ValueError, match=r"^\[fastmetal\.random\.normal\] expected finite mean"):
        _core._random_normal(out, 0, 0, 0, 0.0, float("nan"))
