"""Elementwise benchmark (see fastmetal/benchmarks/elementwise.py); same as
`python -m fastmetal bench elementwise`."""
from fastmetal.benchmarks.elementwise import main

if __name__ == "__main__":
    main()
