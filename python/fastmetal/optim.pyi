# Type stubs of fastmetal.nn.optim (see optim.py for the documentation).
from typing import Any

class Optimizer:
    param_groups: list[dict[str, Any]]
    state: list[dict[str, Any]]
    def __init__(self, params: Any, defaults: dict[str, Any]) -> None: ...
    @property
    def lr(self) -> float: ...
    def zero_grad(self) -> None: ...
    def step(self) -> None: ...

class SGD(Optimizer):
    def __init__(self, params: Any, lr: float = ..., momentum: float = ...,
                 weight_decay: float = ..., *, dampening: float = ...,
                 nesterov: bool = ...) -> None: ...

class Adam(Optimizer):
    def __init__(self, params: Any, lr: float = ..., betas: tuple[float, float] = ...,
                 eps: float = ..., weight_decay: float = ...) -> None: ...

class Adadelta(Optimizer):
    def __init__(self, params: Any, lr: float = ..., rho: float = ..., eps: float = ...,
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
