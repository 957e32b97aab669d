"""``fastmetal.nn.init``: filling parameters in place, as ``torch.nn.init``.

Every draw comes from ``fastmetal.random`` (the module's generator unless ``generator=`` is
given), so ``fm.random.seed(n)`` (or ``fm.manual_seed``) makes initialisation reproducible,
with the same numbers on every device. The layers' own default (``kaiming_uniform_`` with
``a=sqrt(5)``: uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``, as PyTorch's) is drawn the
same way, or from NumPy where a layer is given ``seed=`` or ``rng=``.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .._core import Array
from ..autograd.tape import no_grad
from ..ops import random as _random
from ..ops.creation import asarray
from ..ops.elementwise import copy
from .modules.module import Parameter

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "zeros_",
           "ones_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_"]

_GAINS = {"linear": 1.0, "conv1d": 1.0, "conv2d": 1.0, "conv3d": 1.0, "conv_transpose1d": 1.0,
          "conv_transpose2d": 1.0, "conv_transpose3d": 1.0, "sigmoid": 1.0,
          "tanh": 5.0 / 3, "relu": math.sqrt(2.0), "selu": 0.75}


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for ``nonlinearity``, as ``torch.nn.init.calculate_gain``."""
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        if isinstance(slope, (bool, np.bool_)) or not isinstance(slope, numbers.Real):
            raise ValueError(f"[fastmetal.nn.init.calculate_gain] expected param to be a "
                             f"number, got {param!r}")
        return math.sqrt(2.0 / (1 + float(slope) ** 2))
    if nonlinearity not in _GAINS:
        raise ValueError(f"[fastmetal.nn.init.calculate_gain] expected a nonlinearity among "
                         f"{sorted([*_GAINS, 'leaky_relu'])}, got {nonlinearity!r}")
    return _GAINS[nonlinearity]


def _check(tensor, where):
    if not isinstance(tensor, Array) or tensor.dtype.kind != "f":
        got = f"dtype {tensor.dtype}" if isinstance(tensor, Array) else type(tensor).__name__
        raise TypeError(f"[fastmetal.nn.init.{where}] expected a float fastmetal.Array, got {got}")


def _fill(tensor, values):
    """Write `values` (an Array on tensor's device, or a number) into `tensor` in place."""
    with no_grad():
        if not isinstance(values, Array):
            values = asarray(np.full(tuple(tensor.shape), values, np.float32), device=tensor.device)
        copy(values, out=tensor)
    return tensor


def _calculate_fan_in_and_fan_out(tensor):
    """(fan_in, fan_out) of a weight: dims 1 and 0, times the receptive field (dims 2...)."""
    if tensor.ndim < 2:
        raise ValueError("[fastmetal.nn.init] expected a weight of at least 2 dimensions for "
                         f"its fan in and fan out, got shape {tuple(tensor.shape)}")
    field = math.prod(tensor.shape[2:])
    return tensor.shape[1] * field, tensor.shape[0] * field


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    """Fill with draws from U(a, b)."""
    _check(tensor, "uniform_")
    return _fill(tensor, _random.uniform(tuple(tensor.shape), a, b, device=tensor.device,
                                         generator=generator))


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """Fill with draws from N(mean, std**2)."""
    _check(tensor, "normal_")
    return _fill(tensor, _random.normal(tuple(tensor.shape), mean, std, device=tensor.device,
                                        generator=generator))


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Fill with draws from N(mean, std**2) truncated to [a, b] (absolute bounds, as PyTorch's):
    draws outside are drawn again (deterministic for a seeded generator)."""
    _check(tensor, "trunc_normal_")
    if not a < b:
        raise ValueError(f"[fastmetal.nn.init.trunc_normal_] expected a < b, got a={a!r}, b={b!r}")
    n = tensor.size
    kept = np.empty(0, np.float32)
    for _ in range(1000):
        if kept.size >= n:
            break
        draw = _random.normal((max(2 * (n - kept.size), 16),), mean, std,
                              generator=generator, device=tensor.device).numpy()
        kept = np.concatenate([kept, draw[(draw >= a) & (draw <= b)]])
    else:
        raise ValueError("[fastmetal.nn.init.trunc_normal_] expected [a, b] to hold some of "
                         f"N({mean}, {std}**2), got a={a!r}, b={b!r}")
    return _fill(tensor, asarray(kept[:n].reshape(tuple(tensor.shape)), device=tensor.device))


def constant_(tensor, val):
    """Fill with ``val``."""
    _check(tensor, "constant_")
    return _fill(tensor, float(val))


def zeros_(tensor):
    """Fill with 0."""
    return constant_(tensor, 0.0)


def ones_(tensor):
    """Fill with 1."""
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor, gain=1.0, generator=None):
    """U(-a, a) with ``a = gain * sqrt(6 / (fan_in + fan_out))`` (Glorot and Bengio)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    """N(0, std**2) with ``std = gain * sqrt(2 / (fan_in + fan_out))``."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def _kaiming_std(tensor, a, mode, nonlinearity, where):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"[fastmetal.nn.init.{where}] expected mode 'fan_in' or 'fan_out', "
                         f"got {mode!r}")
    fan = _calculate_fan_in_and_fan_out(tensor)[0 if mode == "fan_in" else 1]
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """U(-bound, bound) with ``bound = gain * sqrt(3 / fan)`` (He et al.)."""
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_uniform_")
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """N(0, std**2) with ``std = gain / sqrt(fan)`` (He et al.)."""
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_normal_"),
                   generator)


# ----------------------------------------------------------------------------- the layers' default
def _rng_for(cls, seed, rng):
    """A layer's own NumPy generator where it was given ``seed`` or ``rng``; None otherwise
    (its draws then come from fastmetal.random, which ``fm.random.seed`` seeds)."""
    if seed is not None and rng is not None:
        raise ValueError(f"[fastmetal.nn.{cls}] expected at most one of seed and rng, got both")
    if rng is None:
        return None if seed is None else np.random.default_rng(seed)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"[fastmetal.nn.{cls}] expected rng to be a numpy.random.Generator, "
                        f"got {type(rng).__name__}")
    return rng


def _uniform_parameter(rng, bound, shape, device):
    if rng is None:
        return Parameter(_random.uniform(shape, -bound, bound, device=device))
    host = rng.uniform(-bound, bound, size=shape).astype(np.float32)
    return Parameter(asarray(host, device=device))


def _seed_for(rng):
    """A Dropout layer's first mask seed: from its own generator, else fastmetal.random's."""
    return _random.fresh_seed() if rng is None else int(rng.integers(0, 2**63))
