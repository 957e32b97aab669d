"""``fastmetal.nn.functional`` (``import fastmetal.nn.functional as F``), as
``torch.nn.functional``: the differentiable functions that layers are made of. Each is
defined in its family's module under fastmetal/ops and is the same object as the
top-level ``fastmetal.<name>`` where one exists."""
from ..ops.conv import conv2d
from ..ops.elementwise import gelu, relu, sigmoid, softplus, tanh
from ..ops.linalg import linear
from ..ops import losses
from ..ops.attention import scaled_dot_product_attention
from ..ops.losses import *  # noqa: F401,F403  (every loss function)
from ..ops.training import cross_entropy, dropout, log_softmax, max_pool2d

__all__ = ["conv2d", "linear", "relu", "sigmoid", "tanh", "gelu", "softplus", "max_pool2d",
           "dropout", "log_softmax", "cross_entropy", *losses.__all__,
           "scaled_dot_product_attention"]
