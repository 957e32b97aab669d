"""Containers of Modules, as ``torch.nn``'s: Sequential and ModuleList."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator

from .module import Module

__all__ = ["Sequential", "ModuleList"]


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
