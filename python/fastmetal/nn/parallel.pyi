# Type stubs of fastmetal.nn.parallel (see parallel.py for the documentation).
from contextlib import AbstractContextManager
from typing import Any

from . import Module

class DistributedDataParallel(Module):
    module: Module
    broadcast_buffers: bool
    bucket_cap_mb: float
    require_backward_grad_sync: bool
    def __init__(self, module: Module, device_ids: Any = ..., output_device: Any = ...,
                 broadcast_buffers: bool = ..., bucket_cap_mb: float = ...) -> None: ...
    def forward(self, *args: Any, **kwargs: Any) -> Any: ...
    def no_sync(self) -> AbstractContextManager[None]: ...
    def extra_repr(self) -> str: ...

__all__: list[str]
