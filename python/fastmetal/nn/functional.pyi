# Type stubs of fastmetal.nn.functional: fastmetal's functions (see ../__init__.pyi) and the
# ones only F has.
from typing import Any

from .. import binary_cross_entropy as binary_cross_entropy
from .. import binary_cross_entropy_with_logits as binary_cross_entropy_with_logits
from .. import conv2d as conv2d
from .. import cross_entropy as cross_entropy
from .. import dropout as dropout
from .. import gelu as gelu
from .. import linear as linear
from .. import log_softmax as log_softmax
from .. import max_pool2d as max_pool2d
from .. import mse_loss as mse_loss
from .. import nll_loss as nll_loss
from .. import relu as relu
from .. import sigmoid as sigmoid
from .. import softplus as softplus
from .. import tanh as tanh

def l1_loss(input: Any, target: Any, reduction: str = ...) -> Any: ...
def smooth_l1_loss(input: Any, target: Any, reduction: str = ..., beta: float = ...) -> Any: ...
def huber_loss(input: Any, target: Any, reduction: str = ..., delta: float = ...) -> Any: ...
def kl_div(input: Any, target: Any, reduction: str = ..., log_target: bool = ...) -> Any: ...
def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = ...,
                                 dropout_p: float = ..., is_causal: bool = ...,
                                 scale: float | None = ..., enable_gqa: bool = ..., *,
                                 seed: int | None = ...) -> Any: ...

__all__: list[str]
