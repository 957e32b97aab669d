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


_SPECS = {spec.name: spec for spec in OPS}

# One name per line of the op table, written out so that IDEs and type checkers see them
# (tests/test_public_api.py checks that this list and the table agree).
sigmoid = _make(_SPECS["sigmoid"])
relu = _make(_SPECS["relu"])
tanh = _make(_SPECS["tanh"])
exp = _make(_SPECS["exp"])
log = _make(_SPECS["log"])
sin = _make(_SPECS["sin"])
cos = _make(_SPECS["cos"])
sqrt = _make(_SPECS["sqrt"])
abs = _make(_SPECS["abs"])  # noqa: A001 (fastmetal.abs, as numpy.abs)
negative = _make(_SPECS["negative"])
square = _make(_SPECS["square"])
reciprocal = _make(_SPECS["reciprocal"])
softplus = _make(_SPECS["softplus"])
gelu = _make(_SPECS["gelu"])
add = _make(_SPECS["add"])
subtract = _make(_SPECS["subtract"])
multiply = _make(_SPECS["multiply"])
divide = _make(_SPECS["divide"])
power = _make(_SPECS["power"])
maximum = _make(_SPECS["maximum"])
minimum = _make(_SPECS["minimum"])

UNARY = ["sigmoid", "relu", "tanh", "exp", "log", "sin", "cos", "sqrt", "abs", "negative",
         "square", "reciprocal", "softplus", "gelu"]
BINARY = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum"]
