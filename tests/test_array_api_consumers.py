"""Libraries that dispatch on the Array API run on fastmetal Arrays: array-api-compat finds
fastmetal's namespace, array-api-extra's functions compute on Arrays, and SciPy's
array-API-aware functions (SCIPY_ARRAY_API=1, which must be set before SciPy is imported: they
run in a subprocess) take and give Arrays. Every value is checked against NumPy (float64 where
the function has a NumPy spelling). Each part skips cleanly without its library.

What does not run yet, and why, is in docs/API.md ("Conformance")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import fastmetal as fm
from helpers import host


def arr(x, device, dtype=np.float32):
    # a copy: on the cpu asarray shares NumPy's memory, and the inputs here are module constants
    return fm.asarray(np.array(x, dtype=dtype), dtype=dtype, device=device)


def test_array_api_compat_finds_fastmetal(device):
    compat = pytest.importorskip("array_api_compat")
    a = arr([1.0, 2.0], device)
    assert compat.is_array_api_obj(a)
    assert compat.array_namespace(a) is fm
    assert compat.array_namespace(a, arr([3.0], device)) is fm
    assert compat.device(a) == device


X = np.array([[0.5, -1.0, 2.0], [3.0, 4.5, -6.0]], np.float32)
V = np.array([0.0, 0.5, 1.0, 3.0], np.float32)
IDX = np.array([0, 2, 1, 2], np.int64)
WITH_NAN = np.array([[np.nan, 2.0, 1.0], [4.0, np.nan, -3.0]], np.float32)

# name -> (call on fastmetal Arrays, the NumPy reference on the same values)
EXTRA_CASES = {
    "atleast_nd": (lambda xpx, a: xpx.atleast_nd(a["v"], ndim=3), lambda: V[None, None]),
    "pad": (lambda xpx, a: xpx.pad(a["x"], 2, constant_values=7.0),
            lambda: np.pad(X, 2, constant_values=7.0)),
    "kron": (lambda xpx, a: xpx.kron(a["x"], a["v"][None, :2]),
             lambda: np.kron(X, V[None, :2])),
    "create_diagonal": (lambda xpx, a: xpx.create_diagonal(a["v"], offset=1),
                        lambda: np.diag(V, k=1)),
    "union1d": (lambda xpx, a: xpx.union1d(a["v"], a["x"][0]), lambda: np.union1d(V, X[0])),
    "nunique": (lambda xpx, a: xpx.nunique(a["x"]), lambda: np.unique(X).size),
    "one_hot": (lambda xpx, a: xpx.one_hot(a["idx"], 3), lambda: np.eye(3)[IDX]),
    "apply_where": (lambda xpx, a: xpx.apply_where(a["x"] > 1.0, a["x"], lambda v: v * 2.0,
                                                   fill_value=0.0),
                    lambda: np.where(X > 1.0, X * 2.0, 0.0)),
    "nansum": (lambda xpx, a: xpx.nansum(a["nan"], axis=1), lambda: np.nansum(WITH_NAN, axis=1)),
    "nanmean": (lambda xpx, a: xpx.nanmean(a["nan"], axis=0),
                lambda: np.nanmean(WITH_NAN, axis=0)),
    "nanmax": (lambda xpx, a: xpx.nanmax(a["nan"]), lambda: np.nanmax(WITH_NAN)),
    "nanmin": (lambda xpx, a: xpx.nanmin(a["nan"], axis=1), lambda: np.nanmin(WITH_NAN, axis=1)),
    "deg2rad": (lambda xpx, a: xpx.deg2rad(a["x"]), lambda: np.deg2rad(X)),
    "rad2deg": (lambda xpx, a: xpx.rad2deg(a["x"]), lambda: np.rad2deg(X)),
    "searchsorted": (lambda xpx, a: xpx.searchsorted(a["v"], a["x"], side="right"),
                     lambda: np.searchsorted(V, X, side="right")),
    "unravel_index": (lambda xpx, a: xpx.unravel_index(a["idx"] + 3, (2, 3)),
                      lambda: np.unravel_index(IDX + 3, (2, 3))),
    "tril_indices": (lambda xpx, a: xpx.tril_indices(3, offset=1, m=4, xp=fm,
                                                     device=a["x"].device),
                     lambda: np.tril_indices(3, 1, 4)),
    "sinc": (lambda xpx, a: xpx.sinc(a["x"]), lambda: np.sinc(X)),
    "setdiff1d": (lambda xpx, a: xpx.setdiff1d(a["v"], a["x"][0]), lambda: np.setdiff1d(V, X[0])),
    "isclose": (lambda xpx, a: xpx.isclose(a["x"], a["x"] + 1e-7, atol=0.0),
                lambda: np.isclose(X, X + np.float32(1e-7), atol=0.0)),
    "isin": (lambda xpx, a: xpx.isin(a["x"], a["x"][0]), lambda: np.isin(X, X[0])),
    "at_set": (lambda xpx, a: xpx.at(a["x"])[0, 1].set(9.0, copy=True),
               lambda: np.where(np.arange(6).reshape(2, 3) == 1, np.float32(9.0), X)),
    "at_add": (lambda xpx, a: xpx.at(a["x"], (slice(None), 0)).add(1.0, copy=True),
               lambda: X + np.array([[1.0, 0.0, 0.0]] * 2, np.float32)),
}


@pytest.mark.parametrize("name", sorted(EXTRA_CASES))
def test_array_api_extra_on_fastmetal(name, device):
    xpx = pytest.importorskip("array_api_extra")
    call, reference = EXTRA_CASES[name]
    inputs = {"x": arr(X, device), "v": arr(V, device), "idx": arr(IDX, device, np.int64),
              "nan": arr(WITH_NAN, device)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got = call(xpx, inputs)
    want = reference()
    parts_got = got if isinstance(got, tuple) else (got,)
    parts_want = want if isinstance(want, tuple) else (want,)
    assert len(parts_got) == len(parts_want)
    for g, w in zip(parts_got, parts_want):
        assert isinstance(g, fm.Array), type(g)  # computed by fastmetal, not NumPy
        assert g.device == device
        np.testing.assert_allclose(host(g), w, rtol=2e-6, atol=1e-6, err_msg=name)


def test_array_api_extra_partition_and_lazy_apply(device):
    xpx = pytest.importorskip("array_api_extra")
    rng = np.random.default_rng(5)
    x = rng.standard_normal(20).astype(np.float32)
    got = host(xpx.partition(arr(x, device), 7))
    assert got[7] == np.sort(x)[7] and got[:7].max() <= got[7] <= got[8:].min()
    np.testing.assert_array_equal(np.sort(got), np.sort(x))
    out = xpx.lazy_apply(lambda v: np.cumsum(v), arr(x, device), shape=(20,), dtype=fm.float32)
    assert isinstance(out, fm.Array)
    np.testing.assert_allclose(host(out), np.cumsum(x), rtol=1e-6, atol=1e-6)


# SciPy's array-API-aware functions: name -> the call, on `x` (an Array or an ndarray).
SCIPY_CASES = {
    "special.logsumexp": "scipy.special.logsumexp(x, axis=1)",
    "special.softmax": "scipy.special.softmax(x, axis=1)",
    "special.expit": "scipy.special.expit(x)",
    "special.entr": "scipy.special.entr(abs(x))",
    "special.xlogy": "scipy.special.xlogy(abs(x), abs(x) + 1)",
    "special.erf": "scipy.special.erf(x)",
    "special.gammaln": "scipy.special.gammaln(abs(x))",
    "stats.hmean": "scipy.stats.hmean(abs(x), axis=1)",
    "stats.gmean": "scipy.stats.gmean(abs(x), axis=1)",
    "stats.pmean": "scipy.stats.pmean(abs(x), 2.0, axis=1)",
    "stats.sem": "scipy.stats.sem(x, axis=1)",
    "special.log_softmax": "scipy.special.log_softmax(x, axis=1)",
    "stats.moment": "scipy.stats.moment(x, order=2, axis=1)",
    "stats.skew": "scipy.stats.skew(x, axis=1)",
    "stats.zscore": "scipy.stats.zscore(x, axis=1)",
}
SCIPY_CHILD = """
import json, sys, warnings
import numpy as np, scipy.special, scipy.stats, fastmetal as fm
warnings.simplefilter("ignore")
cases, device = json.loads(sys.argv[1]), sys.argv[2]
x_np = np.array({x!r}, np.float32)
x = fm.asarray(x_np, device=device)
out = {{}}
for name, expr in cases.items():
    got = eval(expr, {{"scipy": scipy, "x": x}})
    want = eval(expr, {{"scipy": scipy, "x": x_np.astype(np.float64)}})
    out[name] = [type(got).__name__, np.asarray(got).tolist(), np.asarray(want).tolist()]
print(json.dumps(out))
"""


def test_scipy_array_api_functions_on_fastmetal(device):
    pytest.importorskip("scipy")
    env = dict(os.environ, SCIPY_ARRAY_API="1")
    child = SCIPY_CHILD.format(x=X.tolist())
    proc = subprocess.run([sys.executable, "-c", child, json.dumps(SCIPY_CASES), device],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == set(SCIPY_CASES)
    for name, (kind, got, want) in results.items():
        assert kind == "Array", f"{name} gave a {kind}, not a fastmetal Array"
        np.testing.assert_allclose(np.array(got, np.float64), want, rtol=2e-6, atol=1e-6,
                                   err_msg=name)


def test_array_api_extra_at_updates_in_place_without_copy(device):
    xpx = pytest.importorskip("array_api_extra")
    a = arr(X, device)
    out = xpx.at(a)[1, :2].multiply(2.0)  # copy=None: fastmetal Arrays are writeable
    want = X.copy()
    want[1, :2] *= 2.0
    np.testing.assert_array_equal(host(a), want)
    np.testing.assert_array_equal(host(out), want)
