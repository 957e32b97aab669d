"""Neural-network layers (issue 4): placeholder."""
from __future__ import annotations


class Conv2d:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("fastmetal.nn.Conv2d is not implemented yet")
