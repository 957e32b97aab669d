"""fastmetal's functions, one module per family (elementwise, reductions, linalg, conv,
numerics, random, creation, manipulation, views, indexing, training, losses). This is the
only layer that calls the compiled ``_core``; each function that has a gradient is declared
with ``fastmetal.autograd.declare.op`` beside its vjp. ``fastmetal`` re-exports the public
ones; import them from there."""
