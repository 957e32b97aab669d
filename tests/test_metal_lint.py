"""The kernels stay inside the portable MSL subset: the textual rules of the MSL checker
(tools/ci/check_msl.py, rules in tools/ci/msl_text_rules.py), which need no compiler."""
from __future__ import annotations

import importlib.util
import sys
import textwrap

from conftest import REPO

spec = importlib.util.spec_from_file_location("check_msl", REPO / "tools" / "ci" / "check_msl.py")
check_msl = importlib.util.module_from_spec(spec)
check_msl = sys.modules.setdefault("check_msl", check_msl)  # dataclasses look their module up
if not hasattr(check_msl, "text_findings"):
    spec.loader.exec_module(check_msl)
lint_text = check_msl.msl_text_rules.lint_text


def test_repository_kernels_pass_the_textual_rules():
    findings = check_msl.text_findings(REPO / "metal")
    assert findings == [], "\n".join(map(str, findings))


def test_textual_findings_name_file_line_and_rule(tmp_path):
    (tmp_path / "k.metal").write_text("kernel void k(device float* a [[buffer(0)]]) {\n"
                                      "  a[0] = fast::exp(a[1]);\n}\n")
    (found,) = check_msl.text_findings(tmp_path)
    assert (found.path.endswith("k.metal"), found.line, found.rule) == (True, 2, "fast-math")


def test_lint_catches_each_rule():
    bad = textwrap.dedent("""
        #include <metal_stdlib>
        using namespace metal;
        threadgroup float global_tile[4];
        kernel void k(device float* a [[buffer(0)]], threadgroup float* t [[threadgroup(0)]],
                      texture2d<float> img [[texture(0)]], constant float* w [[buffer(1)]],
                      uint i [[thread_position_in_grid]]) {
          threadgroup float tile[64];
          if (i > 10) return;
          float4 v = float4(1.0f); float2 w = v.xy; long q = 0; double d = 1;
          tile[i] = a[i];
          threadgroup_barrier(mem_flags::mem_threadgroup);
          a[i] = tile[0] + fast::exp(w.x);
        }
    """)
    rules = {line.split("[")[1].split("]")[0] for line in lint_text("bad.metal", bad)}
    # double is the strict gate's rule (tests/test_metal_gate.py plants one).
    assert rules == {"threadgroup-param", "texture", "int-width", "swizzle",
                     "fast-math", "threadgroup-scope", "early-return", "constant-pointer"}


def test_lint_accepts_the_subset():
    good = textwrap.dedent("""
        kernel void k(device float* a [[buffer(0)]], uint i [[thread_position_in_grid]],
                      uint l [[thread_position_in_threadgroup]]) {
          threadgroup float tile[64];
          tile[l] = a[i];
          threadgroup_barrier(mem_flags::mem_threadgroup);
          if (i < 10) { a[i] = tile[0] + float4(1.0f).x; }
        }
    """)
    assert lint_text("good.metal", good) == []
