# Type stubs of fastmetal.optim.lr_scheduler (see lr_scheduler.py for the documentation).
from . import Optimizer

class StepLR:
    optimizer: Optimizer
    step_size: int
    gamma: float
    base_lrs: list[float]
    last_epoch: int
    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = ...) -> None: ...
    def step(self) -> None: ...
    def get_last_lr(self) -> list[float]: ...

__all__: list[str]
