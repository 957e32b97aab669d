"""The Linux gates for the macOS-only parts: the Objective-C++ host type-checked by libclang
against Apple-signature stubs (tools/ci/check_objc.py), and cmake/metal.cmake driven by a
stand-in xcrun (tools/ci/check_metal_cmake.sh). Both also prove they can fail. Plus the Metal
backend's arithmetic and command-buffer bookkeeping, compiled natively."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

spec = importlib.util.spec_from_file_location("check_objc", REPO / "tools" / "ci" / "check_objc.py")
check_objc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_objc)


def skip_or_fail(reason: str):
    """A gate whose tool is missing skips; with FASTMETAL_REQUIRE_GATES=1 (CI) it fails."""
    if os.environ.get("FASTMETAL_REQUIRE_GATES") == "1":
        pytest.fail(f"FASTMETAL_REQUIRE_GATES=1 but the gate cannot run: {reason}")
    pytest.skip(reason)


def _run(script, env=None):
    return subprocess.run(["bash", str(REPO / "tools" / "ci" / script)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def objc_tools():
    cindex, why = check_objc.load()
    if cindex is None:
        skip_or_fail(why)


def test_objc_gate(objc_tools):
    lines = []
    assert check_objc.run(REPO, quick=False, log=lines.append) == 0, "\n".join(lines)
    out = "\n".join(lines)
    # The self-check ran: each deliberately broken copy was rejected.
    for name, _, _ in check_objc.TEETH:
        assert f"teeth/{name} rejected" in out, out


def test_objc_gate_fails_on_a_broken_source(objc_tools, tmp_path):
    """The gate as a whole (not only its self-check) fails on a bad .mm."""
    shutil.copytree(REPO / "tools/ci/objc_stubs", tmp_path / "tools/ci/objc_stubs")
    shutil.copytree(REPO / "csrc", tmp_path / "csrc", ignore=shutil.ignore_patterns("*.o"))
    mm = tmp_path / "csrc/backend/metal/metal_backend.mm"
    text = mm.read_text()
    assert "[encoder_ endEncoding]" in text
    mm.write_text(text.replace("[encoder_ endEncoding]", "[encoder_ endEncodng]"))
    lines = []
    assert check_objc.run(tmp_path, quick=True, log=lines.append, sources_only=True) == 1
    assert any(line.startswith("check_objc: FAIL  csrc/backend/metal/metal_backend.mm") for line in lines), lines


def test_objc_gate_needs_no_system_clang():
    """The gate's compiler comes from the package registry (libclang wheel), not apt."""
    assert "apt-get" not in (REPO / "tools/ci/check_objc.sh").read_text()
    assert "clang.cindex" in (REPO / "tools/ci/check_objc.py").read_text()


def test_metal_cmake_with_standin_xcrun():
    needed = ["cmake", "cc" if shutil.which("cc") else "gcc"]
    if sys.platform == "darwin":
        pytest.skip("on macOS the real build exercises cmake/metal.cmake")
    missing = [t for t in needed if not shutil.which(t)]
    if missing:
        skip_or_fail(f"missing {missing}")
    if not any(shutil.which(c) for c in ["clang-16", "clang", "gcc"]):
        skip_or_fail("no C preprocessor")
    env = dict(os.environ, PYTHON=sys.executable)
    r = _run("check_metal_cmake.sh", env)
    assert r.returncode == 0, r.stdout + r.stderr
    for what in ("embedded bytes == fastmetal.metallib", "Metal host names == kernels.json",
                 "metallib re-embedded", "no-op rebuild", "FASTMETAL_METAL=AUTO without a working"):
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
  // setBuffer:offset: offsets suit float32 and float16; setBytes only below 4 KiB.
  assert(offset_bindable(0) && offset_bindable(4) && offset_bindable(16384 + 8));
  assert(!offset_bindable(1) && !offset_bindable(2) && !offset_bindable(16384 + 3));
  assert(fits_set_bytes(4095) && !fits_set_bytes(4096) && !fits_set_bytes(5000));
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


TRACKER_TEST = r"""
#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>
#include "backend/metal/command_tracker.h"
using namespace fm::metal;

// A stand-in command buffer: completes when the test says so.
struct FakeCB {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool failed = false;
  void complete(bool fail = false) {
    { std::lock_guard<std::mutex> l(mu); done = true; failed = fail; }
    cv.notify_all();
  }
  void wait() { std::unique_lock<std::mutex> l(mu); cv.wait(l, [&] { return done; }); }
  bool finished() { std::lock_guard<std::mutex> l(mu); return done; }
};
using CB = std::shared_ptr<FakeCB>;
using Tracker = CommandTracker<CB, std::shared_ptr<int>>;

std::string sync(Tracker& t) {
  return t.wait_committed([](const CB& cb) { cb->wait(); }, [](const CB& cb) { return cb->finished(); },
                          [](const CB& cb) { return cb->failed ? std::string("boom") : std::string(); });
}

int main() {
  using namespace std::chrono_literals;
  // Thread A synchronizes while its buffer runs; thread B's buffer, committed before B's
  // synchronize, must be complete when B's synchronize returns, although A is waiting.
  for (int round = 0; round < 20; ++round) {
    Tracker t;
    auto a = std::make_shared<FakeCB>(), b = std::make_shared<FakeCB>();
    auto keep_b = std::make_shared<int>(1);
    std::weak_ptr<int> watch_b = keep_b;
    t.committed(a, {});
    t.committed(b, {std::move(keep_b)});
    std::atomic<bool> a_done{false}, b_done{false};
    std::thread ta([&] { sync(t); a_done = true; });
    std::this_thread::sleep_for(2ms);              // A is now waiting on a (and b)
    std::thread tb([&] { sync(t); b_done = true; });
    std::this_thread::sleep_for(5ms);
    assert(!b_done);                                // b still runs: B must not have returned
    assert(!watch_b.expired());                     // nor may b's storages be released
    a->complete();
    std::this_thread::sleep_for(5ms);
    assert(!b_done && !a_done);
    b->complete();
    ta.join();
    tb.join();
    assert(watch_b.expired());                      // released once b completed
    assert(t.empty());
  }
  // Storages of a finished buffer are released by the next synchronize, any thread's.
  {
    Tracker t;
    auto c = std::make_shared<FakeCB>();
    auto keep = std::make_shared<int>(2);
    std::weak_ptr<int> w = keep;
    t.committed(c, {std::move(keep)});
    c->complete();
    assert(!w.expired());
    assert(sync(t).empty());
    assert(w.expired());
  }
  // A failure is reported, also when another thread retired the failed buffer first.
  {
    Tracker t;
    auto c = std::make_shared<FakeCB>();
    t.committed(c, {});
    c->complete(true);
    assert(sync(t) == "boom");
    Tracker u;
    auto x = std::make_shared<FakeCB>(), y = std::make_shared<FakeCB>();
    u.committed(x, {});
    x->complete();
    std::string first;
    std::thread tx([&] { first = u.wait_committed([](const CB& cb) { cb->wait(); },
                                                  [](const CB& cb) { return cb->finished(); },
                                                  [](const CB& cb) { return cb->failed ? std::string("boom") : std::string(); }); });
    tx.join();
    u.committed(y, {});
    y->complete(true);
    // Retire y from a call that did not wait on it: a fake call that snapshots nothing.
    assert(first.empty());
    assert(sync(u) == "boom");
  }
  // Many threads, many buffers: every synchronize sees its own buffer completed.
  {
    Tracker t;
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (int i = 0; i < 8; ++i)
      threads.emplace_back([&, i] {
        for (int k = 0; k < 200; ++k) {
          auto cb = std::make_shared<FakeCB>();
          t.committed(cb, {std::make_shared<int>(i)});
          std::thread gpu([cb, k] { if (k % 3 == 0) std::this_thread::sleep_for(50us); cb->complete(); });
          sync(t);
          if (!cb->finished()) ++bad;
          gpu.join();
        }
      });
    for (auto& th : threads) th.join();
    assert(bad == 0);
  }
  // reap() (at each commit) releases completed buffers without waiting on running ones,
  // and a failure it retires is reported by the next synchronize.
  {
    Tracker t;
    auto running = std::make_shared<FakeCB>(), done = std::make_shared<FakeCB>();
    auto keep_r = std::make_shared<int>(3), keep_d = std::make_shared<int>(4);
    std::weak_ptr<int> wr = keep_r, wd = keep_d;
    t.committed(running, {std::move(keep_r)});
    t.committed(done, {std::move(keep_d)});
    done->complete(true);
    t.reap([](const CB& cb) { return cb->finished(); },
           [](const CB& cb) { return cb->failed ? std::string("boom") : std::string(); });
    assert(wd.expired() && !wr.expired() && !t.empty());
    running->complete();
    assert(sync(t) == "boom");
    assert(wr.expired() && t.empty());
  }
  std::puts("command_tracker ok");
  return 0;
}
"""


def test_metal_synchronize_waits_for_every_earlier_commit(tmp_path):
    """The invariant behind MetalBackend::synchronize (csrc/backend/metal/command_tracker.h):
    a synchronize returns only after every command buffer committed before it began, by
    any thread, completed; storages go only after their command buffer completed."""
    cxx = next((c for c in ["c++", "g++", "clang++"] if shutil.which(c)), None)
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "tracker_test.cpp"
    src.write_text(TRACKER_TEST)
    exe = tmp_path / "tracker_test"
    subprocess.run([cxx, "-std=c++17", "-O1", "-pthread", "-Wall", "-Werror", "-I", str(REPO / "csrc"),
                    str(src), "-o", str(exe)], check=True, capture_output=True, text=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "command_tracker ok" in r.stdout, r.stdout + r.stderr
