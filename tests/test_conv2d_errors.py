"""Every bad argument of conv2d / conv2d_backward, on every device: a clear ValueError/TypeError
before any work."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm


# ----------------------------------------------------------------------------- bad arguments
X = np.zeros((2, 4, 8, 8), np.float32)
Wt = np.zeros((6, 2, 3, 3), np.float32)  # for groups=2
W1 = np.zeros((6, 4, 3, 3), np.float32)

BAD_CONV = [
    # (args, kwargs, exception, message fragment)
    ((np.zeros((4, 8, 8, 1, 1)), W1), {}, ValueError, r"expected a 4-D input .* got shape \(4, 8, 8, 1, 1\)"),
    ((np.zeros((8, 8)), W1), {}, ValueError, r"3-D unbatched input"),
    ((np.float32(1.0), W1), {}, ValueError, r"4-D input"),
    ((X, np.zeros((6, 4, 3))), {}, ValueError, r"expected a 4-D weight \(C_out, C_in/groups, kH, kW\), got shape \(6, 4, 3\)"),
    ((X, np.zeros((6, 3, 3, 3))), {}, ValueError, r"weight.shape\[1\] \* groups = 3 \* 1 = 3 channels, got 4"),
    ((X, Wt), {}, ValueError, r"weight.shape\[1\] \* groups = 2 \* 1 = 2 channels, got 4"),
    ((X, W1), dict(groups=2), ValueError, r"weight.shape\[1\] \* groups = 4 \* 2 = 8 channels, got 4"),
    ((X, np.zeros((5, 2, 3, 3))), dict(groups=2), ValueError, r"weight.shape\[0\] = 5\) to be divisible by groups = 2"),
    ((X, np.zeros((6, 1, 3, 3))), dict(groups=3), ValueError, r"C_in = 4\) to be divisible by groups = 3"),
    ((X, np.zeros((0, 4, 3, 3))), {}, ValueError, r"every dimension at least 1"),
    ((X, np.zeros((6, 4, 0, 3))), {}, ValueError, r"every dimension at least 1"),
    ((np.zeros((2, 0, 8, 8)), np.zeros((6, 0, 3, 3))), {}, ValueError, r"at least 1"),
    ((np.zeros((2, 4, 0, 8)), W1), {}, ValueError, r"non-zero height and width"),
    ((X, np.zeros((6, 4, 9, 3))), {}, ValueError, r"padded input \(8 x 8\) to be at least as large as the dilated kernel \(9 x 3\)"),
    ((X, W1), dict(dilation=4), ValueError, r"dilated kernel \(9 x 9\)"),
    ((X, W1, np.zeros(5)), {}, ValueError, r"expected a bias of shape \(C_out,\) = \(6,\), got shape \(5,\)"),
    ((X, W1, np.zeros((6, 1))), {}, ValueError, r"bias of shape"),
    ((X, W1), dict(stride=0), ValueError, r"expected stride to be positive .*got \(0, 0\)"),
    ((X, W1), dict(stride=(1, -2)), ValueError, r"stride to be positive"),
    ((X, W1), dict(stride=(1, 2, 3)), ValueError, r"pair of 2 ints, got 3 values"),
    ((X, W1), dict(stride=(1,)), ValueError, r"pair of 2 ints, got 1 values"),
    ((X, W1), dict(stride=1.0), TypeError, r"expected stride to be a positive int or a pair of ints, got 1.0"),
    ((X, W1), dict(stride=True), TypeError, r"stride"),
    ((X, W1), dict(stride=(1, np.bool_(True))), TypeError, r"stride"),
    ((X, W1), dict(stride="1"), TypeError, r"stride"),
    ((X, W1), dict(stride=None), TypeError, r"stride"),
    ((X, W1), dict(dilation=0), ValueError, r"dilation to be positive"),
    ((X, W1), dict(dilation=(1, 0.5)), TypeError, r"dilation"),
    ((X, W1), dict(padding=-1), ValueError, r"padding to be non-negative"),
    ((X, W1), dict(padding=(0, -1)), ValueError, r"padding to be non-negative"),
    ((X, W1), dict(padding="full"), ValueError, r"expected padding 'valid', 'same', an int or a pair of ints, got 'full'"),
    ((X, W1), dict(padding=1.5), TypeError, r"padding"),
    ((X, W1), dict(padding=False), TypeError, r"padding"),
    ((X, W1), dict(padding="same", stride=2), ValueError, r"stride 1 with padding='same'.*got stride \(2, 2\)"),
    ((X, W1), dict(padding="same", stride=(1, 2)), ValueError, r"stride 1 with padding='same'"),
    ((X, W1), dict(groups=0), ValueError, r"groups to be a positive int, got 0"),
    ((X, W1), dict(groups=1.0), TypeError, r"groups"),
    ((X, W1), dict(groups=True), TypeError, r"groups"),
    ((X, W1), dict(stride=2**40), ValueError, r"at most 2\*\*31-1"),
    ((X.astype(np.complex64), W1), {}, TypeError, r"real .* for input, got dtype complex64"),
    ((X, W1.astype(object)), {}, TypeError, r"for weight, got dtype object"),
    ((X, W1, np.array(["a"] * 6)), {}, TypeError, r"for bias"),
    ((X, W1, np.zeros(6, np.complex128)), {}, TypeError, r"for bias"),
    (("abc", W1), {}, (TypeError, ValueError), r"input"),
    (([[1, 2], [3]], W1), {}, TypeError, r"array-like"),
]


@pytest.mark.parametrize("args,kwargs,exc,msg", BAD_CONV)
def test_conv2d_bad_arguments(args, kwargs, exc, msg, device):
    with pytest.raises(exc, match=r"\[fastmetal.conv2d\] " + ".*" + msg):
        fm.conv2d(*args, **kwargs)


GY = np.zeros((2, 6, 6, 6), np.float32)

BAD_BACKWARD = [
    ((GY[:, :5], X, W1), {}, ValueError, r"expected grad_output of shape \(2, 6, 6, 6\) .*got shape \(2, 5, 6, 6\)"),
    ((GY, X, W1), dict(padding=1), ValueError, r"grad_output of shape \(2, 6, 8, 8\)"),
    ((GY[0], X, W1), {}, ValueError, r"grad_output"),
    ((GY[:, :, :, :, None], X, W1), {}, ValueError, r"grad_output"),
    ((GY, X, Wt), {}, ValueError, r"channels"),
    ((GY, X[0, 0], W1), {}, ValueError, r"4-D input"),
    ((GY, X, W1), dict(needs=("input", "grad")), ValueError, r"needs entries to be 'input', 'weight' or 'bias', got 'grad'"),
    ((GY, X, W1), dict(needs=("input", 1)), TypeError, r"needs entries"),
    ((GY, X, W1), dict(needs="inputs"), ValueError, r"needs entries"),
    ((GY, X, W1), dict(needs=5), TypeError, r"expected needs to be a sequence"),
    ((GY, X, W1), dict(needs=None), TypeError, r"needs"),
    ((GY, X, W1), dict(stride=0), ValueError, r"stride to be positive"),
    ((GY, X, W1), dict(padding="same", stride=2), ValueError, r"padding='same'"),
    ((GY.astype(np.complex64), X, W1), {}, TypeError, r"grad_output"),
]


@pytest.mark.parametrize("args,kwargs,exc,msg", BAD_BACKWARD)
def test_conv2d_backward_bad_arguments(args, kwargs, exc, msg, device):
    with pytest.raises(exc, match=r"\[fastmetal.conv2d_backward\] " + ".*" + msg):
        fm.conv2d_backward(*args, **kwargs)


def test_bad_arguments_leave_outputs_untouched_and_do_no_work(device):
    # Validation happens before conversion: a float64 input with a bad weight raises the
    # shape error (not a conversion side effect) and user arrays are never written.
    x = np.ones((2, 4, 8, 8))
    before = x.copy()
    with pytest.raises(ValueError, match="channels"):
        fm.conv2d(x, np.ones((6, 3, 3, 3)))
    np.testing.assert_array_equal(x, before)


def test_array_inputs_keep_their_device(device):
    x = fm.asarray(X)
    y = fm.conv2d(x, fm.asarray(W1), None)
    assert y.device == x.device
