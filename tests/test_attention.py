"""Fused scaled-dot-product attention (metal/attention_forward.metal and
attention_backward.metal, the CPU's tiled path in csrc/backend/cpu/isa/attention.cpp) through
the private _core._sdpa_forward / _sdpa_backward, against float64 NumPy (softmax(Q K^T * scale
+ mask) V and its analytic gradients) on every device, the MSL kernels under the CPU's
emulator, PyTorch where installed, and the O(T) memory claim at T = 16384."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core
from references import msl_kernels_on_cpu

try:
    import torch
except ImportError:  # the NumPy references still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
kernels = pytest.fixture(msl_kernels_on_cpu)


@pytest.fixture(params=["tiled", "classic", "prefetch"])
def forward_variant(request, monkeypatch):
    """FASTMETAL_SDPA_FORWARD for the test: the register-blocked forward for head dims <= 64
    (sdpa_forward_tiled, the default; its 40 KiB "prefetch" instance on discrete GPUs, tiled
    where a device lacks it) or sdpa_forward. Read on every call; the CPU's own path ignores
    it (the emulator tests run the MSL kernels)."""
    monkeypatch.setenv("FASTMETAL_SDPA_FORWARD", request.param)
    return request.param
OP = r"^\[fastmetal\.scaled_dot_product_attention\] expected"


def host(a):
    return a.numpy() if isinstance(a, fm.Array) else np.asarray(a)


# ----------------------------------------------------------------------------- calls
def dropout_key(p, seed):
    """fastmetal.dropout's (threshold, scale, key0, key1) for probability p."""
    if p == 0:
        return 0, 1.0, 0, 0
    return (math.ceil(p * 2**24), float(np.float32(1) / np.float32(1 - p)), seed & 0xFFFFFFFF,
            seed >> 32)


def sdpa(q, k, v, mask=None, causal=False, scale=None, p=0.0, seed=0):
    """(out, lse) of the fused forward; a NumPy bool mask is a boolean mask."""
    is_bool = mask is not None and np.asarray(mask).dtype == np.bool_
    return _core._sdpa_forward(q, k, v, mask, is_bool, causal, -1.0 if scale is None else scale,
                               *dropout_key(p, seed))


def sdpa_grads(g, q, k, v, out, lse, mask=None, causal=False, scale=None, p=0.0, seed=0):
    is_bool = mask is not None and np.asarray(mask).dtype == np.bool_
    return _core._sdpa_backward(g, q, k, v, mask, is_bool, causal,
                                -1.0 if scale is None else scale, *dropout_key(p, seed), out, lse)


# ----------------------------------------------------------------------------- references
def philox_words(n, seed):
    """Word n % 4 of Philox-4x32-10(counter (n // 4 mod 2**32, n // 2**34, 0, 0), key seed)
    for n = 0 .. size - 1, in NumPy uint64 arithmetic (Random123's algorithm)."""
    idx = np.arange(n, dtype=np.uint64)
    m32 = np.uint64(0xFFFFFFFF)
    x0, x1 = (idx >> np.uint64(2)) & m32, idx >> np.uint64(34)
    x2 = np.zeros_like(x0)
    x3 = np.zeros_like(x0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * x0
        p1 = np.uint64(0xCD9E8D57) * x2
        n0 = (p1 >> np.uint64(32)) ^ x1 ^ k0
        n2 = (p0 >> np.uint64(32)) ^ x3 ^ k1
        x1, x3, x0, x2 = p1 & m32, p0 & m32, n0, n2
        k0 = (k0 + np.uint64(0x9E3779B9)) & m32
        k1 = (k1 + np.uint64(0xBB67AE85)) & m32
    words = np.stack([x0, x1, x2, x3], axis=-1)
    return words[np.arange(n), (idx & np.uint64(3)).astype(np.int64)]


def keep_factors(shape, p, seed):
    """The dropout factors (0 or 1 / (1 - p) in float32) of an attention matrix of `shape`
    (batch..., L, S), by the flat index of each score (attention_args.h)."""
    if p == 0:
        return np.ones(shape)
    n = int(np.prod(shape))
    keep = (philox_words(n, seed) >> np.uint64(8)) >= np.uint64(math.ceil(p * 2**24))
    return np.where(keep, float(np.float32(1) / np.float32(1 - p)), 0.0).reshape(shape)


def scores(q, k, mask, causal, scale):
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    sc = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * sc
    L, S = s.shape[-2:]
    if causal:
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    if mask is not None:
        m = np.asarray(mask)
        s = np.where(m, s, -np.inf) if m.dtype == np.bool_ else s + m.astype(np.float64)
    return s, sc


def softmax_rows(s):
    """softmax over the last axis; a row with no finite score gives zeros (PyTorch 2.13)."""
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1), 0.0)


def reference(q, k, v, mask=None, causal=False, scale=None, p=0.0, seed=0, g=None):
    """float64 (out, lse, P, keep) and, with g, the gradients (dq, dk, dv) over the broadcast
    batch shape, plus the same formulas on absolute values (error scales)."""
    s, sc = scores(q, k, mask, causal, scale)
    v64 = np.asarray(v, np.float64)
    # Over the full broadcast batch shape (value's batch dims included), as the kernels index
    # the attention matrix (dropout) and lay out lse.
    full = np.broadcast_shapes(s.shape[:-2], v64.shape[:-2]) + s.shape[-2:]
    s = np.broadcast_to(s, full)
    P = softmax_rows(s)
    keep = keep_factors(P.shape, p, seed)
    out = (P * keep) @ v64
    with np.errstate(divide="ignore"):
        mx = s.max(-1)
        lse = np.where(np.isfinite(mx), mx + np.log(np.exp(s - np.where(np.isfinite(mx), mx, 0)[..., None]).sum(-1)), -np.inf)
    res = {"out": out, "out_scale": (P * keep) @ np.abs(v64), "lse": lse}
    if g is not None:
        g64, q64 = np.asarray(g, np.float64), np.asarray(q, np.float64)
        k64 = np.asarray(k, np.float64)
        dP = (g @ np.swapaxes(v64, -1, -2)) * keep
        delta = (dP * P).sum(-1, keepdims=True)
        dS = P * (dP - delta)
        res["dv"] = np.swapaxes(P * keep, -1, -2) @ g64
        res["dq"] = dS @ k64 * sc
        res["dk"] = np.swapaxes(dS, -1, -2) @ q64 * sc
        adS = P * ((np.abs(g64) @ np.swapaxes(np.abs(v64), -1, -2)) * keep + np.abs(delta))
        res["dv_scale"] = np.swapaxes(P * keep, -1, -2) @ np.abs(g64)
        res["dq_scale"] = adS @ np.abs(k64) * abs(sc)
        res["dk_scale"] = np.swapaxes(adS, -1, -2) @ np.abs(q64) * abs(sc)
    return res


def close(got, want, scale, what, rel=2e-5, floor=1e-6):
    """|got - want| <= rel * scale + floor elementwise (scale: the computation on absolute
    values; float32 sums of a few hundred terms stay far inside, an indexing bug does not)."""
    got = host(got).astype(np.float64)
    want = np.broadcast_to(want, got.shape)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = np.abs(got - want)
    bound = rel * np.broadcast_to(scale, got.shape) + floor
    bad = ~(err <= bound)
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} off, worst {np.nanmax(err):.3g} "
                           f"(bound {bound.flat[np.argmax(np.where(bad, err, 0))]:.3g})")


def check(r, q, k, v, mask=None, causal=False, scale=None, p=0.0, seed=0, rel=2e-5):
    """Forward and backward of one problem against the float64 reference."""
    out, lse = sdpa(q, k, v, mask, causal, scale, p, seed)
    g = r.standard_normal(host(out).shape).astype(host(q).dtype)
    ref = reference(q, k, v, mask, causal, scale, p, seed, g)
    where = f"q {np.shape(q)} k {np.shape(k)} v {np.shape(v)} mask {None if mask is None else np.shape(mask)} causal={causal} p={p}"
    close(out, ref["out"], ref["out_scale"], "out " + where, rel)
    lse_h = host(lse)
    finite = np.isfinite(ref["lse"])
    assert np.array_equal(np.isfinite(lse_h), finite), "lse: finite where the reference is"
    np.testing.assert_allclose(lse_h[finite], ref["lse"][finite], rtol=1e-5, atol=1e-5)
    dq, dk, dv = sdpa_grads(g, q, k, v, out, lse, mask, causal, scale, p, seed)
    close(dq, ref["dq"], ref["dq_scale"], "dq " + where, rel)
    close(dk, ref["dk"], ref["dk_scale"], "dk " + where, rel)
    close(dv, ref["dv"], ref["dv_scale"], "dv " + where, rel)
    return out


def rand(r, *shape, dtype=np.float32):
    return r.standard_normal(shape).astype(dtype)


# (q shape, k shape, v shape, mask shape or None, mask kind, causal)
CASES = [
    ((2, 3, 40, 16), (2, 3, 50, 16), (2, 3, 50, 24), None, None, False),     # L != S, Ev != E
    ((2, 70, 64), (2, 70, 64), (2, 70, 64), None, None, True),               # causal, 3 tiles
    ((3, 37, 20), (3, 45, 20), (3, 45, 9), (37, 45), "bool", False),         # E % 4 != 0
    ((1, 33, 100), (1, 19, 100), (1, 19, 72), (33, 19), "float", True),      # wide heads, L > S
    ((2, 5, 128), (2, 70, 128), (2, 70, 128), (2, 1, 70), "float", True),    # L < S, D = 128
    ((4, 1, 8, 16), (1, 2, 8, 16), (4, 2, 8, 16), (2, 8, 8), "bool", False), # batch broadcast
    ((1, 1, 1), (1, 1, 1), (1, 1, 1), None, None, False),                    # size-1 dims
    ((6, 17), (23, 17), (23, 3), (23,), "float", False),                     # 2-D, 1-D mask
    ((2, 2, 65, 32), (2, 2, 65, 32), (2, 2, 65, 48), (2, 2, 65, 65), "float", False),
    ((2, 130, 44), (2, 130, 44), (2, 130, 12), None, None, True),           # K, V in 8 x 8 blocks + tails
]


def make_case(r, case):
    qs, ks, vs, ms, kind, causal = case
    q, k, v = rand(r, *qs), rand(r, *ks), rand(r, *vs)
    mask = None
    if kind == "bool":
        mask = r.random(ms) < 0.7
    elif kind == "float":
        mask = (r.standard_normal(ms) * 2).astype(np.float32)
    return q, k, v, mask, causal


# ----------------------------------------------------------------------------- every device
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_float64_reference(device, rng, case, forward_variant):
    q, k, v, mask, causal = make_case(rng, case)
    check(rng, q, k, v, mask, causal)


def forward_cases(r):
    """Problems for the forwards: odd L and S (1, 33, 1000), masks of every kind and
    broadcast, causal (with paired query tiles that stop before S), fully masked rows,
    E != Ev, head dims 1 .. 64."""
    fmask = (r.standard_normal((33, 70)) * 2).astype(np.float32)
    fmask[5] = -np.inf                      # a fully masked row (additive)
    bmask = r.random((1, 1000, 33)) < 0.8
    bmask[0, 999] = False                   # the last row, in the last partial tile
    return [
        (rand(r, 2, 1, 16), rand(r, 2, 1, 16), rand(r, 2, 1, 8), None, False),
        (rand(r, 3, 33, 64), rand(r, 3, 70, 64), rand(r, 3, 70, 64), fmask, False),
        (rand(r, 2, 33, 64), rand(r, 2, 33, 64), rand(r, 2, 33, 40), None, True),
        (rand(r, 1, 1000, 8), rand(r, 1, 33, 8), rand(r, 1, 33, 5), bmask, True),
        (rand(r, 2, 2, 70, 1), rand(r, 2, 1, 129, 1), rand(r, 1, 2, 129, 63), r.random((2, 1, 129)) < 0.5, False),
        (rand(r, 1, 140, 64), rand(r, 1, 140, 64), rand(r, 1, 140, 64), None, True),  # paired tiles
    ]


FORWARDS = ("tiled", "classic", "split", "prefetch")


def test_forward_variants(device, rng):
    check_forward_variants(rng, exact=False)


def check_forward_variants(rng, exact):
    """The forwards (FASTMETAL_SDPA_FORWARD) against float64 and each other: the same scores,
    maxima, P and accumulation order, so classic differs from tiled only through the order the
    row sums are added in (ulps); dropout draws the same bits; the backward runs on either lse.
    split and prefetch (the 40 KiB instances; tiled where a device lacks them) do what tiled
    does in the same order: bit for bit under the CPU emulator (exact), within ulps on a GPU
    whose compiler may contract the sums differently per instance."""
    saved = os.environ.get("FASTMETAL_SDPA_FORWARD")
    try:
        for q, k, v, mask, causal in forward_cases(rng):
            got = {}
            for variant in FORWARDS:
                os.environ["FASTMETAL_SDPA_FORWARD"] = variant
                check(rng, q, k, v, mask, causal, p=0.0)
                got[variant] = [host(x) for x in sdpa(q, k, v, mask, causal, p=0.25, seed=11)]
            for other in FORWARDS[1:]:
                for name, a, b in zip(("out", "lse"), got["tiled"], got[other]):
                    if exact and other != "classic":
                        np.testing.assert_array_equal(a, b, err_msg=f"tiled against {other} {name}")
                        continue
                    assert np.array_equal(np.isfinite(a), np.isfinite(b)), name
                    np.testing.assert_allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=2e-6,
                                               atol=1e-6, err_msg=f"tiled against {other} {name}")
        q, k, v = (rand(rng, 2, 45, 48).astype(np.float16) for _ in range(3))
        for variant in FORWARDS:
            os.environ["FASTMETAL_SDPA_FORWARD"] = variant
            out, lse = sdpa(q, k, v, causal=True, p=0.2, seed=3)
            ref = reference(q, k, v, causal=True, p=0.2, seed=3)
            close(out, ref["out"], ref["out_scale"], variant + " float16 out",
                  rel=2 * float(np.finfo(np.float16).eps))
        os.environ["FASTMETAL_SDPA_FORWARD"] = "tiled"
        check_head_split_views(rng)
    finally:
        if saved is None:
            os.environ.pop("FASTMETAL_SDPA_FORWARD", None)
        else:
            os.environ["FASTMETAL_SDPA_FORWARD"] = saved


def backward_cases(r):
    """Problems for both backwards (head dims <= 64): L = S = 1, odd L != S both ways, tiles of
    32 rows and 64 keys with tails, causal (diagonal and skipped tiles), masks of both kinds
    with a fully masked row, dropout, E != Ev, E % 4 != 0, broadcast batch dims."""
    fmask = (r.standard_normal((33, 70)) * 2).astype(np.float32)
    fmask[7] = -np.inf
    return [  # q, k, v, mask, causal, dropout p
        (rand(r, 2, 1, 16), rand(r, 2, 1, 16), rand(r, 2, 1, 8), None, False, 0.0),
        (rand(r, 2, 33, 64), rand(r, 2, 70, 64), rand(r, 2, 70, 64), fmask, False, 0.0),
        (rand(r, 1, 140, 64), rand(r, 1, 140, 64), rand(r, 1, 140, 64), None, True, 0.25),
        (rand(r, 2, 5, 20), rand(r, 2, 130, 20), rand(r, 2, 130, 9), None, True, 0.0),
        (rand(r, 1, 100, 33), rand(r, 1, 20, 33), rand(r, 1, 20, 64), r.random((100, 20)) < 0.6,
         True, 0.3),
        (rand(r, 3, 1, 33, 8), rand(r, 1, 2, 65, 8), rand(r, 3, 2, 65, 4), None, False, 0.0),
    ]


def check_backward_variants(rng, exact):
    """Both backwards (FASTMETAL_SDPA_BACKWARD) against float64 and each other. They form the
    same scores, P, dP and dS and sum every gradient element over the same rows or keys in
    the same order, so under the CPU emulator (exact) they agree bit for bit; a GPU compiler
    may contract the dS expression differently in each (tolerance)."""
    saved = os.environ.get("FASTMETAL_SDPA_BACKWARD")
    try:
        for q, k, v, mask, causal, p in backward_cases(rng):
            out, lse = sdpa(q, k, v, mask, causal, p=p, seed=5)
            g = rand(rng, *host(out).shape)
            ref = reference(q, k, v, mask, causal, p=p, seed=5, g=g)
            got = {}
            for variant in ("tiled", "classic"):
                os.environ["FASTMETAL_SDPA_BACKWARD"] = variant
                got[variant] = [host(x) for x in sdpa_grads(g, q, k, v, out, lse, mask, causal,
                                                            p=p, seed=5)]
                for name, x in zip(("dq", "dk", "dv"), got[variant]):
                    close(x, ref[name], ref[name + "_scale"],
                          f"{variant} {name} q {q.shape} k {k.shape} causal={causal} p={p}")
            for name, a, b in zip(("dq", "dk", "dv"), got["tiled"], got["classic"]):
                if exact:
                    np.testing.assert_array_equal(a, b, err_msg=name)
                else:
                    close(a, b, ref[name + "_scale"], "tiled against classic " + name, rel=4e-6)
        q, k, v, g = (rand(rng, 2, 45, 48).astype(np.float16) for _ in range(4))
        out, lse = sdpa(q, k, v, causal=True, p=0.2, seed=3)
        ref = reference(q, k, v, causal=True, p=0.2, seed=3, g=g)
        for variant in ("tiled", "classic"):
            os.environ["FASTMETAL_SDPA_BACKWARD"] = variant
            grads = sdpa_grads(g, q, k, v, out, lse, causal=True, p=0.2, seed=3)
            for name, x in zip(("dq", "dk", "dv"), grads):
                assert host(x).dtype == np.float16
                close(x, ref[name], ref[name + "_scale"], f"{variant} float16 {name}",
                      rel=4 * float(np.finfo(np.float16).eps))
    finally:
        if saved is None:
            os.environ.pop("FASTMETAL_SDPA_BACKWARD", None)
        else:
            os.environ["FASTMETAL_SDPA_BACKWARD"] = saved


def test_backward_variants(device, rng):
    check_backward_variants(rng, exact=False)


def test_scale_and_fastmetal_arrays(device, rng):
    q, k, v = rand(rng, 2, 30, 24), rand(rng, 2, 41, 24), rand(rng, 2, 41, 24)
    out = check(rng, fm.asarray(q), fm.asarray(k), fm.asarray(v), scale=0.37)
    assert isinstance(out, fm.Array) and out.shape == (2, 30, 24)
    check(rng, q, k, v, scale=0.0)  # every score 0: the mean of V


def test_fully_masked_rows_are_zero_as_torch(device, rng):
    # PyTorch 2.13's SDPA gives 0 (not NaN) for a row with no key taking part, and no
    # gradient through it; so does an empty key sequence.
    q, k, v = rand(rng, 2, 6, 16), rand(rng, 2, 9, 16), rand(rng, 2, 9, 8)
    mask = rng.random((6, 9)) < 0.6
    mask[2] = False
    fmask = np.where(mask, 0.0, -np.inf).astype(np.float32)
    for m in (mask, fmask):
        out = check(rng, q, k, v, m)
        np.testing.assert_array_equal(host(out)[:, 2], 0.0)
        _, lse = sdpa(q, k, v, m)
        assert np.all(host(lse)[:, 2] == -np.inf)
        g = rand(rng, 2, 6, 8)
        o, lse = sdpa(q, k, v, m)
        dq, dk, dv = sdpa_grads(g, q, k, v, o, lse, m)
        np.testing.assert_array_equal(host(dq)[:, 2], 0.0)
    out, lse = sdpa(q, k[:, :0], v[:, :0])
    np.testing.assert_array_equal(host(out), np.zeros((2, 6, 8), np.float32))
    dq, dk, dv = sdpa_grads(rand(rng, 2, 6, 8), q, k[:, :0], v[:, :0], out, lse)
    np.testing.assert_array_equal(host(dq), 0.0)
    assert host(dk).shape == (2, 0, 16) and host(dv).shape == (2, 0, 8)


def test_empty_shapes(device, rng):
    out, lse = sdpa(rand(rng, 0, 5, 16), rand(rng, 0, 7, 16), rand(rng, 0, 7, 4))
    assert host(out).shape == (0, 5, 4) and host(lse).shape == (0, 5)
    q, k, v = rand(rng, 2, 0, 16), rand(rng, 2, 7, 16), rand(rng, 2, 7, 4)
    out, lse = sdpa(q, k, v)
    assert host(out).shape == (2, 0, 4)
    dq, dk, dv = sdpa_grads(np.zeros((2, 0, 4), np.float32), q, k, v, out, lse)
    np.testing.assert_array_equal(host(dk), 0.0)
    np.testing.assert_array_equal(host(dv), 0.0)
    out, _ = sdpa(rand(rng, 2, 3, 16), rand(rng, 2, 7, 16), rand(rng, 2, 7, 0))
    assert host(out).shape == (2, 3, 0)


def test_nan_and_huge_scores(device, rng):
    q, k, v = rand(rng, 1, 4, 16), rand(rng, 1, 6, 16), rand(rng, 1, 6, 8)
    q[0, 1, 3] = np.nan
    out, _ = sdpa(q, k, v)
    o = host(out)
    assert np.isnan(o[0, 1]).all() and np.isfinite(np.delete(o[0], 1, axis=0)).all()
    # Scores of 1e4 and more: the running max keeps exp in range.
    check(rng, q[:, [0, 2, 3]] * 300, k * 300, v, scale=1.0, rel=1e-4)
    big = np.full((1, 6, 6), 1e30, np.float32)
    check(rng, rand(rng, 1, 6, 16), k, v, big * np.eye(6, dtype=np.float32)[None])


def test_dropout_is_the_philox_mask_of_the_attention_matrix(device, rng):
    q, k, v = rand(rng, 2, 3, 19, 16), rand(rng, 2, 3, 37, 16), rand(rng, 2, 3, 37, 24)
    for p, seed in ((0.25, 7), (0.5, 2**40 + 3), (0.1, 123)):
        check(rng, q, k, v, causal=True, p=p, seed=seed)
    a, _ = sdpa(q, k, v, p=0.3, seed=5)
    b, _ = sdpa(q, k, v, p=0.3, seed=5)
    c, _ = sdpa(q, k, v, p=0.3, seed=6)
    np.testing.assert_array_equal(host(a), host(b))
    assert not np.array_equal(host(a), host(c))


def test_float16(device, rng):
    # float16 storage, float32 accumulation: against float64 of the rounded inputs, within
    # float16 rounding of the results.
    for qs, ks, vs, causal in (((2, 40, 64), (2, 50, 64), (2, 50, 32), False),
                               ((1, 21, 96), (1, 21, 96), (1, 21, 128), True)):
        q, k, v = (rand(rng, *s).astype(np.float16) for s in (qs, ks, vs))
        out, lse = sdpa(q, k, v, causal=causal)
        assert host(out).dtype == np.float16 and host(lse).dtype == np.float32
        g = rand(rng, *host(out).shape).astype(np.float16)
        ref = reference(q, k, v, causal=causal, g=g)
        eps = float(np.finfo(np.float16).eps)
        close(out, ref["out"], ref["out_scale"], "float16 out", rel=2 * eps)
        dq, dk, dv = sdpa_grads(g, q, k, v, out, lse, causal=causal)
        assert host(dq).dtype == np.float16
        # The backward reads the float16-rounded output (delta = rowsum(dO * O)).
        for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
            close(got, ref[name], ref[name + "_scale"], "float16 " + name, rel=4 * eps)


def test_bad_input(device, rng):
    q, k, v = rand(rng, 2, 5, 16), rand(rng, 2, 7, 16), rand(rng, 2, 7, 8)
    bad = [
        ((q, rand(rng, 2, 7, 15), v), ValueError, "key's last dim"),
        ((q, k, rand(rng, 2, 6, 8)), ValueError, "value's sequence length"),
        ((q, k, v.astype(np.float16)), TypeError, "one dtype"),
        ((rand(rng, 5), k, v), ValueError, "query with at least 2 dims"),
        ((rand(rng, 3, 5, 16), k, v), ValueError, "batch dims that broadcast"),
        ((rand(rng, 2, 5, 130), rand(rng, 2, 7, 130), v), ValueError, "head dims"),
        ((q, k, rand(rng, 2, 7, 129)), ValueError, "head dims"),
    ]
    for args, err, what in bad:
        with pytest.raises(err, match=OP + ".*" + what):
            sdpa(*args)
    for mshape, what in (((5, 6), "attn_mask broadcastable"), ((4, 7), "attn_mask broadcastable"),
                         ((3, 5, 7), "batch dims that broadcast"),
                         ((2, 2, 5, 7), "attn_mask broadcastable")):  # no added batch dims
        with pytest.raises(ValueError, match=OP + " " + what):
            sdpa(q, k, v, np.zeros(mshape, np.float32))
    out, lse = sdpa(q, k, v)
    with pytest.raises(ValueError, match=OP + " grad_output of shape"):
        sdpa_grads(rand(rng, 2, 5, 9), q, k, v, out, lse)
    with pytest.raises(ValueError, match=OP + " the forward's logsumexp"):
        sdpa_grads(rand(rng, 2, 5, 8), q, k, v, out, host(lse)[:, :4])
    with pytest.raises(TypeError, match="query"):
        sdpa(np.array([["a"]]), k, v)


def test_backward_is_deterministic(device, rng):
    # No atomics: the same call gives the same bits; one batch entry (its key blocks split in
    # groups with dQ partials) agrees with the same entry inside a large batch.
    q, k, v = rand(rng, 64, 150, 32), rand(rng, 64, 150, 32), rand(rng, 64, 150, 32)
    g = rand(rng, 64, 150, 32)
    out, lse = sdpa(q, k, v, causal=True)
    full = [host(x) for x in sdpa_grads(g, q, k, v, out, lse, causal=True)]
    again = [host(x) for x in sdpa_grads(g, q, k, v, out, lse, causal=True)]
    for a, b in zip(full, again):
        np.testing.assert_array_equal(a, b)
    for i in (0, 37):
        o1, l1 = sdpa(q[i:i + 1], k[i:i + 1], v[i:i + 1], causal=True)
        np.testing.assert_array_equal(host(o1), host(out)[i:i + 1])
        one = sdpa_grads(g[i:i + 1], q[i:i + 1], k[i:i + 1], v[i:i + 1], o1, l1, causal=True)
        for a, b in zip(one, full):
            np.testing.assert_allclose(host(a), b[i:i + 1], rtol=1e-5, atol=1e-6)


@pytest.mark.cpu_only
def test_cpu_results_do_not_depend_on_the_thread_count(tmp_path):
    # The CPU path's tasks and sums are cut by the shape only: 1 thread and the default give
    # the same bits, forward and backward, for many and for few batch entries.
    script = textwrap.dedent("""
        import sys, numpy as np
        from fastmetal import _core
        r = np.random.default_rng(5)
        outs = []
        for shape in ((2, 200, 40), (40, 70, 16)):
            q, k, v, g = (r.standard_normal(shape).astype(np.float32) for _ in range(4))
            o, l = _core._sdpa_forward(q, k, v, None, False, True, -1.0, 0, 1.0, 0, 0)
            outs += [o, l, *_core._sdpa_backward(g, q, k, v, None, False, True, -1.0, 0, 1.0,
                                                 0, 0, o, l)]
        np.savez(sys.argv[1], *outs)
    """)
    results = []
    for threads in ("1", None):
        env = dict(os.environ, FASTMETAL_DEVICE="cpu")
        env.pop("FASTMETAL_NUM_THREADS", None)
        if threads:
            env["FASTMETAL_NUM_THREADS"] = threads
        path = tmp_path / f"t{threads}.npz"
        res = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                             text=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr
        results.append(np.load(path))
    for name in results[0].files:
        np.testing.assert_array_equal(results[0][name], results[1][name], err_msg=name)


def check_head_split_views(r, dtype=np.float32):
    """(N, T, H, D) memory seen as (N, H, T, D) (as attention layers split heads): read in
    place, and the output and gradients laid out the same way (their (N, T, H, D) permute is
    contiguous); a negative-stride NumPy view is copied first."""
    N, H, L, S, D, Dv = 2, 3, 21, 34, 16, 8
    bq, bk, bv, bg = (rand(r, N, t, H, d).astype(dtype) for t, d in ((L, D), (S, D), (S, Dv), (L, Dv)))
    q, k, v, g = (fm.asarray(x).permute(0, 2, 1, 3) for x in (bq, bk, bv, bg))
    nq, nk, nv, ng = (np.transpose(x, (0, 2, 1, 3)) for x in (bq, bk, bv, bg))
    mask = r.random((L, S)) < 0.8
    out, lse = sdpa(q, k, v, mask, causal=True)
    ref = reference(nq, nk, nv, mask, causal=True, g=ng)
    rel = 2e-5 if dtype == np.float32 else 4 * float(np.finfo(np.float16).eps)
    close(out, ref["out"], ref["out_scale"], "strided out", rel)
    def contiguous_as_nthd(x):  # noqa: E306
        return host(x.permute(0, 2, 1, 3)).flags.c_contiguous
    assert contiguous_as_nthd(out)
    grads = sdpa_grads(g, q, k, v, out, lse, mask, causal=True)
    for name, got in zip(("dq", "dk", "dv"), grads):
        close(got, ref[name], ref[name + "_scale"], "strided " + name, 2 * rel)
        assert contiguous_as_nthd(got), name
    # Negative strides (a reversed NumPy view) take the copying road.
    rq = np.ascontiguousarray(nq)[:, :, ::-1]
    out2, _ = sdpa(rq, nk, nv)
    ref2 = reference(rq, nk, nv)
    close(out2, ref2["out"], ref2["out_scale"], "reversed out", rel)


def test_rows_that_start_off_a_16_byte_boundary(device, rng):
    check_offset_rows(rng)


def check_offset_rows(rng):
    """Head dim 64 read through views that start 4 bytes into their buffer (row strides still
    multiples of 4 elements): the tiled kernels must take their element loads here, not the
    float4 ones of aligned rows; and aligned copies of the same data agree bit for bit."""
    base = [fm.asarray(rand(rng, 2, 37, 68)) for _ in range(4)]
    q, k, v, g = (x[:, :, 1:65] for x in base)
    nq, nk, nv, ng = (host(x) for x in (q, k, v, g))
    for causal in (False, True):
        out, lse = sdpa(q, k, v, causal=causal)
        ref = reference(nq, nk, nv, causal=causal, g=ng)
        close(out, ref["out"], ref["out_scale"], "offset out")
        for name, got in zip(("dq", "dk", "dv"), sdpa_grads(g, q, k, v, out, lse, causal=causal)):
            close(got, ref[name], ref[name + "_scale"], "offset " + name)
        aligned = sdpa_grads(ng, nq, nk, nv, out, lse, causal=causal)
        for a, b in zip(sdpa_grads(g, q, k, v, out, lse, causal=causal), aligned):
            np.testing.assert_array_equal(host(a), host(b))


def test_head_split_views(device, rng):
    check_head_split_views(rng)
    check_head_split_views(rng, np.float16)


# ----------------------------------------------------------------------------- MSL kernels
EMULATED = [
    ((2, 40, 16), (2, 50, 16), (2, 50, 24), (40, 50), "bool", False),
    ((1, 37, 64), (1, 37, 64), (1, 37, 64), None, None, True),
    ((2, 1, 20, 20), (1, 3, 33, 20), (1, 3, 33, 7), (20, 33), "float", True),
    ((1, 17, 100), (1, 23, 100), (1, 23, 128), (1, 23), "float", False),    # the d128 family
    ((1, 9, 128), (1, 40, 128), (1, 40, 65), None, None, True),
]


@pytest.mark.cpu_only
@pytest.mark.parametrize("seed", [1, 2])
def test_msl_kernels_under_the_emulator(kernels, seed):
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)  # another interleaving of the fibers
    r = np.random.default_rng(seed)
    for case in EMULATED:
        q, k, v, mask, causal = make_case(r, case)
        check(r, q, k, v, mask, causal, p=0.2 if seed == 2 else 0.0, seed=seed)
    check_head_split_views(r)
    for _ in range(3):
        q, k, v, mask, causal, p = random_problem(r, small=True)
        check(r, q, k, v, mask, causal, p=p, seed=seed, rel=4e-5)
    q, k, v = (rand(r, 1, 19, 40).astype(np.float16) for _ in range(3))
    out, lse = sdpa(q, k, v, causal=True)
    g = rand(r, 1, 19, 40).astype(np.float16)
    ref = reference(q, k, v, causal=True, g=g)
    eps = float(np.finfo(np.float16).eps)
    close(out, ref["out"], ref["out_scale"], "emulated float16 out", rel=2 * eps)
    for name, got in zip(("dq", "dk", "dv"), sdpa_grads(g, q, k, v, out, lse, causal=True)):
        close(got, ref[name], ref[name + "_scale"], "emulated float16 " + name, rel=4 * eps)


@pytest.mark.cpu_only
@pytest.mark.parametrize("seed", [3, 4])
def test_forward_variants_under_the_emulator(kernels, seed):
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    check_forward_variants(np.random.default_rng(seed), exact=True)


@pytest.mark.cpu_only
@pytest.mark.parametrize("seed", [5, 6])
def test_backward_variants_under_the_emulator(kernels, seed):
    os.environ["FASTMETAL_EMULATOR_SEED"] = str(seed)
    check_backward_variants(np.random.default_rng(seed), exact=True)
    check_offset_rows(np.random.default_rng(seed))


@pytest.mark.cpu_only
def test_msl_kernels_agree_with_the_cpu_path(rng):
    q, k, v = rand(rng, 2, 45, 32), rand(rng, 2, 45, 32), rand(rng, 2, 45, 16)
    mask = rng.random((45, 45)) < 0.8
    mask[4] = False
    g = rand(rng, 2, 45, 16)
    native = sdpa(q, k, v, mask, True, p=0.3, seed=9)
    grads = sdpa_grads(g, q, k, v, *native, mask, True, p=0.3, seed=9)
    saved = _core._native_cpu()
    _core._set_native_cpu(False)
    try:
        msl = sdpa(q, k, v, mask, True, p=0.3, seed=9)
        msl_grads = sdpa_grads(g, q, k, v, *msl, mask, True, p=0.3, seed=9)
    finally:
        _core._set_native_cpu(saved)
    for a, b in zip(list(native) + list(grads), list(msl) + list(msl_grads)):
        a, b = host(a), host(b)
        assert np.array_equal(np.isfinite(a), np.isfinite(b))
        np.testing.assert_allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- PyTorch
@needs_torch
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_against_torch(device, rng, case):
    q, k, v, mask, causal = make_case(rng, case)
    if causal and mask is not None:
        causal = False  # PyTorch refuses both at once
    tq, tk, tv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    tm = None if mask is None else torch.tensor(mask if mask.dtype == np.bool_ else mask.astype(np.float64))
    to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, is_causal=causal)
    g = rand(rng, *to.shape)
    to.backward(torch.tensor(g, dtype=torch.float64))
    out, lse = sdpa(q, k, v, mask, causal)
    ref = reference(q, k, v, mask, causal, g=g)
    close(out, to.detach().numpy(), ref["out_scale"], "torch out")
    grads = sdpa_grads(g, q, k, v, out, lse, mask, causal)
    for got, t, name in zip(grads, (tq, tk, tv), ("dq", "dk", "dv")):
        want = t.grad.numpy()
        got = host(got)
        # Our gradients are over the broadcast batch shape: sum the broadcast dims away.
        extra = got.ndim - want.ndim
        got = got.sum(axis=tuple(range(extra))) if extra else got
        axes = tuple(i for i, (a, b) in enumerate(zip(got.shape, want.shape)) if a != b)
        got = got.sum(axis=axes, keepdims=True) if axes else got
        scale = ref[name + "_scale"]
        scale = scale.sum(axis=tuple(range(extra))) if extra else scale
        scale = scale.sum(axis=axes, keepdims=True) if axes else scale
        close(got, want, scale, "torch " + name)


# ----------------------------------------------------------------------------- memory
@pytest.mark.cpu_only
def test_memory_is_linear_in_sequence_length():
    # T = 16384, head dim 64, forward + backward on the CPU path: T x T floats would be 1 GiB;
    # the peak RSS may grow by the inputs, outputs and O(T) scratch only (a few tens of MiB).
    script = textwrap.dedent("""
        import resource, numpy as np, fastmetal as fm
        from fastmetal import _core
        T, E = 16384, 64
        r = np.random.default_rng(0)
        q, k, v, g = (fm.asarray(r.standard_normal((1, T, E)).astype(np.float32)) for _ in range(4))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out, lse = _core._sdpa_forward(q, k, v, None, False, True, -1.0, 0, 1.0, 0, 0)
        dq, dk, dv = _core._sdpa_backward(g, q, k, v, None, False, True, -1.0, 0, 1.0, 0, 0, out, lse)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert np.isfinite(dq.numpy()).all() and np.isfinite(out.numpy()).all()
        print((after - before) * 1024)
    """)
    env = dict(os.environ, FASTMETAL_DEVICE="cpu")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=900)
    assert res.returncode == 0, res.stderr
    growth = int(res.stdout.split()[-1])
    assert growth < 64 * 2**20, f"peak RSS grew by {growth / 2**20:.1f} MiB (T x T floats: 1024 MiB)"


# ----------------------------------------------------------------------------- public API
F = fm.nn.functional


def leaves(r, *shapes, dtype=np.float32):
    return [fm.asarray(rand(r, *s).astype(dtype)).requires_grad_() for s in shapes]


def test_functional_gradients_through_autograd(device, rng):
    # Broadcast key/value (one head shared by the batch): the tape sums dk, dv back.
    q, k, v = leaves(rng, (2, 3, 11, 16), (1, 3, 13, 16), (3, 13, 8))
    mask = rng.random((11, 13)) < 0.8
    g = rand(rng, 2, 3, 11, 8)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    out.backward(fm.asarray(g))
    ref = reference(q.numpy(), k.numpy(), v.numpy(), mask, scale=0.3, g=g)
    close(out, ref["out"], ref["out_scale"], "F out")
    close(q.grad, ref["dq"], ref["dq_scale"], "F dq")
    close(k.grad, ref["dk"].sum(axis=0, keepdims=True), ref["dk_scale"].sum(axis=0, keepdims=True),
          "F dk")
    close(v.grad, ref["dv"].sum(axis=0), ref["dv_scale"].sum(axis=0), "F dv")


def test_functional_finite_differences(device, rng):
    q, k, v = (rand(rng, 1, 5, 8) for _ in range(3))
    w = rand(rng, 1, 5, 8)

    def loss(q, k, v):
        return fm.sum(F.scaled_dot_product_attention(q, k, v, is_causal=True) * w)

    grads = fm.grad(loss, argnums=(0, 1, 2))(q, k, v)
    h = 1e-2
    for which, (x, gx) in enumerate(zip((q, k, v), grads)):
        gx = host(gx)
        for idx in [(0, 1, 2), (0, 4, 7), (0, 0, 0), (0, 3, 5)]:
            args = [q, k, v]
            plus, minus = x.copy(), x.copy()
            plus[idx] += h
            minus[idx] -= h
            args[which] = plus
            fp = float(host(loss(*args)))
            args[which] = minus
            fmn = float(host(loss(*args)))
            assert abs((fp - fmn) / (2 * h) - gx[idx]) < 2e-2 * (1 + abs(gx[idx])), (which, idx)


def test_functional_gqa_matches_repeated_heads(device, rng):
    q, k, v = leaves(rng, (2, 6, 9, 16), (2, 2, 12, 16), (2, 2, 12, 8))
    mask = rng.random((2, 6, 9, 12)) < 0.8
    g = rand(rng, 2, 6, 9, 8)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, is_causal=True)
    out.backward(fm.asarray(g))
    kr, vr = (np.repeat(x.numpy(), 3, axis=1) for x in (k, v))
    ref = reference(q.numpy(), kr, vr, mask, causal=True, g=g)
    close(out, ref["out"], ref["out_scale"], "gqa out")
    close(q.grad, ref["dq"], ref["dq_scale"], "gqa dq")
    fold = lambda x: x.reshape(2, 2, 3, *x.shape[2:]).sum(axis=2)  # noqa: E731
    close(k.grad, fold(ref["dk"]), fold(ref["dk_scale"]), "gqa dk")
    close(v.grad, fold(ref["dv"]), fold(ref["dv_scale"]), "gqa dv")
    with pytest.raises(ValueError, match=OP + " with enable_gqa"):
        F.scaled_dot_product_attention(q, k[:, :1].numpy().repeat(4, 1), v, enable_gqa=True)


def test_functional_mask_that_requires_grad_is_refused(device, rng):
    x = rand(rng, 2, 5, 8)
    mask = fm.asarray(rand(rng, 5, 5)).requires_grad_()
    with pytest.raises(RuntimeError, match=OP + " an attn_mask that does not require grad"):
        F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
    with fm.no_grad():
        F.scaled_dot_product_attention(x, x, x, attn_mask=mask)
    out = F.scaled_dot_product_attention(x, x, x, attn_mask=mask.detach())
    close(out, reference(x, x, x, mask.detach().numpy())["out"],
          reference(x, x, x, mask.detach().numpy())["out_scale"], "detached mask")


def random_problem(r, small=False):
    """A random problem: broadcast batch dims, any head dims up to 128 (up to 40 small), L and
    S from 1, a mask of a random kind and broadcast, causal or not, dropout or not."""
    nd = int(r.integers(0, 3))
    batch = [int(r.integers(1, 4)) for _ in range(nd)]
    def dims():  # noqa: E306  (each operand keeps or broadcasts each batch dim)
        return [b if r.random() < 0.7 else 1 for b in batch][int(r.integers(0, nd + 1)):]
    top = 40 if small else 128
    L, S = int(r.integers(1, 30 if small else 90)), int(r.integers(1, 30 if small else 90))
    E, Ev = int(r.integers(1, top + 1)), int(r.integers(1, top + 1))
    q, k, v = rand(r, *dims(), L, E), rand(r, *dims(), S, E), rand(r, *dims(), S, Ev)
    mask = None
    kind = r.choice(["none", "bool", "float"])
    if kind != "none":
        qkv = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        mshape = tuple(int(x) if r.random() < 0.5 else 1 for x in qkv)[int(r.integers(0, len(qkv) + 1)):]
        mshape += (L if r.random() < 0.7 else 1, S if r.random() < 0.8 else 1)
        mask = (r.random(mshape) < 0.75) if kind == "bool" else rand(r, *mshape)
    return q, k, v, mask, bool(r.random() < 0.4), 0.3 if r.random() < 0.3 else 0.0


@pytest.mark.parametrize("seed", range(12))
def test_random_problems(device, seed):
    r = np.random.default_rng(1000 + seed)
    q, k, v, mask, causal, p = random_problem(r)
    check(r, q, k, v, mask, causal, p=p, seed=seed, rel=4e-5)


def test_functional_dropout_seeds(device, rng):
    q, k, v = (rand(rng, 2, 7, 16) for _ in range(3))
    a = host(F.scaled_dot_product_attention(q, k, v, dropout_p=0.4, seed=11))
    ref = reference(q, k, v, p=0.4, seed=11)
    close(a, ref["out"], ref["out_scale"], "dropout out")
    fm.random.seed(3)
    b = host(F.scaled_dot_product_attention(q, k, v, dropout_p=0.4))
    c = host(F.scaled_dot_product_attention(q, k, v, dropout_p=0.4))
    fm.random.seed(3)
    np.testing.assert_array_equal(b, host(F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)))
    assert not np.array_equal(b, c)
    np.testing.assert_array_equal(host(F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)),
                                  host(F.scaled_dot_product_attention(q, k, v)))


@pytest.mark.parametrize("kwargs,err,what", [
    (dict(dropout_p=1.0), ValueError, "dropout_p"), (dict(dropout_p="0.1"), TypeError, "dropout_p"),
    (dict(is_causal=1), TypeError, "is_causal"), (dict(scale="x"), TypeError, "scale"),
    (dict(scale=float("nan")), ValueError, "scale"), (dict(enable_gqa=None), TypeError, "enable_gqa"),
])
def test_functional_bad_arguments(kwargs, err, what):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(err, match=OP + " .*" + what):
        F.scaled_dot_product_attention(x, x, x, **kwargs)


def mha_reference(m, query, key, value, attn_mask=None, key_padding_mask=None, causal=False):
    """float64 multi-head attention from the layer's parameters (batch_first=False layout,
    PyTorch's mask conventions: bool True = may not attend)."""
    sd = {n: np.asarray(a, np.float64) for n, a in m.state_dict().items()}
    E, H = m.embed_dim, m.num_heads
    W, b = sd["in_proj_weight"], sd.get("in_proj_bias", np.zeros(3 * E))
    x = [np.swapaxes(np.asarray(t, np.float64), 0, 1) for t in (query, key, value)]  # (N, T, E)
    proj = [xi @ W[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E] for i, xi in enumerate(x)]
    N = proj[0].shape[0]
    q, k, v = (p.reshape(N, -1, H, E // H).transpose(0, 2, 1, 3) for p in proj)
    L, S = q.shape[2], k.shape[2]
    add = np.zeros((N, H, L, S))
    if attn_mask is not None:
        am = np.where(attn_mask, -np.inf, 0.0) if attn_mask.dtype == np.bool_ else attn_mask
        add = add + (am.reshape(N, H, L, S) if am.ndim == 3 else am)
    if key_padding_mask is not None:
        add = add + np.where(key_padding_mask, -np.inf, 0.0)[:, None, None, :]
    if causal:
        add = add + np.triu(np.full((L, S), -np.inf), 1)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(E // H) + add
    P = softmax_rows(s)
    o = (P @ v).transpose(0, 2, 1, 3).reshape(N, L, E)
    out = o @ sd["out_proj.weight"].T + sd.get("out_proj.bias", np.zeros(E))
    return np.swapaxes(out, 0, 1), P


def test_multihead_attention_against_numpy(device, rng):
    m = fm.nn.MultiheadAttention(16, 4, seed=0)
    assert [n for n, _ in m.named_parameters()] == ["in_proj_weight", "in_proj_bias",
                                                    "out_proj.weight", "out_proj.bias"]
    np.testing.assert_array_equal(m.in_proj_bias.numpy(), 0.0)
    np.testing.assert_array_equal(m.out_proj.bias.numpy(), 0.0)
    bound = math.sqrt(6 / (16 + 48))
    assert np.abs(m.in_proj_weight.numpy()).max() <= bound
    query, key = rand(rng, 7, 3, 16), rand(rng, 9, 3, 16)
    am = rng.random((7, 9)) < 0.3
    am[:, 0] = False  # every row keeps a key (PyTorch's weights path gives NaN otherwise)
    kpm = np.zeros((3, 9), bool)
    kpm[1, 5:] = True
    out, w = m(query, key, key, key_padding_mask=kpm, attn_mask=am)
    want, P = mha_reference(m, query, key, key, am, kpm)
    np.testing.assert_allclose(host(out), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(host(w), P.mean(axis=1), rtol=1e-4, atol=1e-6)
    out, w = m(query, query, query, need_weights=False, is_causal=True)
    assert w is None
    np.testing.assert_allclose(host(out), mha_reference(m, query, query, query, causal=True)[0],
                               rtol=1e-4, atol=1e-5)
    # Unbatched input, a 3-D float mask, per-head weights.
    fmask = rand(rng, 4, 7, 9)
    out, w = m(query[:, 0], key[:, 0], key[:, 0], attn_mask=fmask, average_attn_weights=False)
    want, P = mha_reference(m, query[:, :1], key[:, :1], key[:, :1], fmask[None].reshape(4, 7, 9))
    np.testing.assert_allclose(host(out), want[:, 0], rtol=1e-4, atol=1e-5)
    assert host(w).shape == (4, 7, 9)
    np.testing.assert_allclose(host(w), P[0], rtol=1e-4, atol=1e-6)


def test_multihead_attention_options_and_errors(device, rng):
    m = fm.nn.MultiheadAttention(8, 2, bias=False, batch_first=True, seed=1)
    assert m.in_proj_bias is None and m.out_proj.bias is None
    assert list(m.state_dict()) == ["in_proj_weight", "out_proj.weight"]
    x = rand(rng, 3, 5, 8)
    out, _ = m(x, x, x)
    want, _ = mha_reference(m, np.swapaxes(x, 0, 1), np.swapaxes(x, 0, 1), np.swapaxes(x, 0, 1))
    np.testing.assert_allclose(host(out), np.swapaxes(want, 0, 1), rtol=1e-4, atol=1e-5)
    for kwargs in (dict(embed_dim=10, num_heads=3), dict(embed_dim=8, num_heads=2, dropout=1.0)):
        with pytest.raises(ValueError, match=r"^\[fastmetal\.nn\.MultiheadAttention\] expected"):
            fm.nn.MultiheadAttention(**kwargs)
    with pytest.raises(ValueError, match="attn_mask of shape"):
        m(x, x, x, attn_mask=np.zeros((4, 4), bool))
    with pytest.raises(ValueError, match="key_padding_mask of shape"):
        m(x, x, x, key_padding_mask=np.zeros((3, 4), bool))
    with pytest.raises(ValueError, match="last dim to be embed_dim"):
        m(rand(rng, 3, 5, 7), x, x)
    # Dropout: a new mask per training call, none in eval mode; the weights carry the same mask.
    d = fm.nn.MultiheadAttention(8, 2, dropout=0.5, seed=2)
    y = rand(rng, 5, 2, 8)
    a, wa = d(y, y, y, average_attn_weights=False)
    b, _ = d(y, y, y)
    assert not np.array_equal(host(a), host(b))
    d.eval()
    e, we = d(y, y, y, average_attn_weights=False)
    np.testing.assert_allclose(host(e), mha_reference(d, y, y, y)[0], rtol=1e-4, atol=1e-5)
    kept = host(wa) != 0
    assert 0.3 < kept.mean() < 0.7
    np.testing.assert_allclose(host(wa)[kept], (host(we) * 2)[kept], rtol=1e-5)


@needs_torch
@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention_against_torch(device, rng, batch_first):
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first)
    m = fm.nn.MultiheadAttention(32, 4, batch_first=batch_first, seed=0)
    m.load_state_dict({n: t.detach().numpy() for n, t in tm.state_dict().items()})
    shape = (3, 10, 32) if batch_first else (10, 3, 32)
    kshape = (3, 12, 32) if batch_first else (12, 3, 32)
    query, key, value = rand(rng, *shape), rand(rng, *kshape), rand(rng, *kshape)
    am = rng.random((10, 12)) < 0.3
    am[:, 3] = False
    kpm = rng.random((3, 12)) < 0.2
    kpm[:, 3] = False
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (query, key, value))
    to, tw = tm(tq, tk, tv, key_padding_mask=torch.tensor(kpm), attn_mask=torch.tensor(am))
    g = rand(rng, *to.shape)
    to.backward(torch.tensor(g))
    fq, fk, fv = (fm.asarray(x).requires_grad_() for x in (query, key, value))
    out, w = m(fq, fk, fv, key_padding_mask=kpm, attn_mask=am)
    out.backward(fm.asarray(g))
    np.testing.assert_allclose(host(out), to.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(host(w), tw.detach().numpy(), rtol=1e-4, atol=1e-6)
    for got, t in ((fq.grad, tq), (fk.grad, tk), (fv.grad, tv)):
        np.testing.assert_allclose(host(got), t.grad.numpy(), rtol=1e-4, atol=1e-5)
    for (name, p), (tname, tp) in zip(m.named_parameters(), tm.named_parameters()):
        assert name == tname
        np.testing.assert_allclose(host(p.grad), tp.grad.numpy(), rtol=1e-4, atol=1e-4)
    # A fully masked row: 0 as PyTorch's fused path (need_weights=False) gives it.
    am2 = np.zeros((10, 12), bool)
    am2[4] = True
    to2, _ = tm(tq, tk, tv, attn_mask=torch.tensor(am2), need_weights=False)
    out2, _ = m(query, key, value, attn_mask=am2, need_weights=False)
    np.testing.assert_allclose(host(out2), to2.detach().numpy(), rtol=1e-4, atol=1e-5)


@needs_torch
def test_functional_against_torch_autograd(device, rng):
    for dtype, tol in ((np.float32, 2e-5), (np.float16, 4e-3)):
        q, k, v = leaves(rng, (2, 4, 33, 64), (2, 2, 40, 64), (2, 2, 40, 64), dtype=dtype)
        g = rand(rng, 2, 4, 33, 64).astype(dtype)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(fm.asarray(g))
        tq, tk, tv = (torch.tensor(x.numpy().astype(np.float64), requires_grad=True)
                      for x in (q, k, v))
        to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                              enable_gqa=True)
        to.backward(torch.tensor(g.astype(np.float64)))
        for got, want in ((out, to), (q.grad, tq.grad), (k.grad, tk.grad), (v.grad, tv.grad)):
            want = want.detach().numpy()
            np.testing.assert_allclose(host(got).astype(np.float64), want,
                                       atol=tol * max(1.0, np.abs(want).max()))
