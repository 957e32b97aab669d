# Type stubs of fastmetal.nn (see nn.py and layers.py for the documentation).
from typing import Any, Iterable, Iterator, Literal, Mapping, TypeVar, Union, overload

import numpy as np
import numpy.typing as npt

from . import optim as optim
from ._core import Array

# What a layer takes: a fastmetal.Array, or anything NumPy turns into an array.
_Input = Union[Array, npt.ArrayLike]
# What it returns: a fastmetal.Array where the input or the layer's parameters are one,
# else a NumPy float32 array.
_Tensor = Union[Array, npt.NDArray[np.float32]]
_Pair = Union[int, tuple[int, int]]
# Parameters and gradients are Any: NumPy arrays or fastmetal.Arrays (the layer's
# `device`), None where a layer has no bias or before backward(); in-place updates such
# as `layer.weight -= lr * layer.weight_grad` type-check either way.
_Param = Any

class Parameters(list[_Tensor]):
    slots: list[tuple[object, str]]
    def __init__(self, slots: Iterable[tuple[object, str]] = ...) -> None: ...

class Module:
    training: bool
    def parameters(self) -> Parameters: ...
    def named_parameters(self) -> list[tuple[str, _Tensor]]: ...
    def zero_grad(self) -> None: ...
    def train(self: _M, mode: bool = ...) -> _M: ...
    def eval(self: _M) -> _M: ...
    def state_dict(self) -> dict[str, npt.NDArray[np.float32]]: ...
    def load_state_dict(self, state: Mapping[str, npt.ArrayLike]) -> None: ...
    def forward(self, x: _Input, /) -> _Tensor: ...
    def backward(self, grad_output: _Input, /) -> _Tensor: ...
    def __call__(self, x: _Input, /) -> _Tensor: ...

_M = TypeVar("_M", bound=Module)

class Conv2d:
    in_channels: int
    out_channels: int
    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int] | str
    dilation: tuple[int, int]
    groups: int
    device: str | None
    weight: _Param
    bias: _Param
    weight_grad: _Param
    bias_grad: _Param
    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Pair,
                 stride: _Pair = ..., padding: _Pair | str = ..., dilation: _Pair = ...,
                 groups: int = ..., bias: bool = ..., *, seed: int | None = ...,
                 rng: np.random.Generator | None = ..., device: str | None = ...) -> None: ...
    def forward(self, x: _Input) -> _Tensor: ...
    def __call__(self, x: _Input) -> _Tensor: ...
    def backward(self, grad_output: _Input, *, input_grad: bool = ...) -> _Tensor | None: ...
    def parameters(self) -> list[_Tensor]: ...

# A layer of a Sequential: one of ours (Conv2d is not a Module).
_Layer = Union[Module, Conv2d]

class Linear(Module):
    in_features: int
    out_features: int
    device: str | None
    weight: _Param
    bias: _Param
    weight_grad: _Param
    bias_grad: _Param
    def __init__(self, in_features: int, out_features: int, bias: bool = ..., *,
                 seed: int | None = ..., rng: np.random.Generator | None = ...,
                 device: str | None = ...) -> None: ...
    @overload
    def backward(self, grad_output: _Input, /) -> _Tensor: ...
    @overload
    def backward(self, grad_output: _Input, /, *, input_grad: Literal[True]) -> _Tensor: ...
    @overload
    def backward(self, grad_output: _Input, /, *, input_grad: bool) -> _Tensor | None: ...

class ReLU(Module):
    def __init__(self) -> None: ...

class MaxPool2d(Module):
    kernel_size: _Pair
    stride: _Pair | None
    padding: _Pair
    def __init__(self, kernel_size: _Pair, stride: _Pair | None = ...,
                 padding: _Pair = ...) -> None: ...

class Dropout(Module):
    p: float
    def __init__(self, p: float = ..., *, seed: int | None = ...,
                 rng: np.random.Generator | None = ...) -> None: ...

class Flatten(Module):
    start_dim: int
    end_dim: int
    def __init__(self, start_dim: int = ..., end_dim: int = ...) -> None: ...

class LogSoftmax(Module):
    dim: int
    def __init__(self, dim: int = ...) -> None: ...

class Sequential(Module):
    layers: list[_Layer]
    def __init__(self, *layers: _Layer) -> None: ...
    def __getitem__(self, i: int) -> _Layer: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[_Layer]: ...
    @overload
    def backward(self, grad_output: _Input, /) -> _Tensor: ...
    @overload
    def backward(self, grad_output: _Input, /, *, input_grad: Literal[True]) -> _Tensor: ...
    @overload
    def backward(self, grad_output: _Input, /, *, input_grad: bool) -> _Tensor | None: ...

class CrossEntropyLoss(Module):
    def __init__(self) -> None: ...
    # (loss, grad_logits): the mean loss as a 0-d array and its gradient.
    def forward(self, logits: _Input, labels: npt.ArrayLike, /) -> tuple[_Tensor, _Tensor]: ...  # type: ignore[override]
    def __call__(self, logits: _Input, labels: npt.ArrayLike, /) -> tuple[_Tensor, _Tensor]: ...  # type: ignore[override]
    def backward(self, grad_output: object = ..., /) -> _Tensor: ...
