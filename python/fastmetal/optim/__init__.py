"""``fastmetal.optim``: optimizers with PyTorch's update rules (SGD, Adam, AdamW and Adadelta
through fused kernels, several parameters per launch; RMSprop, Adagrad and LBFGS written
with fastmetal's ops), on float32 and float16 parameters (float64 ones, after
``Module.double()``: SGD and LBFGS, in double), with ``step(closure=None)``, ``state_dict()``
and ``load_state_dict()``; the learning-rate schedules in ``lr_scheduler``.
``fastmetal.nn.optim`` is this same module."""
from . import lr_scheduler
from .adadelta import Adadelta
from .adam import Adam, AdamW
from .lbfgs import LBFGS
from .lr_scheduler import StepLR
from .optimizer import Optimizer
from .rmsprop import Adagrad, RMSprop
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "RMSprop", "Adagrad", "LBFGS",
           "StepLR", "lr_scheduler"]
