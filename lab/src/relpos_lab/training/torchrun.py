"""Data-parallel training with ``torchrun`` (DistributedDataParallel; gloo on CPU, nccl on GPU).

Run ``relpos_lab.training.train.train`` on N processes of one machine::

    torchrun --standalone --nproc_per_node 2 -m relpos_lab.training.torchrun \\
        --encoding alibi --steps 600 --out runs/alibi-ddp [--data PATH] [--resume]

(every field of ``TrainConfig`` is an option: ``--dim 128 --depth 4 --num-heads 4 --seq-len 128
--batch-size 32 --lr 1e-3 ...``, ``--encoding-options '{"base": 500}'`` takes JSON). Without
``torchrun`` the same command trains in one process.

How it works: ``relpos_lab.training.distributed`` (the process-group helpers ``train()`` uses). This
module is only the entry point: options, ``train()``, one JSON summary line from rank 0. A
Ctrl-C or SIGTERM exits ``128 + signal`` (130, 143) after the checkpoint.

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

from relpos.optional import require

from .distributed import env_world_size
from .runtime import exit_code
from .train import TrainConfig, TrainingInterrupted, train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m relpos_lab.training.torchrun",
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
    """Entry point of ``python -m relpos_lab.training.torchrun`` (see the module docstring)."""
    from .data import load_corpus

    args = build_parser().parse_args(argv)
    try:
        needs = {"safetensors": "checkpoints in --out"} if args.out else {}
        if args.tokenizer == "bpe":
            needs["tokenizers"] = "--tokenizer bpe"
        require("python -m relpos_lab.training.torchrun", needs)
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
        print(f"relpos_lab.training.torchrun: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except TrainingInterrupted as stop:
        if int(os.environ.get("RANK", "0")) == 0:
            hint = " (continue with --resume)" if stop.out_dir else ""
            print(f"relpos_lab.training.torchrun: {stop}{hint}", file=sys.stderr)
        return exit_code(stop.signum)
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
