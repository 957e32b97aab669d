"""The Modules of ``fastmetal.nn``, one file per family as ``torch.nn.modules``: ``module``
(Module, Parameter), ``container``, ``linear``, ``conv``, ``activation``, ``pooling``,
``dropout``, ``flatten``, ``loss``, ``batchnorm``, ``normalization``, ``sparse``,
``upsampling``, ``attention``, ``rnn``, ``transformer``."""
from .activation import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .batchnorm import *  # noqa: F401,F403
from .container import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .dropout import *  # noqa: F401,F403
from .flatten import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .module import *  # noqa: F401,F403
from .normalization import *  # noqa: F401,F403
from .pooling import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from .sparse import *  # noqa: F401,F403
from .transformer import *  # noqa: F401,F403
from .upsampling import *  # noqa: F401,F403
from . import (activation, attention, batchnorm, container, conv, dropout, flatten, linear,
               loss, module, normalization, pooling, rnn, sparse, transformer, upsampling)

# Every Module class, in the order docs/API.md lists them.
__all__ = [*module.__all__, *container.__all__, *linear.__all__, *conv.__all__,
           *activation.__all__, *pooling.__all__, *upsampling.__all__, *sparse.__all__,
           *dropout.__all__, *flatten.__all__, *loss.__all__, *batchnorm.__all__,
           *normalization.__all__, *attention.__all__, *rnn.__all__, *transformer.__all__]
