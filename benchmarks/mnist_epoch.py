"""One MNIST training epoch, fastmetal against PyTorch (see fastmetal/benchmarks/mnist.py);
same as `python -m fastmetal bench mnist`."""
from fastmetal.benchmarks.mnist import main

if __name__ == "__main__":
    main()
