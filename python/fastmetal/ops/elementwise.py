"""Public elementwise functions, one per line of the op table."""
from __future__ import annotations

from .. import _core
from ..autograd import tape
from ..autograd.tape import is_ones
from ..autograd.declare import op
from .optable import OPS, OpSpec

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




def _differentiable(forward, spec: OpSpec):
    """The forward with the table's gradient expressions as its vjp (fastmetal._declare)."""
    codes = [compile(expr, f"<gradient of {spec.name}>", "eval") for expr in spec.grads]
    # `g * REST` with g backward()'s implicit ones (loss.backward()): REST alone, one kernel
    # launch fewer (the tape broadcasts it to the input's shape).
    unit = [compile(expr[4:], f"<gradient of {spec.name}>", "eval")
            if expr.startswith("g * ") and "g" not in compile(expr[4:], "", "eval").co_names
            else code for expr, code in zip(spec.grads, codes)]
    args = ("x", "y")[:spec.arity]
    reads = {a: [n for n in ("x", "y", "out") if n in code.co_names]
             for a, code in zip(args, codes)}
    fn = op(grads=args, saves_for=reads, passes=True, public=spec.public,
            higher_order=True)(forward)  # the grad column is made of the table's functions

    @fn.vjp
    def vjp(ctx, g):
        local = {"g": g, "x": ctx.x, "y": getattr(ctx, "y", None), "out": ctx.out}
        chosen = unit if is_ones(g) else codes
        return tuple(eval(code, _GRAD_SCOPE, local) if want else None
                     for code, want in zip(chosen, ctx.needs))
    return fn


def _make(spec: OpSpec):
    name = spec.name
    if spec.arity == 1:
        unary = _core.unary

        def forward(x, out=None):
            return unary(name, x, out)

        forward.__doc__ = _UNARY_DOC.format(doc=spec.doc)
    else:
        binary = _core.binary

        def forward(x, y, out=None):
            return binary(name, x, y, out)

        forward.__doc__ = _BINARY_DOC.format(doc=spec.doc)
    forward.__name__ = forward.__qualname__ = name
    forward.__module__ = "fastmetal" if spec.public else __name__
    return _differentiable(forward, spec) if spec.differentiable else forward


# One function per line of the op table: adding a line adds the function, its gradient,
# its docstring, its stub (generated into _elementwise.pyi by the build) and its tests.
# Lines whose doc says "internal:" are kernels of fastmetal's own (gradients, losses):
# fastmetal._elementwise.<name>, not exported.
for _spec in OPS:
    globals()[_spec.name] = _make(_spec)
del _spec

UNARY = [spec.name for spec in OPS if spec.arity == 1 and spec.public]
BINARY = [spec.name for spec in OPS if spec.arity == 2 and spec.public]
__all__ = [spec.name for spec in OPS if spec.public]
# name -> function, for NumPy ufunc dispatch and the operators (_array.py): every line.
FUNCTIONS = {spec.name: globals()[spec.name] for spec in OPS}
# Where the table's gradient expressions find their names: the table's own functions.
_GRAD_SCOPE = dict(FUNCTIONS)
# backward(create_graph=True) adds and copies gradients with these (recorded).
tape.ENGINE["add"] = FUNCTIONS["add"]
tape.ENGINE["copy"] = FUNCTIONS["copy"]
