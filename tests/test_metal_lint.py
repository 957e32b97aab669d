"""The kernels stay inside the portable MSL subset (tools/lint_metal.py)."""
from __future__ import annotations

import importlib.util
import textwrap

from conftest import REPO

spec = importlib.util.spec_from_file_location("lint_metal", REPO / "tools" / "lint_metal.py")
lint_metal = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lint_metal)


def test_repository_kernels_pass_the_lint(capsys):
    assert lint_metal.main([str(REPO / "metal")]) == 0, capsys.readouterr().out


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
    rules = {line.split("[")[1].split("]")[0] for line in lint_metal.lint_text("bad.metal", bad)}
    assert rules == {"threadgroup-param", "texture", "int-width", "double", "swizzle",
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
    assert lint_metal.lint_text("good.metal", good) == []
