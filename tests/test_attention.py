"""Fused scaled-dot-product attention (metal/attention_forward.metal and
attention_backward.metal, the CPU's tiled path in csrc/backend/cpu/isa/attention.cpp) through
the private _core._sdpa_forward / _sdpa_backward, against float64 NumPy (softmax(Q K^T * scale
+ mask) V and its analytic gradients; tests/attention_reference.py) on every device, the MSL
kernels under the CPU's emulator, PyTorch where installed, and the O(T) memory claim at
T = 16384. The public functional and MultiheadAttention: tests/test_attention_api.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core
from attention_reference import (CASES, OP, check, close, make_case, rand, random_problem,
                                 reference, sdpa, sdpa_grads)
from helpers import host, needs_torch, torch
from references import msl_kernels_on_cpu

kernels = pytest.fixture(msl_kernels_on_cpu)


@pytest.fixture(params=["tiled", "classic", "prefetch"])
def forward_variant(request, monkeypatch):
    """FASTMETAL_SDPA_FORWARD for the test: the register-blocked forward for head dims <= 64
    (sdpa_forward_tiled, the default; its 40 KiB "prefetch" instance on discrete GPUs, tiled
    where a device lacks it) or sdpa_forward. Read on every call; the CPU's own path ignores
    it (the emulator tests run the MSL kernels)."""
    monkeypatch.setenv("FASTMETAL_SDPA_FORWARD", request.param)
    return request.param


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
