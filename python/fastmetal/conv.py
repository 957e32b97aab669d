"""conv2d forward and backward (issue 4): placeholder."""
from __future__ import annotations


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    raise NotImplementedError("fastmetal.conv2d is not implemented yet")


def conv2d_backward(grad_output, input, weight, stride=1, padding=0, dilation=1, groups=1,
                    needs=("input", "weight", "bias")):
    raise NotImplementedError("fastmetal.conv2d_backward is not implemented yet")
