"""fourier benchmark (see fastmetal/benchmarks/fourier.py); same as
`python -m fastmetal bench fourier`."""
from fastmetal.benchmarks.fourier import main

if __name__ == "__main__":
    main()
