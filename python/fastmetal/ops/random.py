"""Random numbers on every device from one counter-based generator (``fastmetal.random``).

The generator is dropout's Philox-4x32-10 (``metal/philox.h``), run by the kernels of
``metal/random.metal``: a :class:`Generator` is a seed (the Philox key) and a counter (the
Philox blocks it has used so far). Element ``i`` of a draw comes from word ``i % 4`` of the
block ``counter + i // 4``, and the draw then moves the counter past its blocks. So the
numbers depend only on the seed, the draws before and the element's index in C order: the
same bits on every device and for any number of threads, and each draw is new.

    >>> import fastmetal as fm
    >>> fm.random.seed(0)
    >>> eps = fm.random.normal((128, 20))           # on the default device
    >>> g = fm.random.Generator(42)
    >>> mask = fm.random.bernoulli(0.25, (4, 4), generator=g, device="cpu")

The module's own generator (``seed(n)`` restarts it) starts as ``Generator(0)`` when
fastmetal is imported, so a program that never seeds still draws the same numbers every run.
"""
import math as _math
import operator as _operator
import threading as _threading

import numpy as _np

from .. import _core
from .capture import dynamic

__all__ = ["Generator", "seed", "normal", "uniform", "bernoulli"]

_WORDS_PER_BLOCK = 4      # a Philox-4x32 block gives four 32-bit words
_COUNTER_LIMIT = 2**63    # the kernels take the counter as a signed 64-bit int
_FLOAT32_MAX = float(_np.finfo(_np.float32).max)  # the kernels compute in float32
_MAX_ELEMENTS = 4 * (2**32 - 1)  # four elements a thread, a 32-bit grid


def _check_seed(value, op):
    if isinstance(value, (bool, _np.bool_)) or not isinstance(value, (int, _np.integer)):
        raise TypeError(f"[fastmetal.{op}] expected seed to be an int in [0, 2**64), "
                        f"got {value!r}")
    if not 0 <= value < 2**64:
        raise ValueError(f"[fastmetal.{op}] expected seed to be an int in [0, 2**64), "
                         f"got {value!r}")
    return int(value)


class Generator:
    """A stream of random numbers: Philox-4x32-10 keyed by ``seed`` (an int in ``[0, 2**64)``).

    Pass it as ``generator=`` to :func:`normal`, :func:`uniform` and :func:`bernoulli`.
    ``counter`` is the number of Philox blocks (four 32-bit words each) drawn so far; each
    draw of ``n`` elements advances it by ``ceil(n / 4)``. Draws from several threads are
    safe (each takes its own blocks) but their order decides who gets which numbers.
    """

    __slots__ = ("_seed", "_counter", "_lock")

    def __init__(self, seed):
        self._seed = _check_seed(seed, "random.Generator")
        self._counter = 0
        self._lock = _threading.Lock()

    @property
    def seed(self):
        """The key this generator was (last) seeded with."""
        return self._seed

    @property
    def counter(self):
        """Philox blocks used so far."""
        return self._counter

    def manual_seed(self, seed):
        """Restart the stream from ``seed`` (counter 0); returns the generator."""
        seed = _check_seed(seed, "random.Generator.manual_seed")
        with self._lock:
            self._seed, self._counter = seed, 0
        return self

    def _take(self, n, op):
        """Reserves the blocks of an n-element draw: (key0, key1, first block)."""
        blocks = -(-n // _WORDS_PER_BLOCK)
        with self._lock:
            start = self._counter
            if start + blocks >= _COUNTER_LIMIT:
                raise OverflowError(f"[fastmetal.{op}] expected a generator with fewer than "
                                    f"2**63 blocks used, got {start} + {blocks}: reseed it")
            self._counter = start + blocks
            return self._seed & 0xFFFFFFFF, self._seed >> 32, start

    def __repr__(self):
        return f"fastmetal.random.Generator(seed={self._seed}, counter={self._counter})"


_default = Generator(0)


def seed(n):
    """Restart the module's generator from seed ``n`` (an int in ``[0, 2**64)``), as
    ``torch.manual_seed``: the draws that follow are the same on every run and device."""
    _default.manual_seed(_check_seed(n, "random.seed"))


# ----------------------------------------------------------------------------- arguments
def _shape(shape, op):
    """An int or a sequence of ints, each >= 0, as a tuple."""
    def bad(cls):
        return cls(f"[fastmetal.{op}] expected shape as a tuple of non-negative ints, "
                   f"got {shape!r}")
    dims = shape if isinstance(shape, (tuple, list)) else (shape,)
    out = []
    for d in dims:
        if isinstance(d, (bool, _np.bool_)):
            raise bad(TypeError)
        try:
            d = _operator.index(d)
        except TypeError:
            raise bad(TypeError) from None
        if d < 0:
            raise bad(ValueError)
        out.append(d)
    return tuple(out)


def _dtype(dtype, op):
    try:
        dt = _np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (_np.dtype(_np.float32), _np.dtype(_np.float16)):
        raise TypeError(f"[fastmetal.{op}] expected dtype float32 or float16, got {dtype!r}")
    return dt


def _device(device, op):
    if device is None:
        return _core.default_device()
    if not isinstance(device, str):
        raise TypeError(f"[fastmetal.{op}] expected device to be a device name (str) or None, "
                        f"got {device!r}")
    if device not in _core.devices():
        raise ValueError(f"[fastmetal.{op}] expected device to be one of {_core.devices()}, "
                         f"got {device!r}")
    return device


def _generator(generator, op):
    if generator is None:
        return _default
    if not isinstance(generator, Generator):
        raise TypeError(f"[fastmetal.{op}] expected generator to be a "
                        f"fastmetal.random.Generator or None, got {generator!r}")
    return generator


def _real(value, name, op):
    """A real number (a Python or NumPy int or float, not a bool) finite in float32, as a
    float."""
    if isinstance(value, (bool, _np.bool_)) or not isinstance(value, (int, float, _np.integer,
                                                                     _np.floating)):
        raise TypeError(f"[fastmetal.{op}] expected {name} to be a real number, got {value!r}")
    value = float(value)
    if not abs(value) <= _FLOAT32_MAX:  # NaN fails too
        raise ValueError(f"[fastmetal.{op}] expected {name} to be finite in float32, "
                         f"got {value!r}")
    return value


def _draw(op, fill, shape, dtype, device, generator, *params):
    """Validates the common arguments, fills a float32 Array with `fill` and converts it to
    `dtype` on its device."""
    shape = _shape(shape, op)
    n = _math.prod(shape)
    if n > _MAX_ELEMENTS:
        raise ValueError(f"[fastmetal.{op}] expected at most 4 * (2**32 - 1) elements, got "
                         f"shape {shape}")
    dt = _dtype(dtype, op)
    device = _device(device, op)
    gen = _generator(generator, op)
    out = _core.empty(shape, dtype="float32", device=device)

    def draw():  # re-run at each replay of a compiled step: the counter advances as eagerly
        key0, key1, counter = gen._take(n, op)
        if n:
            fill(out, key0, key1, counter, *params)

    dynamic(draw)
    return out if dt == _np.float32 else _core.asarray(out, dtype=dt)


# ----------------------------------------------------------------------------- draws
def normal(shape, mean=0.0, std=1.0, *, dtype="float32", device=None, generator=None):
    """An Array of ``shape`` drawn from the normal distribution N(mean, std**2), as
    ``torch.normal(mean, std, size)``.

    Box–Muller on Philox words: words ``2k`` and ``2k + 1`` of a block give
    ``u1 = ((w >> 8) + 1) / 2**24`` and ``u2 = (w >> 8) / 2**24``, then
    ``z = sqrt(-2 ln u1) * (cos, sin)(2 pi u2)`` (so ``|z| <= 5.77``), within 4 ulps of
    float64, and ``mean + std * z`` as one fma in float32, rounded to ``dtype`` (float32 or
    float16). The transform is integers, exact operations and explicit fmas, so the same
    seed gives the same bits on every device and for any number of threads (the x86-64
    fallback without FMA, cpu ISA ``base``, emulates fma and could differ in the last bit in
    rare elements).
    """
    op = "random.normal"
    mean, std = _real(mean, "mean", op), _real(std, "std", op)
    if std < 0:
        raise ValueError(f"[fastmetal.{op}] expected std >= 0, got {std!r}")
    return _draw(op, _core._random_normal, shape, dtype, device, generator, mean, std)


def uniform(shape, low=0.0, high=1.0, *, dtype="float32", device=None, generator=None):
    """An Array of ``shape`` drawn uniformly from ``[low, high)``, as
    ``torch.empty(shape).uniform_(low, high)``.

    Each element is ``low + (high - low) * u`` (one fma, in float32) with ``u = k / 2**b``
    from the ``b`` high bits of its Philox word: ``b = 24`` for float32, ``11`` for float16,
    so every ``u`` is exact in the output dtype and the default range never gives 1.0.
    (Rounding can give ``high`` itself when ``low`` and ``high`` are far from 0 relative to
    their distance.) Bit for bit the same numbers on every device.
    """
    op = "random.uniform"
    low, high = _real(low, "low", op), _real(high, "high", op)
    if not low <= high:
        raise ValueError(f"[fastmetal.{op}] expected low <= high, got low={low!r}, "
                         f"high={high!r}")
    if not high - low <= _FLOAT32_MAX:
        raise ValueError(f"[fastmetal.{op}] expected high - low to fit in float32, got "
                         f"low={low!r}, high={high!r}")
    bits = 24 if _dtype(dtype, op) == _np.float32 else 11
    return _draw(op, _core._random_uniform, shape, dtype, device, generator, low, high, bits)


def bernoulli(p, shape, *, dtype="float32", device=None, generator=None):
    """An Array of ``shape`` holding 1.0 with probability ``p`` (a float in ``[0, 1]``) and
    0.0 otherwise, as ``torch.bernoulli(torch.full(shape, p))``.

    Element ``i`` is 1 where the 24 high bits of its Philox word are below
    ``ceil(p * 2**24)``, that is ``u < p`` for the float32 ``u`` of :func:`uniform`: an
    integer comparison, bit for bit the same on every device.
    """
    op = "random.bernoulli"
    if isinstance(p, (bool, _np.bool_)) or not isinstance(p, (int, float, _np.integer,
                                                             _np.floating)):
        raise TypeError(f"[fastmetal.{op}] expected p to be a float in [0, 1], got {p!r}")
    if not 0.0 <= float(p) <= 1.0:  # NaN fails too
        raise ValueError(f"[fastmetal.{op}] expected p to be a float in [0, 1], got {p!r}")
    threshold = _math.ceil(float(p) * 2**24)  # exact: p * 2**24 is p with another exponent
    return _draw(op, _core._random_bernoulli, shape, dtype, device, generator, threshold)


def __dir__():
    return sorted(__all__)


def fresh_seed(generator=None):
    """A 64-bit seed taken from ``generator``'s stream (default: the module's), advancing it
    by one block: for consumers that carry a seed of their own (a Dropout layer's masks), so
    that ``seed(n)`` makes them reproducible too. splitmix64 of (key, block): distinct
    blocks give unrelated seeds."""
    gen = _generator(generator, "random.fresh_seed")
    key0, key1, block = gen._take(_WORDS_PER_BLOCK, "random.fresh_seed")
    z = ((key1 << 32 | key0) + (block + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)
