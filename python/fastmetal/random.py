"""``fastmetal.random``: random numbers that are the same on every device, from one
counter-based generator (Philox-4x32). Defined in fastmetal/ops/random.py."""
from .ops.random import Generator, bernoulli, normal, seed, uniform

__all__ = ["Generator", "seed", "normal", "uniform", "bernoulli"]


def __dir__():
    return sorted(__all__)
