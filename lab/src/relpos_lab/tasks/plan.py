"""What a ``relpos tasks`` run does, resolved and validated before anything is written, for
every suite.

``plan_tasks(suite, ...) -> TaskPlan``: the suite (``get_suite``), its profile with the
command line's overrides, the tasks, the model specs of each task (``Suite.parse_model``:
registry names checked, the suite's variant allowed, the model buildable), the seeds,
``--jobs``, the output folder (``relpos_lab.report.check_run_folder``), one job per task x
model x seed in ``OUT/TASK/MODEL/seedK`` and, on ``--resume``, ``run.json`` and every
checkpoint (``checkpoint.verify_checkpoint``, the config compared), all in one pass; nothing
is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relpos.optional import require
from relpos.validation import check_int

from ..arguments import parse_names
from ..report import check_run_folder
from ..training import checkpoint as ckpt
from .jobs import SCHEDULES, load_result
from .length_suites import LENGTH_SUITES
from .multiview_suite import MULTIVIEW
from .profiles import TaskProfile, check_suite, get_task_profile
from .suite import ModelSpec, Suite

__all__ = ["TaskPlan", "plan_tasks", "get_suite", "RUN_FILE", "RUN_KIND"]

RUN_FILE = "run.json"
RUN_KIND = "relpos-tasks"
_SUITES: dict[str, Suite] = {**LENGTH_SUITES, MULTIVIEW.name: MULTIVIEW}


def get_suite(name: str) -> Suite:
    """The suite called ``name``; ``ValueError`` naming ``--suite`` and the known ones."""
    check_suite(name)
    return _SUITES[name]


@dataclass
class TaskPlan:
    """One run: the suite, its profile (with overrides), the jobs in order, where they go.
    ``models``: every model spec of the run (the union over tasks), ``task_models`` those of
    each task."""

    suite: Suite
    profile: TaskProfile
    tasks: list[str]
    models: list[str]
    seeds: int
    jobs: list[Any]
    out_dir: Path
    workers: int
    resume: bool = False
    clear: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    task_models: dict[str, list[str]] = field(default_factory=dict)
    #: the first seed (``--first-seed``): jobs train seeds ``first_seed .. first_seed + seeds - 1``
    first_seed: int = 0
    #: per job, the training steps already done (``--resume``; empty: none)
    done_steps: list[int] = field(default_factory=list)

    def settings(self) -> dict[str, Any]:
        """What must match for ``--resume`` to continue this run."""
        return {**self.suite.settings(self.profile), "profile": self.profile.name}

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


def _names(value: str | Sequence[str], flag: str) -> list[str]:
    """Comma-separated names (or a list of them), at least one, duplicates dropped."""
    items = parse_names(value, flag) if isinstance(value, str) else list(value)
    if not items:
        raise ValueError(f"{flag} is empty")
    return list(dict.fromkeys(items))


def _tasks(value: str | Sequence[str] | None, suite: Suite, profile: TaskProfile) -> list[str]:
    if value is None:
        return list(profile.tasks)
    items = _names(value, "--tasks")
    unknown = [t for t in items if t not in suite.tasks]
    if unknown:
        raise ValueError(
            f"--tasks: unknown {suite.name} task{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; known: {', '.join(suite.tasks)}"
        )
    return items


def _profile(suite: Suite, name: str, overrides: dict[str, Any]) -> TaskProfile:
    """The profile ``name`` of ``suite`` with ``overrides`` (profile fields), checked."""
    prof = get_task_profile(suite.name, name)
    fields = {f.name for f in dataclasses.fields(TaskProfile)}
    bad = [k for k in overrides if k not in fields]
    if bad:
        raise ValueError(f"unknown profile fields {bad}")
    suite.check_overrides(overrides)
    prof = dataclasses.replace(prof, **overrides)
    if prof.dim % prof.num_heads:
        raise ValueError(f"--dim ({prof.dim}) must be divisible by --heads ({prof.num_heads})")
    suite.check_profile(prof)
    if prof.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {prof.schedule!r}")
    if prof.warmup >= prof.steps:
        prof = dataclasses.replace(prof, warmup=max(0, prof.steps // 10))
    return prof


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
    --steps --train-len --test-lengths --eval-size``. ``encodings`` (given) apply to every
    task; by default each task trains its profile models. Seeds ``first_seed .. first_seed +
    seeds - 1`` (``--first-seed``: later seeds into a run folder, or a run of its own to set
    beside an earlier one)."""
    found = get_suite(suite)
    overrides = dict(overrides or {})
    prof = _profile(found, profile, overrides)
    names = _tasks(tasks, found, prof)
    task_models = {
        task: _names(prof.models_for(task) if encodings is None else encodings, "--encodings")
        for task in names
    }
    parsed: dict[str, ModelSpec] = {}
    for spec in (s for specs in task_models.values() for s in specs):
        if spec not in parsed:
            parsed[spec] = found.parse_model(spec, prof)
    # each task's models as the run names them (``rope+default`` is ``rope``), once each
    task_models = {
        t: list(dict.fromkeys(parsed[s].spec for s in specs)) for t, specs in task_models.items()
    }
    models = {m.spec: m for m in parsed.values()}
    found.check_plan(prof, names, list(models.values()))
    seeds = prof.seeds if seeds is None else check_int(seeds, "--seeds")
    first_seed = check_int(first_seed, "--first-seed", minimum=0)
    cpus = os.cpu_count() or 1
    workers = min(2, cpus) if workers is None else check_int(workers, "--jobs")
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
    jobs = [
        found.make_job(prof, task, models[spec], seed, out / task / spec / f"seed{seed}")
        for task in names
        for spec in task_models[task]
        for seed in range(first_seed, first_seed + seeds)
    ]
    plan = TaskPlan(
        suite=found,
        profile=prof,
        tasks=names,
        models=list(models),
        seeds=seeds,
        jobs=jobs,
        out_dir=out,
        workers=workers,
        resume=resume,
        clear=clear,
        overrides=overrides,
        task_models=task_models,
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
    mismatched checkpoint is a ``ValueError`` naming its folder."""
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
    before anything is written; note the steps each job has done."""
    check_resume_settings(plan.out_dir, plan.settings())
    plan.done_steps = [0] * len(plan.jobs)
    for index, job in enumerate(plan.jobs):
        step = checkpoint_step(job)
        if step is None:
            continue
        done = load_result(Path(job.folder), job) is not None
        plan.done_steps[index] = job.steps if done else step
