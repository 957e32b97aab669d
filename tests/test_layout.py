"""The source layout keeps its promises (docs/ARCHITECTURE.md): only a backend's own folder
names a backend or an instruction set (not the backend-neutral C++ layers, not the shared
files of csrc/backend/, not the Python package, which asks _core what a device can do), and
no file cites tracker numbers."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NEUTRAL_DIRS = ["csrc/core", "csrc/ops", "csrc/python"]
# A backend named as a string or reached by path, or an instruction set by name.
BACKEND_NAMED = re.compile(r'"(cpu|cuda|metal)"|backend/(cpu|cuda|metal)/|\bavx(2|512)\b|\bfm::(cpu|cuda|metal)::')
# In Python: a device named by a string literal, as code that decides by the name does
# (a path component such as / "metal" / is a folder; device="cpu" asks for the CPU, which
# every build has), or an instruction set.
PY_BACKEND_NAMED = re.compile(r"""(?<!/ )(?<!device=)["'](cpu|cuda|metal)["'](?! /)|\bavx(2|512)\b""")
TRACKER = re.compile(r"\bissues? ?#?\d+", re.IGNORECASE)


def sources(*dirs: str) -> list[Path]:
    files = [p for d in dirs for p in sorted((REPO / d).rglob("*")) if p.suffix in {".h", ".cpp", ".mm"}]
    assert files, f"no sources under {dirs}"
    return files


@pytest.mark.parametrize("path", sources(*NEUTRAL_DIRS), ids=lambda p: str(p.relative_to(REPO)))
def test_backend_neutral_layers_name_no_backend(path: Path):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if BACKEND_NAMED.search(line)]
    assert not hits, f"{path.relative_to(REPO)} names a backend or ISA:\n" + "\n".join(hits)


def shared_backend_files() -> list[Path]:
    """csrc/backend/'s own files: the interface, registry, launch layer and settings that every
    backend shares (the backends' folders below it are theirs)."""
    files = sorted(p for p in (REPO / "csrc" / "backend").iterdir() if p.suffix in {".h", ".cpp"})
    assert files, "no shared backend files"
    return files


@pytest.mark.parametrize("path", shared_backend_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_shared_backend_files_name_no_backend(path: Path):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if BACKEND_NAMED.search(line)]
    assert not hits, f"{path.relative_to(REPO)} names a backend or ISA:\n" + "\n".join(hits)


def python_package_files() -> list[Path]:
    """The package's modules and stubs. benchmarks/ is left out: comparing devices by name is
    what a benchmark does."""
    root = REPO / "python" / "fastmetal"
    files = sorted(p for p in root.rglob("*") if p.suffix in {".py", ".pyi"}
                   and "benchmarks" not in p.relative_to(root).parts)
    assert len(files) > 10, "the package's modules were not found"
    return files


@pytest.mark.parametrize("path", python_package_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_python_package_names_no_backend(path: Path):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if PY_BACKEND_NAMED.search(line)]
    assert not hits, (f"{path.relative_to(REPO)} names a device; ask "
                      "_core._device_capabilities(device) what it can do instead:\n" + "\n".join(hits))


def test_no_tracker_numbers_in_code():
    roots = ["csrc", "metal", "python", "tools", "benchmarks"]
    code = [p for r in roots for p in (REPO / r).rglob("*")
            if p.is_file() and p.suffix in {".h", ".cpp", ".mm", ".metal", ".py", ".sh", ".tbl"}]
    hits = [f"{p.relative_to(REPO)}:{i}" for p in code
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if TRACKER.search(line)]
    assert not hits, "tracker numbers in code: " + ", ".join(hits)


def test_the_layout_check_sees_a_backend_name():
    # The pattern itself must catch what the old op code did.
    assert BACKEND_NAMED.search('return b.name() == "cpu" && fast;')
    assert BACKEND_NAMED.search('#include "backend/cpu/conv2d_cpu.h"')
    assert BACKEND_NAMED.search('std::string(cpu::kernel_isa()) == "avx512"')
    assert not BACKEND_NAMED.search('if (auto* fast = native<Fn>(b, "conv2d_forward"))')
    assert PY_BACKEND_NAMED.search('_HOST_VISIBLE = ("cpu", "metal")')
    assert PY_BACKEND_NAMED.search("if a.device == 'cuda':")
    assert not PY_BACKEND_NAMED.search('TABLE = ROOT / "metal" / "elementwise_ops.tbl"')
    assert not PY_BACKEND_NAMED.search('>>> fm.random.bernoulli(0.25, (4, 4), device="cpu")')
