# Type stubs of fastmetal.optim (= fastmetal.nn.optim; see optim/*.py for the documentation).
from typing import Any, Callable, Iterable, Union

from .._core import Array
from . import lr_scheduler as lr_scheduler
from .lr_scheduler import StepLR as StepLR

# Any iterable of parameters, or of param-group dicts ({"params": [...], "lr": ...}).
_Params = Union[Iterable[Array], Iterable[dict[str, Any]]]

class Optimizer:
    defaults: dict[str, Any]
    param_groups: list[dict[str, Any]]
    state: dict[int, dict[str, Any]]
    def __init__(self, params: _Params, defaults: dict[str, Any]) -> None: ...
    @property
    def lr(self) -> float: ...
    def zero_grad(self, set_to_none: bool = ...) -> None: ...
    def step(self, closure: Callable[[], Any] | None = ...) -> Any: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

class SGD(Optimizer):
    def __init__(self, params: _Params, lr: float = ..., momentum: float = ...,
                 weight_decay: float = ..., *, dampening: float = ...,
                 nesterov: bool = ...) -> None: ...

class Adam(Optimizer):
    def __init__(self, params: _Params, lr: float = ..., betas: tuple[float, float] = ...,
                 eps: float = ..., weight_decay: float = ...) -> None: ...

class AdamW(Adam): ...

class Adadelta(Optimizer):
    def __init__(self, params: _Params, lr: float = ..., rho: float = ..., eps: float = ...,
                 weight_decay: float = ...) -> None: ...

class RMSprop(Optimizer):
    def __init__(self, params: _Params, lr: float = ..., alpha: float = ..., eps: float = ...,
                 weight_decay: float = ..., momentum: float = ...,
                 centered: bool = ...) -> None: ...

class Adagrad(Optimizer):
    def __init__(self, params: _Params, lr: float = ..., lr_decay: float = ...,
                 weight_decay: float = ..., initial_accumulator_value: float = ...,
                 eps: float = ...) -> None: ...

class LBFGS(Optimizer):
    def __init__(self, params: _Params, lr: float = ..., max_iter: int = ...,
                 max_eval: int | None = ..., tolerance_grad: float = ...,
                 tolerance_change: float = ..., history_size: int = ...,
                 line_search_fn: str | None = ...) -> None: ...

__all__: list[str]
