"""The math helpers (metal/fm_math.h) over the whole float32 range, in float32 ulps.

Every op of the table against its NumPy float64 reference on random bit patterns (so every
exponent, subnormals included), special values and, for sin/cos, arguments next to
multiples of pi/2 up to 1e38, where the range reduction has to cancel the most bits.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.ops.optable import OPS
from fastmetal.ops.elementwise import FUNCTIONS as OP

from references import numpy_reference

MAX_ULP = 8.0
UNARY = [s for s in OPS if s.arity == 1]
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.1754944e-38,
                     -1.1754944e-38, 3.4028235e38, -3.4028235e38, 1.0, -1.0, 0.5, 0.625, 9.1,
                     88.72, 89.0, -87.3, -103.9, -104.5, 32768.0, 32769.0, 1e10, 1e30],
                    dtype=np.float32)


def whole_range(rng, n):
    bits = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    x[np.isnan(x)] = np.nan  # quiet NaNs: a signalling one warns when NumPy casts it
    return np.concatenate([x, SPECIALS])


def near_multiples_of_half_pi(rng, n):
    k = np.concatenate([np.arange(1, 2000), rng.integers(1, 2**62, size=n, dtype=np.int64)])
    x = (k.astype(np.float64) * (np.pi / 2)).astype(np.float32)
    x = x[np.isfinite(x)]
    return np.concatenate([x, -x, np.nextafter(x, np.float32(np.inf))])


def ulp_errors(got, ref):
    """|got - ref| in ulps of the float32 result (subnormal spacing below the normal range);
    NaN, infinities and signs of infinities must match exactly (returned as inf if not)."""
    got = np.asarray(got)
    with np.errstate(all="ignore"):
        want = ref.astype(np.float32)
    special = ~np.isfinite(want) | ~np.isfinite(got)
    same_special = (np.isnan(got) & np.isnan(want)) | (got == want)
    with np.errstate(all="ignore"):
        spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        err = np.abs(got.astype(np.float64) - ref) / spacing
    return np.where(special, np.where(same_special, 0.0, np.inf), err)


def assert_within(name, x, got, ref, *extra):
    err = ulp_errors(got, ref)
    i = int(np.argmax(err))
    where = ", ".join(f"{a[i]!r}" for a in (x, *extra))
    assert err[i] <= MAX_ULP, f"{name}({where}) = {np.asarray(got)[i]!r}, want {ref[i]!r}: {err[i]:.1f} ulp"


@pytest.mark.parametrize("spec", UNARY, ids=lambda s: s.name)
def test_unary_whole_float_range(spec, rng, device):
    x = whole_range(rng, 200_000 if spec.name != "gelu" else 40_000)
    if spec.name in ("sin", "cos"):
        x = np.concatenate([x, near_multiples_of_half_pi(rng, 100_000)])
    got = OP[spec.name](x)
    assert_within(spec.name, x, got, numpy_reference(spec, x.astype(np.float64)))


def test_power_whole_range(rng, device):
    spec = next(s for s in OPS if s.name == "power")
    n = 200_000
    x = whole_range(rng, n)
    y = np.concatenate([(rng.standard_normal(n) * rng.choice([0.5, 3, 30, 300, 3e6], n)).astype(np.float32),
                        SPECIALS])
    # bases near 1 with large exponents (y log x near the overflow threshold), and every
    # combination of the special values (C99 / NumPy's special cases)
    near1 = (1 + rng.standard_normal(n) * 1e-3).astype(np.float32)
    big_y = (rng.standard_normal(n) * 3e4).astype(np.float32)
    sx, sy = np.meshgrid(np.concatenate([SPECIALS, [-2.0, 2.0, -0.5, 3.0]]).astype(np.float32),
                         np.concatenate([SPECIALS, [2.0, 3.0, -3.0, 0.5, -0.5, 2.5]]).astype(np.float32))
    x = np.concatenate([x, near1, sx.ravel()])
    y = np.concatenate([y, big_y, sy.ravel()])
    got = fm.power(x, y)
    assert_within("power", x, got, numpy_reference(spec, x.astype(np.float64), y.astype(np.float64)), y)
