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
    env = dict(os.environ, FM_CHECK_OBJC_QUICK="1")
    r = subprocess.run(["bash", str(tmp_path / "tools/check_objc.sh")], cwd=tmp_path, env=env,
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


DISPATCH_MATH_TEST = r"""
#include <cassert>
#include <cstdio>
#include <random>
#include "backend/metal/dispatch_math.h"
using namespace fm::metal;
int main() {
  std::mt19937_64 rng(7);
  // Page spans: page-aligned, a whole number of pages, covering [p, p+n), minimal.
  for (int t = 0; t < 200000; ++t) {
    const std::uintptr_t page = t % 2 ? 16384 : 4096;
    const std::uintptr_t p = rng() % (std::uintptr_t(1) << 47);
    const std::size_t n = 1 + rng() % (t % 3 ? 100000 : 64);
    const PageSpan s = page_span(p, n, page);
    assert(s.ok);
    assert(s.begin % page == 0 && (s.end - s.begin) % page == 0);
    assert(s.begin <= p && p + n <= s.end);
    assert(p - s.begin < page && s.end - (p + n) < page);
  }
  assert(page_span(0x1000, 1, 16384).begin == 0 && page_span(0x1000, 1, 16384).end == 16384);
  assert(page_span(16384, 16384, 16384).begin == 16384 && page_span(16384, 16384, 16384).end == 32768);
  assert(!page_span(UINTPTR_MAX - 10, 5, 16384).ok);   // would wrap
  assert(!page_span(100, 10, 3000).ok);                 // not a power of two
  // Threadgroups: within grid, axis limits and the total; unchanged when already valid.
  for (int t = 0; t < 200000; ++t) {
    std::uint32_t grid[3] = {std::uint32_t(rng() % 5000), std::uint32_t(1 + rng() % 70),
                             std::uint32_t(1 + rng() % 9)};
    std::uint64_t want[3] = {rng() % 2048, rng() % 64, rng() % 8};
    const std::uint64_t axis[3] = {1024, 1024, 64};
    const std::uint64_t total = 32 + rng() % 1024;
    std::uint64_t g[3] = {want[0], want[1], want[2]};
    clamp_group(g, grid, axis, total);
    for (int i = 0; i < 3; ++i) {
      assert(g[i] >= 1 && g[i] <= axis[i]);
      assert(g[i] <= std::max<std::uint64_t>(1, want[i]));
      assert(g[i] <= std::max<std::uint32_t>(1, grid[i]));
    }
    assert(g[0] * g[1] * g[2] <= total);
  }
  std::uint32_t grid[3] = {1 << 20, 1, 1};
  const std::uint64_t axis[3] = {1024, 1024, 1024};
  std::uint64_t g[3] = {256, 1, 1};
  clamp_group(g, grid, axis, 1024);
  assert(g[0] == 256 && g[1] == 1 && g[2] == 1);       // a valid request is kept
  std::uint64_t h[3] = {1024, 1, 1};
  clamp_group(h, grid, axis, 384);                      // halved until it fits: 1024 -> 256
  assert(h[0] == 256);
  std::uint64_t k[3] = {256, 4, 1};
  std::uint32_t small[3] = {5, 2, 1};
  clamp_group(k, small, axis, 1024);                    // no larger than the grid
  assert(k[0] == 5 && k[1] == 2 && k[2] == 1);
  std::puts("dispatch_math ok");
  return 0;
}
"""


def test_dispatch_math(tmp_path):
    """Page rounding for no-copy buffers and threadgroup clamping, run natively."""
    cxx = next((c for c in ["c++", "g++", "clang++-16", "clang++"] if shutil.which(c)), None)
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "dispatch_math_test.cpp"
    src.write_text(DISPATCH_MATH_TEST)
    exe = tmp_path / "dispatch_math_test"
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Werror", "-I", str(REPO / "csrc"), str(src),
                    "-o", str(exe)], check=True, capture_output=True, text=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "dispatch_math ok" in r.stdout, r.stdout + r.stderr
