"""``fastmetal.nn.functional`` (``import fastmetal.nn.functional as F``), as
``torch.nn.functional``: the differentiable functions that layers are made of. Each is
defined in its family's module under fastmetal/ops and is the same object as the
top-level ``fastmetal.<name>`` where one exists."""
from ..ops import activations
from ..ops.activations import *  # noqa: F401,F403  (leaky_relu, elu, dropout2d)
from ..ops.conv import conv1d, conv2d, conv_transpose2d
from ..ops.embedding import embedding, one_hot
from ..ops.elementwise import gelu, relu, sigmoid, silu, softplus, tanh
from ..ops.linalg import linear
from ..ops import losses, pooling
from ..ops.attention import scaled_dot_product_attention
from ..ops.losses import *  # noqa: F401,F403  (every loss function)
from ..ops.pooling import *  # noqa: F401,F403  (avg_pool2d, adaptive_avg_pool2d, interpolate)
from ..ops.training import dropout, log_softmax, max_pool2d
from ..ops.normalization import batch_norm, group_norm, layer_norm, rms_norm, softmax

__all__ = ["conv2d", "linear", "relu", "sigmoid", "tanh", "gelu", "softplus", "silu",
           "max_pool2d", "dropout", "log_softmax", "softmax", "batch_norm",
           "group_norm", "layer_norm", "rms_norm", *activations.__all__, *losses.__all__,
           "conv1d", "conv_transpose2d", *pooling.__all__, "embedding", "one_hot",
           "scaled_dot_product_attention"]
