"""Fused attention on the CPU: fastmetal vs PyTorch SDPA and MultiheadAttention, forward and
forward + backward, medians of interleaved repeats, ratios.

    python benchmarks/attention_cpu.py [--budget 0.5] [--quick]

The same as `python -m fastmetal bench attention` (python/fastmetal/benchmarks/attention.py).
"""
import sys

from fastmetal.benchmarks.attention import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
