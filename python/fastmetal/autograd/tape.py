"""Reverse-mode automatic differentiation: the tape, grad mode and ``backward``.

Every differentiable op is declared once with its forward and, beside it, its
vector-Jacobian product (``fastmetal._declare.op``; the elementwise ops' ``grad`` column
of ``metal/elementwise_ops.tbl``). When grad mode is on and an argument requires grad, the
call records a :class:`Node` on its result: the vjp, the Arrays the vjp reads (saved with
their storage's version) and one edge per differentiable input -- the input's own Node, or
the input itself where it is a leaf. ``backward`` walks the nodes from the result in
reverse topological order, on the forward's device, with the ops' own kernels (the vjps
call fastmetal functions, which enqueue as always), sums each input's gradient back to the
input's shape and dtype, and accumulates into the leaves' ``.grad``. Then the graph is
freed (unless ``retain_graph``): saved Arrays are dropped and a second ``backward`` through
it raises RuntimeError, as PyTorch.

Nodes hold their inputs (edges) but never their own result, so a graph is a tree of
references from the result down, freed as soon as the result is: no reference cycles.
"""
from __future__ import annotations

import functools
import threading
import time
import weakref
from typing import Any, Callable, Optional

import numpy as np

from .. import _core
from .._core import Array

class _Mode(threading.local):
    enabled = True  # a class default: the lookup never misses (this runs on every op call)


_mode = _Mode()  # grad mode is per thread, as PyTorch's

# Seconds spent by the tape itself, when a profiler sets this to a dict (bench mnist
# --profile): "record" (what recording adds to forward calls), "backward" (all of
# backward()), "vjp" (the vjps inside it: the kernels and their Python).
PROFILE: Optional[dict] = None


def is_grad_enabled() -> bool:
    """Whether ops record their gradients (True unless inside :class:`no_grad`)."""
    return _mode.enabled


def set_grad_enabled(mode: bool) -> None:
    """Turn grad mode on or off for this thread (as ``torch.set_grad_enabled``)."""
    if not isinstance(mode, (bool, np.bool_)):
        raise TypeError(f"[fastmetal.set_grad_enabled] expected True or False, got {mode!r}")
    _mode.enabled = bool(mode)


class _GradMode:
    """A context manager and decorator setting grad mode for its block: ``with no_grad():``,
    ``@no_grad()`` and, as PyTorch's, ``@no_grad`` without brackets."""

    _enabled = True

    def __new__(cls, fn: Optional[Callable] = None) -> Any:
        if fn is None:
            return super().__new__(cls)
        if not callable(fn):
            raise TypeError(f"[fastmetal.{cls.__name__}] expected no argument (or a function "
                            f"to decorate), got {type(fn).__name__}")
        return cls()(fn)  # the bare decorator

    def __init__(self, fn: Optional[Callable] = None) -> None:
        self._saved: list = []

    def __enter__(self) -> None:
        self._saved.append(is_grad_enabled())
        _mode.enabled = self._enabled

    def __exit__(self, *exc: Any) -> None:
        _mode.enabled = self._saved.pop()

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with type(self)():
                return fn(*args, **kwargs)
        return wrapped


class no_grad(_GradMode):
    """Inside ``with fastmetal.no_grad():`` (or a function decorated with it) ops record
    nothing: results do not require grad, and nothing is kept for a backward pass (for
    evaluation and for updating parameters in place), as ``torch.no_grad``."""

    _enabled = False


class enable_grad(_GradMode):
    """Turns grad mode back on inside a :class:`no_grad` block, as ``torch.enable_grad``."""

    _enabled = True


class Context:
    """What a vjp reads: the forward call's arguments by name (Arrays among them as saved,
    or None where the declaration does not save them), ``out`` (the result, if saved),
    ``aux`` (what the forward returned beside its result, if declared), ``needs`` (one bool
    per differentiable argument: whether its gradient is wanted) and ``shapes`` (the shape
    of every Array argument)."""

    def __init__(self) -> None:
        self.needs: tuple = ()
        self.shapes: dict = {}
        self.out: Any = None
        self.aux: Any = None


class Node:
    """One recorded call: its vjp, context, saved Arrays and edges to its inputs."""

    __slots__ = ("name", "vjp", "ctx", "edges", "metas", "saved", "passes", "freed",
                 "retained", "higher_order", "edge_names", "__weakref__")

    def __init__(self, name: str, vjp: Callable, ctx: Context, edges: list, metas: list,
                 saved: list, passes: bool, higher_order: bool = False,
                 edge_names: tuple = ()) -> None:
        self.name = name
        self.vjp = vjp
        self.ctx = ctx
        self.edges = edges    # per differentiable input: None, a Node, or a leaf Array
        self.metas = metas    # per differentiable input: (shape, dtype) its gradient takes
        self.saved = saved    # (argument name, saved Array, version when saved)
        self.passes = passes  # the vjp may return the output's gradient itself (or a view)
        self.freed = False
        self.retained: Optional[weakref.ref] = None
        # The vjp is made of differentiable ops (a second-order gradient may go through it);
        # edge_names: the argument name of each edge, to give the vjp the saved inputs with
        # their graph under create_graph.
        self.higher_order = higher_order
        self.edge_names = edge_names

    def __repr__(self) -> str:
        return f"<{self.name[:1].upper()}{self.name[1:]}Backward>"

    def apply(self, g: Array) -> tuple:
        if self.freed:
            raise RuntimeError(
                f"[fastmetal.backward] expected a graph that has not been through backward() "
                f"yet, got {self!r}, freed by an earlier backward() (pass retain_graph=True "
                "to the first backward() to go through the graph twice)")
        for name, saved, version in self.saved:
            if saved._version != version:
                raise RuntimeError(
                    f"[fastmetal.backward] expected the Arrays needed for gradient computation "
                    f"to be unchanged, got argument '{name}' of {self.name} modified by an "
                    f"in-place operation (version {saved._version}, expected {version}); "
                    "compute out of place (without out=, +=, [...] =) instead")
        grads = self.vjp(self._connected_ctx() if _mode.enabled else self.ctx, g)
        return grads if isinstance(grads, tuple) else (grads,)

    def _connected_ctx(self) -> Context:
        """Under create_graph: the context with each saved input (and the saved result) as an
        Array in the graph again (a saved Array is a bare handle), so the vjp's own ops
        record their dependence on it, as PyTorch's SavedVariable does when unpacked."""
        ctx = Context()
        ctx.__dict__.update(self.ctx.__dict__)
        for name, saved, _ in self.saved:
            if name == "out":
                edge: Any = self
            elif name in self.edge_names:
                edge = self.edges[self.edge_names.index(name)]
            else:
                continue
            if type(edge) is Node:
                alias = saved._alias()
                alias._node, alias._requires_grad = edge, True
                setattr(ctx, name, alias)
            elif edge is not None:
                setattr(ctx, name, edge)  # the leaf itself
        return ctx

    def release(self) -> None:
        self.ctx = None
        self.saved = []
        self.freed = True


# ----------------------------------------------------------------------------- recording
def _handle(a: Array) -> Array:
    """A new Array object over a's memory with no autograd state (what is saved, what
    detach() returns): the node never refers to the result object itself."""
    return a._alias()


def requires_grad(a: Any) -> bool:
    return type(a) is Array and a._requires_grad


def edge_of(a: Array) -> Any:
    return a._node if a._node is not None else a


def record(name: str, vjp: Callable, out: Array, ctx: Context, edges: list, metas: list,
           saved: list, passes: bool, higher_order: bool = False,
           edge_names: tuple = ()) -> None:
    out._node = Node(name, vjp, ctx, edges, metas, saved, passes, higher_order, edge_names)
    out._requires_grad = True


def save(a: Array) -> tuple:
    h = _handle(a)
    return h, a._version


# ----------------------------------------------------------------------------- backward
def _topological(root: Node) -> list:
    """Nodes reachable from root, each before the nodes of its inputs."""
    order: list = []
    seen = {root}
    stack = [(root, iter(root.edges))]
    while stack:
        node, children = stack[-1]
        for child in children:
            if type(child) is Node and child not in seen:
                seen.add(child)
                stack.append((child, iter(child.edges)))
                break
        else:
            stack.pop()
            order.append(node)
    order.reverse()
    return order


def _dead_ends(node: Node, g: Array) -> tuple:
    """create_graph through a node whose vjp calls kernels without gradients: its gradients,
    computed as usual, each recorded as the result of an op whose own gradient raises
    NotImplementedError naming the node, so that a second-order gradient through it fails
    loudly instead of being silently zero."""
    with no_grad():
        grads = node.apply(g)
    inputs = [(e, m) for e, m in zip(node.edges, node.metas) if e is not None]
    if g._requires_grad:
        inputs.append((g._node if g._node is not None else g, (g.shape, g.dtype)))
    if not inputs:
        return grads

    def refuse(ctx: Context, gg: Array) -> tuple:
        raise NotImplementedError(
            f"[fastmetal.backward] expected ops whose gradients are differentiable for a "
            f"second-order gradient, got {node.name}: its gradient is computed by a kernel "
            "without a gradient of its own (not implemented yet)")
    marked = []
    for gi in grads:
        if type(gi) is Array and gi.dtype.kind == "f":
            gi = _handle(gi)
            ctx = Context()
            ctx.needs = tuple(True for _ in inputs)
            record(f"{node.name}_gradient", refuse, gi, ctx, [e for e, _ in inputs],
                   [m for _, m in inputs], [], False)
        marked.append(gi)
    return tuple(marked)


def _as_array(g: Any, like_device: str) -> Array:
    if isinstance(g, Array):
        return g
    return _core.asarray(np.asarray(g, dtype=np.float32), device=like_device)


# The differentiable ops that backward(create_graph=True) uses for its own sums, copies and
# conversions, registered by the ops that define them (ops/elementwise.py: add, copy;
# ops/reductions.py: sum, broadcast_to; ops/views.py: astype). Without create_graph the
# engine calls the kernels directly (nothing to record).
ENGINE: dict = {}


def sum_to(g: Any, shape: tuple, dtype: Any, device: str) -> Array:
    """g summed over the axes that broadcasting added to `shape` (or broadcast up to it),
    in `dtype`: the gradient of an input of that shape. A g in the graph (create_graph) takes
    the same steps through recorded ops."""
    if type(g) is Array and g.shape == shape and g.dtype == dtype:
        return g  # the usual case, first
    g = _as_array(g, device)
    recorded = g._requires_grad
    gshape = tuple(g.shape)
    if gshape != shape:
        lead = len(gshape) - len(shape)
        if lead >= 0 and all(s == 1 or s == gs for s, gs in zip(shape, gshape[lead:])):
            axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                              if s == 1 and gshape[lead + i] != 1)
            if axes:
                g = ENGINE["sum"](g, axis=axes) if recorded else \
                    _core._reduce("sum", g, axes, False, 0.0)
            g = g.reshape(shape)
        else:  # smaller than the input (a vjp that left broadcasting to us)
            g = (ENGINE["broadcast_to"] if recorded else broadcast_view)(g, shape)
    if g.dtype != dtype:
        g = ENGINE["astype"](g, dtype) if recorded else _core.asarray(g, dtype=dtype)
    return g


def broadcast_view(g: Array, shape: tuple) -> Array:
    """g broadcast to `shape` as a view (zero strides, no copy; kernels read it broadcast,
    and _accumulate copies it before it becomes a .grad). backward()'s ones stay marked.
    `shape` is one that g broadcasts to (an input's shape, by construction)."""
    lead = len(shape) - len(g.shape)
    if lead < 0 or any(n != 1 and n != m for n, m in zip(g.shape, shape[lead:])):
        raise RuntimeError(f"[fastmetal.backward] expected a gradient that broadcasts to the "
                           f"input's shape {tuple(shape)}, got shape {tuple(g.shape)}")
    strides = [0] * lead + [0 if n == 1 and m != 1 else s
                            for n, m, s in zip(g.shape, shape[lead:], g._strides)]
    view = g._view(g._offset, list(shape), strides)
    if g._ones:
        view._ones = True
    return view


def _dense(g: Array) -> bool:
    want, step = [], 1
    for n in reversed(g.shape):
        want.append(step)
        step *= n
    return all(n == 1 or s == w for n, s, w in zip(g.shape, g._strides, reversed(want)))


def is_ones(g: Any) -> bool:
    """Whether g is backward()'s implicit gradient of a one-element result (all ones): a
    vjp may then return its factor unscaled (one kernel launch fewer per step)."""
    return type(g) is Array and g._ones


def _add(a: Array, b: Array) -> Array:
    if a._requires_grad or b._requires_grad:
        return ENGINE["add"](a, b)
    return _core.binary("add", a, b)


# ----------------------------------------------------------------------------- leaf hooks
# Post-accumulate-grad hooks, as PyTorch's ``Tensor.register_post_accumulate_grad_hook``:
# ``hook(leaf)`` runs once per backward() after the leaf's .grad holds everything that
# backward() adds to it (DistributedDataParallel starts averaging a bucket of gradients from
# it). Keyed by id(leaf), the leaf held by a weak reference; while none is registered,
# backward() pays one dict truthiness check.
_post_hooks: dict = {}


class HookHandle:
    """What :func:`register_post_accumulate_grad_hook` returns; ``remove()`` unregisters."""

    __slots__ = ("_key", "_hook")

    def __init__(self, key: int, hook: Callable) -> None:
        self._key, self._hook = key, hook

    def remove(self) -> None:
        entry = _post_hooks.get(self._key)
        if entry is not None and self._hook in entry[1]:
            entry[1].remove(self._hook)
            if not entry[1]:
                del _post_hooks[self._key]


def register_post_accumulate_grad_hook(leaf: Array, hook: Callable) -> HookHandle:
    """Run ``hook(leaf)`` after each backward() has finished accumulating into ``leaf.grad``
    (once per backward, however many ops used the leaf). ``leaf``: an Array that requires
    grad and was computed by nothing."""
    where = "fastmetal.autograd.register_post_accumulate_grad_hook"
    if type(leaf) is not Array or not leaf._requires_grad or leaf._node is not None:
        got = type(leaf).__name__ if type(leaf) is not Array else \
            "a computed Array" if leaf._node is not None else "an Array that does not"
        raise RuntimeError(f"[{where}] expected a leaf Array that requires grad, got {got}")
    if not callable(hook):
        raise TypeError(f"[{where}] expected a callable hook, got {type(hook).__name__}")
    key = id(leaf)
    entry = _post_hooks.get(key)
    if entry is None or entry[0]() is not leaf:  # new, or an id reused after a leaf died
        entry = _post_hooks[key] = (weakref.ref(leaf, lambda _r, k=key: _drop_hooks(k, _r)), [])
    entry[1].append(hook)
    return HookHandle(key, hook)


def _drop_hooks(key: int, ref: weakref.ref) -> None:
    entry = _post_hooks.get(key)
    if entry is not None and entry[0] is ref:
        del _post_hooks[key]


def _hooked_leaves(order: list, only: Optional[frozenset]) -> dict:
    """id(leaf) -> how many edges of the graph reach it, for the leaves with hooks."""
    counts: dict = {}
    for node in order:
        for edge in node.edges:
            if type(edge) is Array and id(edge) in _post_hooks and \
                    (only is None or id(edge) in only):
                counts[id(edge)] = counts.get(id(edge), 0) + 1
    return counts


def _run_hooks(leaf: Array) -> None:
    entry = _post_hooks.get(id(leaf))
    if entry is not None and entry[0]() is leaf:
        for hook in list(entry[1]):
            hook(leaf)


def _accumulate(leaf: Array, g: Array, borrowed: bool) -> None:
    if g._requires_grad or (leaf.grad is not None and leaf.grad._requires_grad):
        # create_graph: .grad is itself in the graph (a copy where it is borrowed).
        leaf.grad = (ENGINE["copy"](g) if borrowed or not _dense(g) else g) \
            if leaf.grad is None else ENGINE["add"](leaf.grad, g)
        return
    if leaf.grad is None:
        # A gradient that is also another's (passed through by add, a view, ...) is copied,
        # so that writing into one .grad never changes another; so is a broadcast view.
        leaf.grad = _core.unary("copy", g) if borrowed or not _dense(g) else g
    else:
        leaf.grad = _core.binary("add", leaf.grad, g)


def backward(tensor: Array, gradient: Any = None, retain_graph: bool = False,
             only: Optional[frozenset] = None, create_graph: bool = False) -> None:
    """Gradients of `tensor` into the leaves' .grad; with `only` (ids of Arrays), into those
    leaves alone (autograd.grad), the rest untouched. With `create_graph` the gradients are
    computed by recorded ops (the vjps run in grad mode, their saved inputs connected), so
    they can be differentiated again; a node whose vjp is not made of differentiable ops
    gives gradients that raise NotImplementedError, naming it, if a later backward reaches
    them (never silent zeros)."""
    where = "fastmetal.Array.backward"
    if not tensor._requires_grad:
        raise RuntimeError(f"[{where}] expected an Array that requires grad (computed, with "
                           "grad mode on, from one with requires_grad=True), got one that "
                           "does not")
    if gradient is None:
        if tensor.size != 1:
            raise RuntimeError(f"[{where}] expected a gradient argument for an Array of "
                               f"shape {tuple(tensor.shape)} (it can be left out only for "
                               "one element), got none")
        gradient = _core.ones(tuple(tensor.shape), dtype=tensor.dtype, device=tensor.device)
        gradient._ones = True  # vjps may skip multiplying by it (is_ones)
        borrowed = False
    else:
        if isinstance(gradient, Array) and gradient.device != tensor.device:
            raise ValueError(f"[{where}] expected gradient on device '{tensor.device}', got "
                             f"'{gradient.device}'")
        gradient = _as_array(gradient, tensor.device)
        if tuple(gradient.shape) != tuple(tensor.shape):
            raise ValueError(f"[{where}] expected gradient of shape {tuple(tensor.shape)}, "
                             f"got {tuple(gradient.shape)}")
        borrowed = True
    root = tensor._node
    if root is None:  # a leaf
        if only is not None and id(tensor) not in only:
            return
        _accumulate(tensor, sum_to(gradient, tuple(tensor.shape), tensor.dtype,
                                   tensor.device), borrowed)
        if _post_hooks:
            _run_hooks(tensor)
        return
    profile = PROFILE
    started = time.perf_counter() if profile is not None else 0.0
    order = _topological(root)
    pending: dict = {root: gradient}
    # Nodes whose pending gradient this backward made itself (a vjp's fresh zeros-and-slice,
    # or a sum), so nothing else holds it: a slice read's gradient may be added into it in
    # place (see _add_in_place).
    owned: set = set()
    # Leaves with hooks: edges still to come (a hook runs after the last), and which got any.
    hooked = _hooked_leaves(order, only) if _post_hooks else None
    with (enable_grad() if create_graph else no_grad()):
        try:
            for node in order:
                g = pending.pop(node, None)
                owned.discard(node)
                if g is None:
                    if hooked:
                        _count_down(node, (None,) * len(node.edges), hooked)
                    continue  # no gradient reached it (its consumers' vjps returned None)
                if node.retained is not None:
                    kept = node.retained()
                    if kept is not None:
                        kept.grad = g
                if not create_graph and _add_in_place(node, g, pending, owned):
                    continue
                if create_graph and not node.higher_order:
                    grads = _dead_ends(node, g)
                elif profile is None:
                    grads = node.apply(g)
                else:
                    t0 = time.perf_counter()
                    grads = node.apply(g)
                    profile["vjp"] = profile.get("vjp", 0.0) + time.perf_counter() - t0
                for edge, meta, gi in zip(node.edges, node.metas, grads):
                    if edge is None or gi is None:
                        continue
                    shape, dtype = meta
                    fresh = sum_to(gi, shape, dtype, g.device)
                    # Borrowed (copied before it becomes a .grad): the incoming gradient
                    # itself or, from a vjp that passes it on, a view of it (it may also be
                    # another's, or the caller's). A gradient a vjp computed is its own,
                    # even where the incoming one was the caller's.
                    passed = node.passes or gi is g
                    borrowed_i = passed and fresh is gi
                    if type(edge) is Node:
                        prev = pending.get(edge)
                        pending[edge] = fresh if prev is None else _add(prev, fresh)
                        # A sum is new; so is an in-place adder's own result (zeros and a
                        # slice: its vjp makes it and passes nothing on).
                        if prev is not None or (not create_graph and fresh is gi and
                                                getattr(node.vjp, "add_into", None)):
                            owned.add(edge)
                        else:
                            owned.discard(edge)
                    elif only is None or id(edge) in only:
                        _accumulate(edge, fresh, borrowed_i)
                if hooked:
                    _count_down(node, grads, hooked)
        finally:
            if not retain_graph:
                for node in order:
                    node.release()
            if profile is not None:
                profile["backward"] = profile.get("backward", 0.0) + \
                    time.perf_counter() - started



def _add_in_place(node: Node, g: Array, pending: dict, owned: set) -> bool:
    """A slice read's backward without its zeros: where `node`'s vjp can add its gradient
    into an existing one (``vjp.add_into(target, ctx, g)``, views.py's basic getitem) and its
    input's pending gradient is this backward's own (`owned`), g goes into that gradient's
    slice in place. GPT's ``qkv[:, :, i]`` for i = 0, 1, 2 then costs one zero fill and three
    slice writes instead of three fills, three writes and two full adds. The values are the
    same (x + 0 and 0 + x are x; only a -0.0 gradient entry may stay -0.0 where the sum would
    make it +0.0). False where it does not apply: the caller runs the vjp as usual."""
    add_into = getattr(node.vjp, "add_into", None)
    if add_into is None or len(node.edges) != 1:
        return False
    edge = node.edges[0]
    if type(edge) is not Node or edge not in owned or node.freed:
        return False
    target = pending[edge]
    if target.dtype != g.dtype or target._requires_grad or g._requires_grad:
        return False
    return bool(add_into(target, node.ctx, g))


def _count_down(node: Node, grads: tuple, hooked: dict) -> None:
    """After `node`'s gradients went to its inputs: run the hooks of leaves it was the last
    edge of (a leaf that no gradient reached has no hook run, as PyTorch)."""
    for edge, gi in zip(node.edges, grads):
        if type(edge) is not Array:
            continue
        key = id(edge)
        left = hooked.get(key)
        if left is None:
            continue
        if gi is not None:
            hooked[("got", key)] = True
        if left == 1:
            del hooked[key]
            if hooked.pop(("got", key), False):
                _run_hooks(edge)
        else:
            hooked[key] = left - 1


def grad(outputs: Any, inputs: Any, grad_outputs: Any = None, retain_graph: Any = None,
         create_graph: bool = False, allow_unused: bool = False) -> tuple:
    """The gradients of ``outputs`` with respect to ``inputs``, returned rather than added to
    ``.grad``, as ``torch.autograd.grad``. ``outputs``: an Array or a sequence of them;
    ``grad_outputs``: their gradients (None: ones, for one-element outputs);
    ``retain_graph`` defaults to ``create_graph``; with ``create_graph`` the gradients are in
    the graph themselves (second-order gradients, gradient penalties, Hessian-vector
    products). An input that the outputs do not depend on is an error, as PyTorch's default
    (``allow_unused=False``), unless ``allow_unused`` (its gradient is then None)."""
    where = "fastmetal.autograd.grad"
    outs = [outputs] if isinstance(outputs, Array) else list(outputs)
    ins = [inputs] if isinstance(inputs, Array) else list(inputs)
    for name, items in (("outputs", outs), ("inputs", ins)):
        if not items or not all(isinstance(a, Array) for a in items):
            raise TypeError(f"[{where}] expected {name} to be an Array or a non-empty sequence "
                            f"of Arrays, got {items!r}")
    for i, a in enumerate(ins):
        if not a._requires_grad:
            raise RuntimeError(f"[{where}] expected inputs[{i}] to require grad, got an "
                               "Array that does not")
    if grad_outputs is None or isinstance(grad_outputs, Array):
        grad_outputs = [grad_outputs] * len(outs) if grad_outputs is None else [grad_outputs]
    grad_outputs = list(grad_outputs)
    if len(grad_outputs) != len(outs):
        raise ValueError(f"[{where}] expected one grad_output per output ({len(outs)}), got "
                         f"{len(grad_outputs)}")
    keep = bool(create_graph) if retain_graph is None else bool(retain_graph)
    # The inputs' gradients are collected in place of their .grad: leaves get a stand-in
    # .grad slot for the call; non-leaves are retained the way retain_grad() does.
    saved = [(a, a.grad, a._node.retained if a._node is not None else None) for a in ins]
    try:
        for a in ins:
            a.grad = None
            if a._node is not None:
                a._node.retained = weakref.ref(a)
        for k, (out, g) in enumerate(zip(outs, grad_outputs)):
            backward(out, g, keep or k + 1 < len(outs), only=frozenset(map(id, ins)),
                     create_graph=bool(create_graph))
        found = [a.grad for a in ins]
    finally:
        for a, old_grad, old_retained in saved:
            a.grad = old_grad
            if a._node is not None:
                a._node.retained = old_retained
    for i, g in enumerate(found):
        if g is None and not allow_unused:
            raise RuntimeError(f"[{where}] expected every input to be used in computing the "
                               f"outputs, got inputs[{i}], which was not")
    return tuple(found)


def set_requires_grad(a: Array, value: Any) -> None:
    """``a.requires_grad = value``, checked: only float leaves take gradients."""
    where = "fastmetal.Array.requires_grad"
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"[{where}] expected True or False, got {value!r}")
    if value and a.dtype.kind != "f":  # float16, float32, float64 (where the device has it)
        raise TypeError(f"[{where}] expected a float16, float32 or float64 Array (only those "
                        f"have gradients), got dtype {a.dtype}")
    if a._node is not None and not value:
        raise RuntimeError(f"[{where}] expected a leaf Array (requires_grad of a computed "
                           "Array follows from its inputs; use .detach()), got one computed "
                           f"by {a._node!r}")
    a._requires_grad = bool(value)


def retain_grad(a: Array) -> None:
    """Keep this non-leaf Array's gradient in ``.grad`` at the next backward()."""
    if a._node is not None:
        a._node.retained = weakref.ref(a)
    elif not a._requires_grad:
        raise RuntimeError("[fastmetal.Array.retain_grad] expected an Array that requires "
                           "grad, got one that does not")


def view_in_graph(a: Array) -> Array:
    """A new Array object over a's memory that stays in a's graph (a recorded identity): the
    input of a nested gradient, whose .grad and retained slot are its own."""
    alias = a._alias()
    ctx = Context()
    ctx.needs = (True,)
    record("alias", lambda c, g: g, alias, ctx, [edge_of(a)], [(a.shape, a.dtype)], [], True,
           True, ("self",))
    return alias


def detach(a: Array) -> Array:
    """The same memory as a new Array outside the graph (requires_grad False), as
    ``torch.Tensor.detach``."""
    return _handle(a)
