"""The ``relpos tasks`` command, for every suite: its options (``add_arguments``) and
``run_command``, which turns the flags into numbers, calls the façade ``run_tasks`` (plan,
validate, train, evaluate) and writes the suite's report (``report.write_report``)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from relpos.optional import missing_plot_note

from .. import report as lab_report
from ..arguments import optional_int, parse_int, parse_int_list
from ..training.profiles import add_training_arguments, seeds_flag, training_overrides
from ..training.runtime import exit_code, resume_command
from . import report
from .plan import TaskPlan
from .profiles import SUITES, get_task_profile
from .run import run_tasks

__all__ = ["add_arguments", "run_command"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``relpos tasks`` (numbers parsed by ``run_command``, so a bad value is
    one line naming the flag)."""
    add = parser.add_argument
    add("--suite", required=True, help=f"one of {', '.join(SUITES)}")
    add("--tasks", help="comma-separated tasks of the suite (default: the profile's)")
    add(
        "--encodings",
        help="comma-separated NAME[+SCHEME] (schemes: random, random-start, coupled); "
        "default: the profile's",
    )
    add("--profile", default="quick", help="quick (default; minutes per model) or full")
    add_training_arguments(parser)
    add(
        "--train-len", help="longest training length (default: the profile's; SCAN keeps its split)"
    )
    add("--test-lengths", help="test lengths: A-B or comma-separated (default: the profile's)")
    add(
        "--eval-size",
        help="test sequences per length (multiview: test scenes per condition; default: the "
        "profile's)",
    )
    add(
        "--first-seed",
        help="the first seed (with --seeds N: seeds K .. K+N-1; default 0), e.g. a later "
        "seed into a run that has the earlier ones",
    )
    add("--jobs", help="models trained in parallel processes (default: min(2, CPUs))")
    add("--out", help="run folder (default runs/tasks-SUITE-PROFILE)")
    add("--resume", action="store_true", help="continue the run in --out")
    add("--force", action="store_true", help="replace the run in --out")
    add("--no-progress", action="store_true", help="no progress bars")


def _seed_range(plan: TaskPlan) -> str:
    """`` (seeds K-M)`` when ``--first-seed`` moved the seeds off ``0 .. N-1``."""
    if not plan.first_seed:
        return ""
    last = plan.first_seed + plan.seeds - 1
    return f" (seed {last})" if plan.seeds == 1 else f" (seeds {plan.first_seed}-{last})"


def _print_plan(plan: TaskPlan) -> None:
    p = plan.profile
    per_task = [len(plan.task_models.get(t, plan.models)) for t in plan.tasks]
    if all(n == len(plan.models) for n in per_task):
        count = f"{len(plan.tasks)} tasks x {len(plan.models)} models"
    else:
        count = f"{len(plan.tasks)} tasks ({' + '.join(map(str, per_task))} models)"
    print(
        f"relpos tasks, suite {plan.suite.name}, profile {p.name}: {count} x {plan.seeds} "
        f"seeds = {len(plan.jobs)} models" + _seed_range(plan)
    )
    if len(set(map(tuple, plan.task_models.values()))) > 1:
        for task in plan.tasks:
            print(f"  {task}: {', '.join(plan.task_models[task])}")
    else:
        print(f"  tasks: {', '.join(plan.tasks)}")
        print(f"  models: {', '.join(plan.models)}")
    print(
        f"  each: dim {p.dim}, depth {p.depth}, {p.num_heads} heads; {p.steps} steps x batch "
        f"{p.batch_size}, lr {p.lr:g}; {plan.suite.describe(p)}"
    )
    left = plan.jobs_left()
    todo = f" for the {left} left" if left < len(plan.jobs) else ""
    print(
        f"  {plan.workers} worker process(es); estimated ~{plan.estimate_seconds() / 60:.0f} "
        f"min{todo} on {os.cpu_count()} free CPUs (longer on a shared machine); out: "
        f"{plan.out_dir}"
    )


def parse_lengths(text: str, flag: str) -> tuple[int, ...]:
    """``"21-60"`` (inclusive) or ``"15,20,25"``: positive lengths, increasing."""
    text = str(text).strip()
    if "-" in text and "," not in text:
        low, _, high = text.partition("-")
        a, b = parse_int(low, flag), parse_int(high, flag)
        if b < a:
            raise ValueError(f"{flag} must be A-B with A <= B, got {text!r}")
        return tuple(range(a, b + 1))
    return tuple(sorted(set(parse_int_list(text, flag))))


def _length_overrides(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {}
    if getattr(args, "train_len", None) is not None:
        out["train_len"] = parse_int(args.train_len, "--train-len")
    if getattr(args, "test_lengths", None) is not None:
        out["test_lengths"] = parse_lengths(args.test_lengths, "--test-lengths")
    if getattr(args, "eval_size", None) is not None:
        out["eval_size"] = parse_int(args.eval_size, "--eval-size")
    return out


def run_command(args: argparse.Namespace) -> int:
    """``relpos tasks``: every flag checked before anything is written; then train,
    evaluate, report."""
    t0 = time.perf_counter()
    argv = getattr(args, "argv", None)
    command = "relpos " + (shlex.join(argv) if argv else f"tasks --suite {args.suite}")
    get_task_profile(args.suite, args.profile)  # a bad --suite / --profile is one line
    overrides = training_overrides(args)
    overrides.update(_length_overrides(args))
    seeds = seeds_flag(args, get_task_profile(args.suite, args.profile).seeds)
    first_seed = getattr(args, "first_seed", None)
    first_seed = 0 if first_seed is None else parse_int(first_seed, "--first-seed", minimum=0)
    workers = optional_int(args.jobs, "--jobs")
    out = Path(args.out or f"runs/tasks-{args.suite}-{args.profile}")
    meta: dict = {}

    def on_plan(plan: TaskPlan) -> None:
        _print_plan(plan)
        meta.update(
            lab_report.run_metadata(
                command=command,
                suite=plan.suite.name,
                profile=plan.profile.name,
                seeds=plan.seeds,
                workers=plan.workers,
                settings=plan.settings(),
            )
        )
        plots = dict.fromkeys(plan.suite.report.plot_file(t) for t in plan.tasks)
        note = missing_plot_note(", ".join(plots))
        if note:
            print(f"  {note}")

    try:
        plan, rows = run_tasks(
            args.suite,
            out_dir=out,
            tasks=args.tasks,
            encodings=args.encodings,
            profile=args.profile,
            seeds=seeds,
            first_seed=first_seed,
            resume=args.resume,
            force=args.force,
            workers=workers,
            overrides=overrides,
            progress=not args.no_progress,
            meta={"command": command},
            on_plan=on_plan,
        )
    except KeyboardInterrupt as stop:
        hint = resume_command(getattr(args, "argv", None), "tasks")
        print(f"relpos: interrupted; continue with: {hint}", file=sys.stderr)
        return exit_code(getattr(stop, "signum", None))
    meta["wall_seconds"] = time.perf_counter() - t0
    paths = report.write_report(out, rows, meta, plan.suite.report)
    plan.suite.report.print_table(paths["summary"])
    print(f"wall time {meta['wall_seconds']:.0f} s")
    print(f"report: {paths['md']}")
    return 0
