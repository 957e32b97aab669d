"""No input may crash the process, on any device: every public function, fed random junk,
raises only TypeError / ValueError (or RuntimeError from a backend), never anything else."""
from __future__ import annotations

import random
import warnings

import numpy as np
import pytest

import fastmetal as fm

from conftest import HOST_VISIBLE

ALLOWED = (TypeError, ValueError, RuntimeError, OverflowError)


def junk():
    return [None, "abc", 3, -1, 0, 2.5, float("nan"), float("inf"), True, [], [1, 2],
            [[1], [2, 3]], (1, 2), {"a": 1}, object(), 10**30, -(10**30),
            np.ones(0, np.float32), np.ones((2, 3), np.float32), np.ones((2, 3, 4, 5), np.float32),
            np.ones((1, 1, 3, 3)), np.arange(6).reshape(2, 3), np.ones(3, np.complex64),
            np.array(["x"]), np.ones((2, 3), np.float16)[:, ::-1], fm.zeros((2, 3))]


def unmergeable_20d():
    """20 dims that cannot be merged: more than the strided kernels take."""
    return np.ones((2,) * 20, np.float32).transpose(*range(19, -1, -1))[(slice(None, None, -1),) * 20]


PUBLIC = [n for n in fm.__all__ if callable(getattr(fm, n)) and n not in ("Array", "set_default_device", "nn")]


@pytest.mark.parametrize("name", PUBLIC)
def test_random_junk_raises_cleanly(name, device):
    fn = getattr(fm, name)
    rng = random.Random(name)
    values = junk()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for nargs in range(4):
            for _ in range(40):
                args = [rng.choice(values) for _ in range(nargs)]
                try:
                    fn(*args)
                except ALLOWED:
                    pass
                except FileNotFoundError:  # fm.load of a junk path: Python's own error for it
                    assert name == "load"


@pytest.mark.parametrize("kwargs", [dict(stride=0), dict(padding="bogus"), dict(dilation=(1, 2, 3)),
                                    dict(groups=0), dict(stride=True), dict(padding=-1),
                                    dict(stride=2**40), dict(padding=(1, 2, 3))])
def test_conv2d_bad_options_name_the_argument(kwargs, device):
    with pytest.raises((TypeError, ValueError), match=rf"\[fastmetal\.conv2d\] expected {next(iter(kwargs))}"):
        fm.conv2d(np.ones((1, 2, 5, 5), np.float32), np.ones((2, 2, 3, 3), np.float32), **kwargs)


def test_too_many_unmergeable_dims_is_a_value_error(device):
    x = unmergeable_20d()
    if device not in HOST_VISIBLE:
        # Copied to the device as a contiguous array first: no strides left to merge.
        np.testing.assert_allclose(fm.exp(x), np.exp(x.astype(np.float64)), rtol=1e-6)
        return
    with pytest.raises(ValueError, match="at most 16"):  # strided views are used in place
        fm.exp(x)
