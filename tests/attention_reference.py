"""What the attention tests share (tests/test_attention.py: the fused kernels on every device,
under the CPU's emulator and against PyTorch; tests/test_attention_api.py: the public
functional and MultiheadAttention): the private calls of the fused forward and backward,
their float64 NumPy reference (softmax(Q K^T * scale + mask) V, its analytic gradients and
the Philox dropout mask), the comparison with error scales, and random problems."""
from __future__ import annotations

import math

import numpy as np

from fastmetal import _core
from helpers import host

OP = r"^\[fastmetal\.scaled_dot_product_attention\] expected"


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
