"""Public elementwise functions, one per line of the op table."""
from __future__ import annotations

from . import _core
from ._optable import OPS, OpSpec

_UNARY_DOC = """{doc}

Parameters
----------
x : array_like or fastmetal.Array
    Input. float32 and float16 are computed natively; float64, integer and bool
    inputs are converted to float32. Any strides, including negative ones.
out : numpy.ndarray or fastmetal.Array, optional
    Where to write the result: the input's shape and a floating dtype.

Returns
-------
numpy.ndarray or fastmetal.Array
    ``out`` if given; an Array if ``x`` is one, else a NumPy array.
"""

_BINARY_DOC = """{doc}

Parameters
----------
x, y : array_like, fastmetal.Array or Python scalar
    Operands, broadcast together as in NumPy. float32 and float16 are computed
    natively (float16 with float32 gives float32; a Python scalar takes the other
    operand's dtype); float64, integer and bool inputs are converted to float32.
out : numpy.ndarray or fastmetal.Array, optional
    Where to write the result: the broadcast shape and a floating dtype.

Returns
-------
numpy.ndarray or fastmetal.Array
    ``out`` if given; an Array if ``x`` or ``y`` is one, else a NumPy array.
"""


def _make(spec: OpSpec):
    name = spec.name
    if spec.arity == 1:
        unary = _core.unary

        def op(x, out=None):
            return unary(name, x, out)

        op.__doc__ = _UNARY_DOC.format(doc=spec.doc)
    else:
        binary = _core.binary

        def op(x, y, out=None):
            return binary(name, x, y, out)

        op.__doc__ = _BINARY_DOC.format(doc=spec.doc)
    op.__name__ = op.__qualname__ = name
    op.__module__ = "fastmetal"
    return op


# One public function per line of the op table: adding a line adds the function, its
# docstring, its stub (generated into _elementwise.pyi by the build) and its tests.
for _spec in OPS:
    globals()[_spec.name] = _make(_spec)
del _spec

UNARY = [spec.name for spec in OPS if spec.arity == 1]
BINARY = [spec.name for spec in OPS if spec.arity == 2]
__all__ = [spec.name for spec in OPS]
# name -> function, for NumPy ufunc dispatch (_array.py)
FUNCTIONS = {name: globals()[name] for name in __all__}
