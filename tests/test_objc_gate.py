"""The Linux gates for the macOS-only parts: the Objective-C++ host type-checked against
Apple-signature stubs (tools/check_objc.sh), and cmake/metal.cmake driven by a stand-in
xcrun (tools/check_metal_cmake.sh). Both scripts also prove they can fail."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLANGS = ["clang++-16", "clang++-17", "clang++-18", "clang++-19", "clang++-20", "clang++"]


def _run(script, env=None):
    return subprocess.run(["bash", str(REPO / "tools" / script)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_objc_gate():
    if not any(shutil.which(c) for c in CLANGS):
        pytest.skip("clang++ not installed (Debian: apt-get install -y clang-16)")
    r = _run("check_objc.sh")
    assert r.returncode == 0, r.stdout + r.stderr
    # The self-check ran: each deliberately broken copy was rejected.
    for name in ("misspelled-selector", "wrong-argument-type", "wrong-protocol-type",
                 "nullable-to-nonnull", "unknown-selector"):
        assert f"teeth/{name} rejected" in r.stdout, r.stdout


def test_objc_gate_fails_on_a_broken_source(tmp_path):
    """The gate as a whole (not only its self-check) fails on a bad .mm."""
    if not any(shutil.which(c) for c in CLANGS):
        pytest.skip("clang++ not installed")
    # A scratch copy of the repository pieces the gate reads, with one selector misspelled.
    for rel in ("tools/check_objc.sh", "tools/objc_stubs", "csrc"):
        src, dst = REPO / rel, tmp_path / rel
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    mm = tmp_path / "csrc/backend/metal/metal_backend.mm"
    text = mm.read_text()
    assert "[encoder_ endEncoding]" in text
    mm.write_text(text.replace("[encoder_ endEncoding]", "[encoder_ endEncodng]"))
    r = subprocess.run(["bash", str(tmp_path / "tools/check_objc.sh")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL  csrc/backend/metal/metal_backend.mm" in r.stderr


def test_metal_cmake_with_standin_xcrun():
    needed = ["cmake", "cc" if shutil.which("cc") else "gcc"]
    if sys.platform == "darwin":
        pytest.skip("on macOS the real build exercises cmake/metal.cmake")
    missing = [t for t in needed if not shutil.which(t)]
    if missing:
        pytest.skip(f"missing {missing}")
    if not any(shutil.which(c) for c in ["clang-16", "clang", "gcc"]):
        pytest.skip("no C preprocessor")
    env = dict(os.environ, PYTHON=sys.executable)
    r = _run("check_metal_cmake.sh", env)
    assert r.returncode == 0, r.stdout + r.stderr
    for what in ("embedded bytes == fastmetal.metallib", "Metal host names == kernels.json",
                 "metallib re-embedded", "no-op rebuild"):
        assert what in r.stdout, r.stdout
