"""One model of a ``relpos tasks`` run, for every suite: train it from its checkpoint,
evaluate it, keep its result.

``run_job(suite, job)`` trains ``job`` (the suite's ``JobRecord``) into ``job.folder`` with
atomic checkpoints through ``relpos_lab.training.checkpoint`` (the model, the optimizer, the
step, the losses, the RNG states), evaluates it (``suite.evaluate``) and writes
``result.json`` there; ``--resume`` returns a result whose ``key`` matches as it is and
continues a checkpoint bit for bit, because the suites draw every training batch from
``(seed, step)`` or from generators whose states are checkpointed.

Training (``train_steps``): the learning rate ``learning_rate`` (linear warmup, then
constant, cosine to ``lr / 10`` or linear to 0), Adam or AdamW with weight decay on the weight
matrices only (``make_optimizer``), global-norm clipping, a checkpoint every
``checkpoint_every`` steps, at the end and on SIGINT / SIGTERM.

Evaluation data do not depend on the model's seed: every model of a run is scored on the same
data, drawn from ``EVAL_SEED``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from relpos.encodings.base import Encoding

from ..report import write_json_file
from ..training import checkpoint as ckpt
from ..training.runtime import Progress, SignalStop
from .suite import Suite

__all__ = [
    "run_job",
    "train_job",
    "train_steps",
    "load_result",
    "learning_rate",
    "make_optimizer",
    "one_thread",
    "training_columns",
    "TRAINING_COLUMNS",
    "RESULT_FILE",
    "EVAL_SEED",
    "SCHEDULES",
]

RESULT_FILE = "result.json"
#: the seed of every suite's evaluation data (the official Chomsky code's ``rng`` seed)
EVAL_SEED = 1
#: the learning-rate shapes after the warmup (``job.schedule``)
SCHEDULES = ("constant", "cosine", "linear")


def learning_rate(job: Any, step: int) -> float:
    """Linear warmup over ``warmup`` steps, then ``constant``, ``cosine`` to ``lr / 10``, or
    ``linear`` to 0 at ``steps`` (the NoPE study's trainer: HF ``polynomial`` with power 1,
    ``configs/trainer/default.jsonnet``)."""
    if job.warmup and step < job.warmup:
        return job.lr * (step + 1) / job.warmup
    if job.schedule == "constant":
        return job.lr
    span = max(1, job.steps - job.warmup)
    t = min(1.0, (step - job.warmup) / span)
    if job.schedule == "linear":
        return job.lr * (1.0 - t)
    if job.schedule == "cosine":
        return job.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
    raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {job.schedule!r}")


def make_optimizer(
    job: Any, model: nn.Module, *, decay_encodings: bool = False
) -> torch.optim.Optimizer:
    """``job.optimizer``: ``adam`` (no decay), or ``adamw`` (betas 0.9, 0.95) with
    ``job.weight_decay`` on the weight matrices only (not norms, biases or scalars) and, unless
    ``decay_encodings``, not on the parameters of the model's encodings."""
    if job.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=job.lr)
    own = set()
    if not decay_encodings:
        own = {id(p) for m in model.modules() if isinstance(m, Encoding) for p in m.parameters()}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in own]
    rest = [p for p in model.parameters() if not (p.dim() >= 2 and id(p) not in own)]
    groups = [
        {"params": decay, "weight_decay": job.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=job.lr, betas=(0.9, 0.95))


def train_steps(
    job: Any,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    *,
    step: int,
    elapsed: float,
    losses: list[float],
    folder: Path,
    save: Callable[[int, float], None],
    batch_loss: Callable[[int], tuple[Tensor, int]],
    lr_at: Callable[[int], float],
    progress: bool,
) -> tuple[int, float]:
    """The training loop of every ``relpos tasks`` job, from ``step`` to ``job.steps``.

    Per step: the learning rate ``lr_at(step)``, ``batch_loss(step) -> (loss, units)``,
    backward, clipping at ``job.grad_clip``, the optimiser step; ``losses`` grows in place.
    ``save(step, seconds)`` checkpoints every ``job.checkpoint_every`` steps, at the end, and
    on SIGINT/SIGTERM, which then raises ``TrainingInterrupted``. The progress bar shows
    units per second. Returns ``(step, training seconds)``, model in eval mode."""
    from ..training.train import TrainingInterrupted

    model.train()
    t0, units, first = time.perf_counter(), 0, step
    with SignalStop() as stop, Progress(progress, job.model, job.steps, step) as bar:
        while step < job.steps:
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            loss, n = batch_loss(step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if job.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), job.grad_clip)
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
            units += n
            seconds = elapsed + time.perf_counter() - t0
            if stop.signum is not None:
                save(step, seconds)
                raise TrainingInterrupted(step, str(folder), stop.signum)
            if job.checkpoint_every and step % job.checkpoint_every == 0 and step < job.steps:
                save(step, seconds)
            if step % 10 == 0 or step == job.steps:
                bar.update(step, losses[-1], units / max(1e-9, time.perf_counter() - t0))
    seconds = elapsed + time.perf_counter() - t0
    if step > first or not ckpt.has_checkpoint(folder):
        save(step, seconds)
    model.eval()
    return step, seconds


def train_job(
    suite: Suite, job: Any, data: Any, folder: Path, *, resume: bool, progress: bool
) -> tuple[nn.Module, dict[str, Any]]:
    """Train (or resume) the job's model; returns it (eval mode) and its training record
    ``{"steps", "final_loss", "train_seconds"}``."""
    model = suite.build_model(job, data)
    opt = make_optimizer(job, model, decay_encodings=suite.decay_encodings)
    gen = torch.Generator().manual_seed(job.seed)
    step, losses, elapsed = 0, [], 0.0
    if resume and ckpt.has_checkpoint(folder):
        state = ckpt.load_checkpoint(folder, model, opt)
        step, losses = state["step"], list(state["losses"])
        elapsed = float(state.get("elapsed_seconds", 0.0))
        torch.set_rng_state(torch.tensor(state["rng"]["torch"], dtype=torch.uint8))
        gen.set_state(torch.tensor(state["rng"]["batch"], dtype=torch.uint8))

    def save(at: int, seconds: float) -> None:
        ckpt.save_checkpoint(
            folder,
            model,
            opt,
            {
                "config": job.to_json(),
                "step": at,
                "vocab_size": suite.vocab_size(job, data),
                "corpus": {"suite": suite.name, "task": job.task},
                "rng": {
                    "torch": torch.get_rng_state().tolist(),
                    "batch": gen.get_state().tolist(),
                },
                "losses": losses,
                "elapsed_seconds": seconds,
            },
        )

    step, seconds = train_steps(
        job,
        model,
        opt,
        step=step,
        elapsed=elapsed,
        losses=losses,
        folder=folder,
        save=save,
        batch_loss=lambda at: suite.batch_loss(job, data, model, at, gen),
        lr_at=lambda at: learning_rate(job, at),
        progress=progress,
    )
    tail = losses[-suite.loss_tail :]
    return model, {
        "steps": step,
        "final_loss": sum(tail) / max(1, len(tail)),
        "train_seconds": seconds,
    }


def load_result(folder: Path, job: Any) -> dict[str, Any] | None:
    """The saved result of ``job`` in ``folder`` if it was made with the same key."""
    try:
        data = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != job.key():
        return None
    return data


def run_job(
    suite: Suite,
    job: Any,
    *,
    resume: bool,
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train and evaluate one job of ``suite`` into ``job.folder``; returns ``{"key",
    "train", suite.result_key}`` (also written to ``result.json``). With ``resume`` a
    matching result is returned as is and a checkpoint is continued."""
    folder = Path(job.folder)
    if resume:
        cached = load_result(folder, job)
        if cached is not None:
            log(f"  {job.task} {job.model} seed {job.seed}: done (resume)")
            return cached
    data = suite.prepare(job)
    model, record = train_job(suite, job, data, folder, resume=resume, progress=progress)
    t0 = time.perf_counter()
    scores = suite.evaluate(job, data, model)
    record["eval_seconds"] = time.perf_counter() - t0
    result = {
        "key": job.key(),
        "train": record,
        suite.result_key: {str(k): v for k, v in scores.items()},
    }
    write_json_file(folder / RESULT_FILE, result)
    return result


#: the last columns of every suite's rows (``training_columns``)
TRAINING_COLUMNS = ("steps", "final_loss", "train_seconds", "dim", "depth", "heads", "batch", "lr")


def training_columns(job: Any, result: dict[str, Any]) -> dict[str, Any]:
    """``TRAINING_COLUMNS`` of a job's row: its training record and its model's sizes."""
    train = result["train"]
    values = (train["steps"], train["final_loss"], train["train_seconds"], job.dim, job.depth)
    values += (job.num_heads, job.batch_size, job.lr)
    return dict(zip(TRAINING_COLUMNS, values, strict=True))


@contextmanager
def one_thread() -> Iterator[None]:
    """Train on one torch thread, as a worker process does, so that ``--jobs 1`` (models in
    this process) and ``--jobs 2`` give the same numbers to the last bit (the thread count
    changes the order of float reductions); the caller's thread count is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
