"""The length-generalisation suites of ``relpos tasks`` (train short, test long), one
``LengthSuite`` each: ``chomsky`` (the 15 tasks of Delétang et al. 2023, "Neural Networks and
the Chomsky Hierarchy", arXiv 2207.02098), ``nope`` (copy, reverse, addition, sort and SCAN in
the formats of Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length
Generalization in Transformers", arXiv 2305.19466) and ``coupling`` (addition with coupled
position ids: Cho et al. 2024, "Position Coupling: Improving Length Generalization of
Arithmetic Transformers Using Task Structure", arXiv 2405.20671).

A ``Job`` is one (suite, task, model spec, seed) with every number it depends on (plain
JSON: the checkpoint's ``config``). Its data (``_Data``): training batches from a numpy
generator seeded by ``(seed, step)``, the position draws and dropout from generators whose
states are checkpointed (so ``--resume`` continues bit for bit), and the evaluation sets at
every length (``eval_lengths``), the same for every model of a run (``jobs.EVAL_SEED``, one
stream per length, as the official ``rng`` seeded 1; the SCAN split drawn once with
``DATA_SEED``). Models: the non-causal Chomsky encoder (``models.TaskEncoder``) or
``relpos.nn.TransformerLM`` for the decoder tasks, with the model spec's position scheme
(``models.POSITION_SCHEMES``) and ``DECODER_INIT``: GPT-2's init and a tied head, the model
the suites' results in docs/tasks.md were recorded with (``TransformerLM``'s defaults until
the fan-in init and an untied head became them; the suites keep it so those results rerun
as recorded).

Training: Adam (Chomsky, ``optax.adam`` as the paper) or AdamW with weight decay on the
weight matrices only, linear warmup then constant, cosine to ``lr / 10`` or linear to 0,
global-norm clipping (``jobs``). Loss: the Chomsky suite's cross-entropy over every output
position, unmasked (the official loss; only the accuracy is masked); the decoder tasks'
cross-entropy over the target tokens and EOS (``decoder_only_mask_inputs``). Scores: per
length, the masked per-token accuracy (Chomsky) or the exact match (decoder tasks, plus the
teacher-forced token accuracy); the report is ``length_report``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relpos import registry
from relpos.nn import TransformerLM
from relpos.schedules import randomized_positions

from . import length_report
from .chomsky import CHOMSKY_TASKS, TaskBatch, chomsky_task
from .coupled_addition import (
    addition_example,
    coupled_batch_positions,
    coupling_vocab,
    random_start,
)
from .jobs import EVAL_SEED, training_columns
from .metrics import exact_match, masked_accuracy
from .models import POSITION_SCHEMES, TaskEncoder, check_encoding_for_tasks
from .nope_study import NOPE_TASKS, nope_task
from .profiles import TaskProfile
from .suite import JobRecord, ModelSpec, Suite
from .text import DecoderBatch, Example, Vocab, decoder_batch

#: the decoder tasks' ``TransformerLM`` init and head (see the module docstring)
DECODER_INIT: dict[str, Any] = {"init": "gpt2", "tie_embedding": True}

__all__ = [
    "LengthSuite",
    "LENGTH_SUITES",
    "Job",
    "eval_lengths",
    "build_model",
    "positions",
    "evaluate_job",
    "job_rows",
    "parse_model",
    "SUITE_TASKS",
    "DATA_SEED",
]

DATA_SEED = 0
EVAL_BATCH = 64
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


@dataclass(kw_only=True)
class Job(JobRecord):
    """One model of a length suite: the shared ``JobRecord`` fields, ``suite``, the position
    ``scheme``, the lengths, and what its data, model and optimizer read."""

    suite: str
    scheme: str
    train_len: int
    test_lengths: list[int]
    eval_size: int
    optimizer: str = "adam"
    schedule: str = "constant"
    dropout: float = 0.0
    max_length: int = 256
    max_position: int = 40
    encoding_options: dict[str, Any] = field(default_factory=dict)


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
        **DECODER_INIT,
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


def _tokens(batch: Any) -> int:
    if isinstance(batch, TaskBatch):
        return batch.inputs.numel() + batch.targets.numel()
    return batch.tokens.numel()


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


# ------------------------------------------------------------------------------ plan


def parse_model(spec: str, suite: str) -> ModelSpec:
    """``"rope+random"`` -> ``ModelSpec("rope+random", "rope", "random")`` (``"rope"``: scheme
    ``default``); the name checked against the registry, the scheme against the suite."""
    name, _, scheme = spec.partition("+")
    scheme = scheme or "default"
    known = registry.available()
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
    return ModelSpec(spec if scheme != "default" else name, name, scheme)


def _check_random_range(profile: TaskProfile, tasks: Sequence[str]) -> None:
    """Randomized positions are drawn from ``[0, max_length)``: the longest Chomsky test
    sequence (inputs and outputs) must fit."""
    longest = max(profile.test_lengths)
    need = max(
        chomsky_task(t).input_length(longest) + chomsky_task(t).output_length(longest)
        for t in tasks
    )
    if need > profile.max_length:
        raise ValueError(
            f"randomized positions are drawn from [0, {profile.max_length}), but the longest "
            f"test sequence has {need} tokens (input + outputs); fewer test lengths or a "
            "larger max_length"
        )


def job_rows(job: Job, result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per evaluated length of a job."""
    rows = []
    per_length = result["per_length"]
    test = set(job.test_lengths)
    for length in eval_lengths(job):
        cell = per_length.get(str(length))
        if cell is None:
            continue
        rows.append(
            {
                "suite": job.suite,
                "task": job.task,
                "model": job.model,
                "encoding": job.encoding,
                "scheme": job.scheme,
                "seed": job.seed,
                "length": length,
                "test": length in test,
                "accuracy": cell["accuracy"],
                "token_accuracy": cell.get("token_accuracy", ""),
                "n": cell["n"],
                "train_len": job.train_len,
                **training_columns(job, result),
            }
        )
    return rows


class LengthSuite(Suite):
    """``chomsky``, ``nope`` or ``coupling`` (module docstring)."""

    job_type = Job
    result_key = "per_length"
    loss_tail = 10
    report = length_report

    def __init__(self, name: str) -> None:
        self.name = name
        self.tasks = SUITE_TASKS[name]

    def check_profile(self, profile: TaskProfile) -> None:
        if min(profile.test_lengths) <= profile.train_len:
            raise ValueError(
                f"--test-lengths must all be longer than --train-len ({profile.train_len}), "
                f"got {min(profile.test_lengths)}"
            )

    def parse_model(self, spec: str, profile: TaskProfile) -> ModelSpec:
        return parse_model(spec, self.name)

    def check_plan(
        self, profile: TaskProfile, tasks: Sequence[str], models: Sequence[ModelSpec]
    ) -> None:
        if self.name == "chomsky" and any(m.variant == "random" for m in models):
            _check_random_range(profile, tasks)

    def job_fields(self, profile: TaskProfile, task: str, model: ModelSpec) -> dict[str, Any]:
        train_len, test_lengths = profile.train_len, list(profile.test_lengths)
        if task == "scan":
            train_len, test_lengths = SCAN_TRAIN_LEN, list(SCAN_TEST_LENGTHS)
        return {
            "suite": self.name,
            "scheme": str(model.variant),
            "train_len": train_len,
            "test_lengths": test_lengths,
            "eval_size": profile.eval_size,
            "optimizer": profile.optimizer,
            "schedule": profile.schedule,
            "dropout": profile.dropout,
            "max_length": profile.max_length,
            "max_position": profile.max_position,
            "encoding_options": dict(profile.encoding_options.get(model.encoding, {})),
        }

    def more_settings(self, profile: TaskProfile) -> dict[str, Any]:
        keys = ("train_len", "optimizer", "weight_decay", "schedule", "grad_clip", "dropout")
        keys += ("mlp_ratio", "max_length", "max_position")
        return {k: getattr(profile, k) for k in keys}

    def describe(self, profile: TaskProfile) -> str:
        return (
            f"train lengths <= {profile.train_len}, test {min(profile.test_lengths)}-"
            f"{max(profile.test_lengths)}"
        )

    def prepare(self, job: Job) -> _Data:
        return _Data(job)

    def build_model(self, job: Job, data: _Data) -> nn.Module:
        return build_model(job, data)

    def vocab_size(self, job: Job, data: _Data) -> int:
        return data.vocab_size

    def batch_loss(
        self, job: Job, data: _Data, model: nn.Module, step: int, generator: torch.Generator
    ) -> tuple[Tensor, int]:
        batch = data.train_batch(step)
        pos = positions(job, data, batch, train=True, generator=generator)
        return loss_of(forward(model, batch, pos), batch), _tokens(batch)

    def evaluate(self, job: Job, data: _Data, model: nn.Module) -> dict[int, dict[str, float]]:
        return evaluate_job(job, data, model)

    def rows(self, job: Job, result: dict[str, Any]) -> list[dict[str, Any]]:
        return job_rows(job, result)

    def result_text(self, job: Job, result: dict[str, Any]) -> str:
        # the report's test score (the NoPE study: the mean over test examples, else lengths)
        summary = length_report.summarize(job_rows(job, result))
        return f"test score {summary[0]['mean'] if summary else float('nan'):.3f}"


LENGTH_SUITES = {name: LengthSuite(name) for name in SUITE_TASKS}
