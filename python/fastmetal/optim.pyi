# Type stubs of fastmetal.nn.optim (see optim.py for the documentation).
from typing import Any, Protocol, Sequence, Union

class _Layer(Protocol):
    def parameters(self) -> Sequence[object]: ...

# What an optimizer takes: what parameters() of a layer returns (nn.Parameters), or the
# layer itself.
_Params = Union[Sequence[object], _Layer]

class Optimizer:
    # Hyper-parameters by name (floats, and Adam's `betas` pair).
    param_groups: list[dict[str, Any]]
    state: list[dict[str, Any]]
    def __init__(self, params: _Params, defaults: dict[str, Any]) -> None: ...
    @property
    def lr(self) -> float: ...
    def zero_grad(self) -> None: ...
    def step(self) -> None: ...

class SGD(Optimizer):
    def __init__(self, params: _Params, lr: float = ..., momentum: float = ...,
                 weight_decay: float = ..., *, dampening: float = ...,
                 nesterov: bool = ...) -> None: ...

class Adam(Optimizer):
    def __init__(self, params: _Params, lr: float = ..., betas: tuple[float, float] = ...,
                 eps: float = ..., weight_decay: float = ...) -> None: ...

class Adadelta(Optimizer):
    def __init__(self, params: _Params, lr: float = ..., rho: float = ..., eps: float = ...,
                 weight_decay: float = ...) -> None: ...

class StepLR:
    optimizer: Optimizer
    step_size: int
    gamma: float
    base_lr: float
    last_epoch: int
    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = ...) -> None: ...
    def step(self) -> None: ...
    def get_last_lr(self) -> list[float]: ...
