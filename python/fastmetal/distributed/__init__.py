"""``fastmetal.distributed``: data-parallel training over several processes, as
``torch.distributed`` (its default process group and collectives).

Start the processes with ``python -m fastmetal.distributed.run --nproc-per-node N script.py``;
in the script, ``init_process_group()`` joins them, over MPI (mpi4py: CPU processes, Macs)
or NCCL (CuPy: CUDA GPUs). ``fastmetal.nn.parallel.DistributedDataParallel`` averages
gradients with it; ``fastmetal.data.DistributedSampler`` splits a data set between ranks.
"""
from .group import (all_gather, all_reduce, barrier, broadcast, destroy_process_group,
                    get_backend, get_rank, get_world_size, init_process_group, is_initialized)

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "get_rank",
           "get_world_size", "get_backend", "all_reduce", "broadcast", "all_gather",
           "barrier"]
