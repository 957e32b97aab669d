"""Numerical differentiation and fused Fourier series (issue 3): placeholder."""
from __future__ import annotations


def gradient(f, *varargs, axis=None, edge_order=1):
    raise NotImplementedError("fastmetal.gradient is not implemented yet")


def derivative(y, dx=1.0, order=1, accuracy=2, axis=-1):
    raise NotImplementedError("fastmetal.derivative is not implemented yet")


def fourier_series(x, a, b, period=None, derivative=0):
    raise NotImplementedError("fastmetal.fourier_series is not implemented yet")
