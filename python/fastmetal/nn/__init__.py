"""``fastmetal.nn``: Modules, layers, losses and their functions, as ``torch.nn``.

Models are :class:`Module` subclasses whose ``forward`` calls fastmetal's differentiable
functions (``fastmetal.nn.functional``, as ``torch.nn.functional``); ``loss.backward()``
fills every parameter's ``.grad`` and an optimizer of :mod:`fastmetal.optim` (also reachable
as ``fastmetal.nn.optim``) updates them in place. ``nn.init`` draws initial parameters,
``nn.utils`` clips gradients.
"""
from .. import optim
from . import functional, init, modules, parallel, utils
from .modules import *  # noqa: F401,F403

__all__ = [*modules.__all__, "functional", "init", "optim", "parallel", "utils"]


def __dir__():
    return sorted(__all__)
