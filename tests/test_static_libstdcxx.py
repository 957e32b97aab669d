"""_core must work however its toolchain links libstdc++. A statically linked libstdc++ whose
symbols _core exports gets half-bound to the libstdc++.so.6 that the process loads anyway
(Python extensions, torch): two copies' locale state mixed, and formatting any error message
segfaulted in std::ostream (GCC 13.3 with a static libstdc++). The build keeps static
libraries' symbols private (-Wl,--exclude-libs,ALL in CMakeLists.txt); these tests check it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import fastmetal as fm

from conftest import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF linking only")

# Mangled-name prefixes of libstdc++'s locale/iostream internals (std::locale, std::ios_base,
# the num_put/num_get/ctype facets, std::use_facet), of libc++ and of the CUDA runtime: defined in
# _core's dynamic symbol table only when a static copy was linked in and exported.
PRIVATE_PREFIXES = ("_ZNSt6locale", "_ZNKSt6locale", "_ZNSt8ios_base", "_ZNKSt7num_put",
                    "_ZNSt7num_put", "_ZNKSt7num_get", "_ZNSt5ctypeIcE", "_ZSt9use_facet",
                    "cudaMalloc", "cudaLaunchKernel", "cudaStreamSynchronize",
                    "_ZNSt3__1", "_ZNKSt3__1")  # libc++ (std::__1), linked in by zig's clang

# libstdc++.so.6 loaded first, privately (as an extension linked against it loads it: this
# is what crashed) or globally.
REPRODUCER = r"""
import ctypes, sys
ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL if sys.argv[2] == "global" else ctypes.RTLD_LOCAL)
sys.path.insert(0, sys.argv[1])
import numpy as np
import fastmetal as fm
assert fm._core.__file__.startswith(sys.argv[1]), fm._core.__file__
try:
    fm.conv2d(np.ones((2, 3, 8, 8), np.float32), np.ones((4, 2, 3, 3), np.float32))
except ValueError as e:
    print("ValueError:", e)
"""


def exported_private_symbols(so: Path) -> list[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not installed")
    out = subprocess.run([nm, "-D", "--defined-only", str(so)], capture_output=True, text=True,
                         check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PRIVATE_PREFIXES)]


def test_core_exports_no_static_library_internals():
    assert exported_private_symbols(Path(fm._core.__file__)) == []


def test_statically_linked_libstdcxx_formats_errors(tmp_path):
    """Builds _core with -static-libstdc++ (minutes: opt-in) and formats an error message
    with the system libstdc++.so.6 loaded first."""
    if os.environ.get("FASTMETAL_BUILD_TESTS") != "1":
        pytest.skip("builds _core from scratch (minutes); set FASTMETAL_BUILD_TESTS=1 "
                    "(tools/gpu/gpu_check.sh does)")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    cmake = shutil.which("cmake")
    if cxx is None or cmake is None:
        pytest.skip("needs a C++ compiler and cmake")
    static = subprocess.run([cxx, "-print-file-name=libstdc++.a"], capture_output=True,
                            text=True).stdout.strip()
    if not os.path.isabs(static):
        pytest.skip(f"{cxx} has no static libstdc++ (libstdc++.a) to link")
    import pybind11
    build = tmp_path / "build"
    configure = [cmake, "-S", str(REPO), "-B", str(build), f"-DCMAKE_CXX_COMPILER={cxx}",
                 "-DFASTMETAL_CUDA=OFF", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
                 f"-DPython_EXECUTABLE={sys.executable}",
                 "-DCMAKE_MODULE_LINKER_FLAGS=-static-libstdc++"]
    for cmd in (configure, [cmake, "--build", str(build), "-j", str(os.cpu_count() or 2)]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    pkg = tmp_path / "site" / "fastmetal"
    shutil.copytree(REPO / "python" / "fastmetal", pkg)
    (so,) = build.glob("_core*" + sysconfig.get_config_var("EXT_SUFFIX"))
    shutil.copy(so, pkg)
    shutil.copy(REPO / "metal" / "elementwise_ops.tbl", pkg)
    assert exported_private_symbols(pkg / so.name) == []
    for mode in ("local", "global"):
        r = subprocess.run([sys.executable, "-c", REPRODUCER, str(tmp_path / "site"), mode],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "FASTMETAL_DEVICE": "cpu"})
        assert r.returncode == 0, (mode, r.returncode, r.stderr[-3000:])
        assert "ValueError: [fastmetal.conv2d] expected" in r.stdout, (mode, r.stdout)
