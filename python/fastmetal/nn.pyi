# Type stubs of fastmetal.nn (see nn.py for the documentation).
from typing import Any

import numpy as np

class Conv2d:
    in_channels: int
    out_channels: int
    kernel_size: tuple[int, int]
    stride: Any
    padding: Any
    dilation: Any
    groups: int
    device: str | None
    weight: Any
    bias: Any
    weight_grad: Any
    bias_grad: Any
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 stride: Any = ..., padding: Any = ..., dilation: Any = ..., groups: int = ...,
                 bias: bool = ..., *, seed: int | None = ..., rng: np.random.Generator | None = ...,
                 device: str | None = ...) -> None: ...
    def forward(self, x: Any) -> Any: ...
    def __call__(self, x: Any) -> Any: ...
    def backward(self, grad_output: Any) -> Any: ...
    def parameters(self) -> list[Any]: ...
