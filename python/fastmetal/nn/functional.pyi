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
def conv1d(input: Any, weight: Any, bias: Any = ..., stride: Any = ..., padding: Any = ...,
           dilation: Any = ..., groups: int = ...) -> Any: ...
def conv_transpose2d(input: Any, weight: Any, bias: Any = ..., stride: Any = ...,
                     padding: Any = ..., output_padding: Any = ..., groups: int = ...,
                     dilation: Any = ...) -> Any: ...
def avg_pool2d(input: Any, kernel_size: Any, stride: Any = ..., padding: Any = ...) -> Any: ...
def adaptive_avg_pool2d(input: Any, output_size: Any) -> Any: ...
def interpolate(input: Any, size: Any = ..., scale_factor: Any = ...,
                mode: str = ...) -> Any: ...
def embedding(input: Any, weight: Any, padding_idx: int | None = ...) -> Any: ...
def one_hot(tensor: Any, num_classes: int = ...) -> Any: ...

__all__: list[str]
