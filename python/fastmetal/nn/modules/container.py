"""Containers of Modules, as ``torch.nn``'s: Sequential, ModuleList and ModuleDict."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator

from .module import Module

__all__ = ["Sequential", "ModuleList", "ModuleDict"]


class Sequential(Module):
    """Modules applied in order, named ``"0"``, ``"1"``, ... (or by the keys of an
    OrderedDict), as ``torch.nn.Sequential``."""

    def __init__(self, *modules: Any) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            items = list(modules[0].items())
        else:
            items = [(str(i), m) for i, m in enumerate(modules)]
        for name, m in items:
            if not isinstance(m, Module):
                raise TypeError(f"[fastmetal.nn.Sequential] expected Modules, got "
                                f"{type(m).__name__} at {name!r}")
            self.add_module(name, m)

    def __getitem__(self, i: Any) -> Any:
        mods = list(self.children())
        if isinstance(i, slice):
            return Sequential(*mods[i])
        return mods[i]

    def __len__(self) -> int:
        return len(list(self.children()))

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self.children()))

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self)), module)
        return self

    def forward(self, x: Any) -> Any:
        for m in self.children():
            x = m(x)
        return x


class ModuleList(Module):
    """A list of Modules, registered as ``"0"``, ``"1"``, ..., as ``torch.nn.ModuleList``."""

    def __init__(self, modules: Any = ()) -> None:
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> "ModuleList":
        if not isinstance(module, Module):
            raise TypeError(f"[fastmetal.nn.ModuleList] expected a Module, got "
                            f"{type(module).__name__}")
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Any) -> "ModuleList":
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, i: Any) -> Any:
        mods = list(self.children())
        return ModuleList(mods[i]) if isinstance(i, slice) else mods[i]

    def __len__(self) -> int:
        return len(self._registry()[1])

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self.children()))


class ModuleDict(Module):
    """Modules by name, registered under their keys (in insertion order), as
    ``torch.nn.ModuleDict``: ``d[key]``, ``d[key] = module``, ``del d[key]``, ``len``,
    ``in``, iteration over the keys, ``keys()``, ``values()``, ``items()``, ``update()``,
    ``pop()``, ``clear()``."""

    def __init__(self, modules: Any = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def _check(self, key: Any, module: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"[fastmetal.nn.ModuleDict] expected str keys, got "
                            f"{type(key).__name__}")
        if not isinstance(module, Module):
            raise TypeError(f"[fastmetal.nn.ModuleDict] expected Modules, got "
                            f"{type(module).__name__} at {key!r}")

    def __getitem__(self, key: str) -> Module:
        return self._registry()[1][key]

    def __setitem__(self, key: str, module: Module) -> None:
        self._check(key, module)
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        self[key]  # KeyError for an unknown key, as a dict
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._registry()[1])

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._registry()[1]))

    def __contains__(self, key: object) -> bool:
        return key in self._registry()[1]

    def keys(self) -> Any:
        return self._registry()[1].keys()

    def values(self) -> Any:
        return self._registry()[1].values()

    def items(self) -> Any:
        return self._registry()[1].items()

    def update(self, modules: Any) -> None:
        pairs = modules.items() if hasattr(modules, "items") else modules
        for key, module in pairs:
            self[key] = module

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module

    def clear(self) -> None:
        for key in list(self):
            delattr(self, key)
