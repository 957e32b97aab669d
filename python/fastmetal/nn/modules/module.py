"""``fastmetal.nn.Module`` and ``Parameter``, as PyTorch's: attributes that are Modules or
Parameters register themselves, so any subclass has recursive ``parameters()``,
``named_parameters()``, ``state_dict()`` / ``load_state_dict()``, ``train()`` / ``eval()``,
``zero_grad()``, ``to(device, dtype)``, ``cpu()`` / ``cuda()`` and ``float()`` / ``double()`` /
``half()`` / ``type(dtype)``. Buffers (``register_buffer``: state that is not a parameter, as
BatchNorm's running statistics) are moved, converted, saved and loaded with them. Gradients
come from autograd (``loss.backward()``).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator

import numpy as np

from ..._core import Array
from ...autograd.tape import detach, no_grad
from ...ops.creation import asarray, zeros
from ...ops.devices import device as as_device
from ...ops.devices import device_capabilities, devices
from ...ops.dtypes import native_dtype
from ...ops.elementwise import copy
from ...ops.views import astype, to as move_to

__all__ = ["Parameter", "Module"]


class _ParameterType(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return type(obj) is Array and getattr(obj, "_is_parameter", False)


class Parameter(metaclass=_ParameterType):
    """``Parameter(data, requires_grad=True)``: a leaf Array that requires grad and that a
    Module registers when it is assigned as an attribute, as ``torch.nn.Parameter``. An Array
    ``data`` is shared (not copied); anything else becomes a float32 Array on the default
    device. ``isinstance(p, Parameter)`` is True for them; they are ``fastmetal.Array``s."""

    def __new__(cls, data: Any = None, requires_grad: bool = True) -> Any:  # type: ignore[misc]
        if data is None:
            data = np.zeros((0,), np.float32)
        if isinstance(data, Array):
            p = detach(data)
        else:
            host = np.asarray(data)
            if host.dtype.kind not in "fiub":
                raise TypeError(f"[fastmetal.nn.Parameter] expected real data, got dtype "
                                f"{host.dtype}")
            p = asarray(host.astype(np.float16 if host.dtype == np.float16 else
                                          np.float32))
        p.requires_grad = requires_grad
        p._is_parameter = True
        return p


def _state_value(p: Array) -> np.ndarray:
    return np.array(p.numpy(), copy=True)


class Module:
    """Base class of every layer and model, as ``torch.nn.Module``."""

    training = True

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())

    # -- registration
    def _registry(self) -> tuple:
        d = self.__dict__
        if "_parameters" not in d:  # a subclass that did not call super().__init__()
            Module.__init__(self)
        return d["_parameters"], d["_modules"]

    def _buffer_registry(self) -> "OrderedDict[str, Any]":
        self._registry()
        return self.__dict__["_buffers"]

    def __setattr__(self, name: str, value: Any) -> None:
        params, modules = self._registry()
        buffers = self.__dict__["_buffers"]
        if isinstance(value, Parameter):
            modules.pop(name, None)
            buffers.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            buffers.pop(name, None)
            modules[name] = value
        elif name in buffers:
            if value is not None and not isinstance(value, Array):
                raise TypeError(f"[fastmetal.nn.{type(self).__name__}] expected an Array or "
                                f"None for buffer '{name}', got {type(value).__name__}")
            buffers[name] = value
        elif name in params:
            if value is not None and not isinstance(value, Array):
                raise TypeError(f"[fastmetal.nn.{type(self).__name__}] expected a Parameter "
                                f"or None for parameter '{name}', got {type(value).__name__}")
            if value is not None:
                value = Parameter(value)
            params[name] = value
        else:
            modules.pop(name, None)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        params, modules = self._registry()
        params.pop(name, None)
        modules.pop(name, None)
        self.__dict__["_buffers"].pop(name, None)
        self.__dict__["_non_persistent"].discard(name)
        object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor: Any, persistent: bool = True) -> None:
        """Register ``tensor`` (an Array, a NumPy array (copied into an Array) or None) as
        the buffer ``name``: state that is not a parameter (no gradient, not given to
        optimizers) but is moved by ``to()`` and, when ``persistent``, saved in
        ``state_dict()`` and loaded by ``load_state_dict()``, as ``torch.nn.Module``'s."""
        where = f"fastmetal.nn.{type(self).__name__}.register_buffer"
        if not isinstance(name, str):
            raise TypeError(f"[{where}] expected name to be a str, got {type(name).__name__}")
        if name == "" or "." in name:
            raise KeyError(f"[{where}] expected a non-empty name without '.', got {name!r}")
        buffers = self._buffer_registry()
        if name not in buffers and (hasattr(self, name) or name in self._registry()[0]):
            raise KeyError(f"[{where}] expected a new attribute name, got {name!r}, which "
                           "already exists")
        if not isinstance(persistent, (bool, np.bool_)):
            raise TypeError(f"[{where}] expected persistent to be True or False, got "
                            f"{persistent!r}")
        if isinstance(tensor, np.ndarray):  # integers stay integers (int64), as PyTorch's
            kind = tensor.dtype.kind
            dt = np.int64 if kind in "iub" else (np.float16 if tensor.dtype == np.float16
                                                  else np.float32)
            tensor = asarray(np.array(tensor, dtype=dt), dtype=dt)
        if tensor is not None and not isinstance(tensor, Array):
            raise TypeError(f"[{where}] expected an Array, a NumPy array or None, got "
                            f"{type(tensor).__name__}")
        buffers[name] = tensor
        non_persistent = self.__dict__["_non_persistent"]
        if persistent:
            non_persistent.discard(name)
        else:
            non_persistent.add(name)
        object.__setattr__(self, name, tensor)

    def register_parameter(self, name: str, param: Any) -> None:
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"[fastmetal.nn.{type(self).__name__}.register_parameter] "
                            f"expected a Parameter or None, got {type(param).__name__}")
        self._registry()[0][name] = param
        object.__setattr__(self, name, param)

    def add_module(self, name: str, module: Any) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"[fastmetal.nn.{type(self).__name__}.add_module] expected a "
                            f"Module, got {type(module).__name__}")
        self._registry()[1][name] = module
        object.__setattr__(self, name, module)

    # -- traversal
    def named_children(self) -> Iterator[tuple]:
        for name, m in self._registry()[1].items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator["Module"]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "", remove_duplicate: bool = True,
                      _seen: set | None = None) -> Iterator[tuple]:
        seen = set() if _seen is None else _seen
        if remove_duplicate:
            if id(self) in seen:
                return
            seen.add(id(self))
        yield prefix, self
        for name, m in self.named_children():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name,
                                       remove_duplicate, seen)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple]:
        """(dotted name, Parameter) of this module and, with ``recurse``, its submodules; a
        Parameter shared by several modules appears once (unless ``remove_duplicate=False``)."""
        seen: set = set()
        mods = self.named_modules(prefix, remove_duplicate) if recurse else [(prefix, self)]
        for mod_prefix, mod in mods:
            for name, p in mod._registry()[0].items():
                if p is None or (remove_duplicate and id(p) in seen):
                    continue
                seen.add(id(p))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), p

    def parameters(self, recurse: bool = True) -> Iterator[Array]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple]:
        """(dotted name, buffer) of this module and, with ``recurse``, its submodules (None
        buffers skipped)."""
        seen: set = set()
        mods = self.named_modules(prefix, remove_duplicate) if recurse else [(prefix, self)]
        for mod_prefix, mod in mods:
            for name, b in mod._buffer_registry().items():
                if b is None or (remove_duplicate and id(b) in seen):
                    continue
                seen.add(id(b))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), b

    def buffers(self, recurse: bool = True) -> Iterator[Array]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    # -- modes and gradients
    def apply(self, fn: Any) -> "Module":
        """``fn(m)`` for every submodule, children first, then this Module (as
        ``torch.nn.Module.apply``: the usual way to initialise weights); returns self."""
        if not callable(fn):
            raise TypeError(f"[fastmetal.nn.{type(self).__name__}.apply] expected a function "
                            f"of a Module, got {type(fn).__name__}")
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def train(self, mode: bool = True) -> "Module":
        if not isinstance(mode, (bool, np.bool_)):
            raise TypeError(f"[fastmetal.nn.{type(self).__name__}.train] expected mode to be "
                            f"True or False, got {mode!r}")
        object.__setattr__(self, "training", bool(mode))
        for m in self.children():
            m.train(mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the parameters' gradients (None, or zeros with ``set_to_none=False``)."""
        for p in self.parameters():
            _zero_grad(p, set_to_none)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    # -- devices and dtypes
    def to(self, *args: Any, **kwargs: Any) -> "Module":
        """Move and/or convert every parameter and buffer, as ``torch.nn.Module.to``:
        ``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(array)`` (its device and
        dtype) or by name (``device=``, ``dtype=``). A dtype must be a floating one and
        converts only the floating-point parameters and buffers (integer buffers, as
        BatchNorm's ``num_batches_tracked``, keep theirs). In place: the same Module, holding
        new Parameters (a Parameter shared by several modules stays shared; gradients are
        moved and converted with them). Create the optimizer after moving or converting: one
        made before still holds the old Parameters."""
        where = f"fastmetal.nn.{type(self).__name__}.to"
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        if kwargs:
            raise TypeError(f"[{where}] expected device=, dtype= or non_blocking=, got "
                            f"{sorted(kwargs)}")
        if len(args) > 3:
            raise TypeError(f"[{where}] expected at most (device, dtype, non_blocking), got "
                            f"{len(args)} positional arguments")
        for arg in args:
            if isinstance(arg, Array):
                device, dtype = arg.device, arg.dtype
            elif isinstance(arg, (bool, np.bool_)):
                continue  # non_blocking (every copy here completes before to() returns)
            elif isinstance(arg, str) and not _is_dtype_name(arg):
                device = arg  # a device name; dtype names are NumPy's ("float64")
            else:
                dtype = arg
        if device is not None and not isinstance(device, str):
            raise TypeError(f"[{where}] expected a device name (str), got "
                            f"{type(device).__name__}")
        if device is not None and device.partition(":")[0] in devices():
            device = str.__str__(as_device(device))  # kind:0 is the kind, as fm.device's
        if device is not None and device not in devices():
            raise ValueError(f"[{where}] expected a device this fastmetal has "
                             f"({', '.join(devices())}) or a dtype, got {device!r}")
        target = None
        if dtype is not None:
            target = _dtype(dtype, where)
            if target.kind != "f":
                raise TypeError(f"[{where}] expected a floating-point dtype (as PyTorch's "
                                f"Module.to), got {target}")
        return self._convert(where, device, target, floating_only=True)

    def cpu(self) -> "Module":
        """Every parameter and buffer on the cpu device, as ``torch.nn.Module.cpu``
        (``to(device="cpu")``)."""
        return self.to(device="cpu")

    def cuda(self, device: Any = None) -> "Module":
        """Every parameter and buffer on the cuda device, as ``torch.nn.Module.cuda``
        (``to(device="cuda")``); RuntimeError where this fastmetal has no cuda device."""
        where = f"fastmetal.nn.{type(self).__name__}.cuda"
        gpu = _named(device="cuda")
        if device not in (None, 0, gpu, f"{gpu}:0"):
            raise ValueError(f"[{where}] expected device None or 0 (one GPU), got {device!r}")
        if gpu not in devices():
            raise RuntimeError(f"[{where}] expected a cuda device, got none (this fastmetal's "
                               f"devices: {devices()})")
        return self.to(device=gpu)

    def float(self) -> "Module":  # noqa: A003 (PyTorch's name)
        """Floating-point parameters and buffers in float32, as ``torch.nn.Module.float``
        (in place, new Parameters: see :meth:`to`)."""
        return self._convert(f"fastmetal.nn.{type(self).__name__}.float", None,
                             np.dtype(np.float32), floating_only=True)

    def double(self) -> "Module":
        """Floating-point parameters and buffers in float64, as ``torch.nn.Module.double``
        (devices with double: cpu, cuda; TypeError on metal). In place, new Parameters: see
        :meth:`to`."""
        return self._convert(f"fastmetal.nn.{type(self).__name__}.double", None,
                             np.dtype(np.float64), floating_only=True)

    def half(self) -> "Module":
        """Floating-point parameters and buffers in float16, as ``torch.nn.Module.half``
        (in place, new Parameters: see :meth:`to`)."""
        return self._convert(f"fastmetal.nn.{type(self).__name__}.half", None,
                             np.dtype(np.float16), floating_only=True)

    def type(self, dst_type: Any) -> "Module":  # noqa: A003 (PyTorch's name)
        """EVERY parameter and buffer in ``dst_type``, integer buffers included, as
        ``torch.nn.Module.type`` (``to(dtype)`` converts the floating-point ones only).
        Parameters take floating dtypes only (they require gradients)."""
        where = f"fastmetal.nn.{type(self).__name__}.type"
        if dst_type is None:  # (NumPy would read None as float64)
            raise TypeError(f"[{where}] expected a dtype, got None")
        target = _dtype(dst_type, where)
        if target.kind != "f" and any(True for _ in self.parameters()):
            raise RuntimeError(f"[{where}] expected a floating-point dtype for a module with "
                               f"parameters (only floating-point Arrays take gradients), got "
                               f"{target}")
        return self._convert(where, None, target, floating_only=False)

    def _convert(self, where: str, device: Any, dtype: Any, floating_only: bool) -> "Module":
        """Every parameter and buffer on ``device`` and in ``dtype`` (None: unchanged; with
        ``floating_only``, integer ones keep their dtype). Everything is checked before
        anything is replaced; each Array is converted once (tied ones stay tied)."""
        def wanted(a: Array) -> Any:
            keep = dtype is None or a.dtype == dtype or (floating_only and a.dtype.kind != "f")
            return a.dtype if keep else dtype

        items = [(m, reg, name, a) for m in self.modules()
                 for reg in (m._registry()[0], m._buffer_registry())
                 for name, a in list(reg.items()) if a is not None]
        for _, _, name, a in items:
            dev = device if device is not None else a.device
            if wanted(a) == np.float64 and not device_capabilities(dev).get("float64", True):
                raise TypeError(f"[{where}] expected a dtype device '{dev}' has, got float64 "
                                f"for {name} (Apple GPUs have no double: use float32 there, or "
                                "device='cpu' for float64)")
        done: dict = {}  # id -> converted: a shared Parameter / buffer stays one

        def convert(a: Array) -> Array:
            with no_grad():
                out = a if wanted(a) == a.dtype else astype(a, wanted(a))
                return move_to(out, device) if device is not None else out

        for m, reg, name, a in items:
            new = done.get(id(a))
            if new is None:
                new = convert(a)
                if new is not a and isinstance(a, Parameter):
                    new = Parameter(new, requires_grad=a.requires_grad)
                    if a.grad is not None:  # as PyTorch's: the gradient follows
                        new.grad = convert(a.grad)
                done[id(a)] = new
            if new is not a:
                reg[name] = new
                object.__setattr__(m, name, new)
        return self

    def _state_items(self) -> "OrderedDict[str, Array]":
        """What state_dict saves, in PyTorch's order: each module's parameters, then its
        persistent buffers, module by module."""
        items: "OrderedDict[str, Array]" = OrderedDict()
        for mod_prefix, mod in self.named_modules(remove_duplicate=False):
            pre = f"{mod_prefix}." if mod_prefix else ""
            for name, p in mod._registry()[0].items():
                if p is not None:
                    items[pre + name] = p
            non_persistent = mod.__dict__["_non_persistent"]
            for name, b in mod._buffer_registry().items():
                if b is not None and name not in non_persistent:
                    items[pre + name] = b
        return items

    # -- state
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Copies of every parameter and persistent buffer as NumPy arrays by dotted name,
        PyTorch's keys (``numpy.savez(f, **sd)`` saves them)."""
        return OrderedDict((n, _state_value(p)) for n, p in self._state_items().items())

    def load_state_dict(self, state_dict: Any, strict: bool = True) -> tuple:
        """Copy values into the parameters and persistent buffers in place (optimizers keep
        working), by name (float buffers in place; integer ones, num_batches_tracked, anew).
        strict: the keys must be exactly this model's. Shapes must match. Everything is
        checked before anything is written. Returns (missing_keys, unexpected_keys)."""
        cls = type(self).__name__
        if not hasattr(state_dict, "keys"):
            raise TypeError(f"[fastmetal.nn.{cls}.load_state_dict] expected a mapping of "
                            f"names to arrays, got {type(state_dict).__name__}")
        own = self._state_items()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict.keys() if k not in own]
        if strict and (missing or unexpected):
            raise ValueError(f"[fastmetal.nn.{cls}.load_state_dict] expected the keys "
                             f"{list(own)}, got missing {missing} and unexpected {unexpected}")
        values = {}
        for name, p in own.items():
            if name not in state_dict:
                continue
            v = state_dict[name]
            host = v.numpy() if isinstance(v, Array) else np.asarray(v)
            if host.shape != tuple(p.shape):
                raise ValueError(f"[fastmetal.nn.{cls}.load_state_dict] expected {name} of "
                                 f"shape {tuple(p.shape)}, got {host.shape}")
            if host.dtype.kind not in "fiub":
                raise TypeError(f"[fastmetal.nn.{cls}.load_state_dict] expected {name} with "
                                f"a real dtype, got {host.dtype}")
            if p._readonly:  # checked for all before copying any: a failure loads nothing
                raise ValueError(f"[fastmetal.nn.{cls}.load_state_dict] expected writeable "
                                 f"parameters, got {name} read-only (it views memory that is "
                                 "not writeable)")
            values[name] = host
        with no_grad():
            for name, host in values.items():
                p = own[name]
                # (ascontiguousarray would make a 0-d buffer 1-d: the shape is kept)
                value = asarray(np.ascontiguousarray(host).reshape(host.shape).astype(p.dtype),
                                dtype=p.dtype, device=p.device)
                if p.dtype.kind == "f":
                    copy(value, out=p)
                else:  # an integer buffer (num_batches_tracked): replaced
                    mod_name, _, attr = name.rpartition(".")
                    mod = self._submodule(mod_name)
                    mod._buffer_registry()[attr] = value
                    object.__setattr__(mod, attr, value)
        return missing, unexpected

    def _submodule(self, dotted: str) -> "Module":
        mod = self
        for part in dotted.split(".") if dotted else ():
            mod = mod._registry()[1][part]
        return mod

    # -- calling and printing
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"[fastmetal.nn.{type(self).__name__}] expected a forward() "
                                  "method (define it in the subclass), got none")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = [f"({n}): " + repr(m).replace("\n", "\n  ")
                    for n, m in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not children:
            return head + ")"
        return head + "".join(f"\n  {c}" for c in children) + "\n)"


def _is_dtype_name(name: str) -> bool:
    """Whether ``to()`` reads the string ``name`` as a dtype ("float64"); else a device."""
    try:
        np.dtype(name)
    except TypeError:
        return False
    return True


def _named(device: str) -> str:
    return device  # a device named as an argument (the layout check reads device= as one)


def _dtype(dtype: Any, where: str) -> np.dtype:
    """One of fastmetal's dtypes (``fm.float64``, ``fm.double``, ``"float32"``, ...)."""
    return np.dtype(native_dtype(dtype, where))


def _zero_grad(p: Array, set_to_none: bool) -> None:
    if set_to_none or p.grad is None:
        p.grad = None
    else:
        p.grad = zeros(tuple(p.shape), dtype=p.dtype, device=p.device)
