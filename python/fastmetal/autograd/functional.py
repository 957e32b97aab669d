"""Function transforms over the tape: ``fm.grad`` and ``fm.value_and_grad`` (as MLX's and
JAX's), which run a function on fresh leaves and use the same ``backward``."""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from .. import _core
from .._core import Array
from . import tape
from .tape import detach, enable_grad, is_grad_enabled, set_requires_grad


def _argnums(argnums: Any, where: str) -> tuple:
    items = argnums if isinstance(argnums, (tuple, list)) else (argnums,)
    if not items or any(isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer))
                        for i in items):
        raise TypeError(f"[{where}] expected argnums to be an int or a tuple of ints, got "
                        f"{argnums!r}")
    return tuple(int(i) for i in items)


def value_and_grad(fun: Callable, argnums: Any = 0) -> Callable:
    """A function returning ``(fun(*args), gradient)``: the gradient of ``fun``'s result (a
    one-element Array) with respect to the arguments at ``argnums`` (an int: one gradient;
    a tuple: a tuple of them), as ``mlx.core.value_and_grad`` / ``jax.value_and_grad``.
    The arguments may be Arrays or array-likes (taken as float32 on the default device);
    they are not changed, and no ``.grad`` is touched. Nested (``fm.grad(fm.grad(f))``, or
    called on Arrays in a graph being recorded), the gradient is recorded too, so the
    enclosing gradient differentiates it."""
    where = "fastmetal.value_and_grad"
    if not callable(fun):
        raise TypeError(f"[{where}] expected a callable, got {type(fun).__name__}")
    nums = _argnums(argnums, where)

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        args_list = list(args)
        inputs = []
        nested = False
        for i in nums:
            if not -len(args_list) <= i < len(args_list):
                raise ValueError(f"[{where}] expected argnums within the {len(args_list)} "
                                 f"positional arguments, got {i}")
            a = args_list[i]
            if isinstance(a, Array) and a._requires_grad and is_grad_enabled():
                # In an enclosing graph (an outer fm.grad's argument, say): differentiate
                # with respect to the Array itself, recording, so the outer one sees it.
                leaf = tape.view_in_graph(a)
                nested = True
            else:
                leaf = detach(a) if isinstance(a, Array) else \
                    _core.asarray(np.asarray(a, dtype=np.float32))
                set_requires_grad(leaf, True)
            args_list[i] = leaf
            inputs.append(leaf)
        with enable_grad():
            value = fun(*args_list, **kwargs)
        if not isinstance(value, Array) or value.size != 1:
            got = f"shape {tuple(value.shape)}" if isinstance(value, Array) else \
                type(value).__name__
            raise TypeError(f"[{where}] expected the function to return a one-element "
                            f"fastmetal.Array, got {got}")
        found = tape.grad(value, inputs, create_graph=nested, allow_unused=True) \
            if value._requires_grad else (None,) * len(inputs)
        grads = tuple(g if g is not None else
                      _core.zeros(tuple(x.shape), dtype=x.dtype, device=x.device)
                      for g, x in zip(found, inputs))
        return (value if nested else detach(value)), \
            (grads if isinstance(argnums, (tuple, list)) else grads[0])
    return wrapped


def grad(fun: Callable, argnums: Any = 0) -> Callable:
    """A function returning the gradient of ``fun`` (whose result is a one-element Array)
    with respect to its arguments at ``argnums``, as ``mlx.core.grad`` / ``jax.grad``."""
    if not callable(fun):
        raise TypeError(f"[fastmetal.grad] expected a callable, got {type(fun).__name__}")
    _argnums(argnums, "fastmetal.grad")
    inner = value_and_grad(fun, argnums)

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs)[1]
    return wrapped


