"""Process-group helpers for data-parallel training (DistributedDataParallel; gloo on CPU,
nccl on GPU): where this process stands (``DistInfo``), its device, joining and leaving the
group. ``relpos_lab.training.train.train`` calls them; the ``torchrun`` entry point is
``relpos_lab.training.torchrun``.

``train()`` sees the ``torchrun`` environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), joins the process group (or uses one the caller
initialized) and wraps the model in ``DistributedDataParallel``. ``batch_size`` is the
**global** batch: every rank draws the same global batch from the same seeded generator and
keeps its own ``batch_size / world_size`` rows, and DDP averages the gradients, so N processes
compute the same steps as one process (equal up to float rounding) and a checkpoint written by
any world size resumes under any other. Rank 0 alone shows progress and writes checkpoints;
losses are averaged over ranks every few steps (no collective per step beyond DDP's own). A
Ctrl-C / SIGTERM is agreed on by all ranks at the next such point, then rank 0 checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    """Where this process stands: ``rank`` of ``world_size``, and its ``local_rank``.

    ``owns_group``: this module initialized the process group (and ``cleanup`` destroys it).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def env_world_size() -> int:
    """``WORLD_SIZE`` from the environment (1 when unset)."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"WORLD_SIZE must be an integer, got {value!r}") from None


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """``"auto"`` -> ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}"
        ) from None


def setup(device: torch.device) -> DistInfo:
    """Join the process group the environment describes; a single-process ``DistInfo`` if none.

    Uses an already initialized group as is. Otherwise, when ``WORLD_SIZE > 1``, initializes one
    with nccl for CUDA devices and gloo for CPU (``env://``: ``MASTER_ADDR``/``MASTER_PORT``).
    """
    if dist.is_available() and dist.is_initialized():
        return DistInfo(
            dist.get_rank(),
            dist.get_world_size(),
            int(os.environ.get("LOCAL_RANK", dist.get_rank())),
        )
    world_size = env_world_size()
    if world_size <= 1:
        return DistInfo()
    if not dist.is_available():
        raise ValueError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    return DistInfo(rank, world_size, local_rank, owns_group=True)


def cleanup(info: DistInfo, *, barrier: bool = True) -> None:
    """Destroy the process group if ``setup`` created it.

    ``barrier``: wait for every rank first (gloo can abort a rank whose peer tears down the
    group early); pass False on an error path, where the other ranks may never arrive.
    """
    if info.owns_group and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()
