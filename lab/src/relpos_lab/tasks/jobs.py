"""One model of a ``relpos tasks`` run: its ``Job`` record, training and evaluation.

A ``Job`` is one (suite, task, model spec, seed) with every number it depends on; it is plain
JSON (the checkpoint's ``config``, compared on ``--resume``). ``run_job`` trains it into its
folder (atomic checkpoints through ``relpos_lab.training.checkpoint``: the model, the optimizer, the
step, the losses, the RNG states; resume continues bit for bit, because every training
batch is drawn from a numpy generator seeded by ``(seed, step)`` and the position draws and
dropout from generators whose states are checkpointed), evaluates it at every length and
writes ``result.json`` there (``--resume`` skips jobs whose result matches).

Training: Adam (Chomsky, ``optax.adam`` as the paper) or AdamW with weight decay on the
weight matrices only, linear warmup then constant or cosine to ``lr / 10``, global-norm
clipping. Loss: the Chomsky suite's cross-entropy over every output position, unmasked (the
official loss; only the accuracy is masked); the decoder tasks' cross-entropy over the target
tokens and EOS (``decoder_only_mask_inputs``).

Evaluation data do not depend on the model's seed: every model of a run is scored on the
same sequences (``EVAL_SEED``, one stream per length, as the official ``rng`` seeded 1); the
SCAN split is drawn once with ``DATA_SEED``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relpos import registry
from relpos.encodings.base import Encoding
from relpos.nn import TransformerLM
from relpos.schedules import randomized_positions

from ..report import write_json_file
from ..training import checkpoint as ckpt
from ..training.runtime import Progress, SignalStop
from .chomsky import TaskBatch, chomsky_task
from .coupled_addition import (
    addition_example,
    coupled_batch_positions,
    coupling_vocab,
    random_start,
)
from .metrics import exact_match, masked_accuracy
from .models import TaskEncoder
from .nope_study import nope_task
from .text import DecoderBatch, Example, Vocab, decoder_batch

__all__ = ["Job", "run_job", "RESULT_FILE", "EVAL_SEED", "DATA_SEED", "eval_lengths"]

RESULT_FILE = "result.json"
EVAL_SEED = 1
DATA_SEED = 0
EVAL_BATCH = 64


@dataclass
class Job:
    """One model to train and evaluate (all plain JSON)."""

    suite: str
    task: str
    model: str  # NAME[+SCHEME]
    encoding: str
    scheme: str
    seed: int
    dim: int
    depth: int
    num_heads: int
    batch_size: int
    steps: int
    lr: float
    warmup: int
    train_len: int
    test_lengths: list[int]
    eval_size: int
    optimizer: str = "adam"
    weight_decay: float = 0.0
    schedule: str = "constant"
    grad_clip: float = 1.0
    dropout: float = 0.0
    mlp_ratio: float = 4.0
    max_length: int = 256
    max_position: int = 40
    checkpoint_every: int = 500
    encoding_options: dict[str, Any] = field(default_factory=dict)
    folder: str = ""

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def key(self) -> dict[str, Any]:
        """What the trained weights and the scores depend on (not where they live)."""
        data = self.to_json()
        data.pop("folder")
        data.pop("checkpoint_every")
        return data


def eval_lengths(job: Job) -> list[int]:
    """The lengths a job is scored at: the training range and the test lengths (Chomsky:
    every length ``1..max(test)``; SCAN: the validation and test target lengths)."""
    if job.suite == "chomsky":
        return list(range(1, max(job.test_lengths) + 1))
    if job.suite == "coupling":
        return sorted({max(1, job.train_len // 2), job.train_len, *job.test_lengths})
    if job.task == "scan":
        return list(range(1, 49))
    return list(range(1, job.train_len + 1)) + list(job.test_lengths)


# ------------------------------------------------------------------------------ data


class _Data:
    """The job's data: training batches by step and the fixed evaluation sets."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.vocab: Vocab | None = None
        if job.suite == "chomsky":
            self.task = chomsky_task(job.task)
        elif job.suite == "nope":
            self.text = nope_task(job.task)
            self.vocab = Vocab(self.text.vocabulary())
            if job.task == "scan":
                self.scan_train = self.text.scan_examples(DATA_SEED, "train")
                valid = self.text.scan_examples(DATA_SEED, "valid")
                test = self.text.scan_examples(DATA_SEED, "test")
                # every test command (the paper's score is over all of them), a sample of
                # eval_size validation commands per in-distribution length
                self.scan_eval = {**_group(valid, job.eval_size), **_group(test, len(test))}
        else:
            self.vocab = coupling_vocab()
        self._eval: dict[int, Any] | None = None

    @property
    def vocab_size(self) -> int:
        return self.task.input_size if self.vocab is None else len(self.vocab)

    def train_batch(self, step: int) -> TaskBatch | DecoderBatch:
        job = self.job
        rng = np.random.default_rng([job.seed, step])
        if job.suite == "chomsky":
            length = int(rng.integers(1, job.train_len + 1))  # one length per batch
            return self.task.sample(rng, job.batch_size, length)
        if job.suite == "coupling":
            exs = [addition_example(rng, 1, job.train_len) for _ in range(job.batch_size)]
        elif job.task == "scan":
            idx = rng.integers(0, len(self.scan_train), size=job.batch_size)
            exs = [self.scan_train[i] for i in idx]
        else:
            exs = [self.text.train_example(rng, job.train_len) for _ in range(job.batch_size)]
        assert self.vocab is not None
        return decoder_batch(exs, self.vocab)

    def eval_sets(self) -> dict[int, list[Any]]:
        """``{length: [batches]}``, the same for every model of a run."""
        if self._eval is not None:
            return self._eval
        job, out = self.job, {}
        for length in eval_lengths(job):
            rng = np.random.default_rng([EVAL_SEED, length])
            if job.suite == "chomsky":
                n = job.eval_size
                sizes = [min(EVAL_BATCH, n - i) for i in range(0, n, EVAL_BATCH)]
                out[length] = [self.task.sample(rng, s, length) for s in sizes]
                continue
            if job.suite == "coupling":
                exs = [
                    addition_example(rng, 1, length, a_digits=length) for _ in range(job.eval_size)
                ]
            elif job.task == "scan":
                exs = self.scan_eval.get(length, [])
            else:
                exs = [self.text.example(rng, length) for _ in range(job.eval_size)]
            if exs:
                assert self.vocab is not None
                out[length] = [
                    decoder_batch(exs[i : i + EVAL_BATCH], self.vocab)
                    for i in range(0, len(exs), EVAL_BATCH)
                ]
        self._eval = out
        return out

    def longest(self) -> int:
        """The longest sequence the model sees (training or evaluation), in tokens."""
        longest = 0
        for batches in self.eval_sets().values():
            for b in batches:
                if isinstance(b, TaskBatch):
                    longest = max(longest, b.inputs.shape[1] + b.targets.shape[1])
                else:
                    longest = max(longest, b.tokens.shape[1])
        return longest


def _group(examples: list[Example], cap: int) -> dict[int, list[Example]]:
    by_length: dict[int, list[Example]] = {}
    for ex in examples:
        by_length.setdefault(ex.length, []).append(ex)
    return {n: v[:cap] for n, v in sorted(by_length.items())}


# ------------------------------------------------------------------------------ model


def encoding_options_for(job: Job, longest: int) -> dict[str, Any]:
    """The job's encoding options, read from the encoding's declarations: the encoder form
    (``bidirectional=True``) in the non-causal Chomsky encoder, and a learned table
    (``max_positions``) that covers every position the scheme can produce."""
    options = dict(job.encoding_options)
    specs = registry.encoding_class(job.encoding).option_specs
    if job.suite == "chomsky" and "bidirectional" in specs:
        options.setdefault("bidirectional", True)  # the encoder form (T5, ALiBi, ...)
    if "max_positions" in specs:
        table = {"random": job.max_length, "coupled": job.max_position + 1}
        options.setdefault("max_positions", table.get(job.scheme, longest))
    return options


def build_model(job: Job, data: _Data) -> nn.Module:
    torch.manual_seed(job.seed)
    options = encoding_options_for(job, data.longest())
    if job.suite == "chomsky":
        return TaskEncoder(
            data.task.input_size,
            data.task.output_size,
            dim=job.dim,
            depth=job.depth,
            num_heads=job.num_heads,
            encoding=job.encoding,
            encoding_options=options,
            dropout=job.dropout,
        )
    return TransformerLM(
        data.vocab_size,
        job.dim,
        job.depth,
        job.num_heads,
        job.encoding,
        encoding_options=options,
        mlp_ratio=job.mlp_ratio,
    )


def positions(
    job: Job, data: _Data, batch: Any, *, train: bool, generator: torch.Generator
) -> Tensor | None:
    """The position ids of one forward pass under the job's scheme (None: ``0..T-1``)."""
    if isinstance(batch, TaskBatch):
        T = batch.inputs.shape[1] + batch.targets.shape[1]
    else:
        T = batch.tokens.shape[1]
    if job.scheme == "default":
        return None
    if job.scheme == "random":
        if T > job.max_length:
            raise ValueError(
                f"{job.model}: sequences of {T} tokens do not fit randomized positions from "
                f"[0, {job.max_length}); raise max_length"
            )
        return randomized_positions(T, job.max_length, generator=generator)
    if job.scheme == "coupled":
        assert data.vocab is not None
        return coupled_batch_positions(
            batch, data.vocab, max_position=job.max_position, train=train, generator=generator
        )
    table = data.longest()
    return random_start(batch, max_position=table - 1, train=train, generator=generator)


def forward(model: nn.Module, batch: Any, pos: Tensor | None) -> Tensor:
    if isinstance(batch, TaskBatch):
        return model(batch.inputs, batch.targets.shape[1], pos)
    return model(batch.tokens, pos=pos)


def loss_of(logits: Tensor, batch: Any) -> Tensor:
    if isinstance(batch, TaskBatch):
        return F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten())
    target = batch.tokens[:, 1:]
    mask = batch.loss_mask[:, :-1]
    return F.cross_entropy(logits[:, :-1][mask], target[mask])


#: the learning-rate shapes after the warmup (``Job.schedule``)
SCHEDULES = ("constant", "cosine", "linear")


def learning_rate(job: Job, step: int) -> float:
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


def make_optimizer(job: Job, model: nn.Module) -> torch.optim.Optimizer:
    if job.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=job.lr)
    own = {id(p) for m in model.modules() if isinstance(m, Encoding) for p in m.parameters()}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in own]
    rest = [p for p in model.parameters() if not (p.dim() >= 2 and id(p) not in own)]
    groups = [
        {"params": decay, "weight_decay": job.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=job.lr, betas=(0.9, 0.95))


# ------------------------------------------------------------------------------ run


def _tokens(batch: Any) -> int:
    if isinstance(batch, TaskBatch):
        return batch.inputs.numel() + batch.targets.numel()
    return batch.tokens.numel()


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

    Per step: the learning rate ``lr_at(step)``, ``batch_loss(step) -> (loss, units)`` (the
    data must be a function of the step, or of checkpointed RNG state, for a bit-exact
    resume), backward, clipping at ``job.grad_clip``, the optimiser step; ``losses`` grows
    in place. ``save(step, seconds)`` checkpoints every ``job.checkpoint_every`` steps, at the
    end, and on SIGINT/SIGTERM, which then raises ``TrainingInterrupted``. The progress bar
    shows units (tokens) per second. Returns ``(step, training seconds)``, model in eval
    mode."""
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
    job: Job, data: _Data, folder: Path, *, resume: bool, progress: bool
) -> tuple[nn.Module, dict[str, Any]]:
    """Train (or resume) the job's model; returns it (eval mode) and its training record."""
    model = build_model(job, data)
    opt = make_optimizer(job, model)
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
                "vocab_size": data.vocab_size,
                "corpus": {"suite": job.suite, "task": job.task},
                "rng": {
                    "torch": torch.get_rng_state().tolist(),
                    "batch": gen.get_state().tolist(),
                },
                "losses": losses,
                "elapsed_seconds": seconds,
            },
        )

    def batch_loss(at: int) -> tuple[Tensor, int]:
        batch = data.train_batch(at)
        pos = positions(job, data, batch, train=True, generator=gen)
        return loss_of(forward(model, batch, pos), batch), _tokens(batch)

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
    tail = losses[-10:]
    return model, {
        "steps": step,
        "final_loss": sum(tail) / max(1, len(tail)),
        "train_seconds": seconds,
    }


@torch.no_grad()
def evaluate_job(job: Job, data: _Data, model: nn.Module) -> dict[int, dict[str, float]]:
    """``{length: {"accuracy": .., "n": ..}}``: masked per-token accuracy (Chomsky, the mean
    over sub-batches) or exact match (decoder tasks, the mean over examples; plus
    ``token_accuracy``, the fraction of target tokens and EOS predicted right under teacher
    forcing, which Cho et al. report too)."""
    gen = torch.Generator().manual_seed(EVAL_SEED)
    out: dict[int, dict[str, float]] = {}
    for length, batches in data.eval_sets().items():
        if job.suite == "chomsky":
            scores = [
                masked_accuracy(
                    forward(model, b, positions(job, data, b, train=False, generator=gen)), b
                )
                for b in batches
            ]
            n = sum(b.inputs.shape[0] for b in batches)
            out[length] = {"accuracy": sum(scores) / len(scores), "n": n}
        else:
            hits = total = right = tokens = 0
            for b in batches:
                pos = positions(job, data, b, train=False, generator=gen)
                logits = forward(model, b, pos)
                ok = exact_match(logits, b)
                hits += int(ok.sum())
                total += ok.numel()
                mask = b.loss_mask[:, :-1]
                right += int(((logits[:, :-1].argmax(-1) == b.tokens[:, 1:]) & mask).sum())
                tokens += int(mask.sum())
            out[length] = {
                "accuracy": hits / total,
                "n": total,
                "token_accuracy": right / tokens,
            }
    return out


def load_result(folder: Path, job: Job) -> dict[str, Any] | None:
    """The saved result of ``job`` in ``folder`` if it was made with the same key."""
    try:
        data = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != job.key():
        return None
    return data


def run_job(
    job: Job,
    *,
    resume: bool,
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train and evaluate one job into ``job.folder``; returns ``{"key", "train",
    "per_length"}`` (also written to ``result.json``). With ``resume`` a matching result is
    returned as is and a checkpoint is continued."""
    folder = Path(job.folder)
    if resume:
        cached = load_result(folder, job)
        if cached is not None:
            log(f"  {job.task} {job.model} seed {job.seed}: done (resume)")
            return cached
    data = _Data(job)
    model, record = train_job(job, data, folder, resume=resume, progress=progress)
    t0 = time.perf_counter()
    per_length = evaluate_job(job, data, model)
    record["eval_seconds"] = time.perf_counter() - t0
    result = {
        "key": job.key(),
        "train": record,
        "per_length": {str(k): v for k, v in per_length.items()},
    }
    write_json_file(folder / RESULT_FILE, result)
    return result


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


def worker(job_data: dict[str, Any], resume: bool) -> dict[str, Any]:
    """Entry point of a worker process: one thread (one thread per model ran faster than two on
    a loaded 2-core machine), no progress bar."""
    torch.set_num_threads(1)
    job = Job(**job_data)
    return run_job(job, resume=resume, progress=False, log=lambda _: None)
