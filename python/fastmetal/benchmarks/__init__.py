"""Benchmarks shipped with fastmetal: `python -m fastmetal bench [name]`.

Each module has `main(argv=None)`; the scripts under the repository's benchmarks/ call them.
Every benchmark measures fastmetal and its peers (NumPy, PyTorch CPU, MLX CPU where
installed) in one run and prints medians of repeats and ratios (peer time / fastmetal time:
above 1 means fastmetal is faster).
"""
