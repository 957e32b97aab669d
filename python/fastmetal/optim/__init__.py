"""``fastmetal.optim``: optimizers with PyTorch's update rules (each step one fused kernel per
parameter, on its device) and, in ``lr_scheduler``, the learning-rate schedules.
``fastmetal.nn.optim`` is this same module."""
from . import lr_scheduler
from .adadelta import Adadelta
from .adam import Adam, AdamW
from .lr_scheduler import StepLR
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "StepLR", "lr_scheduler"]
