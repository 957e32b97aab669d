"""``fastmetal.autograd``: reverse-mode differentiation.

``tape`` records every differentiable call and runs ``backward``; ``declare`` is the one way
to declare a public op beside its gradient (``op``); ``functional`` holds the function
transforms ``fm.grad`` / ``fm.value_and_grad``. This package imports nothing above it: the
ops declare themselves with it.
"""
from .tape import enable_grad, grad, is_grad_enabled, no_grad, set_grad_enabled

# As torch.autograd: grad(outputs, inputs, ...) returns gradients (fm.grad, the function
# transform, is functional.grad).
__all__ = ["grad", "no_grad", "enable_grad", "is_grad_enabled", "set_grad_enabled"]
