# Type stubs of fastmetal.autograd (see tape.py for the documentation).
from typing import Any, Sequence

from .._core import Array
from .. import enable_grad as enable_grad
from .. import is_grad_enabled as is_grad_enabled
from .. import no_grad as no_grad
from .. import set_grad_enabled as set_grad_enabled

def grad(outputs: Array | Sequence[Array], inputs: Array | Sequence[Array],
         grad_outputs: Any = ..., retain_graph: bool | None = ...,
         create_graph: bool = ..., allow_unused: bool = ...) -> tuple[Array | None, ...]: ...

__all__: list[str]
