"""``relpos tasks --suite multiview``: the experiment of spec camera §5 with its two tasks,
cross-view correspondence (``correspondence``: ``relpos_lab.tasks.correspondence``) and
target-feature regression (``nvs``: ``relpos_lab.tasks.nvs``), with the run-folder
contract of the other suites (``run.json``, one folder ``TASK/MODEL/seedK`` per task x model
x seed with atomic checkpoints and ``result.json``, ``--tasks``, ``--seeds``,
``--first-seed``, ``--resume``, ``--force``, one-line errors; the report in
``multiview_report``).

Profiles (``MULTIVIEW_PROFILES``; every size can be overridden with ``--dim --depth --heads
--batch --lr --steps --seeds``, ``--eval-size`` sets the test scenes per condition):

* ``quick``: correspondence for the spec's seven models (``rope-axial`` alone, world-frame
  Plücker with 2-D RoPE ``rope-axial+plucker``, first-camera ``rope-axial+plucker-first``,
  augmented ``rope-axial+plucker-aug``, ``gta``, ``prope``, ``rayrope-known-depth``) plus
  ``ucpe``, ``cape-6dof`` and no positions (``nope``); target-feature regression for
  ``nope``, ``rope-axial+plucker``, ``prope``, ``gta``, ``ucpe``; 3 seeds; dim 64, depth 2, 2
  heads (head 32: RayRoPE rotates 24 channels, one frequency per coordinate, and passes 8
  through), batch 32 scenes, 1000 steps, AdamW 1e-3; 1000 test scenes per condition. A model
  costs 0.05-0.09 CPU-seconds per step (``time.process_time``, one thread), 2.5-3 minutes
  of wall time on a shared 2-core machine; RayRoPE about 2.3 times that (one attention per
  view: 340-436 s against 147-190 s for ``rope-axial`` in the same run).
  The spec's 4 x 96 model at batch 64 costs about 6 times more per step.
* ``full``: the spec's model (dim 96, depth 4, 2 heads; head 48, RayRoPE with 2 frequencies
  per coordinate), batch 64, 3000 steps, 3 seeds, the same models and tasks.

``--first-seed K`` with ``--seeds N`` runs seeds ``K .. K + N - 1`` (the folders
``seedK``...), e.g. a third seed into a run that has two.

Training scenes are drawn on the fly from ``(seed, step)`` (``_scene_seed``) and the
augmentation's rigid changes from the same pair, so ``--resume`` continues bit for bit;
the test scenes and their rigid changes are the same for every model of a run
(``EVAL_SEED``), so conditions and models are compared on paired data.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from relpos.optional import missing_plot_note, require
from relpos.validation import check_int

from .. import report as lab_report
from ..arguments import optional_int, parse_int, parse_names
from ..training import checkpoint as ckpt
from ..training.profiles import lookup_profile, seeds_flag, training_overrides
from ..training.runtime import exit_code
from . import scenes as multiview
from .correspondence import (
    CONDITIONS,
    CorrespondenceModel,
    MultiviewEncoder,
    appearance_chance,
    condition_transform,
    parse_model_spec,
    pointer_accuracy,
    pointer_loss,
    view_batch,
)
from .jobs import one_thread, train_steps
from .nvs import FeatureRegressionModel, NMSESums, appearance, hide_targets, regression_loss
from .plan import RUN_FILE, RUN_KIND, check_resume_settings, checkpoint_step

__all__ = [
    "MultiviewProfile",
    "MULTIVIEW_PROFILES",
    "MultiviewJob",
    "MultiviewPlan",
    "plan_multiview",
    "run_multiview_job",
    "run_multiview",
    "run_multiview_command",
    "EVAL_SEED",
    "TASKS",
]

EVAL_SEED = 1
EVAL_BATCH = 256
RESULT_FILE = "result.json"
TASK = "correspondence"
NVS = "nvs"
TASKS = (TASK, NVS)


@dataclass(frozen=True)
class MultiviewProfile:
    """One size of the multiview suite. ``models``: the correspondence models,
    ``nvs_models`` the target-feature regression ones, ``tasks`` the default tasks;
    ``scene``: ``multiview.make_scenes`` options (views, points, grid, ...);
    ``eval_scenes``: test scenes per condition."""

    name: str
    models: tuple[str, ...]
    nvs_models: tuple[str, ...]
    dim: int
    depth: int
    num_heads: int
    batch_size: int
    steps: int
    lr: float
    warmup: int
    eval_scenes: int
    seeds: int
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    mlp_ratio: float = 4.0
    checkpoint_every: int = 500
    scene: Mapping[str, Any] = field(default_factory=dict)
    #: measured CPU seconds per training step on one core (for the estimate)
    seconds_per_step: float = 0.07
    tasks: tuple[str, ...] = TASKS

    def task_models(self, task: str) -> tuple[str, ...]:
        return self.nvs_models if task == NVS else self.models

    def settings(self) -> dict[str, Any]:
        """What a run's models depend on (``--resume`` compares it)."""
        keys = ("dim", "depth", "num_heads", "batch_size", "steps", "lr", "warmup")
        keys += ("weight_decay", "grad_clip", "mlp_ratio", "eval_scenes")
        out = {k: getattr(self, k) for k in keys}
        return {"suite": "multiview", **out, "scene": dict(self.scene)}


MULTIVIEW_PROFILES: dict[str, MultiviewProfile] = {
    "quick": MultiviewProfile(
        name="quick",
        models=(
            "nope",
            "rope-axial",
            "rope-axial+plucker",
            "prope",
            "gta",
            "ucpe",
            "cape-6dof",
            "rope-axial+plucker-first",
            "rope-axial+plucker-aug",
            "rayrope-known-depth",
        ),
        nvs_models=("nope", "rope-axial+plucker", "prope", "gta", "ucpe"),
        dim=64,
        depth=2,
        num_heads=2,
        batch_size=32,
        steps=1000,
        lr=1e-3,
        warmup=100,
        eval_scenes=1000,
        seeds=3,
        seconds_per_step=0.07,
    ),
    "full": MultiviewProfile(
        name="full",
        models=(
            "rope-axial",
            "rope-axial+plucker",
            "rope-axial+plucker-first",
            "gta",
            "prope",
            "rope-axial+plucker-aug",
            "rayrope-known-depth",
            "ucpe",
            "cape-6dof",
            "nope",
        ),
        nvs_models=("nope", "rope-axial+plucker", "prope", "gta", "ucpe"),
        dim=96,
        depth=4,
        num_heads=2,
        batch_size=64,
        steps=3000,
        lr=3e-4,
        warmup=200,
        eval_scenes=2000,
        seeds=3,
        checkpoint_every=1000,
        seconds_per_step=0.4,
    ),
}


@dataclass
class MultiviewJob:
    """One task x model x seed (plain JSON: the checkpoint's ``config``)."""

    model: str
    encoding: str
    plucker: str | None
    seed: int
    dim: int
    depth: int
    num_heads: int
    batch_size: int
    steps: int
    lr: float
    warmup: int
    weight_decay: float
    grad_clip: float
    mlp_ratio: float
    eval_scenes: int
    scene: dict[str, Any]
    conditions: list[str]
    checkpoint_every: int = 500
    folder: str = ""
    task: str = TASK

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def key(self) -> dict[str, Any]:
        data = self.to_json()
        data.pop("folder")
        data.pop("checkpoint_every")
        return data


# ------------------------------------------------------------------------------ data


def _scene_seed(*parts: int) -> int:
    """A 63-bit seed from integers (numpy's SeedSequence: independent streams)."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


def train_scenes(job: MultiviewJob, step: int) -> dict[str, torch.Tensor]:
    """The training batch of ``step``: scenes and (``plucker-aug``) a rigid world change,
    both from ``(seed, step)`` only."""
    scene = multiview.make_scenes(job.batch_size, seed=_scene_seed(0, job.seed, step), **job.scene)
    if job.plucker == "plucker-aug":
        gen = torch.Generator().manual_seed(_scene_seed(1, job.seed, step))
        G = condition_transform("rigid", job.batch_size, gen)
        assert G is not None
        scene = multiview.apply_world_transform(scene, G, _image(job))
    return scene


def eval_scenes(job: MultiviewJob) -> dict[str, torch.Tensor]:
    """The test scenes, the same for every model of a run."""
    return multiview.make_scenes(job.eval_scenes, seed=_scene_seed(2, EVAL_SEED), **job.scene)


def _image(job: MultiviewJob) -> int:
    return int(job.scene.get("image", 32))


def _grid(job: MultiviewJob) -> int:
    return int(job.scene.get("grid", 4))


def _slice(scene: dict[str, torch.Tensor], a: int, b: int) -> dict[str, torch.Tensor]:
    return {k: v[a:b] for k, v in scene.items()}


# ------------------------------------------------------------------------------ model


def build_model(job: MultiviewJob) -> MultiviewEncoder:
    """The task's model (``CorrespondenceModel`` or ``FeatureRegressionModel``), seeded."""
    torch.manual_seed(job.seed)
    palette = int(job.scene.get("palette", 6))
    model = FeatureRegressionModel if job.task == NVS else CorrespondenceModel
    return model(
        palette + 1,
        dim=job.dim,
        depth=job.depth,
        num_heads=job.num_heads,
        encoding=job.encoding,
        plucker=job.plucker,
        mlp_ratio=job.mlp_ratio,
        grid=_grid(job),
        image=_image(job),
    )


def learning_rate(job: MultiviewJob, step: int) -> float:
    """Linear warmup, then cosine to ``lr / 10``."""
    if job.warmup and step < job.warmup:
        return job.lr * (step + 1) / job.warmup
    t = min(1.0, (step - job.warmup) / max(1, job.steps - job.warmup))
    return job.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def make_optimizer(job: MultiviewJob, model: nn.Module) -> torch.optim.Optimizer:
    """AdamW, weight decay on the weight matrices only (not norms, biases, GTA's ``s``)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": job.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=job.lr, betas=(0.9, 0.95))


# ------------------------------------------------------------------------------ train / eval


def train_multiview_job(
    job: MultiviewJob, folder: Path, *, resume: bool, progress: bool
) -> tuple[MultiviewEncoder, dict[str, Any]]:
    """Train (or continue) one model; returns it in eval mode and its training record."""
    model = build_model(job)
    opt = make_optimizer(job, model)
    step, losses, elapsed = 0, [], 0.0
    if resume and ckpt.has_checkpoint(folder):
        state = ckpt.load_checkpoint(folder, model, opt)
        step, losses = state["step"], list(state["losses"])
        elapsed = float(state.get("elapsed_seconds", 0.0))

    rng = torch.get_rng_state().tolist()

    def save(at: int, seconds: float) -> None:
        ckpt.save_checkpoint(
            folder,
            model,
            opt,
            {
                "config": job.to_json(),
                "step": at,
                "vocab_size": int(job.scene.get("palette", 6)) + 1,
                "corpus": {"suite": "multiview", "task": job.task},
                # the data are a function of (seed, step) and training reads no RNG; the
                # states are kept for the checkpoint format
                "rng": {"torch": rng, "batch": rng},
                "losses": losses,
                "elapsed_seconds": seconds,
            },
        )

    def batch_loss(at: int) -> tuple[torch.Tensor, int]:
        scene = train_scenes(job, at)
        batch = view_batch(scene, model.encoding, job.plucker, grid=_grid(job), image=_image(job))
        if job.task == NVS:
            target = appearance(scene)[:, batch.context :]
            return regression_loss(model(hide_targets(batch)), target), 1
        return pointer_loss(model(batch), batch.label), 1

    step, seconds = train_steps(
        job,
        model,
        opt,
        step=step,
        elapsed=elapsed,
        losses=losses,
        folder=folder,
        save=save,
        batch_loss=batch_loss,
        lr_at=lambda at: learning_rate(job, at),
        progress=progress,
    )
    tail = losses[-50:]
    return model, {
        "steps": step,
        "final_loss": sum(tail) / max(1, len(tail)),
        "train_seconds": seconds,
    }


@torch.no_grad()
def evaluate_multiview_job(
    job: MultiviewJob, model: MultiviewEncoder
) -> dict[str, dict[str, float]]:
    """Per condition on the shared test scenes. Correspondence: ``{"accuracy", "hits", "n",
    "appearance"}``, ``appearance`` the expected accuracy of a uniform guess among
    same-colour context tokens (the no-camera ceiling of the spec). Target-feature
    regression: ``{"nmse", "n", "nmse_labelled", "n_labelled", "mse"}`` (``relpos_lab.tasks.
    nvs``: over the target tokens that see a sphere, and over the labelled ones)."""
    scenes = eval_scenes(job)
    out: dict[str, dict[str, float]] = {}
    for index, condition in enumerate(job.conditions):
        gen = torch.Generator().manual_seed(_scene_seed(3, EVAL_SEED, index))
        hits = n = 0
        chance = 0.0
        sphere, labelled = NMSESums(), NMSESums()
        for a in range(0, job.eval_scenes, EVAL_BATCH):
            part = _slice(scenes, a, a + EVAL_BATCH)
            batch = view_batch(
                part,
                model.encoding,
                job.plucker,
                condition=condition,
                generator=gen,
                grid=_grid(job),
                image=_image(job),
            )
            if job.task == NVS:
                pred = model(hide_targets(batch))
                target = appearance(part)[:, batch.context :]
                sphere.add(pred, target, part["hit_id"][:, batch.context :] >= 0)
                labelled.add(pred, target, batch.label >= 0)
                continue
            h, m = pointer_accuracy(model(batch), batch.label)
            c, _ = appearance_chance(batch.colour, batch.label)
            hits, n, chance = hits + h, n + m, chance + c
        if job.task == NVS:
            out[condition] = {
                "nmse": sphere.nmse(),
                "n": sphere.n,
                "nmse_labelled": labelled.nmse(),
                "n_labelled": labelled.n,
                "mse": sphere.sse / max(1, sphere.n),
            }
            continue
        out[condition] = {
            "accuracy": hits / max(1, n),
            "hits": hits,
            "n": n,
            "appearance": chance / max(1, n),
        }
    return out


def _load_result(folder: Path, job: MultiviewJob) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != job.key():
        return None
    return data


def run_multiview_job(
    job: MultiviewJob, *, resume: bool, progress: bool = False, log: Callable = print
) -> dict[str, Any]:
    """Train and evaluate one job into ``job.folder`` (``result.json``); with ``resume`` a
    matching result is returned as is and a checkpoint is continued."""
    folder = Path(job.folder)
    if resume:
        cached = _load_result(folder, job)
        if cached is not None:
            log(f"  {job.model} seed {job.seed}: done (resume)")
            return cached
    model, record = train_multiview_job(job, folder, resume=resume, progress=progress)
    t0 = time.perf_counter()
    per_condition = evaluate_multiview_job(job, model)
    record["eval_seconds"] = time.perf_counter() - t0
    result = {"key": job.key(), "train": record, "per_condition": per_condition}
    lab_report.write_json_file(folder / RESULT_FILE, result)
    return result


def multiview_worker(job_data: dict[str, Any], resume: bool) -> dict[str, Any]:
    """Entry point of a worker process: one thread, no progress bar."""
    torch.set_num_threads(1)
    return run_multiview_job(
        MultiviewJob(**job_data), resume=resume, progress=False, log=lambda _: None
    )


# ------------------------------------------------------------------------------ plan


@dataclass
class MultiviewPlan:
    """One run: the profile with overrides, the jobs, where they go. ``models``: every model
    spec of the run (the union over tasks), ``task_models`` those of each task."""

    profile: MultiviewProfile
    models: list[str]
    seeds: int
    jobs: list[MultiviewJob]
    out_dir: Path
    workers: int
    resume: bool = False
    clear: bool = False
    suite: str = "multiview"
    tasks: list[str] = field(default_factory=lambda: [TASK])
    task_models: dict[str, list[str]] = field(default_factory=dict)
    first_seed: int = 0

    def settings(self) -> dict[str, Any]:
        return {**self.profile.settings(), "profile": self.profile.name}

    def estimate_seconds(self) -> float:
        per_job = self.profile.steps * self.profile.seconds_per_step
        return per_job * len(self.jobs) / max(1, self.workers)


def _check_model(prof: MultiviewProfile, spec: str, name: str, plucker: str | None) -> None:
    """Build the model once at the profile's head size (a head dim the encoding cannot take
    is a ``ValueError`` naming ``--encodings``), before any file is written."""
    try:
        CorrespondenceModel(
            int(prof.scene.get("palette", 6)) + 1,
            dim=prof.dim,
            depth=1,
            num_heads=prof.num_heads,
            encoding=name,
            plucker=plucker,
            grid=int(prof.scene.get("grid", 4)),
            image=int(prof.scene.get("image", 32)),
        )
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"--encodings: {spec!r} cannot run at head dim {prof.dim // prof.num_heads}: {err}"
        ) from None


def plan_multiview(
    *,
    encodings: str | Sequence[str] | None = None,
    tasks: str | Sequence[str] | None = None,
    profile: str = "quick",
    seeds: int | None = None,
    first_seed: int = 0,
    out_dir: str | Path,
    resume: bool = False,
    force: bool = False,
    workers: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> MultiviewPlan:
    """Resolve and validate a run (``ValueError`` naming the flag); writes nothing.
    ``encodings`` (given) apply to every task of ``tasks``; by default each task runs its
    profile models. Seeds ``first_seed .. first_seed + seeds - 1``."""
    prof = lookup_profile(MULTIVIEW_PROFILES, profile)
    overrides = dict(overrides or {})
    fields = {f.name for f in dataclasses.fields(MultiviewProfile)}
    bad = [k for k in overrides if k not in fields]
    if bad:
        raise ValueError(f"unknown multiview profile fields {bad}")
    prof = dataclasses.replace(prof, **overrides)
    if prof.dim % prof.num_heads:
        raise ValueError(f"--dim ({prof.dim}) must be divisible by --heads ({prof.num_heads})")
    if prof.warmup >= prof.steps:
        prof = dataclasses.replace(prof, warmup=max(0, prof.steps // 10))
    if tasks is None:
        task_names = list(prof.tasks)
    else:
        task_names = parse_names(tasks, "--tasks") if isinstance(tasks, str) else list(tasks)
        unknown = [t for t in task_names if t not in TASKS]
        if unknown:
            raise ValueError(
                f"--tasks: unknown multiview task {', '.join(map(repr, unknown))}; known: "
                f"{', '.join(TASKS)}"
            )
        if not task_names:
            raise ValueError("--tasks is empty")
    task_names = list(dict.fromkeys(task_names))
    task_models: dict[str, list[str]] = {}
    for task in task_names:
        items = prof.task_models(task) if encodings is None else encodings
        specs = parse_names(items, "--encodings") if isinstance(items, str) else list(items)
        if not specs:
            raise ValueError("--encodings is empty")
        task_models[task] = list(dict.fromkeys(specs))
    every = list(dict.fromkeys(m for specs in task_models.values() for m in specs))
    parsed = {spec: parse_model_spec(spec) for spec in every}
    for spec in every:
        _check_model(prof, spec, *parsed[spec])
    seeds = prof.seeds if seeds is None else check_int(seeds, "--seeds")
    first_seed = check_int(first_seed, "--first-seed", minimum=0)
    workers = 1 if workers is None else check_int(workers, "--jobs")
    out = Path(out_dir)
    clear = lab_report.check_run_folder(
        out, resume=resume, force=force, run_file=RUN_FILE, run_kind=RUN_KIND,
        what="relpos tasks run",
    )  # fmt: skip
    require("relpos tasks", {"safetensors": "the checkpoints"})
    jobs = [
        MultiviewJob(
            model=spec,
            encoding=parsed[spec][0],
            plucker=parsed[spec][1],
            seed=seed,
            dim=prof.dim,
            depth=prof.depth,
            num_heads=prof.num_heads,
            batch_size=prof.batch_size,
            steps=prof.steps,
            lr=prof.lr,
            warmup=prof.warmup,
            weight_decay=prof.weight_decay,
            grad_clip=prof.grad_clip,
            mlp_ratio=prof.mlp_ratio,
            eval_scenes=prof.eval_scenes,
            scene=dict(prof.scene),
            conditions=list(CONDITIONS),
            checkpoint_every=prof.checkpoint_every,
            folder=str(out / task / spec / f"seed{seed}"),
            task=task,
        )
        for task in task_names
        for spec in task_models[task]
        for seed in range(first_seed, first_seed + seeds)
    ]
    plan = MultiviewPlan(
        profile=prof,
        models=every,
        seeds=seeds,
        jobs=jobs,
        out_dir=out,
        workers=workers,
        resume=resume,
        clear=clear,
        tasks=task_names,
        task_models=task_models,
        first_seed=first_seed,
    )
    if resume and out.exists():
        _check_resume(plan)
    return plan


def _check_resume(plan: MultiviewPlan) -> None:
    """Refuse ``--resume`` into a run with other settings or a corrupt checkpoint, before
    anything is written."""
    check_resume_settings(plan.out_dir, plan.settings())
    for job in plan.jobs:
        checkpoint_step(job)


# ------------------------------------------------------------------------------ run


def job_rows(job: MultiviewJob, result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per condition of a job (correspondence: ``accuracy``, ``hits``, ``n``,
    ``appearance``; target-feature regression: ``nmse``, ``n``, ``nmse_labelled``,
    ``n_labelled``, ``mse``)."""
    rows = []
    for condition in job.conditions:
        cell = result["per_condition"].get(condition)
        if cell is None:
            continue
        if job.task == NVS:
            metrics = {k: cell[k] for k in ("nmse", "n", "nmse_labelled", "n_labelled", "mse")}
        else:
            metrics = {k: cell[k] for k in ("accuracy", "hits", "n", "appearance")}
        rows.append(
            {
                "suite": "multiview",
                "task": job.task,
                "model": job.model,
                "encoding": job.encoding,
                "plucker": job.plucker or "",
                "seed": job.seed,
                "condition": condition,
                **metrics,
                "steps": result["train"]["steps"],
                "final_loss": result["train"]["final_loss"],
                "train_seconds": result["train"]["train_seconds"],
                "dim": job.dim,
                "depth": job.depth,
                "heads": job.num_heads,
                "batch": job.batch_size,
                "lr": job.lr,
            }
        )
    return rows


def start_multiview_run(plan: MultiviewPlan, meta: dict[str, Any]) -> None:
    """The first write: clear an old run (``--force``), then ``run.json``."""
    if plan.clear:
        shutil.rmtree(plan.out_dir)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "kind": RUN_KIND,
        "suite": "multiview",
        "profile": plan.profile.name,
        "settings": plan.settings(),
        "tasks": plan.tasks,
        "models": plan.models,
        "seeds": plan.seeds,
        **meta,
    }
    path = plan.out_dir / RUN_FILE
    if plan.resume and path.exists():
        try:
            old = json.loads(path.read_text())
            record["models"] = list(dict.fromkeys(old.get("models", []) + plan.models))
            record["tasks"] = list(dict.fromkeys(old.get("tasks", []) + plan.tasks))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    lab_report.write_json_file(path, record)


def run_multiview(
    plan: MultiviewPlan, *, progress: bool = True, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Train and evaluate every job (``plan.workers`` processes); the rows."""
    from .run import run_parallel

    results: dict[int, dict[str, Any]] = {}

    def done(index: int, result: dict[str, Any]) -> None:
        job = plan.jobs[index]
        results[index] = result
        cells = result["per_condition"]
        metric = "nmse" if job.task == NVS else "accuracy"
        text = ", ".join(
            f"{c} {metric} {cells[c][metric]:.3f}" for c in ("id", "rigid", "ref-swap")
        )
        log(
            f"[{len(results)}/{len(plan.jobs)}] {job.task} {job.model} seed {job.seed}: {text} "
            f"(loss {result['train']['final_loss']:.3f}, "
            f"{result['train']['train_seconds']:.0f} s)"
        )

    if plan.workers <= 1 or len(plan.jobs) <= 1:
        with one_thread():
            for index, job in enumerate(plan.jobs):
                done(index, run_multiview_job(job, resume=plan.resume, progress=progress, log=log))
    else:
        run_parallel(plan, done, multiview_worker)
    rows = []
    for index, job in enumerate(plan.jobs):
        rows.extend(job_rows(job, results[index]))
    return rows


# ------------------------------------------------------------------------------ command


def _print_plan(plan: MultiviewPlan) -> None:
    p = plan.profile
    seeds = f"seeds {plan.first_seed}-{plan.first_seed + plan.seeds - 1}"
    print(
        f"relpos tasks, suite multiview, profile {p.name}: {len(plan.jobs)} models "
        f"({', '.join(plan.tasks)}; {seeds})"
    )
    for task in plan.tasks:
        print(f"  {task}: {', '.join(plan.task_models.get(task, plan.models))}")
    print(
        f"  each: dim {p.dim}, depth {p.depth}, {p.num_heads} heads; {p.steps} steps x batch "
        f"{p.batch_size} scenes, lr {p.lr:g}; tested on {p.eval_scenes} scenes x "
        f"{len(CONDITIONS)} conditions ({', '.join(CONDITIONS)})"
    )
    print(
        f"  {plan.workers} worker process(es); estimated ~{plan.estimate_seconds() / 60:.0f} "
        f"min of CPU time (more on a loaded machine); out: {plan.out_dir}"
    )


def run_multiview_command(args: argparse.Namespace) -> int:
    """``relpos tasks --suite multiview``: every flag checked before anything is written;
    then train, evaluate, report."""
    from . import multiview_report as report

    t0 = time.perf_counter()
    argv = getattr(args, "argv", None)
    command = "relpos " + (shlex.join(argv) if argv else "tasks --suite multiview")
    for flag in ("train_len", "test_lengths"):
        if getattr(args, flag, None) is not None:
            name = "--" + flag.replace("_", "-")
            raise ValueError(
                f"{name} does not apply to the multiview suite (its test conditions are "
                f"{', '.join(CONDITIONS)}; --eval-size sets the test scenes)"
            )
    overrides = training_overrides(args)
    if getattr(args, "eval_size", None) is not None:
        overrides["eval_scenes"] = optional_int(args.eval_size, "--eval-size")
    lookup_profile(MULTIVIEW_PROFILES, args.profile)
    seeds = seeds_flag(args, MULTIVIEW_PROFILES[args.profile].seeds)
    first_seed = getattr(args, "first_seed", None)
    first_seed = 0 if first_seed is None else parse_int(first_seed, "--first-seed", minimum=0)
    workers = optional_int(args.jobs, "--jobs")
    out = Path(args.out or f"runs/tasks-multiview-{args.profile}")
    plan = plan_multiview(
        encodings=args.encodings,
        tasks=args.tasks,
        profile=args.profile,
        seeds=seeds,
        first_seed=first_seed,
        out_dir=out,
        resume=args.resume,
        force=args.force,
        workers=workers,
        overrides=overrides,
    )
    _print_plan(plan)
    note = missing_plot_note(", ".join(f"{t}.png" for t in plan.tasks))
    if note:
        print(f"  {note}")
    meta = lab_report.run_metadata(
        command=command,
        suite="multiview",
        profile=plan.profile.name,
        seeds=plan.seeds,
        workers=plan.workers,
        settings=plan.settings(),
    )
    start_multiview_run(plan, {"command": command})
    try:
        rows = run_multiview(plan, progress=not args.no_progress)
    except KeyboardInterrupt as stop:
        print(f"relpos: interrupted; continue with: {command} --resume", file=sys.stderr)
        return exit_code(getattr(stop, "signum", None))
    meta["wall_seconds"] = time.perf_counter() - t0
    paths = report.write_report(out, rows, meta)
    report.print_table(paths["summary"])
    print(f"wall time {meta['wall_seconds']:.0f} s")
    print(f"report: {paths['md']}")
    return 0
