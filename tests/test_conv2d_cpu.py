"""The CPU conv2d algorithms (fastmetal._core private hooks) against an independent NumPy
float64 reference: forward, backward-input, backward-weight, backward-bias over random
configurations (groups, depthwise, stride, dilation, asymmetric padding, 1x1, batch 1), for
each compiled instruction set (subprocesses with FASTMETAL_CPU_ISA), and from several Python
threads at once. CPU-only: these are the cpu backend's own algorithms, called directly; the
public conv2d runs on every device in test_conv2d.py."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from references import (ref_conv2d_explicit, ref_conv2d_explicit_backward_input,
                        ref_conv2d_explicit_backward_weight)
from thread_harness import threaded_mismatches

pytestmark = pytest.mark.cpu_only
core = pytest.importorskip("fastmetal._core")
TESTS = str(Path(__file__).resolve().parent)

RTOL = 1e-5


def check(got, want, what):
    scale = max(np.abs(want).max(), 1e-30)
    err = np.abs(got.astype(np.float64) - want).max() / scale
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert err < RTOL, f"{what}: relative error {err:.2e}"


# ------------------------------------------------------------------ configurations
def random_config(rng):
    kind = rng.integers(0, 8)
    N = int(rng.choice([1, 1, 2, 3, 5]))
    g = 1
    if kind == 0:  # depthwise
        C = int(rng.integers(1, 20))
        g, Ci, Co = C, C, C * int(rng.choice([1, 2]))
    elif kind == 1:  # grouped
        g = int(rng.integers(2, 5))
        Ci, Co = g * int(rng.integers(1, 6)), g * int(rng.integers(1, 7))
    elif kind == 6:  # many channels per group (the per-tap weight-gradient GEMM), small images
        g = int(rng.choice([1, 2]))
        Ci, Co = g * int(rng.choice([16, 32, 48, 64])), g * int(rng.integers(1, 12))
    else:
        Ci, Co = int(rng.integers(1, 24)), int(rng.integers(1, 40))
    if kind == 2:  # 1x1
        kH = kW = 1
    else:
        kH, kW = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    sh, sw = int(rng.choice([1, 1, 2, 3])), int(rng.choice([1, 1, 2]))
    dh, dw = int(rng.choice([1, 1, 2])), int(rng.choice([1, 1, 3]))
    ph, pw = int(rng.integers(0, 4)), int(rng.integers(0, 3))
    top = 14 if kind == 6 else 30
    H = int(rng.integers((kH - 1) * dh + 1, max(top, (kH - 1) * dh + 2)))
    W = int(rng.integers((kW - 1) * dw + 1, max(top, (kW - 1) * dw + 2)))
    # Bottom/right padding anywhere from "drop the last rows" to ph + 1 (asymmetric).
    bh, bw = int(rng.integers(-sh + 1, ph + 2)), int(rng.integers(-sw + 1, pw + 2))
    Ho = (H + ph + bh - (kH - 1) * dh - 1) // sh + 1
    Wo = (W + pw + bw - (kW - 1) * dw - 1) // sw + 1
    if Ho < 1 or Wo < 1:
        return random_config(rng)
    return dict(N=N, Ci=Ci, Co=Co, H=H, W=W, kH=kH, kW=kW, g=g,
                cfg=(sh, sw, ph, pw, dh, dw, Ho, Wo))


FIXED = [  # the layers the library cares about most, plus edge shapes
    dict(N=3, Ci=1, Co=32, H=28, W=28, kH=3, kW=3, g=1, cfg=(1, 1, 0, 0, 1, 1, 26, 26)),
    dict(N=2, Ci=32, Co=64, H=26, W=26, kH=3, kW=3, g=1, cfg=(1, 1, 0, 0, 1, 1, 24, 24)),
    dict(N=1, Ci=64, Co=64, H=20, W=19, kH=3, kW=3, g=1, cfg=(1, 1, 1, 1, 1, 1, 20, 19)),
    dict(N=2, Ci=16, Co=24, H=15, W=17, kH=1, kW=1, g=1, cfg=(2, 2, 0, 0, 1, 1, 8, 9)),
    dict(N=1, Ci=8, Co=8, H=9, W=9, kH=3, kW=3, g=8, cfg=(1, 1, 1, 1, 1, 1, 9, 9)),
    dict(N=1, Ci=3, Co=5, H=1, W=1, kH=1, kW=1, g=1, cfg=(1, 1, 0, 0, 1, 1, 1, 1)),
    dict(N=2, Ci=4, Co=6, H=8, W=8, kH=4, kW=4, g=2, cfg=(1, 1, 1, 1, 1, 1, 8, 8)),  # "same", even k
    dict(N=1, Ci=2, Co=3, H=5, W=5, kH=3, kW=3, g=1, cfg=(1, 1, 4, 4, 1, 1, 11, 11)),  # pad > k-1
    # enough channels per group for the per-tap weight-gradient GEMM (grouped, batched)
    dict(N=3, Ci=64, Co=8, H=10, W=12, kH=3, kW=2, g=2, cfg=(1, 1, 1, 2, 2, 2, 7, 13)),
    dict(N=5, Ci=32, Co=16, H=9, W=9, kH=3, kW=3, g=1, cfg=(1, 1, 1, 1, 1, 1, 9, 9)),
    dict(N=4, Ci=48, Co=20, H=7, W=40, kH=2, kW=3, g=1, cfg=(1, 1, 0, 1, 1, 1, 6, 40)),
    # large enough to be split into several chunks / units
    dict(N=1, Ci=8, Co=64, H=40, W=40, kH=3, kW=3, g=1, cfg=(1, 1, 1, 1, 1, 1, 40, 40)),
    dict(N=2, Ci=4, Co=8, H=100, W=100, kH=3, kW=3, g=1, cfg=(2, 2, 1, 1, 1, 1, 50, 50)),
    dict(N=6, Ci=1, Co=9, H=60, W=60, kH=3, kW=3, g=1, cfg=(1, 1, 1, 1, 1, 1, 60, 60)),
]


def run_case(c, seed):
    rng = np.random.default_rng(seed)
    N, Ci, Co, H, W, kH, kW, g = (c[k] for k in ("N", "Ci", "Co", "H", "W", "kH", "kW", "g"))
    cfg = c["cfg"]
    sh, sw, ph, pw, dh, dw, Ho, Wo = cfg
    x = rng.standard_normal((N, Ci, H, W), dtype=np.float32)
    w = rng.standard_normal((Co, Ci // g, kH, kW), dtype=np.float32)
    b = rng.standard_normal(Co, dtype=np.float32)
    gy = rng.standard_normal((N, Co, Ho, Wo), dtype=np.float32)
    y = core._conv2d_cpu_forward(x, w, b, sh, sw, ph, pw, dh, dw, g, Ho, Wo)
    check(y, ref_conv2d_explicit(x, w, b.astype(np.float64), g, cfg), f"forward {c}")
    y0 = core._conv2d_cpu_forward(x, w, None, sh, sw, ph, pw, dh, dw, g, Ho, Wo)
    check(y0, ref_conv2d_explicit(x, w, None, g, cfg), f"forward no bias {c}")
    gx = core._conv2d_cpu_backward_input(gy, w, H, W, sh, sw, ph, pw, dh, dw, g)
    check(gx, ref_conv2d_explicit_backward_input(gy, w, H, W, g, cfg), f"backward_input {c}")
    gw = core._conv2d_cpu_backward_weight(gy, x, kH, kW, sh, sw, ph, pw, dh, dw, g)
    check(gw, ref_conv2d_explicit_backward_weight(gy, x, kH, kW, g, cfg), f"backward_weight {c}")
    gb = core._conv2d_cpu_backward_bias(gy)
    check(gb, gy.astype(np.float64).sum(axis=(0, 2, 3)), f"backward_bias {c}")


def run_all(n_random, seed=0):
    for i, c in enumerate(FIXED):
        run_case(c, seed + i)
    rng = np.random.default_rng(seed)
    for i in range(n_random):
        run_case(random_config(rng), seed + 1000 + i)


# ------------------------------------------------------------------ tests
def test_reference_matches_torch():
    """The NumPy reference itself, against PyTorch (float64), on a grouped strided dilated case."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 11, 10))
    w = rng.standard_normal((9, 2, 3, 2))
    b = rng.standard_normal(9)
    cfg = (2, 1, 1, 2, 2, 1, 5, 13)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    yt = F.conv2d(xt, wt, torch.tensor(b), stride=(2, 1), padding=(1, 2), dilation=(2, 1),
                  groups=3)
    assert tuple(yt.shape[2:]) == cfg[-2:]
    gy = rng.standard_normal(yt.shape)
    yt.backward(torch.tensor(gy))
    np.testing.assert_allclose(ref_conv2d_explicit(x, w, b, 3, cfg), yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ref_conv2d_explicit_backward_input(gy, w, 11, 10, 3, cfg), xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ref_conv2d_explicit_backward_weight(gy, x, 3, 2, 3, cfg), wt.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_random_configs():
    run_all(n_random=150)


@pytest.mark.parametrize("isa", ["base", "avx2", "avx512"])
def test_each_isa(isa):
    if isa != "base":
        flags = ""
        if os.path.exists("/proc/cpuinfo"):
            with open("/proc/cpuinfo") as f:
                flags = f.read()
        if (isa == "avx2" and " avx2" not in flags) or (isa == "avx512" and " avx512f" not in flags):
            pytest.skip(f"CPU lacks {isa}")
    code = (f"import sys; sys.path.insert(0, {TESTS!r}); "
            "import fastmetal._core as c; import importlib.util as u; "
            f"assert c._cpu_isa() == {isa!r}, c._cpu_isa(); "
            f"s = u.spec_from_file_location('t', {__file__!r}); m = u.module_from_spec(s); "
            "s.loader.exec_module(m); m.run_all(n_random=60, seed=77)")
    env = dict(os.environ, FASTMETAL_CPU_ISA=isa)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0 and "not compiled" in (r.stderr + r.stdout):
        pytest.skip(f"{isa} not compiled in: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("threads", [1, 3])
def test_pool_sizes(threads):
    """Other pool sizes change how work is split (per image vs within an image)."""
    code = (f"import sys; sys.path.insert(0, {TESTS!r}); import importlib.util as u; "
            f"s = u.spec_from_file_location('t', {__file__!r}); m = u.module_from_spec(s); "
            "s.loader.exec_module(m); m.run_all(n_random=30, seed=91)")
    env = dict(os.environ, FASTMETAL_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_threads_concurrently():
    """Several Python threads calling at once (GIL released) get exactly the serial results."""
    rng = np.random.default_rng(3)
    cases = []
    for i in range(4):
        N = [1, 4][i % 2]  # batch 1 uses the intra-image split, batch 4 the per-image one
        x = rng.standard_normal((N, 12, 17, 15), dtype=np.float32)
        w = rng.standard_normal((20, 12 // (1 + i % 2 * 3), 3, 3), dtype=np.float32)
        g = 1 + i % 2 * 3
        gy = rng.standard_normal((N, 20, 17, 15), dtype=np.float32)
        cases.append((x, w, gy, g))

    def compute(x, w, gy, g):
        return (core._conv2d_cpu_forward(x, w, None, 1, 1, 1, 1, 1, 1, g, 17, 15),
                core._conv2d_cpu_backward_input(gy, w, 17, 15, 1, 1, 1, 1, 1, 1, g),
                core._conv2d_cpu_backward_weight(gy, x, 3, 3, 1, 1, 1, 1, 1, 1, g),
                core._conv2d_cpu_forward(x, w, None, 2, 2, 1, 1, 1, 1, g, 9, 8))

    assert threaded_mismatches(compute, cases, n_threads=6, rounds=6) == []


def test_bad_arguments_raise():
    x = np.zeros((1, 4, 5, 5), np.float32)
    w = np.zeros((6, 4, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"\[fastmetal._conv2d_cpu\] expected"):
        core._conv2d_cpu_forward(x, w, None, 0, 1, 0, 0, 1, 1, 1, 3, 3)
    with pytest.raises(ValueError, match="groups"):
        core._conv2d_cpu_forward(x, w, None, 1, 1, 0, 0, 1, 1, 3, 3, 3)
    with pytest.raises(ValueError, match="4-D"):
        core._conv2d_cpu_forward(x[0], w, None, 1, 1, 0, 0, 1, 1, 1, 3, 3)
    with pytest.raises(ValueError, match="bias"):
        core._conv2d_cpu_forward(x, w, np.zeros(5, np.float32), 1, 1, 0, 0, 1, 1, 1, 3, 3)
    with pytest.raises(ValueError, match="output size"):
        core._conv2d_cpu_forward(x, w, None, 1, 1, 0, 0, 1, 1, 1, 10**6, 3)
