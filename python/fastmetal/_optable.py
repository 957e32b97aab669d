"""The elementwise op table (metal/elementwise_ops.tbl, installed beside this file).

One line per op: name, arity, MSL expression, NumPy reference, docstring. The build
generates the kernels from it; this module gives Python the same lines, for the public
functions (_elementwise.py) and for the tests' references.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("elementwise_ops.tbl")
if not TABLE_PATH.exists():  # an editable install runs from the source tree: its table
    TABLE_PATH = Path(__file__).resolve().parents[2] / "metal" / "elementwise_ops.tbl"


@dataclass(frozen=True)
class OpSpec:
    name: str
    arity: int
    msl: str
    numpy: str
    doc: str


def read_table(path: Path = TABLE_PATH) -> list[OpSpec]:
    specs = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, args, msl, numpy_ref, doc = (c.strip() for c in line.split(" | "))
        specs.append(OpSpec(name, 1 if args == "x" else 2, msl, numpy_ref, doc))
    return specs


OPS: list[OpSpec] = read_table()
