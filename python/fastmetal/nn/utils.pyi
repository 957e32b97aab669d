from typing import Any, Iterable

from .._core import Array

def clip_grad_norm_(parameters: Array | Iterable[Array], max_norm: float, norm_type: float = ...,
                    error_if_nonfinite: bool = ...) -> Array: ...

__all__: list[str]
