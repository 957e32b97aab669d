"""The strict MSL gate (tools/ci/check_msl.py): the kernels compile the way Apple's compiler
wants them, and the gate proves it can fail. Also the CPU shim's NaN test mode, in which
metal::min/max/clamp answer differently for NaN (MSL leaves those cases undefined)."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from conftest import REPO


# Where each tool lives under tools/: the generators, or the CI gates.
_FOLDER = {"gen_kernels": "gen", "msl_frontend": "gen", "check_msl": "ci", "metal_ci_report": "ci"}


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / _FOLDER[name] / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


check_msl = _load("check_msl")


def skip_or_fail(reason: str):
    """A gate whose tool is missing skips; with FASTMETAL_REQUIRE_GATES=1 (CI) it fails."""
    if os.environ.get("FASTMETAL_REQUIRE_GATES") == "1":
        pytest.fail(f"FASTMETAL_REQUIRE_GATES=1 but the gate cannot run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def cindex():
    ci, why = check_msl.load_cindex()
    if ci is None:
        skip_or_fail(why)
    return ci


def test_kernels_pass_the_strict_gate(cindex):
    findings = check_msl.run_gate(REPO / "metal", cindex)
    assert findings == [], "\n".join(map(str, findings))


def test_gate_rejects_every_planted_error(cindex):
    """Teeth: each kind of error a Mac rejects, planted into a copy of a real kernel."""
    assert check_msl.self_check(REPO / "metal", cindex) == []
    assert len({m.rule for m in check_msl.MUTATIONS}) >= 11


def test_gate_names_file_line_and_rule(cindex, tmp_path):
    copy = check_msl.copy_metal(REPO / "metal", tmp_path / "metal")
    m = next(m for m in check_msl.MUTATIONS if m.rule == "metal-namespace")
    check_msl.plant(copy, m)
    text = (copy / m.file).read_text()
    line = text[: text.index(m.new)].count("\n") + 1
    found = [str(f) for f in check_msl.run_gate(copy, cindex)]
    assert any(s.endswith(f"fm_math.h:{line}: [metal-namespace] use of undeclared identifier 'select'")
               for s in found), found


def test_cli_exit_status(cindex, tmp_path, capsys):
    copy = check_msl.copy_metal(REPO / "metal", tmp_path / "metal")
    assert check_msl.main(["--metal-dir", str(copy)]) == 0
    check_msl.plant(copy, check_msl.MUTATIONS[0])
    assert check_msl.main(["--metal-dir", str(copy)]) == 1
    assert "[kernel-param]" in capsys.readouterr().out


def test_missing_libclang_is_reported(monkeypatch):
    """Without libclang the gate says why (and the test fixture turns that into a skip)."""
    import builtins
    real_import = builtins.__import__

    def no_clang(name, *a, **k):
        if name.startswith("clang"):
            raise ImportError("No module named 'clang'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_clang)
    monkeypatch.delitem(sys.modules, "clang.cindex", raising=False)
    monkeypatch.delitem(sys.modules, "clang", raising=False)
    ci, why = check_msl.load_cindex()
    assert ci is None and "pip install libclang" in why


# ----------------------------------------------------------------------------- NaN shim
SPECIAL = ["NAN", "-NAN", "INFINITY", "-INFINITY", "0.0f", "-0.0f", "1.0f", "-1.0f", "0.5f",
           "-2.5f", "88.5f", "-104.5f", "1e-30f", "3.0e38f", "-3.0e38f", "12.0f", "-12.0f"]


def _nan_driver(metal_dir, gen_dir) -> str:
    gen = _load("gen_kernels")
    ops = gen.read_op_table(metal_dir / "elementwise_ops.tbl")
    (gen_dir / "elementwise_ops.h").write_text(gen.elementwise_header(ops))
    lines = ["#include <cstdio>", "#include <cstring>", "#include <cstdint>", "#include <string>",
             "#include <metal_stdlib>",
             '#include "elementwise.metal"', '#include "fm_end.h"',
             "static void put(const char* op, int i, float v) {",
             "  std::uint32_t b; std::memcpy(&b, &v, 4);",
             "  std::printf(\"%s %d %s\\n\", op, i, v != v ? \"nan\" : std::to_string(b).c_str());",
             "}",
             f"static const float kVals[] = {{{', '.join(SPECIAL)}}};",
             "int main() {", "  const int n = int(sizeof(kVals) / sizeof(kVals[0]));"]
    for op in ops:
        if op.arity == 1:
            lines.append(f'  for (int i = 0; i < n; ++i) put("{op.name}", i, Op_{op.name}()(kVals[i]));')
        else:
            lines.append(f"  for (int i = 0; i < n; ++i) for (int j = 0; j < n; ++j) "
                         f'put("{op.name}", i * n + j, Op_{op.name}()(kVals[i], kVals[j]));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def _run_elementwise_ops(metal_dir, tmp_path, nan_test: bool) -> list[str]:
    import shutil
    import subprocess
    cxx = next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
    if cxx is None:
        skip_or_fail("no C++ compiler for the CPU shim build")
    gen_dir = tmp_path / ("gen_nan" if nan_test else "gen")
    gen_dir.mkdir(exist_ok=True)
    src = gen_dir / "driver.cpp"
    src.write_text(_nan_driver(metal_dir, gen_dir))
    exe = gen_dir / "driver"
    cmd = [cxx, "-std=c++17", "-O2", "-fno-fast-math", "-w", "-I", str(REPO / "metal/compat/cpu"),
           "-I", str(metal_dir), "-I", str(gen_dir), str(src), "-o", str(exe)]
    if nan_test:
        cmd.insert(1, "-DFM_SHIM_NAN_TEST")
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()


def _nan_dependence(metal_dir, tmp_path) -> list[str]:
    normal = _run_elementwise_ops(metal_dir, tmp_path, nan_test=False)
    poisoned = _run_elementwise_ops(metal_dir, tmp_path, nan_test=True)
    assert len(normal) == len(poisoned) > 0
    return [f"{a}  (NaN test build: {b.split()[-1]})" for a, b in zip(normal, poisoned) if a != b]


def test_elementwise_ops_do_not_depend_on_min_max_clamp_of_nan(tmp_path):
    """Every op of elementwise_ops.tbl gives bit-identical results (NaN as NaN) when
    metal::min/max/clamp answer 1234 for NaN arguments. With the gate's nan-undefined rule
    (no float min/max/clamp outside fm_math.h) this covers every kernel."""
    diffs = _nan_dependence(REPO / "metal", tmp_path)
    assert diffs == [], "\n".join(diffs[:20])


def test_nan_test_build_catches_dependence(tmp_path):
    """Teeth: relu written as max(x, 0) is NaN-propagating on the CPU (std::max) and
    passes the NumPy comparison there, but Metal may return 0; the NaN test build sees it."""
    import shutil
    copy = tmp_path / "metal"
    shutil.copytree(REPO / "metal", copy, ignore=shutil.ignore_patterns("compat"))
    math_h = copy / "fm_math.h"
    old = "FM_FUNC float fm_relu(float x) { return metal::select(x, 0.0f, x <= 0.0f); }"
    assert old in math_h.read_text()
    math_h.write_text(math_h.read_text().replace(
        old, "FM_FUNC float fm_relu(float x) { return metal::max(x, 0.0f); }"))
    diffs = _nan_dependence(copy, tmp_path)
    # relu and the fusion pass's add_relu (relu(x + y)) are the ops built on fm_relu
    assert diffs and all(d.startswith(("relu ", "add_relu ")) for d in diffs), diffs
    assert any(d.startswith("relu ") for d in diffs), diffs


TRAINING_NAN_DRIVER = r"""
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <metal_stdlib>
#include "training.metal"
#include "fm_end.h"
static void put(const char* what, const float* v, int n) {
  for (int i = 0; i < n; ++i) {
    std::uint32_t b;
    std::memcpy(&b, &v[i], 4);
    if (v[i] != v[i]) std::printf("%s %d nan\n", what, i);
    else std::printf("%s %d %u\n", what, i, b);
  }
}
int main() {
  // 4 rows of 6 logits: NaN first, inside, last, and none; then a row of -inf / +inf.
  const float Q = NAN, I = INFINITY;
  float x[5 * 6] = {Q, 1, 2, 3, 4, 5,  1, 2, Q, 4, 5, 6,  3, 2, 1, 0, -1, Q,
                    0.5f, -2, 7, 1e30f, -1e30f, 3,  -I, -I, -I, I, -I, 1};
  float y[30], loss[5], grad[30];
  int64_t labels[5] = {0, 1, 2, 3, 4};
  SoftmaxRowArgs ra{5, 6, 1, 0};
  for (uint32_t r = 0; r < 5; ++r) log_softmax_forward(x, y, ra, uint2(0, r));
  put("log_softmax", y, 30);
  CrossEntropyArgs ca{5, 6, 0.2f, 0};
  for (uint32_t r = 0; r < 5; ++r) cross_entropy_rows(x, labels, loss, grad, ca, r);
  put("cross_entropy_loss", loss, 5);
  put("cross_entropy_grad", grad, 30);
  // max_pool2d over the same 5 x 6 plane: 2 x 2 windows, stride 1, padding 1.
  PoolArgs pa{1, 5, 6, 6, 7, 2, 2, 1, 1, 1, 1, 0};
  float pooled[42];
  for (uint32_t oy = 0; oy < 6; ++oy)
    for (uint32_t ox = 0; ox < 7; ++ox) max_pool2d_forward(x, pooled, pa, uint3(ox, oy, 0));
  put("max_pool2d", pooled, 42);
  return 0;
}
"""


def _run_training_driver(tmp_path, nan_test: bool) -> list[str]:
    import shutil
    import subprocess
    cxx = next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
    if cxx is None:
        skip_or_fail("no C++ compiler for the CPU shim build")
    d = tmp_path / ("train_nan" if nan_test else "train")
    d.mkdir(exist_ok=True)
    (d / "driver.cpp").write_text(TRAINING_NAN_DRIVER)
    cmd = [cxx, "-std=c++17", "-O2", "-fno-fast-math", "-w", "-I", str(REPO / "metal/compat/cpu"),
           "-I", str(REPO / "metal"), str(d / "driver.cpp"), "-o", str(d / "driver")]
    if nan_test:
        cmd.insert(1, "-DFM_SHIM_NAN_TEST")
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return subprocess.run([str(d / "driver")], capture_output=True, text=True, check=True).stdout.splitlines()


def test_training_kernels_do_not_depend_on_min_max_clamp_of_nan(tmp_path):
    """log_softmax, cross_entropy and max_pool2d with NaN (and infinite) inputs give the
    same bits when metal::min/max/clamp answer 1234 for NaN (MSL leaves that undefined),
    and NaN where PyTorch gives NaN. (The reductions, which need the emulator's barriers,
    are checked with NaN under the emulator in test_reductions.py.)"""
    normal = _run_training_driver(tmp_path, nan_test=False)
    poisoned = _run_training_driver(tmp_path, nan_test=True)
    assert len(normal) == len(poisoned) == 30 + 5 + 30 + 42
    diffs = [f"{a}  (NaN test build: {b.split()[-1]})" for a, b in zip(normal, poisoned) if a != b]
    assert diffs == [], "\n".join(diffs[:20])
    values = {tuple(line.split()[:2]): line.split()[2] for line in normal}
    for row in (0, 1, 2, 4):  # a NaN, or +inf (inf - inf): the whole row NaN, as PyTorch
        assert all(values[("log_softmax", str(row * 6 + c))] == "nan" for c in range(6)), row
        assert values[("cross_entropy_loss", str(row))] == "nan", row
    assert all(values[("log_softmax", str(18 + c))] != "nan" for c in range(6))
    assert values[("cross_entropy_loss", "3")] != "nan"
    assert values[("max_pool2d", "0")] == "nan"  # a window holding x[0, 0] = NaN


INDEX_DRIVER = r"""
#include <cstdio>
#include <cstdint>
#include <random>
#include <metal_stdlib>
#include "strided.h"
#include "fm_end.h"
int main() {
  std::mt19937_64 rng(11);
  long checked = 0;
  for (int t = 0; t < 20000; ++t) {
    StridedArgs a{};
    a.ndim = 1 + int32_t(rng() % 6);
    std::int64_t span = 0;
    for (int d = 0; d < a.ndim; ++d) {
      a.shape[d] = 1 + int32_t(rng() % 40);
      a.strides[0][d] = std::int64_t(rng() % 200000) - 100000;  // negative, zero (broadcast), any
      span += (a.strides[0][d] < 0 ? -a.strides[0][d] : a.strides[0][d]) * (a.shape[d] - 1);
    }
    a.index32 = span <= INT32_MAX ? 1 : 0;  // the host's rule (csrc/elementwise.cpp)
    const int nd = a.ndim;
    const std::uint32_t gx = a.shape[nd - 1], gy = nd > 1 ? a.shape[nd - 2] : 1;
    std::uint32_t gz = 1;
    for (int d = 0; d + 2 < nd; ++d) gz *= a.shape[d];
    for (int s = 0; s < 8; ++s) {
      const uint3 gid(std::uint32_t(rng() % gx), std::uint32_t(rng() % gy), std::uint32_t(rng() % gz));
      if (fm_offset_g(gid, a, 0) != fm_strided_offset(gid, a.shape, a.strides[0], nd)) return 1;
      if (nd == 3 && fm_offset_s(gid, a, 0) != fm_offset3(gid, a.strides[0])) return 2;
      checked += a.index32;
    }
  }
  std::printf("checked %ld\n", checked);
  return checked > 0 ? 0 : 3;
}
"""


def test_narrow_index_math_matches_64_bit(tmp_path):
    """The 32-bit offsets Metal uses (FM_NARROW_INDEX) equal the 64-bit ones wherever the
    host allows them; built here through the CPU shim with the Metal choice forced on."""
    import shutil
    import subprocess
    cxx = next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
    if cxx is None:
        skip_or_fail("no C++ compiler for the CPU shim build")
    src = tmp_path / "index.cpp"
    src.write_text(INDEX_DRIVER)
    exe = tmp_path / "index"
    r = subprocess.run([cxx, "-std=c++17", "-O1", "-w", "-DFM_NARROW_INDEX=1",
                        "-I", str(REPO / "metal/compat/cpu"), "-I", str(REPO / "metal"), str(src),
                        "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_macos_ci_verdict():
    """The macOS job's one line (tools/ci/metal_ci_report.py): it fails when the Metal backend
    was built but no Metal test executed, unless the GPU is known to lack Metal 3."""
    report = _load("metal_ci_report")
    v = report.verdict
    assert v("darwin", ["metal", "cpu"], "", 40)[0]
    assert not v("darwin", ["metal", "cpu"], "", 0)[0]                       # built, device, nothing ran
    ok, line = v("darwin", ["cpu"], "'Apple Paravirtual device' does not support Metal 3", 0)
    assert ok and "lacks Metal 3" in line and "\n" not in line
    assert not v("darwin", ["cpu"], "could not load the embedded metallib: bad", 0)[0]
    assert not v("darwin", ["cpu"], "", 0)[0]                                 # no Metal backend built
    assert v("linux", ["cpu"], "", 0)[0]


@pytest.mark.host_visible
def test_views_at_odd_byte_offsets(device):
    """NumPy views that start at an odd byte offset (Metal's setBuffer:offset: cannot bind
    them in place, so the Metal backend copies them) give the right results, in and out."""
    import numpy as np

    import fastmetal as fm
    raw_in, raw_out = bytearray(4 * 64 + 1), bytearray(4 * 64 + 3)
    x = np.frombuffer(raw_in, np.float32, count=64, offset=1)
    y = np.frombuffer(raw_out, np.float32, count=64, offset=3)
    assert not x.flags.aligned and not y.flags.aligned
    x[:] = np.linspace(-3.0, 3.0, 64, dtype=np.float32)
    want = np.exp(x.astype(np.float64))
    np.testing.assert_allclose(np.asarray(fm.exp(x)), want, rtol=2e-6)
    fm.exp(x, out=y)
    fm.synchronize()
    np.testing.assert_allclose(y, want, rtol=2e-6)


def test_cpu_only_lane_variants_stay_out_of_metal_and_cuda():
    """Kernels only the CPU launches (several lanes per thread) get CPU entries only; the
    metallib (the stand-in xcrun compares its host names with these targets) and the CUDA
    build leave them out."""
    fe = _load("msl_frontend")
    gen = _load("gen_kernels")
    instances = fe.parse_metal(REPO / "metal/numerics.metal", [REPO / "metal"])
    lanes = {i.host_name: i.targets for i in instances if "_l16" in i.host_name or "_l64" in i.host_name}
    assert lanes and all(t == {"cpu"} for t in lanes.values()), lanes
    assert all(i.targets == {"metal", "cpu", "cuda"} for i in instances if i.host_name.endswith("_l1"))
    cuda = gen.cuda_entries("numerics", instances)
    cpu = gen.cpu_entries("numerics", instances)
    assert all(f"k_{h}(" not in cuda and f"entry_{h}(" in cpu for h in lanes)


def test_metal_device_discovery_is_wired():
    """A command-line process gets a device: CoreGraphics linked, MTLCopyAllDevices as the
    fallback, the reason kept when there is none. (Static: only a Mac can run it; the
    Objective-C++ gate type-checks the calls against Apple's signatures.)"""
    cmake = (REPO / "cmake/metal.cmake").read_text()
    mm = (REPO / "csrc/backend/metal/metal_backend.mm").read_text()
    assert '"-framework CoreGraphics"' in cmake
    assert "MTLCopyAllDevices()" in mm and "metal_unavailable_reason" in mm
    assert "MTLCopyAllDevices" in (REPO / "tools/ci/objc_stubs/Metal/Metal.h").read_text()


def test_cuda_wrappers_read_device_buffers_directly():
    """CUDA wrappers pass `device` buffers as a.ptr[i] and only `constant` argument blocks
    through arg_ptr (which may point into the launch parameters); each kernel's inline_ok
    mask names exactly its constant blocks, so the host never inlines bytes bound to a
    device parameter. (Through arg_ptr's select, every pointer was generic and ptxas spilled
    twice as much in the conv2d GEMMs.) Its writes mask names exactly the device buffers not
    declared const: what a compiled step's graph orders launches by."""
    import re
    fe = _load("msl_frontend")
    gen = _load("gen_kernels")
    instances = fe.parse_metal(REPO / "metal/conv2d.metal", [REPO / "metal"])
    cuda = gen.cuda_entries("conv2d", instances)
    checked = 0
    for inst in (i for i in instances if "cuda" in i.targets):
        body = cuda[cuda.index(f"void k_{inst.host_name}("):]
        body = body[: body.index("\n}\n")]
        found = re.search(rf'table\.add\("{inst.host_name}", .*, (\d+)u, (\d+)u\);', cuda)
        mask, writes = int(found.group(1)), int(found.group(2))
        for p in inst.kernel.params:
            if p.buffer is None:
                continue
            constant = p.decl.startswith("constant")
            assert (f"arg_ptr(a, {p.buffer}))" in body) == constant, (inst.host_name, p.decl)
            assert (f"(a.ptr[{p.buffer}])" in body) == (not constant), (inst.host_name, p.decl)
            assert bool(mask >> p.buffer & 1) == constant, (inst.host_name, p.decl, mask)
            read_only = p.decl.startswith("device const")
            assert bool(writes >> p.buffer & 1) == (not constant and not read_only), \
                (inst.host_name, p.decl, writes)
            checked += 1
    assert checked > 20
