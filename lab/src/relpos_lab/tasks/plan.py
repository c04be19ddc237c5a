"""What a ``relpos tasks`` run does, resolved and validated before anything is written.

``plan_tasks(...) -> TaskPlan``: the suite, its profile with the command line's overrides,
the tasks, the model specs (``NAME[+SCHEME]``: registry names checked, the scheme allowed for
the suite and the encoding, ``relpos_lab.tasks.models.check_encoding_for_tasks``), the seeds,
``--jobs``, the output folder (``relpos_lab.report.check_run_folder``) and, on ``--resume``,
``run.json`` and every checkpoint (``checkpoint.verify_checkpoint``, the config compared),
all in one pass; nothing is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relpos import registry
from relpos.optional import require
from relpos.validation import check_int

from ..arguments import parse_names
from ..report import check_run_folder
from ..training import checkpoint as ckpt
from .chomsky import CHOMSKY_TASKS
from .jobs import SCHEDULES, Job
from .models import POSITION_SCHEMES, check_encoding_for_tasks
from .nope_study import NOPE_TASKS
from .profiles import SUITES, TaskProfile, get_task_profile

__all__ = ["TaskPlan", "plan_tasks", "parse_models", "RUN_FILE", "RUN_KIND", "SUITE_TASKS"]

RUN_FILE = "run.json"
RUN_KIND = "relpos-tasks"
SUITE_TASKS = {
    "chomsky": tuple(CHOMSKY_TASKS),
    "nope": tuple(NOPE_TASKS),
    "coupling": ("addition",),
}
#: SCAN's fixed length split (the NoPE study): targets of <= 25 actions train, 26-48 test
SCAN_TRAIN_LEN, SCAN_TEST_LENGTHS = 25, tuple(range(26, 49))
#: the position schemes each suite can train with
SUITE_SCHEMES = {
    "chomsky": ("default", "random"),
    "nope": ("default", "random", "random-start"),
    "coupling": ("default", "random", "random-start", "coupled"),
}


@dataclass
class TaskPlan:
    """One run: the profile (with overrides), the jobs in order, where they go."""

    suite: str
    profile: TaskProfile
    tasks: list[str]
    models: list[str]
    seeds: int
    jobs: list[Job]
    out_dir: Path
    workers: int
    resume: bool = False
    clear: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    #: the first seed (``--first-seed``): jobs train seeds ``first_seed .. first_seed + seeds - 1``
    first_seed: int = 0
    #: per job, the training steps already done (``--resume``; empty: none)
    done_steps: list[int] = field(default_factory=list)

    def settings(self) -> dict[str, Any]:
        """What must match for ``--resume`` to continue this run."""
        return {**self.profile.settings(), "profile": self.profile.name}

    def cpu_seconds(self) -> float:
        """CPU seconds of the training left to do (``profile.seconds_per_step`` per step;
        on ``--resume`` finished jobs and checkpointed steps are not counted)."""
        done = sum(self.done_steps) if self.done_steps else 0
        return self.profile.seconds_per_step * (self.profile.steps * len(self.jobs) - done)

    def estimate_seconds(self, cpus: int | None = None) -> float:
        """Wall seconds of ``cpu_seconds`` in ``workers`` one-thread processes on ``cpus``
        free cores (default ``os.cpu_count()``); a shared machine is slower by its load."""
        cpus = cpus or os.cpu_count() or 1
        workers = max(1, min(self.workers, self.jobs_left(), cpus))
        return self.cpu_seconds() / workers

    def jobs_left(self) -> int:
        """How many jobs still have training steps to do."""
        if not self.done_steps:
            return len(self.jobs)
        return sum(done < job.steps for done, job in zip(self.done_steps, self.jobs, strict=True))


def parse_models(value: str | Sequence[str], suite: str) -> list[tuple[str, str, str]]:
    """``"rope,rope+random"`` -> ``[(spec, encoding, scheme), ...]``; names checked against
    the registry, schemes against the suite."""
    items = parse_names(value, "--encodings") if isinstance(value, str) else list(value)
    if not items:
        raise ValueError("--encodings is empty")
    known = registry.available()
    out = []
    for spec in dict.fromkeys(items):
        name, _, scheme = spec.partition("+")
        scheme = scheme or "default"
        if name not in known and name not in registry.aliases():
            raise ValueError(
                f"--encodings: unknown encoding {name!r}; known encodings: {', '.join(known)}"
            )
        if scheme not in POSITION_SCHEMES:
            raise ValueError(
                f"--encodings: unknown position scheme {scheme!r} in {spec!r}; schemes: "
                f"{', '.join(s for s in POSITION_SCHEMES if s != 'default')} (NAME+SCHEME)"
            )
        if scheme not in SUITE_SCHEMES[suite]:
            raise ValueError(
                f"--encodings: {spec!r}: the {suite} suite trains with "
                f"{', '.join(SUITE_SCHEMES[suite])} positions, not {scheme!r}"
            )
        check_encoding_for_tasks(name, scheme, causal=suite != "chomsky")
        out.append((spec if scheme != "default" else name, name, scheme))
    return out


def _tasks(value: str | Sequence[str] | None, suite: str, profile: TaskProfile) -> list[str]:
    if value is None:
        return list(profile.tasks)
    items = parse_names(value, "--tasks") if isinstance(value, str) else list(value)
    unknown = [t for t in items if t not in SUITE_TASKS[suite]]
    if unknown:
        raise ValueError(
            f"--tasks: unknown {suite} task{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; known: {', '.join(SUITE_TASKS[suite])}"
        )
    return list(dict.fromkeys(items))


def plan_tasks(
    suite: str,
    *,
    tasks: str | Sequence[str] | None = None,
    encodings: str | Sequence[str] | None = None,
    profile: str = "quick",
    seeds: int | None = None,
    first_seed: int = 0,
    out_dir: str | os.PathLike,
    resume: bool = False,
    force: bool = False,
    workers: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> TaskPlan:
    """Resolve and validate a run (``ValueError`` / ``TypeError`` naming the flag); writes
    nothing. ``overrides``: profile fields from ``--dim --depth --heads --batch --lr
    --steps``. Seeds ``first_seed .. first_seed + seeds - 1`` (``--first-seed``: later seeds
    into a run folder, or a run of its own to set beside an earlier one)."""
    if suite not in SUITES:
        raise ValueError(f"--suite must be one of {', '.join(SUITES)}, got {suite!r}")
    prof = get_task_profile(suite, profile)
    overrides = dict(overrides or {})
    fields = {f.name for f in dataclasses.fields(TaskProfile)}
    bad = [k for k in overrides if k not in fields]
    if bad:
        raise ValueError(f"unknown profile fields {bad}")
    prof = dataclasses.replace(prof, **overrides)
    if prof.dim % prof.num_heads:
        raise ValueError(f"--dim ({prof.dim}) must be divisible by --heads ({prof.num_heads})")
    if min(prof.test_lengths) <= prof.train_len:
        raise ValueError(
            f"--test-lengths must all be longer than --train-len ({prof.train_len}), got "
            f"{min(prof.test_lengths)}"
        )
    if prof.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {prof.schedule!r}")
    if prof.warmup >= prof.steps:
        prof = dataclasses.replace(prof, warmup=max(0, prof.steps // 10))
    names = _tasks(tasks, suite, prof)
    models = parse_models(prof.models if encodings is None else encodings, suite)
    seeds = prof.seeds if seeds is None else check_int(seeds, "--seeds")
    first_seed = check_int(first_seed, "--first-seed", minimum=0)
    cpus = os.cpu_count() or 1
    workers = min(2, cpus) if workers is None else check_int(workers, "--jobs")
    if suite == "chomsky" and any(s == "random" for _, _, s in models):
        longest = max(prof.test_lengths)
        from .chomsky import chomsky_task

        need = max(
            chomsky_task(t).input_length(longest) + chomsky_task(t).output_length(longest)
            for t in names
        )
        if need > prof.max_length:
            raise ValueError(
                f"randomized positions are drawn from [0, {prof.max_length}), but the longest "
                f"test sequence has {need} tokens (input + outputs); fewer test lengths or a "
                "larger max_length"
            )
    out = Path(out_dir)
    clear = check_run_folder(
        out,
        resume=resume,
        force=force,
        run_file=RUN_FILE,
        run_kind=RUN_KIND,
        what="relpos tasks run",
    )
    require("relpos tasks", {"safetensors": "the checkpoints"})
    jobs = []
    for task in names:
        train_len, test_lengths = prof.train_len, list(prof.test_lengths)
        if task == "scan":
            train_len, test_lengths = SCAN_TRAIN_LEN, list(SCAN_TEST_LENGTHS)
        for spec, name, scheme in models:
            for seed in range(first_seed, first_seed + seeds):
                jobs.append(
                    Job(
                        suite=suite,
                        task=task,
                        model=spec,
                        encoding=name,
                        scheme=scheme,
                        seed=seed,
                        dim=prof.dim,
                        depth=prof.depth,
                        num_heads=prof.num_heads,
                        batch_size=prof.batch_size,
                        steps=prof.steps,
                        lr=prof.lr,
                        warmup=prof.warmup,
                        train_len=train_len,
                        test_lengths=test_lengths,
                        eval_size=prof.eval_size,
                        optimizer=prof.optimizer,
                        weight_decay=prof.weight_decay,
                        schedule=prof.schedule,
                        grad_clip=prof.grad_clip,
                        dropout=prof.dropout,
                        mlp_ratio=prof.mlp_ratio,
                        max_length=prof.max_length,
                        max_position=prof.max_position,
                        checkpoint_every=prof.checkpoint_every,
                        encoding_options=dict(prof.encoding_options.get(name, {})),
                        folder=str(out / task / spec / f"seed{seed}"),
                    )
                )
    plan = TaskPlan(
        suite=suite,
        profile=prof,
        tasks=names,
        models=[m[0] for m in models],
        seeds=seeds,
        jobs=jobs,
        out_dir=out,
        workers=workers,
        resume=resume,
        clear=clear,
        overrides=overrides,
        first_seed=first_seed,
    )
    if resume and out.exists():
        _check_resume(plan)
    return plan


def check_resume_settings(out_dir: str | Path, settings: dict[str, Any]) -> None:
    """Refuse ``--resume`` into a run folder whose recorded settings differ from
    ``settings`` (each difference named), before anything is written."""
    from ..extrapolate.plan import read_run_file

    recorded = read_run_file(out_dir).get("settings", {})
    diffs = [
        f"{k} {recorded[k]!r} -> {v!r}"
        for k, v in settings.items()
        if k in recorded and recorded[k] != v
    ]
    if diffs:
        raise ValueError(
            f"--resume: {out_dir} holds a run with other settings ({'; '.join(diffs)}); "
            "use --force to start over or another --out"
        )


def checkpoint_step(job: Any) -> int | None:
    """The step of ``job``'s checkpoint (None when it has none), after checking that it
    loads, was trained with ``job.key()`` and is not past ``job.steps``; a corrupt or
    mismatched checkpoint is a ``ValueError`` naming its folder. ``job`` is a tasks ``Job``
    or a multiview job (``folder``, ``steps``, ``key()``)."""
    folder = Path(job.folder)
    if not ckpt.has_checkpoint(folder):
        return None
    state = ckpt.verify_checkpoint(folder)
    saved = dict(state["config"])
    saved.pop("folder", None)
    saved.pop("checkpoint_every", None)
    if json.loads(json.dumps(saved)) != job.key():
        raise ValueError(
            f"--resume: the checkpoint in {folder} was trained with another config; use "
            "--force to start over"
        )
    if state["step"] > job.steps:
        raise ValueError(
            f"--resume: the checkpoint in {folder} is at step {state['step']}, past "
            f"--steps {job.steps}"
        )
    return int(state["step"])


def _check_resume(plan: TaskPlan) -> None:
    """Refuse ``--resume`` into a run with other settings, or with a corrupt checkpoint,
    before anything is written."""
    check_resume_settings(plan.out_dir, plan.settings())
    from .jobs import load_result

    plan.done_steps = [0] * len(plan.jobs)
    for index, job in enumerate(plan.jobs):
        step = checkpoint_step(job)
        if step is None:
            continue
        done = load_result(Path(job.folder), job) is not None
        plan.done_steps[index] = job.steps if done else step
