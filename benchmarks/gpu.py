"""GPU benchmark (see fastmetal/benchmarks/gpu.py); same as `python -m fastmetal bench gpu`."""
from fastmetal.benchmarks.gpu import main

if __name__ == "__main__":
    raise SystemExit(main())
