"""The public ops declared in C++ with FM_PYTHON_OP (csrc/ops/python_op.h): one function of
``fastmetal`` each, with the signature and docstring of its declaration. Adding an op there
needs no edit here; the build writes their type stubs (_ops.pyi) from the same lines."""
from __future__ import annotations

from . import _core

__all__ = [name for name, _signature, _doc in _core._python_ops() if not name.startswith("_")]
for _name in __all__:
    globals()[_name] = getattr(_core, _name)
