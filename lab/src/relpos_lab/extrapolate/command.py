"""The ``relpos extrapolate`` command: its options (``add_arguments``) and ``run_command``,
which parses the flags, then calls the library façade ``run_extrapolation`` (plan, validate,
train, evaluate) and writes the report."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path

from relpos.nn.transformer import INIT_SCHEMES
from relpos.optional import missing_plot_note
from relpos.validation import check_choice

from .. import report
from ..arguments import optional_int, parse_int
from ..io import check_output_dir
from ..training.profiles import add_training_arguments, get_profile, seeds_flag, training_overrides
from ..training.runtime import exit_code, resume_command
from .plan import EvalPlan, check_out_dir
from .run import run_extrapolation

__all__ = ["add_arguments", "run_command"]

PLOT_FILE = "ppl_vs_length.png"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``relpos extrapolate`` (numbers are parsed by ``run_command``, so a bad
    value is one line naming the flag)."""
    add = parser.add_argument
    add("--encodings", help="comma-separated registry names (default: the profile's list)")
    add("--train-len", default="128", help="training length L in tokens (default 128)")
    add("--eval-mult", default="1,2,4,8,16", help="evaluation lengths as multiples of L")
    add(
        "--profile",
        default="quick",
        help="quick (default, ~6 min on 2 cores), paper, or xtransformers (the peer's "
        "configuration of docs/benchmarks.md)",
    )
    add_training_arguments(parser)  # --dim --depth --heads --batch --lr --steps --seeds
    add(
        "--qkv-conv",
        help="kernel size K of causal depth-wise q/k/v convolutions in every layer (RCMHA, "
        "Sugiharto et al. 2023: 3 with --encodings rcmha; default: none)",
    )
    add(
        "--qk-norm",
        help="rms: RMS-normalise q and k per head in every layer (TRA's layer, Opper et al. "
        "2025; default: off)",
    )
    add(
        "--init",
        help="the model's init: fan-in (TransformerLM's default) or gpt2 (GPT-2's, the "
        "default of runs recorded before fan-in was)",
    )
    add(
        "--head",
        help="untied (an output layer of its own, TransformerLM's default) or tied (logits "
        "from the token embedding, the head of runs recorded before untied was the default)",
    )
    add("--data", help="UTF-8 text file or folder of *.txt (default: built-in Shakespeare)")
    add("--tokenizer", default="bytes", help="bytes (default) or bpe")
    add("--bpe-vocab-size", default="2048", help="vocabulary of --tokenizer bpe (> 256)")
    add("--split", default="test", help="evaluation split: test (default) or valid")
    add("--seed", default="0", help="first seed of the model init and the batches (default 0)")
    add("--out", help="run folder (default runs/extrapolate-PROFILE)")
    add("--resume", action="store_true", help="continue the run in --out")
    add("--force", action="store_true", help="replace the run in --out")
    add("--no-progress", action="store_true", help="no progress bars")


def _print_plan(plan: EvalPlan) -> None:
    corpus, profile = plan.source, plan.profile
    budget = ", ".join(f"{m} {n:,}" for m, n in plan.max_tokens.items())
    print(
        f"relpos extrapolate, profile {profile.name}: {len(plan.encodings)} encodings "
        f"({', '.join(plan.encodings)})"
    )
    print(
        f"  model: TransformerLM dim {profile.dim}, depth {profile.depth}, "
        f"{profile.num_heads} heads"
        + ("" if profile.qkv_conv is None else f", q/k/v convolutions K={profile.qkv_conv}")
        + ("" if profile.qk_norm is None else f", q/k norm {profile.qk_norm}")
        + f", {profile.init} init, {'tied' if profile.tie_embedding else 'untied'} head"
        + f"; {plan.steps} steps x batch {profile.batch_size} x "
        f"L={plan.train_len} on {corpus.name} ({corpus.tokenizer}, "
        f"{corpus.train.numel():,} train tokens)"
    )
    print(
        f"  eval: lengths {', '.join(map(str, plan.eval_lengths))} on the {plan.split} split, "
        f"scored tokens per length: {budget}"
    )
    print(
        f"  estimated time: ~{plan.estimate_seconds() / 60:.1f} min on a quiet 2-core CPU "
        f"(this machine: {os.cpu_count()} CPUs); out: {plan.out_dir}"
    )


def run_command(args: argparse.Namespace) -> int:
    """``relpos extrapolate``: every flag checked (``plan_extrapolation``) before the data is
    loaded or anything written; then train, evaluate, report. Here the flags' text only
    becomes numbers; their ranges are checked once, by the plan (in the flags' names)."""
    t0 = time.perf_counter()
    profile = get_profile(args.profile)
    argv = getattr(args, "argv", None)
    command = "relpos " + (shlex.join(argv) if argv else "extrapolate")
    meta: dict = {}

    def on_plan(plan: EvalPlan) -> None:
        _print_plan(plan)
        corpus = plan.source
        meta.update(
            report.run_metadata(
                command=command,
                profile=profile.name,
                seed=plan.seed,
                corpus={
                    "name": corpus.name,
                    "tokenizer": corpus.tokenizer,
                    "vocab_size": corpus.vocab_size,
                    "documents": corpus.documents,
                    "tokens": {
                        s: int(getattr(corpus, s).numel()) for s in ("train", "valid", "test")
                    },
                },
                eval={
                    "split": plan.split,
                    "lengths": plan.eval_lengths,
                    "modes": plan.modes,
                    "max_tokens": plan.max_tokens,
                    "starts": plan.starts,
                },
            )
        )
        note = missing_plot_note(PLOT_FILE)
        if note:
            print(f"  {note}")

    overrides = training_overrides(args)
    steps = overrides.pop("steps", None)
    qkv_conv = optional_int(getattr(args, "qkv_conv", None), "--qkv-conv")
    if qkv_conv is not None:
        overrides["qkv_conv"] = qkv_conv
    qk_norm = getattr(args, "qk_norm", None)
    if qk_norm is not None:
        overrides["qk_norm"] = check_choice(qk_norm, "--qk-norm", ("rms",))
    init = getattr(args, "init", None)
    if init is not None:
        overrides["init"] = check_choice(init, "--init", INIT_SCHEMES)
    head = getattr(args, "head", None)
    if head is not None:
        overrides["tie_embedding"] = check_choice(head, "--head", ("tied", "untied")) == "tied"
    profile = dataclasses.replace(profile, **overrides)
    if profile.dim % profile.num_heads:
        raise ValueError(
            f"--dim ({profile.dim}) must be divisible by --heads ({profile.num_heads})"
        )
    seeds = seeds_flag(args, 1)
    first_seed = parse_int(args.seed, "--seed", minimum=None)
    out = Path(args.out or f"runs/extrapolate-{profile.name}")
    # --seeds N > 1: one standard run folder per seed (out/seed<K>), the report over all
    # seeds in out/; every folder is checked before the first one is written
    folders = [out] if seeds == 1 else [out / f"seed{first_seed + k}" for k in range(seeds)]
    if seeds > 1:
        check_output_dir(out, "--out")
        for folder in folders:
            check_out_dir(folder, resume=args.resume, force=args.force)
    rows: list[dict] = []
    try:
        for k, folder in enumerate(folders):
            if seeds > 1:
                print(f"seed {first_seed + k} ({k + 1}/{seeds}) into {folder}")
            rows += run_extrapolation(
                profile.encodings if args.encodings is None else args.encodings,
                train_len=parse_int(args.train_len, "--train-len", minimum=None),
                eval_mults=args.eval_mult,
                profile=profile,
                data=args.data,
                tokenizer=args.tokenizer,
                bpe_vocab_size=parse_int(args.bpe_vocab_size, "--bpe-vocab-size", minimum=None),
                out_dir=folder,
                resume=args.resume,
                force=args.force,
                seed=first_seed + k,
                steps=steps,
                split=args.split,
                progress=not args.no_progress,
                meta={"command": command},
                on_plan=on_plan if k == 0 else None,
            )
    except KeyboardInterrupt as stop:
        hint = resume_command(getattr(args, "argv", None), "extrapolate")
        print(f"relpos: interrupted; continue with: {hint}", file=sys.stderr)
        return exit_code(getattr(stop, "signum", None))
    meta["wall_seconds"] = time.perf_counter() - t0
    meta["seeds"] = [first_seed + k for k in range(seeds)]
    paths = report.write_report(out, rows, meta)
    report.print_table(rows)
    print(f"wall time {meta['wall_seconds']:.0f} s")
    if "png" not in paths:
        print(missing_plot_note(PLOT_FILE))
    print(f"report: {paths['md']}")
    return 0
