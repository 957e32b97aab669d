# Type stubs of fastmetal.optim.lr_scheduler (see lr_scheduler.py for the documentation).
from typing import Any, Callable, Sequence

from . import Optimizer

class LRScheduler:
    optimizer: Optimizer
    base_lrs: list[float]
    last_epoch: int
    def __init__(self, optimizer: Optimizer, last_epoch: int = ...) -> None: ...
    def get_lr(self) -> list[float]: ...
    def get_last_lr(self) -> list[float]: ...
    def step(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

class StepLR(LRScheduler):
    step_size: int
    gamma: float
    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = ...,
                 last_epoch: int = ...) -> None: ...

class MultiStepLR(LRScheduler):
    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = ...,
                 last_epoch: int = ...) -> None: ...

class ExponentialLR(LRScheduler):
    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = ...) -> None: ...

class CosineAnnealingLR(LRScheduler):
    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = ...,
                 last_epoch: int = ...) -> None: ...

class LambdaLR(LRScheduler):
    def __init__(self, optimizer: Optimizer,
                 lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
                 last_epoch: int = ...) -> None: ...

class LinearLR(LRScheduler):
    def __init__(self, optimizer: Optimizer, start_factor: float = ..., end_factor: float = ...,
                 total_iters: int = ..., last_epoch: int = ...) -> None: ...

class OneCycleLR(LRScheduler):
    def __init__(self, optimizer: Optimizer, max_lr: float | Sequence[float],
                 total_steps: int | None = ..., epochs: int | None = ...,
                 steps_per_epoch: int | None = ..., pct_start: float = ...,
                 anneal_strategy: str = ..., cycle_momentum: bool = ...,
                 base_momentum: float = ..., max_momentum: float = ...,
                 div_factor: float = ..., final_div_factor: float = ...,
                 three_phase: bool = ..., last_epoch: int = ...) -> None: ...

class ReduceLROnPlateau:
    optimizer: Optimizer
    last_epoch: int
    def __init__(self, optimizer: Optimizer, mode: str = ..., factor: float = ...,
                 patience: int = ..., threshold: float = ..., threshold_mode: str = ...,
                 cooldown: int = ..., min_lr: float | Sequence[float] = ...,
                 eps: float = ...) -> None: ...
    def step(self, metrics: Any) -> None: ...
    def get_last_lr(self) -> list[float]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

__all__: list[str]
