"""``fastmetal.nn``: Modules, layers, losses, optimizers and utilities, as ``torch.nn``.

Models are :class:`Module` subclasses whose ``forward`` calls fastmetal's differentiable
functions; ``loss.backward()`` fills every parameter's ``.grad`` and an optimizer of
:mod:`fastmetal.nn.optim` updates them in place.
"""
from . import nn_utils as utils
from . import optim
from .layers import *  # noqa: F401,F403
from .layers import __all__ as _layer_names
from .losses import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, MSELoss,  # noqa: F401
                     NLLLoss)
from .losses import MODULES as _loss_names
from .module import Module, ModuleList, Parameter, Sequential  # noqa: F401

__all__ = ["Module", "Parameter", "Sequential", "ModuleList", *_layer_names, *_loss_names,
           "optim", "utils"]


def __dir__():
    return sorted(__all__)
