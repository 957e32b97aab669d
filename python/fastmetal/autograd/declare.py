"""One way to declare a public op: its forward, and beside it its gradient.

    @op(grads=("input", "weight", "bias"), saves=("input", "weight"))
    def linear(input, weight, bias=None):
        '''docstring: the op's documentation'''
        return _core._linear(input, weight, bias)

    @linear.vjp
    def _(ctx, g):
        return _core._linear_backward(g, ctx.input, ctx.weight,
                                      needed(ctx, ("input", "weight", "bias")))

The decorated function is the public function: its signature and docstring are the
forward's; ``__all__``, the stubs and docs/API.md are checked against the registry of
declarations by tests/test_public_api.py (test_one_road_to_a_public_op) and mypy's
stubtest. When grad mode is on and an argument named in ``grads`` requires grad, the call
records a node whose vjp gets a
:class:`~fastmetal.autograd.tape.Context` (the arguments by name, the saved Arrays, ``out``
and ``aux``) and the result's gradient ``g``, and returns one gradient per name of
``grads`` (None where ``ctx.needs`` says it is not wanted). Gradients may be left in the
broadcast shape: the tape sums them back to each input's shape and dtype.

Otherwise the call is the forward itself, with one check of grad mode and the arguments.

Arguments of ``op``:
  grads    the differentiable arguments, by name
  saves    the Array arguments the vjp reads (and "out" for the result): kept until
           backward() and version-checked then (default: none)
  aux      the forward returns ``(result, aux)``; aux is passed to the vjp as ``ctx.aux``
           (a fused gradient, say) and the public function returns only the result
  passes   the vjp may return ``g`` itself or a view of it (views, copies)
  saves_for  per differentiable argument, what its gradient reads (instead of ``saves``):
           only what the wanted gradients read is kept (``x *= c`` then needs nothing)
  sequences  differentiable arguments that are sequences of Arrays (concatenate's
           ``arrays``): one edge, and one gradient from the vjp, per element
  higher_order  the vjp is made of differentiable ops, so backward(create_graph=True) may
           record it for a second-order gradient (a vjp that checks ``is_grad_enabled()``
           may take a faster kernel path when it is False: plain backward runs in no_grad).
           Without it, a second-order gradient through the op raises NotImplementedError.
"""
from __future__ import annotations

import functools
import inspect
import linecache
import time
from typing import Any, Callable, Iterable

import numpy as np

from . import tape
from .tape import Context
from .._core import Array

# name -> public function, for every declared op (tests check __all__, stubs and docs).
DECLARED: dict = {}


def _unwanted(ctx: Context, g: Any) -> Any:
    raise RuntimeError("[fastmetal.backward] expected the op to declare its gradient "
                       "(@fn.vjp beside its forward), got an op with none")


def op(*, grads: Iterable[str], saves: Iterable[str] = (), aux: bool = False,
       passes: bool = False, name: str | None = None, public: bool = True,
       saves_for: dict | None = None, sequences: Iterable[str] = (),
       higher_order: bool = False) -> Callable:
    grad_names = tuple(grads)
    sequence_names = frozenset(sequences)
    saved_names: Any = frozenset(saves)
    if saves_for is not None:
        saved_names = {n: frozenset(saves_for.get(n, ())) for n in grad_names}
        saves = frozenset().union(*saved_names.values())

    def decorate(forward: Callable) -> Callable:
        op_name = name or forward.__name__
        signature = inspect.signature(forward)
        params = list(signature.parameters)
        for n in grad_names + tuple(frozenset(saves) - {"out"}):
            if n not in params:
                raise TypeError(f"op {op_name}: {n!r} is not an argument of {params}")
        positions = tuple((params.index(n), n) for n in grad_names)
        out_position = params.index("out") if "out" in params else -1
        bind = _binder(signature)
        definition: dict = {"vjp": _unwanted}

        def wants_tape(args: tuple, kwargs: dict) -> bool:
            for i, n in positions:
                a = args[i] if i < len(args) else kwargs.get(n)
                if type(a) is Array and a._requires_grad:
                    return True
                if n in sequence_names and _any_requires_grad(a):
                    return True
            if out_position >= 0:
                o = args[out_position] if out_position < len(args) else kwargs.get("out")
                if type(o) is Array and o._requires_grad:
                    return True
            return False

        mode = tape._mode

        def record(args: tuple, kwargs: dict) -> Any:
            if tape.PROFILE is not None:
                return _profiled(op_name, forward, bind, grad_names, saved_names,
                                 aux, passes, definition["vjp"], args, kwargs, sequence_names,
                                 higher_order)
            return _recorded(op_name, forward, bind, grad_names, saved_names, aux,
                             passes, definition["vjp"], args, kwargs, sequence_names,
                             higher_order)

        call = _same_signature_call(forward, signature, grad_names, aux, mode, record,
                                    sequence_names)
        if call is None:  # *args, **kwargs or positional-only: bound at every call
            def call(*args: Any, **kwargs: Any) -> Any:
                if mode.enabled and wants_tape(args, kwargs):
                    return record(args, kwargs)
                result = forward(*args, **kwargs)
                return result[0] if aux else result
        functools.update_wrapper(call, forward)

        def set_vjp(vjp: Callable) -> Callable:
            definition["vjp"] = vjp
            return vjp

        call.vjp = set_vjp  # type: ignore[attr-defined]
        call.grads = grad_names  # type: ignore[attr-defined]
        if public:
            DECLARED[op_name] = call
        return call
    return decorate


def _any_requires_grad(items: Any) -> bool:
    """Whether a sequence argument (concatenate's arrays) holds an Array that requires grad."""
    return isinstance(items, (list, tuple)) and any(
        type(a) is Array and a._requires_grad for a in items)


def _same_signature_call(forward: Callable, signature: inspect.Signature, grad_names: tuple,
                         aux: bool, mode: Any, record: Callable,
                         sequence_names: frozenset = frozenset()) -> Callable | None:
    """The public function for a forward whose arguments all have names: a function of the
    forward's own signature (so Python binds the arguments, by position or name, as for the
    forward itself), compiled once, that checks grad mode and the differentiable arguments
    and out= by name and calls the forward. Every op call passes here, a NumPy user's too:
    a generic (*args, **kwargs) wrapper cost 0.2-0.5 us more a call (add on 1,024 floats
    1.03 -> 0.82 us). None for other signatures."""
    params = list(signature.parameters.values())
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not all(p.kind in plain and p.name.isidentifier() for p in params):
        return None
    names = {p.name for p in params}
    reserved = {"_forward", "_mode", "_Array", "_record", "_any"}
    if names & reserved or any(n.startswith("_d_") for n in names):
        return None
    space: dict = {"_forward": forward, "_mode": mode, "_Array": Array, "_record": record,
                   "_any": _any_requires_grad}
    heads, passes_on, keyword_only = [], [], False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            heads.append("*")
            keyword_only = True
        if p.default is p.empty:
            heads.append(p.name)
        else:
            space[f"_d_{p.name}"] = p.default
            heads.append(f"{p.name}=_d_{p.name}")
        passes_on.append(f"{p.name}={p.name}" if keyword_only else p.name)
    checked = [n for n in grad_names] + (["out"] if "out" in names else [])
    recording = " or ".join(f"_any({n})" if n in sequence_names else
                            f"(type({n}) is _Array and {n}._requires_grad)" for n in checked)
    # The recording path gets the arguments as the forward takes them: positional ones by
    # position (its binder zips them with the names), keyword-only ones by name.
    positional = "".join(f"{p.name}, " for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
    by_name = ", ".join(f"{p.name!r}: {p.name}" for p in params if p.kind is p.KEYWORD_ONLY)
    call = f"_forward({', '.join(passes_on)})"
    source = (f"def call({', '.join(heads)}):\n"
              f"    if _mode.enabled and ({recording or 'False'}):\n"
              f"        return _record(({positional}), {{{by_name}}})\n"
              f"    return {call}{'[0]' if aux else ''}\n")
    filename = f"<fastmetal op {forward.__name__}>"
    # Tracebacks show the line that called the forward.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), space)  # noqa: S102
    return space["call"]


def _binder(signature: inspect.Signature) -> Callable[[tuple, dict], dict]:
    """A function giving a call's arguments by name, defaults included: by position and
    name directly where the signature allows (inspect's bind is ~10x slower, and this runs
    on every recorded call), else through the signature (*args, and the TypeError)."""
    params = signature.parameters.values()
    names = tuple(p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    every = frozenset(p.name for p in params)
    simple = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)

    def general(args: tuple, kwargs: dict) -> dict:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    def fast(args: tuple, kwargs: dict) -> dict:
        if len(args) <= len(names) and every.issuperset(kwargs):
            values = dict(defaults)
            values.update(zip(names, args))
            values.update(kwargs)
            if len(values) == len(every):
                return values
        return general(args, kwargs)
    return fast if simple else general


def _check_out(out: Any, where: str) -> None:
    if not isinstance(out, Array):
        raise RuntimeError(f"[{where}] expected out= a fastmetal.Array to record a gradient "
                           f"in, got {type(out).__name__} (it cannot carry a gradient)")
    if out._requires_grad and out._node is None:
        raise RuntimeError(f"[{where}] expected out= an Array that is not a leaf requiring "
                           "grad (a parameter is updated in place only inside "
                           "fastmetal.no_grad()), got such a leaf")


def _recorded(op_name: str, forward: Callable, bind: Callable[[tuple, dict], dict],
              grad_names: tuple, saved_names: Any, aux: bool, passes: bool,
              vjp: Callable, args: tuple, kwargs: dict,
              sequence_names: frozenset = frozenset(), higher_order: bool = False) -> Any:
    values = bind(args, kwargs)
    out_arg = values.get("out")
    if out_arg is not None:
        _check_out(out_arg, f"fastmetal.{op_name}")
    inputs = []
    for n in grad_names:  # a sequence argument: one input (and one gradient) per element
        v = values.get(n)
        if n in sequence_names and isinstance(v, (list, tuple)):
            inputs.extend(v)
        else:
            inputs.append(v)
    needs = tuple([type(v) is Array and v._requires_grad for v in inputs])
    if type(saved_names) is dict:  # saves_for: what the wanted gradients read
        key = ("needs", needs)
        chosen = saved_names.get(key)
        if chosen is None:
            chosen = saved_names[key] = frozenset().union(
                *(saved_names[n] for n, want in zip(grad_names, needs) if want))
        saved_names = chosen
    ctx = Context()
    fields = ctx.__dict__
    fields.update(values)
    ctx.needs = needs
    shapes = ctx.shapes
    saved = []
    for n in sequence_names:  # the vjp reads the elements' shapes, never the elements
        items = values.get(n)
        shapes[n] = [tuple(v.shape) if isinstance(v, Array) else np.shape(v) for v in items]
        fields[n] = None
    for n, v in values.items():
        if type(v) is Array:
            shapes[n] = v.shape
            if n in saved_names:
                h, version = tape.save(v)
                fields[n] = h
                saved.append((n, h, version))
            else:
                fields[n] = None
    edges = [(v._node if v._node is not None else v) if want else None
             for v, want in zip(inputs, needs)]
    metas = [(v.shape, v.dtype) if want else None for v, want in zip(inputs, needs)]
    mode = tape._mode
    mode.enabled = False  # the forward records nothing (it may call other ops)
    try:
        result = forward(*args, **kwargs)
    finally:
        mode.enabled = True
    out, extra = result if aux else (result, None)
    ctx.aux = extra
    if out_arg is None:
        for v in inputs:
            if v is out:
                return out  # the op returned an argument as it is (dropout in eval mode)
    if True not in needs:  # only out= required grad: the result no longer depends on the graph
        if type(out) is Array:
            out._node = None
            out._requires_grad = False
        return out
    if type(out) is not Array:
        raise RuntimeError(f"[fastmetal.{op_name}] expected a fastmetal.Array result to "
                           f"record a gradient on, got {type(out).__name__}")
    if "out" in saved_names:
        h, version = tape.save(out)
        ctx.out = h
        saved.append(("out", h, version))
    tape.record(op_name, vjp, out, ctx, edges, metas, saved, passes, higher_order, grad_names)
    return out


def _profiled(op_name: str, forward: Callable, *rest: Any) -> Any:
    """_recorded, adding what recording cost beyond the forward to PROFILE["record"]."""
    spent = [0.0]

    def timed_forward(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return forward(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0
    t0 = time.perf_counter()
    out = _recorded(op_name, timed_forward, *rest)
    profile = tape.PROFILE
    if profile is not None:
        profile["record"] = profile.get("record", 0.0) + time.perf_counter() - t0 - spent[0]
    return out


def needed(ctx: Context, names: tuple) -> tuple:
    """The names (of a backward kernel's ``needs=``) whose gradients are wanted."""
    return tuple(n for n, want in zip(names, ctx.needs) if want)


def refuse_recording(where: str, *arrays: Any) -> None:
    """For a public function without a gradient (``linear_backward`` and the other gradients
    themselves; the numerical differentiation of fastmetal.ops.numerics): an input that
    requires grad is an error (in grad mode), never a silently unrecorded result."""
    if tape.is_grad_enabled() and any(type(a) is Array and a._requires_grad for a in arrays):
        raise RuntimeError(f"[{where}] expected inputs that do not require grad (this function "
                           "has no gradient; call it inside fastmetal.no_grad() or on "
                           ".detach()ed inputs), got one that requires grad")
