"""The multiview suite of ``relpos tasks``: do relative camera encodings keep their accuracy
under a rigid change of the test scenes where absolute Plücker rays do not? (Relative against
absolute camera conditioning, as compared by Li et al. 2025, "Cameras as Relative Positional
Encoding", arXiv 2507.10496.)

Two tasks on the synthetic scenes of ``relpos_lab.tasks.scenes``: cross-view correspondence
(``correspondence``: ``relpos_lab.tasks.correspondence``, top-1 accuracy) and target-feature
regression (``nvs``: ``relpos_lab.tasks.nvs``, NMSE), each scored on the same test scenes
under every condition of ``correspondence.CONDITIONS`` (in distribution, a random rigid
change, another reference camera, a strength sweep). ``MultiviewSuite`` is what the suite
supplies to the shared pipeline (``suite.Suite``): model specs ``NAME[+PLUCKER]`` checked at
the profile's head size, the job (``MultiviewJob``), the training batch, the models, the
evaluation per condition and its rows; the report is ``multiview_report``, the profiles are
``profiles.PROFILES["multiview"]``. ``--train-len`` and ``--test-lengths`` do not apply;
``--eval-size`` is the number of test scenes per condition.

Training scenes are drawn from ``(seed, step)`` (``scene_seed``), and so is the rigid change
of ``plucker-aug``, so ``--resume`` continues bit for bit; the test scenes and their rigid
changes are the same for every model of a run (``jobs.EVAL_SEED``), so conditions and models
are compared on paired data. Training: AdamW with weight decay on every weight matrix (the
encodings' included), linear warmup, then cosine to ``lr / 10``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from . import multiview_report
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
from .jobs import EVAL_SEED, training_columns
from .nvs import FeatureRegressionModel, NMSESums, appearance, hide_targets, regression_loss
from .profiles import TaskProfile
from .suite import JobRecord, ModelSpec, Suite

__all__ = [
    "MultiviewSuite",
    "MULTIVIEW",
    "MultiviewJob",
    "train_scenes",
    "eval_scenes",
    "scene_seed",
    "new_model",
    "evaluate_job",
    "job_rows",
    "TASKS",
]

EVAL_BATCH = 256
TASK = "correspondence"
NVS = "nvs"
TASKS = (TASK, NVS)


@dataclass(kw_only=True)
class MultiviewJob(JobRecord):
    """One model of the multiview suite (plain JSON: the checkpoint's ``config``): the shared
    ``JobRecord`` fields, ``plucker`` the model spec's absolute Plücker embedding (None: none),
    ``scene`` the ``scenes.make_scenes`` options, ``eval_scenes`` test scenes per condition
    and the test ``conditions``."""

    task: str = TASK
    plucker: str | None
    eval_scenes: int
    scene: dict[str, Any]
    conditions: list[str]
    #: the suite's optimizer and learning-rate shape (``jobs.make_optimizer``,
    #: ``jobs.learning_rate``), the same for every job, so not in the JSON
    optimizer: ClassVar[str] = "adamw"
    schedule: ClassVar[str] = "cosine"

    @property
    def image(self) -> int:
        """Image side in pixels."""
        return int(self.scene.get("image", 32))

    @property
    def grid(self) -> int:
        """Patches per image side."""
        return int(self.scene.get("grid", 4))

    @property
    def feat_dim(self) -> int:
        """Token feature width: the palette and the background."""
        return int(self.scene.get("palette", 6)) + 1


# ------------------------------------------------------------------------------ data


def scene_seed(*parts: int) -> int:
    """A 63-bit seed from integers (numpy's SeedSequence: independent streams)."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


def train_scenes(job: MultiviewJob, step: int) -> dict[str, torch.Tensor]:
    """The training batch of ``step``: scenes and (``plucker-aug``) a rigid world change,
    both from ``(seed, step)`` only."""
    scene = multiview.make_scenes(job.batch_size, seed=scene_seed(0, job.seed, step), **job.scene)
    if job.plucker == "plucker-aug":
        gen = torch.Generator().manual_seed(scene_seed(1, job.seed, step))
        G = condition_transform("rigid", job.batch_size, gen)
        assert G is not None
        scene = multiview.apply_world_transform(scene, G, job.image)
    return scene


def eval_scenes(job: MultiviewJob) -> dict[str, torch.Tensor]:
    """The test scenes, the same for every model of a run."""
    return multiview.make_scenes(job.eval_scenes, seed=scene_seed(2, EVAL_SEED), **job.scene)


def _slice(scene: dict[str, torch.Tensor], a: int, b: int) -> dict[str, torch.Tensor]:
    return {k: v[a:b] for k, v in scene.items()}


# ------------------------------------------------------------------------------ model


def new_model(job: MultiviewJob) -> MultiviewEncoder:
    """The task's model (``CorrespondenceModel`` or ``FeatureRegressionModel``), initialised
    from torch's global generator (``MultiviewSuite.build_model`` seeds it first)."""
    model = FeatureRegressionModel if job.task == NVS else CorrespondenceModel
    return model(
        job.feat_dim,
        dim=job.dim,
        depth=job.depth,
        num_heads=job.num_heads,
        encoding=job.encoding,
        plucker=job.plucker,
        mlp_ratio=job.mlp_ratio,
        grid=job.grid,
        image=job.image,
    )


# ------------------------------------------------------------------------------ evaluation


@torch.no_grad()
def evaluate_job(job: MultiviewJob, model: MultiviewEncoder) -> dict[str, dict[str, float]]:
    """Per condition on the shared test scenes. Correspondence: ``{"accuracy", "hits", "n",
    "appearance"}``, ``appearance`` the expected accuracy of a uniform guess among
    same-colour context tokens (what the colours alone give). Target-feature regression:
    ``{"nmse", "n", "nmse_labelled", "n_labelled", "mse"}`` (``relpos_lab.tasks.nvs``: over
    the target tokens that see a sphere, and over the labelled ones)."""
    scenes = eval_scenes(job)
    out: dict[str, dict[str, float]] = {}
    for index, condition in enumerate(job.conditions):
        gen = torch.Generator().manual_seed(scene_seed(3, EVAL_SEED, index))
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
                grid=job.grid,
                image=job.image,
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
                **training_columns(job, result),
            }
        )
    return rows


# ------------------------------------------------------------------------------ suite


class MultiviewSuite(Suite):
    """``--suite multiview`` (module docstring)."""

    name = "multiview"
    tasks = TASKS
    job_type = MultiviewJob
    result_key = "per_condition"
    loss_tail = 50
    decay_encodings = True
    report = multiview_report

    def check_overrides(self, overrides: dict[str, Any]) -> None:
        for flag in ("train_len", "test_lengths"):
            if flag in overrides:
                raise ValueError(
                    f"--{flag.replace('_', '-')} does not apply to the multiview suite (its "
                    f"test conditions are {', '.join(CONDITIONS)}; --eval-size sets the test "
                    "scenes)"
                )

    def parse_model(self, spec: str, profile: TaskProfile) -> ModelSpec:
        """``parse_model_spec``, then the model built once at the profile's head size (a head
        dim the encoding cannot take is a ``ValueError`` naming ``--encodings``)."""
        model = ModelSpec(spec, *parse_model_spec(spec))
        job = dataclasses.replace(self.make_job(profile, TASK, model, 0, Path()), depth=1)
        try:
            new_model(job)
        except (ValueError, TypeError) as err:
            head = job.dim // job.num_heads
            raise ValueError(
                f"--encodings: {spec!r} cannot run at head dim {head}: {err}"
            ) from None
        return model

    def job_fields(self, profile: TaskProfile, task: str, model: ModelSpec) -> dict[str, Any]:
        return {
            "plucker": model.variant,
            "eval_scenes": profile.eval_size,
            "scene": dict(profile.scene),
            "conditions": list(CONDITIONS),
        }

    def more_settings(self, profile: TaskProfile) -> dict[str, Any]:
        more = {k: getattr(profile, k) for k in ("weight_decay", "grad_clip", "mlp_ratio")}
        return {**more, "eval_scenes": profile.eval_size, "scene": dict(profile.scene)}

    def describe(self, profile: TaskProfile) -> str:
        return (
            f"tested on {profile.eval_size} scenes x {len(CONDITIONS)} conditions "
            f"({', '.join(CONDITIONS)})"
        )

    def build_model(self, job: MultiviewJob, data: None) -> MultiviewEncoder:
        torch.manual_seed(job.seed)
        return new_model(job)

    def vocab_size(self, job: MultiviewJob, data: None) -> int:
        return job.feat_dim

    def batch_loss(
        self,
        job: MultiviewJob,
        data: None,
        model: nn.Module,
        step: int,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, int]:
        """The loss of ``train_scenes(job, step)``; one unit (a batch of scenes) per step."""
        scene = train_scenes(job, step)
        batch = view_batch(scene, model.encoding, job.plucker, grid=job.grid, image=job.image)
        if job.task == NVS:
            target = appearance(scene)[:, batch.context :]
            return regression_loss(model(hide_targets(batch)), target), 1
        return pointer_loss(model(batch), batch.label), 1

    def evaluate(
        self, job: MultiviewJob, data: None, model: nn.Module
    ) -> dict[str, dict[str, float]]:
        return evaluate_job(job, model)

    def rows(self, job: MultiviewJob, result: dict[str, Any]) -> list[dict[str, Any]]:
        return job_rows(job, result)

    def result_text(self, job: MultiviewJob, result: dict[str, Any]) -> str:
        cells = result["per_condition"]
        metric = multiview_report.METRICS[job.task]
        return ", ".join(f"{c} {metric} {cells[c][metric]:.3f}" for c in multiview_report.HEADLINE)


MULTIVIEW = MultiviewSuite()
