"""Reductions and matrix products on the CPU: fastmetal vs NumPy vs torch, medians, one run.

    python benchmarks/reduce_matmul.py [--budget 0.3] [--quick]

Now part of `python -m fastmetal bench matmul` (python/fastmetal/benchmarks/matmul.py):
this runs its CPU part with the reduction rows (sum / max / argmax of 2^24 float32, sum over
axis 0 of 4096^2) that this script used to time.
"""
import sys

from fastmetal.benchmarks.matmul import main

if __name__ == "__main__":
    sys.exit(main(["--device", "cpu", "--reductions", *sys.argv[1:]]))
