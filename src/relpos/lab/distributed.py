"""Data-parallel training with ``torchrun`` (DistributedDataParallel; gloo on CPU, nccl on GPU).

Run ``relpos.lab.train.train`` on N processes of one machine::

    torchrun --standalone --nproc_per_node 2 -m relpos.lab.distributed \\
        --encoding alibi --steps 600 --out runs/alibi-ddp [--data PATH] [--resume]

(every field of ``TrainConfig`` is an option: ``--dim 128 --depth 4 --num-heads 4 --seq-len 128
--batch-size 32 --lr 1e-3 ...``, ``--encoding-options '{"base": 500}'`` takes JSON). Without
``torchrun`` the same command trains in one process.

How it works: ``train()`` sees the ``torchrun`` environment (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), joins the process group (or uses one the
caller initialized) and wraps the model in ``DistributedDataParallel``. ``batch_size`` is the
**global** batch: every rank draws the same global batch from the same seeded generator and
keeps its own ``batch_size / world_size`` rows, and DDP averages the gradients, so N processes
compute the same steps as one process (equal up to float rounding) and a checkpoint written by
any world size resumes under any other. Rank 0 alone shows progress and writes checkpoints;
losses are averaged over ranks every few steps (no collective per step beyond DDP's own). A
Ctrl-C / SIGTERM is agreed on by all ranks at the next such point, then rank 0 checkpoints.

On CPU, ``torchrun`` sets ``OMP_NUM_THREADS=1`` per process unless it is set; with 2 processes
on a 2-core machine that is the right value.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
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


# ------------------------------------------------------------------------------ torchrun entry


def build_parser() -> argparse.ArgumentParser:
    from .train import TrainConfig

    parser = argparse.ArgumentParser(
        prog="python -m relpos.lab.distributed",
        description="Train a relpos TransformerLM (under torchrun: data-parallel).",
    )
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "encoding":
            parser.add_argument(flag, required=True, help="registry name, e.g. rope, alibi")
        elif f.name == "encoding_options":
            parser.add_argument(flag, type=json.loads, default={}, help="JSON object")
        else:
            default = f.default
            parser.add_argument(flag, type=type(default), default=default, help=f"({default})")
    parser.add_argument("--data", default=None, help="UTF-8 file or folder (default: built-in)")
    parser.add_argument("--tokenizer", default="bytes", choices=["bytes", "bpe"])
    parser.add_argument("--bpe-vocab-size", type=int, default=2048)
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the split")
    parser.add_argument("--out", default=None, help="run folder for checkpoints")
    parser.add_argument("--resume", action="store_true", help="continue from --out's checkpoint")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m relpos.lab.distributed`` (see the module docstring)."""
    from .data import load_corpus
    from .train import TrainConfig, TrainingInterrupted, train

    args = build_parser().parse_args(argv)
    try:
        names = {f.name for f in dataclasses.fields(TrainConfig)}
        config = TrainConfig(**{k: v for k, v in vars(args).items() if k in names})
        corpus = load_corpus(
            args.data,
            tokenizer=args.tokenizer,
            bpe_vocab_size=args.bpe_vocab_size,
            seed=args.data_seed,
        )
        result = train(config, corpus, args.out, resume=args.resume, progress=not args.no_progress)
    except (ValueError, TypeError) as err:
        print(f"relpos.lab.distributed: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except TrainingInterrupted as stop:
        if int(os.environ.get("RANK", "0")) == 0:
            hint = " (continue with --resume)" if stop.out_dir else ""
            print(f"relpos.lab.distributed: {stop}{hint}", file=sys.stderr)
        return 130
    if int(os.environ.get("RANK", "0")) == 0:
        summary = {
            "encoding": config.encoding,
            "steps": result.steps,
            "final_loss": result.final_loss,
            "tokens_per_second": result.tokens_per_second,
            "world_size": env_world_size(),
        }
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
