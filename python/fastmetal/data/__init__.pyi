# Type stubs of fastmetal.data (see datasets.py for the documentation).
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import numpy.typing as npt

def read_idx(path: str | os.PathLike[str]) -> npt.NDArray[Any]: ...
def load_mnist(data_dir: str | os.PathLike[str], train: bool = ...
               ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]: ...
def mnist_5k_path() -> Path | None: ...
def load_mnist_5k(path: str | os.PathLike[str] | None = ...
                  ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]: ...


class DistributedSampler:
    dataset: Any
    length: int
    num_replicas: int
    rank: int
    shuffle: bool
    seed: int
    drop_last: bool
    epoch: int
    num_samples: int
    total_size: int
    def __init__(self, dataset: Any, num_replicas: int | None = ..., rank: int | None = ...,
                 shuffle: bool = ..., seed: int = ..., drop_last: bool = ...) -> None: ...
    def __iter__(self) -> Iterator[int]: ...
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...

__all__: list[str]
