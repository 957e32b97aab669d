"""conv2d and conv2d_backward on every device (on cpu: the fast CPU algorithms, the default
path) against an independent NumPy float64 reference, finite differences and torch autograd.
The MSL kernels: test_conv2d_kernels.py; nn.Conv2d: test_nn_conv2d.py; bad arguments:
test_conv2d_errors.py."""
from __future__ import annotations


import numpy as np
import pytest

import fastmetal as fm

from references import (
    check_conv2d_against_torch,
    ref_conv2d,
    assert_close,
    make_problem,
    check_forward,
    check_backward,
)


# ----------------------------------------------------------------------------- fast CPU path
@pytest.mark.parametrize("seed", range(40))
def test_forward_and_backward_random_configs(seed, device):
    x, w, b, kw, r = make_problem(1000 + seed)
    check_forward(x, w, b, kw)
    check_backward(x, w, kw, r)


@pytest.mark.parametrize("kw", [
    dict(padding="same"), dict(padding="same", dilation=2), dict(padding="same", dilation=(1, 3)),
    dict(padding="valid"), dict(stride=2, padding=1), dict(stride=(1, 3), padding=(2, 0)),
    dict(dilation=(2, 1), padding=(0, 1)),
])
@pytest.mark.parametrize("k", [(2, 4), (3, 3), (4, 1)])
def test_padding_modes_with_even_and_odd_kernels(kw, k, device):
    r = np.random.default_rng(hash((str(kw), k)) % 2**32)
    x = r.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = r.standard_normal((5, 3, *k)).astype(np.float32)
    b = r.standard_normal(5).astype(np.float32)
    y = check_forward(x, w, b, kw)
    if kw.get("padding") == "same":
        assert y.shape == (2, 5, 9, 8)
    check_backward(x, w, kw, r)


def test_layer_shapes_of_the_benchmarks(device):
    r = np.random.default_rng(7)
    for xshape, wshape, kw in [((4, 1, 28, 28), (32, 1, 3, 3), {}),
                               ((2, 32, 26, 26), (64, 32, 3, 3), {}),
                               ((1, 64, 20, 20), (64, 64, 3, 3), dict(padding=1)),
                               # 1x1 expanding to many channels: few input-gradient tiles
                               # and a long K (a discrete GPU splits K there)
                               ((2, 96, 7, 7), (512, 96, 1, 1), {})]:
        x = r.standard_normal(xshape).astype(np.float32)
        w = r.standard_normal(wshape).astype(np.float32)
        b = r.standard_normal(wshape[0]).astype(np.float32)
        check_forward(x, w, b, kw)
        check_backward(x, w, kw, r)


def test_unbatched_input_gives_unbatched_output(device):
    r = np.random.default_rng(3)
    x = r.standard_normal((4, 7, 6)).astype(np.float32)
    w = r.standard_normal((6, 2, 3, 2)).astype(np.float32)
    b = r.standard_normal(6).astype(np.float32)
    y = check_forward(x, w, b, dict(groups=2, padding=(1, 0)))
    assert y.shape == (6, 7, 5)
    np.testing.assert_array_equal(y, fm.conv2d(x[None], w, b, groups=2, padding=(1, 0))[0])
    gy = r.standard_normal(y.shape).astype(np.float32)
    gx, gw, gb = fm.conv2d_backward(gy, x, w, groups=2, padding=(1, 0))
    assert gx.shape == x.shape and gw.shape == w.shape and gb.shape == (6,)
    gx4, gw4, gb4 = fm.conv2d_backward(gy[None], x[None], w, groups=2, padding=(1, 0))
    np.testing.assert_array_equal(gx, gx4[0])
    np.testing.assert_array_equal(gw, gw4)
    np.testing.assert_array_equal(gb, gb4)


def test_needs_selects_the_gradients(device):
    r = np.random.default_rng(4)
    x = r.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = r.standard_normal((3, 4, 3, 3)).astype(np.float32)
    for needs in [(), ("input",), ("weight",), ("bias",), ("weight", "bias"), ["bias", "input"],
                  ("input", "input"), "weight"]:
        want = (needs,) if isinstance(needs, str) else needs
        check_backward(x, w, {}, r, needs=tuple(want))
        out = fm.conv2d_backward(np.ones((2, 3, 4, 4), np.float32), x, w, needs=needs)
        assert [o is not None for o in out] == [n in want for n in ("input", "weight", "bias")]


def test_zero_batch(device):
    x = np.zeros((0, 3, 5, 5), np.float32)
    w = np.ones((4, 3, 3, 3), np.float32)
    b = np.arange(4, dtype=np.float32)
    y = fm.conv2d(x, w, b, padding=1)
    assert y.shape == (0, 4, 5, 5) and y.dtype == np.float32
    gx, gw, gb = fm.conv2d_backward(np.zeros((0, 4, 5, 5), np.float32), x, w, padding=1)
    assert gx.shape == (0, 3, 5, 5)
    np.testing.assert_array_equal(gw, np.zeros((4, 3, 3, 3), np.float32))
    np.testing.assert_array_equal(gb, np.zeros(4, np.float32))


def test_dtypes_are_computed_in_float32(device):
    r = np.random.default_rng(5)
    x = r.standard_normal((2, 3, 6, 6))
    w = r.standard_normal((4, 3, 3, 3))
    want = ref_conv2d(x.astype(np.float32), w.astype(np.float32))
    scale = ref_conv2d(np.abs(x), np.abs(w))
    assert_close(fm.conv2d(x, w), want, scale, "float64 input")
    for dt in (np.float16, np.int32, np.int64, np.uint8, np.bool_):
        xi, wi = (x * 3).astype(dt), (w * 3).astype(dt)
        assert_close(fm.conv2d(xi, wi), ref_conv2d(xi.astype(np.float32), wi.astype(np.float32)),
                     ref_conv2d(np.abs(xi.astype(np.float64)), np.abs(wi.astype(np.float64))),
                     f"{dt.__name__} input")
    # Python lists are array-likes too.
    assert_close(fm.conv2d(x.tolist(), w.tolist()), want, scale, "list input")
    gx, gw, gb = fm.conv2d_backward(np.ones((2, 4, 4, 4), np.float16), x.astype(np.float16),
                                    w.astype(np.float16))
    assert gx.dtype == gw.dtype == gb.dtype == np.float32


def test_non_contiguous_inputs(device):
    r = np.random.default_rng(6)
    base = r.standard_normal((3, 8, 10, 12)).astype(np.float32)
    x = base[::-1, ::2, :, ::-1].transpose(0, 1, 3, 2)  # negative and permuted strides
    w = r.standard_normal((5, 4, 3, 3)).astype(np.float32)[:, :, ::-1]
    b = r.standard_normal(10).astype(np.float32)[::2]
    check_forward(x, w, b, dict(padding=1))
    check_backward(x, w, dict(padding=1), r)


def test_fastmetal_arrays_in_arrays_out(device):
    r = np.random.default_rng(8)
    x = r.standard_normal((2, 4, 7, 7)).astype(np.float32)
    w = r.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = r.standard_normal(6).astype(np.float32)
    y = fm.conv2d(fm.asarray(x), w, b, groups=2)
    assert isinstance(y, fm.Array) and y.shape == (2, 6, 5, 5) and y.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(y), fm.conv2d(x, w, b, groups=2))
    y16 = fm.conv2d(fm.asarray(x, dtype="float16"), fm.asarray(w), groups=2)
    assert isinstance(y16, fm.Array) and y16.dtype == np.float32
    gy = r.standard_normal((2, 6, 5, 5)).astype(np.float32)
    out = fm.conv2d_backward(fm.asarray(gy), x, w, groups=2)
    assert all(isinstance(o, fm.Array) for o in out)
    ref = fm.conv2d_backward(gy, x, w, groups=2)
    for a, bb in zip(out, ref):
        np.testing.assert_array_equal(np.asarray(a), bb)
    assert isinstance(fm.conv2d(x, w, b, groups=2), np.ndarray)


def test_backward_against_finite_differences_of_the_reference(device):
    """fastmetal's gradients vs central differences of the float64 reference forward,
    f(x, w, b) = sum(conv2d(x, w, b) * gy), for every element of x, w and b."""
    r = np.random.default_rng(9)
    kw = dict(stride=(2, 1), padding="valid", dilation=(1, 2), groups=2)
    x = r.standard_normal((2, 4, 6, 7))
    w = r.standard_normal((4, 2, 2, 3))
    b = r.standard_normal(4)
    gy = r.standard_normal(ref_conv2d(x, w, b, **kw).shape)
    f = lambda x_, w_, b_: float((ref_conv2d(x_, w_, b_, **kw) * gy).sum())  # noqa: E731
    x32, w32, gy32 = x.astype(np.float32), w.astype(np.float32), gy.astype(np.float32)
    gx, gw, gb = fm.conv2d_backward(gy32, x32, w32, **kw)
    h = 1e-3
    for target, got in ((0, gx), (1, gw), (2, gb)):
        args = [x32.astype(np.float64), w32.astype(np.float64), b]
        num = np.zeros(args[target].shape)
        for idx in np.ndindex(num.shape):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[target][idx] += h
            minus[target][idx] -= h
            num[idx] = (f(*plus) - f(*minus)) / (2 * h)
        np.testing.assert_allclose(got, num, rtol=1e-4, atol=1e-4)


@pytest.mark.torch
@pytest.mark.parametrize("seed", range(8))
def test_against_torch_autograd(seed, device):
    pytest.importorskip("torch")
    x, w, b, kw, r = make_problem(5000 + seed)
    check_conv2d_against_torch(x, w, b, kw, r)
