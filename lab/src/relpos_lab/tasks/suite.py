"""What a suite of ``relpos tasks`` supplies to the pipeline every suite shares.

The pipeline is one path: ``profiles`` (each suite's sizes), ``plan`` (a run resolved and
validated before anything is written, one job per task x model spec x seed), ``jobs`` (train
one job from its checkpoint, evaluate it, keep ``result.json``), ``run`` (``run.json``, the
jobs in one-thread worker processes, the rows), ``report`` (``results.json`` / ``.csv``, the
plots, ``report.md``) and ``command`` (``relpos tasks``). A ``Suite`` is the part that
differs between suites: the tasks and model specs it knows, how a job is made from the
profile, its data, model, loss and evaluation, the rows a result gives, and its report
(``SuiteReport``: summary, tables, plots). ``length_suites`` has ``chomsky``, ``nope`` and
``coupling`` (train short, test long); ``multiview_suite`` has ``multiview`` (camera
encodings under rigid changes of the test scenes); ``plan.get_suite`` finds them by name.

A job is a ``JobRecord``: a dataclass of plain JSON values (``to_json`` is the checkpoint's
``config``; ``key`` what the weights and scores depend on, compared on ``--resume``).
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from .profiles import TaskProfile

__all__ = ["ModelSpec", "JobRecord", "SIZE_FIELDS", "PROFILE_FIELDS", "SuiteReport", "Suite"]


@dataclass(frozen=True)
class ModelSpec:
    """One item of ``--encodings``: ``spec`` as the run names it (folders, rows, the report),
    ``encoding`` the registry name, ``variant`` the suite's addition (a position scheme, an
    absolute Plücker embedding; None or ``"default"`` for none)."""

    spec: str
    encoding: str
    variant: str | None


@dataclass(kw_only=True)
class JobRecord:
    """The fields every suite's job has, and its JSON. A job is one task x model spec x seed
    with every number it depends on, all plain JSON values: ``model`` the spec as the run
    names it, ``encoding`` its registry name, the sizes and training numbers of the profile
    (``PROFILE_FIELDS``), ``folder`` where it is trained. A suite's job subclasses it (a
    keyword-only dataclass too) with the fields of its own data and model, and gives the
    ``optimizer`` and ``schedule`` that ``jobs.make_optimizer`` and ``jobs.learning_rate``
    read (a field, or a class constant)."""

    task: str
    model: str
    encoding: str
    seed: int
    dim: int
    depth: int
    num_heads: int
    batch_size: int
    steps: int
    lr: float
    warmup: int
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    mlp_ratio: float = 4.0
    checkpoint_every: int = 500
    folder: str = ""

    def to_json(self) -> dict[str, Any]:
        """Every field as plain JSON (the checkpoint's ``config``, a worker's argument)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def key(self) -> dict[str, Any]:
        """What the trained weights and the scores depend on (not where they live, nor how
        often they are checkpointed)."""
        data = self.to_json()
        data.pop("folder")
        data.pop("checkpoint_every")
        return data


#: the sizes of a run's models: fields of the profile and of every job, the first settings
SIZE_FIELDS = ("dim", "depth", "num_heads", "batch_size", "steps", "lr", "warmup")
#: the ``JobRecord`` fields a job takes from its run's profile
PROFILE_FIELDS = (*SIZE_FIELDS, "weight_decay", "grad_clip", "mlp_ratio", "checkpoint_every")


class SuiteReport(Protocol):
    """A suite's report module (``length_report``, ``multiview_report``), written by
    ``report.write_report``: the CSV's first columns, the summary, the plot of each task,
    ``report.md`` and the summary in the terminal."""

    CSV_COLUMNS: Sequence[str]

    def summarize(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]: ...

    def plot_file(self, task: str) -> str: ...

    def plot_task(self, path: Path, rows: Sequence[dict[str, Any]], task: str) -> None: ...

    def write_markdown(
        self,
        path: Path,
        rows: Sequence[dict[str, Any]],
        summary: Sequence[dict[str, Any]],
        meta: dict[str, Any],
        plots: Sequence[str],
    ) -> None: ...

    def print_table(self, summary: Sequence[dict[str, Any]], file: Any = None) -> None: ...


class Suite(ABC):
    """One suite of ``relpos tasks``: what the shared plan, jobs, run and report read.

    Attributes: ``name`` (``--suite``), ``tasks`` (the tasks ``--tasks`` may name),
    ``job_type`` (its ``JobRecord`` dataclass, rebuilt from JSON in a worker process),
    ``result_key`` (the field of ``result.json`` that holds the evaluation), ``loss_tail``
    (``final_loss`` is the mean of the last ``loss_tail`` training losses),
    ``decay_encodings`` (AdamW decays the encodings' own weight matrices too) and ``report``
    (its ``SuiteReport``).
    """

    name: str
    tasks: tuple[str, ...]
    job_type: type[JobRecord]
    result_key: str
    loss_tail: int
    decay_encodings: bool = False
    report: SuiteReport

    # ---------------------------------------------------------------------------- plan

    def check_overrides(self, overrides: dict[str, Any]) -> None:
        """Refuse the profile fields given on the command line that the suite does not
        read (a ``ValueError`` naming the flag); by default every field applies."""
        return None

    def check_profile(self, profile: TaskProfile) -> None:
        """Check the profile once the overrides are in (a ``ValueError`` naming the flag)."""
        return None

    @abstractmethod
    def parse_model(self, spec: str, profile: TaskProfile) -> ModelSpec:
        """One ``--encodings`` item, checked (a ``ValueError`` naming ``--encodings``)."""

    def check_plan(
        self, profile: TaskProfile, tasks: Sequence[str], models: Sequence[ModelSpec]
    ) -> None:
        """Check the run as a whole, before anything is written."""
        return None

    def make_job(
        self, profile: TaskProfile, task: str, model: ModelSpec, seed: int, folder: Path
    ) -> JobRecord:
        """The job of one task x model x seed, trained into ``folder``: the ``JobRecord``
        fields from the profile (``PROFILE_FIELDS``), the suite's own from ``job_fields``."""
        shared = {name: getattr(profile, name) for name in PROFILE_FIELDS}
        own = self.job_fields(profile, task, model)
        return self.job_type(
            task=task,
            model=model.spec,
            encoding=model.encoding,
            seed=seed,
            folder=str(folder),
            **shared,
            **own,
        )

    @abstractmethod
    def job_fields(self, profile: TaskProfile, task: str, model: ModelSpec) -> dict[str, Any]:
        """The fields of the suite's job beyond ``JobRecord``'s."""

    def settings(self, profile: TaskProfile) -> dict[str, Any]:
        """What a run's models depend on (``run.json``; ``--resume`` compares it): the suite,
        the sizes (``SIZE_FIELDS``) and ``more_settings``."""
        sizes = {name: getattr(profile, name) for name in SIZE_FIELDS}
        return {"suite": self.name, **sizes, **self.more_settings(profile)}

    @abstractmethod
    def more_settings(self, profile: TaskProfile) -> dict[str, Any]:
        """The settings beyond the sizes that the suite's models depend on."""

    @abstractmethod
    def describe(self, profile: TaskProfile) -> str:
        """How the models are trained and tested, for the plan printed before a run."""

    # ---------------------------------------------------------------------------- job

    def prepare(self, job: Any) -> Any:
        """The data a job reads besides its JSON (built once per job; None by default)."""
        return None

    @abstractmethod
    def build_model(self, job: Any, data: Any) -> nn.Module:
        """The job's model, initialised from ``job.seed``."""

    @abstractmethod
    def vocab_size(self, job: Any, data: Any) -> int:
        """The width of the model's token input (kept in the checkpoint)."""

    @abstractmethod
    def batch_loss(
        self, job: Any, data: Any, model: nn.Module, step: int, generator: torch.Generator
    ) -> tuple[Tensor, int]:
        """``(loss, units)`` of training step ``step``: the data must be a function of
        ``(job.seed, step)`` or of ``generator`` (checkpointed), for a bit-exact resume;
        ``units`` (tokens, scenes) feed the progress bar's rate."""

    @abstractmethod
    def evaluate(self, job: Any, data: Any, model: nn.Module) -> dict[Any, dict[str, float]]:
        """The job's scores (``result.json[result_key]``; keys are written as strings)."""

    # ---------------------------------------------------------------------------- run

    @abstractmethod
    def rows(self, job: Any, result: dict[str, Any]) -> list[dict[str, Any]]:
        """The result's rows of ``results.json`` / ``results.csv``."""

    @abstractmethod
    def result_text(self, job: Any, result: dict[str, Any]) -> str:
        """The scores of one finished job, for the line the run prints."""
