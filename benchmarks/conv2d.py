"""conv2d benchmark (see fastmetal/benchmarks/conv2d.py); same as
`python -m fastmetal bench conv2d`."""
from fastmetal.benchmarks.conv2d import main

if __name__ == "__main__":
    main()
