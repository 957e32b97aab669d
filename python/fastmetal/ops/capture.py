"""``fastmetal.compile``: trace a step once, replay its kernels without Python.

How it works (the C++ half is ``csrc/backend/capture.h``):

- The first call of a compiled function with a new *signature* (the shapes, dtypes,
  devices and ``requires_grad`` of its Array arguments, the values of its other
  arguments) runs eagerly: it creates what a step creates once (optimizer state,
  ``.grad`` buffers). The second call is *traced*: it runs eagerly too, while the device
  work of every op it issues (kernel launches, host-to-device copies, the CPU's native
  routines) is recorded with the buffers it uses, which the recording keeps alive. Later
  calls *replay* the recording from C++ (a CUDA graph on cuda, the launch list on cpu, an
  indirect command buffer encoded once on metal): no Python runs per op.
- Array arguments are inputs: each call copies them into the buffers the trace read.
  Everything else the step touches (parameters, optimizer state, buffers) is state, updated
  in place by the replayed kernels exactly as eagerly. Returned Arrays are fresh copies,
  so Arrays returned earlier stay valid.
- What Python computes from its own state at each step is re-run at each replay in *patch
  mode* (:func:`dynamic`): the draw of a dropout key or of random numbers from
  ``fastmetal.random`` (the Philox counter advances as eagerly), an optimizer's update
  (its step count, bias corrections and a scheduler's learning rate). In patch mode the
  ops only rewrite the argument blocks of the recorded launches; nothing runs.
- Before the first replay, elementwise launches that only finish what the kernel before them
  wrote (a ReLU after a convolution or an add, ReLU's gradient after a pooling backward) are folded
  into that kernel where no one else can see the intermediate (``csrc/ops/capture_fusion.h``
  says which and when): a replay reads and writes less memory and launches fewer kernels,
  with results still bit-identical to eager execution. ``FASTMETAL_COMPILE_FUSION=0`` turns
  this off; :attr:`Compiled.fusions` counts the launches folded.
- A step whose Python reads device results (``.item()``, ``.numpy()``, ``float(x)``,
  printing) cannot be replayed: its trace notes the read, and the function then runs
  eagerly for that signature, with one warning. So does a step that uses something marked
  :func:`uncapturable`.
"""
from __future__ import annotations

import functools
import threading
import warnings

import numpy as np

from .. import _core
from ..autograd.tape import no_grad
from .elementwise import copy as _copy

__all__ = ["compile", "dynamic", "cell", "tracing", "uncapturable", "CompileWarning"]


class CompileWarning(UserWarning):
    """A compiled function runs eagerly for a signature (why is in the message)."""


_local = threading.local()  # .trace: the _Trace this thread records or patches, else None


class _Trace:
    """Python's side of one recording: the regions re-run at each replay, and the cells
    that carry values between them (a dropout's key from its forward to its backward)."""

    def __init__(self, capture):
        self.capture = capture
        self.regions = []   # (begin, end, fn): entries fn rewrites, in recorded order
        self.cells = []     # created while tracing, handed out again in order in patch mode
        self.cell_at = 0
        self.patching = False
        self.depth = 0      # nesting of dynamic(): only the outermost region is recorded
        self.problem = ""   # why the step cannot be replayed (uncapturable), else ""


def _trace():
    return getattr(_local, "trace", None)


class _Region:
    __slots__ = ("begin", "end", "fn", "key", "last")

    def __init__(self, begin, end, fn, key, last):
        self.begin, self.end, self.fn, self.key, self.last = begin, end, fn, key, last


def dynamic(fn, key=None):
    """Run ``fn()`` (a closure over the Arrays it uses) and return its result; while a
    compiled function is traced, also run it again at every replay, in patch mode: it must
    issue the same ops on the same Arrays, with the values (keys, learning rates) of that
    replay. Used where Python state feeds a kernel's arguments.

    ``key``: optional, a function of that state, called before ``fn``; where it returns what
    it returned the time before, the replay skips ``fn`` (its launches keep their
    arguments). It must cover every value ``fn`` writes into a launch and every side effect
    ``fn`` has on Python state (an optimizer's step count)."""
    t = _trace()
    if t is None or t.patching or t.depth:
        return fn()
    last = key() if key is not None else None
    begin = _core._capture_position()
    t.depth += 1
    try:
        result = fn()
    finally:
        t.depth -= 1
    t.regions.append(_Region(begin, _core._capture_position(), fn, key, last))
    return result


def tracing():
    """Whether this thread is recording a compiled function's trace (not replaying it)."""
    t = _trace()
    return t is not None and not t.patching


def cell():
    """A one-item list matched by order between the trace and each replay: a value set in
    one :func:`dynamic` region (a dropout's key in its forward) and read in a later one (its
    backward) is the value of the same replay."""
    t = _trace()
    if t is None or (not t.patching and not t.depth):  # outside a region: nothing replays it
        return [None]
    if t.patching:
        c = t.cells[t.cell_at]
        t.cell_at += 1
        return c
    c = [None]
    t.cells.append(c)
    return c


def uncapturable(reason):
    """Called by an op whose work a replay cannot redo (see the module docstring): while a
    compiled function is traced, it will run eagerly instead."""
    t = _trace()
    if t is not None and not t.patching and not t.problem:
        t.problem = reason


# ----------------------------------------------------------------------------- compile
def _flatten(obj, leaves):
    """Leaves of nested tuples/lists/dicts, and the structure to rebuild them."""
    if isinstance(obj, (tuple, list)):
        return (type(obj), tuple(_flatten(x, leaves) for x in obj))
    if isinstance(obj, dict):
        return (dict, tuple((k, _flatten(v, leaves)) for k, v in obj.items()))
    leaves.append(obj)
    return None


def _unflatten(tree, leaves):
    if tree is None:
        return next(leaves)
    kind, items = tree
    if kind is dict:
        return {k: _unflatten(v, leaves) for k, v in items}
    return kind(_unflatten(x, leaves) for x in items)


def _leaf_key(x):
    if isinstance(x, _core.Array):
        # Not its strides: the trace reads a contiguous copy (each call refills it).
        return ("array", tuple(x.shape), str(x.dtype), x.device, bool(x.requires_grad))
    if isinstance(x, np.ndarray):
        return ("numpy", x.shape, str(x.dtype))
    if x is None or isinstance(x, (bool, int, float, str, bytes, complex)):
        return ("value", type(x), x)
    return ("object", id(x))


def _copy_out(leaf):
    if not isinstance(leaf, _core.Array):
        return leaf
    with no_grad():
        return leaf.copy()


class _Replay:
    """One traced signature: the recording, its input buffers, its outputs."""

    def __init__(self, trace, slots, out_tree, out_leaves, fusions):
        self.trace = trace
        self.fusions = fusions        # launches the fusion pass folded away
        self.slots = slots            # per argument leaf: the Array the trace read, or None
        self.out_tree = out_tree
        self.out_leaves = out_leaves
        self.lock = threading.Lock()  # one replay at a time: they share the buffers

    def __call__(self, leaves):
        t = self.trace
        cap = t.capture
        with self.lock:
            for slot, x in zip(self.slots, leaves):
                if slot is not None:
                    _copy(x, out=slot)
            if t.regions:
                _local.trace = t
                t.patching, t.cell_at = True, 0
                try:
                    with no_grad():  # the ops only rewrite arguments: no graph to record
                        for r in t.regions:
                            if r.key is not None:
                                k = r.key()
                                if k == r.last:
                                    continue
                                r.last = k
                            cap.begin_patching(r.begin, r.end)
                            try:
                                r.fn()
                            finally:
                                cap.end_patching()
                finally:
                    t.patching = False
                    _local.trace = None
            cap.replay()
            return _unflatten(self.out_tree, iter([_copy_out(x) for x in self.out_leaves]))


_EAGER = "eager"


class Compiled:
    """What :func:`compile` returns: call it like the function it wraps."""

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError(f"[fastmetal.compile] expected a function, got {fn!r}")
        self.fn = fn
        self._entries = {}   # signature -> None (warmed up), _EAGER or a _Replay
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __repr__(self):
        return f"fastmetal.compile({self.fn!r})"

    @property
    def traces(self):
        """How many signatures have been traced for replay."""
        return sum(isinstance(e, _Replay) for e in self._entries.values())

    @property
    def fusions(self):
        """How many launches the fusion pass folded into others, over every traced signature
        (see this module's docstring)."""
        return sum(e.fusions for e in self._entries.values() if isinstance(e, _Replay))

    def __call__(self, *args, **kwargs):
        leaves = []
        tree = _flatten((args, kwargs), leaves)
        try:
            key = (repr(tree), tuple(_leaf_key(x) for x in leaves))
            hash(key)
        except TypeError:  # an unhashable value among the arguments: no caching
            return self.fn(*args, **kwargs)
        with self._lock:
            state = self._entries.get(key, "new")
            if state == "new":
                self._entries[key] = None
        if isinstance(state, _Replay):
            return state(leaves)
        if state == "new" or state == _EAGER or _trace() is not None:
            return self.fn(*args, **kwargs)
        return self._record(key, tree, leaves)

    def _eager(self, key, why):
        warnings.warn(f"fastmetal.compile: {getattr(self.fn, '__qualname__', self.fn)!s} runs "
                      f"eagerly for this signature: {why}", CompileWarning, stacklevel=3)
        with self._lock:
            self._entries[key] = _EAGER

    def _record(self, key, tree, leaves):
        devices = {x.device for x in leaves if isinstance(x, _core.Array)}
        if len(devices) > 1:
            self._eager(key, f"Array arguments on several devices {sorted(devices)}")
            return _unflatten(tree, iter(leaves))
        device = devices.pop() if devices else _core.default_device()
        # The trace reads its own copies of the inputs (the buffers each replay refills), so
        # the caller's Arrays are never written by a later replay.
        slots, inputs = [], []
        for x in leaves:
            if isinstance(x, (_core.Array, np.ndarray)):
                with no_grad():
                    slot = _core.asarray(x, device=device).copy()
                if isinstance(x, _core.Array) and x.requires_grad:
                    slot.requires_grad = True
                slots.append(slot)
                inputs.append(slot)
            else:
                slots.append(None)
                inputs.append(x)
        args, kwargs = _unflatten(tree, iter(inputs))
        cap = _core._Capture(device)
        t = _Trace(cap)
        _local.trace = t
        cap.begin_recording()
        try:
            out = self.fn(*args, **kwargs)
        finally:
            cap.end_recording()
            _local.trace = None
        why = t.problem or cap.host_read
        if why:
            self._eager(key, why)
            return out
        out_leaves = []
        out_tree = _flatten(out, out_leaves)
        # The traced call's own Arrays are let go first, so that intermediates only the
        # recording still holds can be fused (what the caller gets back is a copy).
        copies = [_copy_out(x) for x in out_leaves]
        del out, args, kwargs, inputs
        fusions = cap.fuse([(r.begin, r.end) for r in t.regions])
        entry = _Replay(t, slots, out_tree, out_leaves, fusions)
        with self._lock:
            self._entries[key] = entry
        return _unflatten(out_tree, iter(copies))


def compile(fn=None):  # noqa: A001 (the name users expect: torch.compile, mx.compile)
    """``fastmetal.compile(fn)``: a function of the same arguments that replays ``fn``'s
    kernels without running Python per op, after one eager call and one traced call per
    signature (see this module's docstring for what is captured, what is an input, and
    what runs eagerly instead). Usable as a decorator, with or without brackets."""
    if fn is None:
        return compile
    return Compiled(fn)
