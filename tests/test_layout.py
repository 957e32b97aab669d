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
    roots = ["csrc", "metal", "python", "tools", "benchmarks", "tests"]
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


# ----------------------------------------------------------------------------- the Python package
# Its layers, bottom up (docs/ARCHITECTURE.md, "The Python package"): a module imports only
# from its own layer or the layers below it, and the import graph has no cycle. The compiled
# _core is below them all; benchmarks, the CLI, the reference models and the package's face
# (fastmetal/__init__.py, fastmetal/random.py) stand on top.
PACKAGE = REPO / "python" / "fastmetal"
LAYERS = ["autograd", "ops", "array", "optim", "distributed", "nn", "data", "top"]
# Where the compiled _core may be called (its Array class may be named anywhere): the ops, and
# the tape's own unrecorded accumulation. The CLI and the benchmarks read backend hooks
# (thread count, instruction set) that no op needs.
CORE_CALLERS = ("ops", "autograd")
CORE_READERS = ("benchmarks", "__main__")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "top"


def _package_modules() -> dict:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, is_package: bool, node) -> list:
    """The fastmetal modules an import statement names (a name imported from a package is a
    module where one of that name exists)."""
    import ast
    known = _package_modules()
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "fastmetal"]
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    elif node.module and node.module.split(".")[0] == "fastmetal":
        target = node.module
    else:
        return []
    found = [f"{target}.{a.name}" for a in node.names
             if f"{target}.{a.name}" in known or a.name == "_core"]
    return found or [target]


def _imports() -> list:
    """(module, imported module, line, at module level) for every import of a fastmetal
    module inside the package."""
    import ast
    edges = []
    for module, path in _package_modules().items():
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        top |= {id(c) for n in tree.body if isinstance(n, (ast.If, ast.Try)) for c in ast.walk(n)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _resolve(module, path.name == "__init__.py", node):
                    edges.append((module, target, node.lineno, id(node) in top))
    return edges


def test_python_package_has_no_import_inside_functions():
    # An import of the package's own modules inside a function hides a dependency (and was how
    # cycles were dodged): every one is at module level.
    hidden = [f"{m}:{line} imports {t}" for m, t, line, top in _imports() if not top]
    assert not hidden, "imports inside functions:\n" + "\n".join(hidden)


def test_python_package_imports_run_down_its_layers():
    up = [f"{m}:{line} ({_layer(m)}) imports {t} ({_layer(t)})" for m, t, line, _ in _imports()
          if t != "fastmetal._core" and LAYERS.index(_layer(t)) > LAYERS.index(_layer(m))]
    assert not up, "imports running back up the layers:\n" + "\n".join(up)


def test_python_package_import_graph_has_no_cycle():
    graph: dict = {}
    for m, t, _, _ in _imports():
        if t != m and not m.startswith(t + "."):  # a module's own package runs first anyway
            graph.setdefault(m, set()).add(t)
    state: dict = {}
    cycle: list = []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycle.extend(stack[stack.index(nxt):] + [nxt])
                return True
            if nxt not in state and visit(nxt, stack + [nxt]):
                return True
        state[node] = "done"
        return False

    for node in sorted(graph):
        if node not in state and visit(node, [node]):
            break
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_core_is_called_from_the_ops_layer_only():
    import ast
    offenders = []
    for module, path in _package_modules().items():
        first = module.split(".")[1] if "." in module else module
        if first in CORE_CALLERS or first in CORE_READERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_core"):
                offenders += [f"{module}:{node.lineno} imports _core.{a.name}"
                              for a in node.names if a.name != "Array"]
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id == "_core" and node.attr != "Array":
                offenders.append(f"{module}:{node.lineno} calls _core.{node.attr}")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                    node.value.attr == "_core" and node.attr != "Array":
                offenders.append(f"{module}:{node.lineno} calls _core.{node.attr}")
    assert not offenders, "_core used outside fastmetal/ops:\n" + "\n".join(offenders)


def test_array_surface_is_attached_in_one_module():
    # Python adds to fastmetal.Array in fastmetal/array/surface.py alone.
    import ast
    owner = "fastmetal.array.surface"
    offenders = []
    for module, path in _package_modules().items():
        if module == owner:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id == "setattr" and node.args and \
                    isinstance(node.args[0], ast.Name) and node.args[0].id == "Array":
                offenders.append(f"{module}:{node.lineno} setattr(Array, ...)")
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                            t.value.id == "Array":
                        offenders.append(f"{module}:{node.lineno} Array.{t.attr} = ...")
    assert not offenders, "Array's surface defined outside array/surface.py:\n" + \
        "\n".join(offenders)


def test_the_layering_checks_can_fail(tmp_path):
    # The resolver must see a relative import running up (ops importing nn).
    import ast
    node = ast.parse("from ..nn import functional").body[0]
    targets = _resolve("fastmetal.ops.losses", False, node)
    assert targets == ["fastmetal.nn.functional"]
    assert LAYERS.index(_layer(targets[0])) > LAYERS.index(_layer("fastmetal.ops.losses"))


# ----------------------------------------------------------------------------- the guide
DOCUMENTED_ROOTS = ("csrc", "metal", "python/fastmetal", "tools")


def _where_things_are() -> dict:
    """docs/ARCHITECTURE.md's "Where things are": folder -> the file names it lists. A line
    starting with a path ending in "/" opens a folder; its names follow on that line and on
    indented lines after it (brace lists and * patterns allowed); "#" starts a comment."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("## Where things are", 1)[1].split("```", 2)[1]
    folders: dict = {}
    current = None
    for line in block.splitlines():
        body = line.split("#", 1)[0]
        if not body.strip():
            continue
        tokens = body.split()
        if not line[0].isspace() and tokens[0].endswith("/"):
            current = tokens[0].rstrip("/")
            folders[current] = []
            tokens = tokens[1:]
        assert current is not None, f"a name before any folder: {line!r}"
        for token in tokens:
            m = re.fullmatch(r"(.*)\{(.*)\}(.*)", token)
            folders[current] += ([m[1] + part + m[3] for part in m[2].split(",")] if m else [token])
    return folders


def _tracked_files() -> list:
    import shutil
    import subprocess
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git checkout (the tracked files are the truth)")
    # Tracked or new, not ignored, and on disk (a copied tree's index may be stale).
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                          *DOCUMENTED_ROOTS], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return sorted({Path(p) for p in out.splitlines() if (REPO / p).is_file()})


def test_where_things_are_lists_every_file_of_the_tree():
    import fnmatch
    listed = _where_things_are()
    tracked: dict = {}
    for p in _tracked_files():
        tracked.setdefault(str(p.parent), []).append(p.name)
    missing_folders = sorted(set(tracked) - set(listed))
    assert not missing_folders, ("docs/ARCHITECTURE.md's 'Where things are' lacks these "
                                 f"folders: {missing_folders}")
    problems = []
    for folder, names in listed.items():
        have = tracked.get(folder)
        if have is None:
            problems.append(f"{folder}/ is listed but has no tracked files")
            continue
        for name in names:
            if not fnmatch.filter(have, name):
                problems.append(f"{folder}/{name} is listed but does not exist")
        for name in have:
            if not any(fnmatch.fnmatch(name, pattern) for pattern in names):
                problems.append(f"{folder}/{name} exists but is not listed")
    assert not problems, "docs/ARCHITECTURE.md, 'Where things are':\n" + "\n".join(problems)
