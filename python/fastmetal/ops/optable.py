"""The elementwise op table (metal/elementwise_ops.tbl, installed beside this file).

One line per op: name, arity, MSL expression, NumPy reference, gradient, docstring. The
build generates the kernels from it; this module gives Python the same lines, for the
functions and their gradients (elementwise.py) and for the tests' references.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("elementwise_ops.tbl")
if not TABLE_PATH.exists():  # an editable install runs from the source tree: its table
    TABLE_PATH = Path(__file__).resolve().parents[3] / "metal" / "elementwise_ops.tbl"

INTERNAL = "internal:"  # a doc starting so: a kernel of fastmetal's own, not exported


@dataclass(frozen=True)
class OpSpec:
    name: str
    arity: int
    msl: str
    numpy: str
    grad: str  # "-" (not differentiable) or "<d/dx>[ ; <d/dy>]" as Python expressions
    doc: str

    @property
    def public(self) -> bool:
        return not self.doc.startswith(INTERNAL)

    @property
    def differentiable(self) -> bool:
        return self.grad != "-"

    @property
    def grads(self) -> tuple[str, ...]:
        """The gradient expression of each argument (empty when not differentiable)."""
        if not self.differentiable:
            return ()
        parts = tuple(p.strip() for p in self.grad.split(" ; "))
        if len(parts) != self.arity:
            raise ValueError(f"op table: {self.name} has {self.arity} argument(s) but "
                             f"{len(parts)} gradient expression(s): {self.grad!r}")
        return parts


def read_table(path: Path = TABLE_PATH) -> list[OpSpec]:
    specs = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, args, msl, numpy_ref, grad, doc = (c.strip() for c in line.split(" | "))
        specs.append(OpSpec(name, 1 if args == "x" else 2, msl, numpy_ref, grad, doc))
    return specs


OPS: list[OpSpec] = read_table()
