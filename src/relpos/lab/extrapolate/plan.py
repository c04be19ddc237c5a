"""Train short, test long: the length-extrapolation experiment behind ``relpos extrapolate``.

The protocol follows Press et al. 2022 (ALiBi, "Train Short, Test Long", arXiv 2108.12409)
at laptop scale: train one small ``TransformerLM`` per encoding at length ``L``, then measure
perplexity on unseen text at ``L, 2L, 4L, ...`` (see ../shared/spec/evaluation.md §1.1, §5).

Two evaluation modes (``evaluate_perplexity``, in ``relpos.lab.perplexity``):

* ``"nonoverlapping"`` (the paper's headline metric, fairseq ``--context-window 0``): cut the
  token stream into windows of ``length`` and score every token of every window, each window
  from scratch. Longer windows have fewer "early tokens" (tokens with little context), which
  by itself lowers perplexity.
* ``"sliding"`` (the paper's Appendix B analysis): windows of ``length`` advance by
  ``stride`` and only the last ``stride`` tokens of each window are scored, so every scored
  token sees at least ``length - stride`` earlier tokens. A model that really uses (or at
  least tolerates) long context keeps its perplexity as ``length`` grows; one that breaks
  past its training length cannot hide behind the early tokens.

For comparable numbers every length scores the same tokens of the same text span: the
budget ``max_tokens`` is the same for every length and ``run_extrapolation`` starts every
length's scored span at the same token.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import registry
from . import report
from .perplexity import (  # noqa: F401  (re-exported: the public evaluation API)
    EVAL_BATCH_TOKENS,
    MODES,
    _positive_int,
    evaluate_perplexity,
    sliding_stride,
    window_spans,
)
from .profiles import Profile, get_profile

RUN_FILE = "run.json"  # marks a folder as a relpos extrapolation run (written first)
EVAL_FILE = "extrapolation.json"  # per-encoding evaluation results (resume skips them)
RUN_KIND = "relpos-extrapolate"
#: what ends a segment for encodings that derive positions from token ids (BiPE: sentences and
#: lines, as '.' and newline in the paper's Llama tokenizer)
SEGMENT_ENDS = (".", "\n")


# ------------------------------------------------------------------------------ the experiment


def parse_encodings(value: str | Sequence[str]) -> list[str]:
    """Encoding names from ``"rope,alibi"`` or a list; unknown names raise ``ValueError``."""
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    names = [n for n in names if n]
    if not names:
        raise ValueError(
            "--encodings is empty; known encodings: " + ", ".join(registry.available())
        )
    unknown = [n for n in names if n not in registry.available()]
    if unknown:
        raise ValueError(
            f"unknown encoding{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))};"
            f" known encodings: {', '.join(registry.available())}"
        )
    seen: list[str] = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return seen


def parse_mults(value: str | Sequence[float]) -> list[float]:
    """Evaluation multiples of the train length from ``"1,2,4"`` or a list (positive)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    mults: list[float] = []
    for item in items:
        if isinstance(item, str):
            item = item.strip()
            if not item:
                continue
        try:
            m = float(item)
        except (TypeError, ValueError):
            raise ValueError(f"--eval-mult must be positive numbers, got {item!r}") from None
        if not math.isfinite(m) or m <= 0:
            raise ValueError(f"--eval-mult must be positive numbers, got {item!r}")
        if m not in mults:
            mults.append(m)
    if not mults:
        raise ValueError("--eval-mult is empty (e.g. 1,2,4,8,16)")
    return sorted(mults)


@dataclass
class EvalPlan:
    """Everything one run will do, resolved and validated before anything is written."""

    encodings: list[str]
    profile: Profile
    train_len: int
    eval_mults: list[float]
    eval_lengths: list[int]
    steps: int
    seed: int
    out_dir: Path
    modes: list[str]
    max_tokens: dict[str, int]  # scored tokens per length, per mode
    starts: dict[str, int]  # first scored target per mode (the same for every length)
    split: str
    resume: bool = False
    clear: bool = False  # --force on an existing run folder
    corpus: dict[str, Any] = field(default_factory=dict)  # corpus_key(corpus)
    configs: dict[str, Any] = field(default_factory=dict)  # encoding -> TrainConfig

    def settings(self) -> dict[str, Any]:
        """What must match for ``--resume`` to continue this run."""
        p = self.profile
        return {
            "train_len": self.train_len,
            "seed": self.seed,
            "dim": p.dim,
            "depth": p.depth,
            "num_heads": p.num_heads,
            "batch_size": p.batch_size,
            "lr": p.lr,
        }

    def estimate_seconds(self) -> float:
        """A rough wall-clock estimate on a quiet 2-core CPU (see ``profiles.py``)."""
        return self.profile.estimate_seconds(
            self.encodings, self.steps, self.eval_lengths, self.max_tokens, self.train_len
        )


def eval_budget(profile: Profile, n_tokens: int, lengths: Sequence[int], train_len: int):
    """Per-mode ``(max_tokens, start)``, the same for every length, fitted to the text.

    Non-overlapping: the first ``max_tokens`` targets, a multiple of the longest length when
    the text allows (so no length has a short last window). Sliding: the scored span starts
    at ``longest - its stride`` so the longest window fits before it.
    """
    longest = max(lengths)
    budgets, starts = {}, {}
    for mode in profile.modes:
        want = profile.eval_tokens[mode]
        if mode == "nonoverlapping":
            start = 0
        else:
            start = max(n - sliding_stride(n) for n in lengths)
        available = n_tokens - 1 - start
        if available < min(want, longest):
            raise ValueError(
                f"the evaluation text has {n_tokens} tokens, too few for {mode} windows of "
                f"{longest} tokens (train length {train_len} x {longest // train_len}); "
                "use smaller --eval-mult or more text"
            )
        budget = min(want, available)
        if mode == "nonoverlapping" and budget >= longest:
            budget -= budget % longest
        budgets[mode], starts[mode] = budget, start
    return budgets, starts


def check_out_dir(out_dir: Path, *, resume: bool, force: bool) -> bool:
    """Validate the output folder; returns True when ``force`` will clear an old run."""
    return report.check_run_folder(
        out_dir, resume=resume, force=force, run_file=RUN_FILE, run_kind=RUN_KIND, what="relpos run"
    )


def plan_extrapolation(
    encodings: str | Sequence[str],
    *,
    corpus: Any,
    out_dir: str | os.PathLike,
    train_len: int = 128,
    eval_mults: str | Sequence[float] = (1, 2, 4, 8, 16),
    profile: str | Profile = "quick",
    steps: int | None = None,
    seed: int = 0,
    resume: bool = False,
    force: bool = False,
    split: str = "test",
) -> EvalPlan:
    """Resolve and validate a run (raises ``ValueError``); writes nothing."""
    from .train import TrainConfig

    names = parse_encodings(encodings)
    prof = get_profile(profile) if isinstance(profile, str) else profile
    train_len = _positive_int(train_len, "--train-len")
    mults = parse_mults(eval_mults)
    lengths = []
    for m in mults:
        n = round(train_len * m)
        if n < 1:
            raise ValueError(f"--eval-mult {m:g} gives an evaluation length < 1")
        if n not in lengths:
            lengths.append(n)
    steps = prof.steps if steps is None else _positive_int(steps, "--steps")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"--seed must be a non-negative int, got {seed!r}")
    if split not in ("valid", "test"):
        raise ValueError(f"split must be 'valid' or 'test', got {split!r}")
    if corpus.train.numel() <= train_len:
        raise ValueError(
            f"the training split has {corpus.train.numel()} tokens, too few for --train-len "
            f"{train_len}; use a shorter --train-len or more text"
        )
    text = getattr(corpus, split)
    budgets, starts = eval_budget(prof, int(text.numel()), lengths, train_len)
    out = Path(out_dir)
    clear = check_out_dir(out, resume=resume, force=force)
    plan = EvalPlan(
        encodings=names,
        profile=prof,
        train_len=train_len,
        eval_mults=mults,
        eval_lengths=lengths,
        steps=steps,
        seed=seed,
        out_dir=out,
        modes=list(prof.modes),
        max_tokens=budgets,
        starts=starts,
        split=split,
        resume=resume,
        clear=clear,
        corpus=corpus_key(corpus),
    )
    for name in names:
        plan.configs[name] = TrainConfig(
            encoding=name,
            encoding_options=encoding_options(prof, name, corpus, train_len, max(lengths)),
            dim=prof.dim,
            depth=prof.depth,
            num_heads=prof.num_heads,
            seq_len=train_len,
            batch_size=prof.batch_size,
            steps=steps,
            lr=prof.lr,
            warmup=min(prof.warmup, max(1, steps // 10)),
            seed=seed,
            checkpoint_every=prof.checkpoint_every,
            backend=prof.backend(name),
        )
    if resume and out.exists():
        _check_resume(plan, corpus)
    return plan


def segment_separators(corpus: Any) -> list[int]:
    """Ids of the tokens whose text holds a ``SEGMENT_ENDS`` character. With byte tokens these
    are the ids of '.' and newline; a BPE also has merged tokens (".'", newline + spaces) that
    end a sentence or a line."""
    texts = ((i, corpus.decode([i])) for i in range(corpus.vocab_size))
    return [i for i, text in texts if any(end in text for end in SEGMENT_ENDS)]


def encoding_options(
    prof: Profile, name: str, corpus: Any, train_len: int, max_len: int
) -> dict[str, Any]:
    """The profile's options for ``name``, plus the corpus' ``segment_separators`` for an
    encoding that takes ``separators`` (BiPE-RoPE) when the profile gives none."""
    options = prof.encoding_options(name, train_len, max_len)
    takes = inspect.signature(registry.encoding_class(name)).parameters
    if "separators" in takes and "separators" not in options:
        options = {**options, "separators": segment_separators(corpus)}
    return options


def _check_resume(plan: EvalPlan, corpus: Any) -> None:
    """Refuse ``--resume`` into a run with other settings, before anything is written."""
    try:
        old = json.loads((plan.out_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return
    old_settings = old.get("settings", {})
    diffs = [
        f"{k} {old_settings[k]!r} -> {v!r}"
        for k, v in plan.settings().items()
        if k in old_settings and old_settings[k] != v
    ]
    old_corpus = old.get("corpus", {})
    for k, v in plan.corpus.items():
        if k in old_corpus and old_corpus[k] != v:
            diffs.append(f"data {k} {old_corpus[k]!r} -> {v!r}")
    if diffs:
        raise ValueError(
            f"--resume: {plan.out_dir} holds a run with other settings ({'; '.join(diffs)}); "
            "use --force to start over or another --out"
        )
    import warnings

    from . import checkpoint as ckpt
    from .train import _check_compatible

    for name, config in plan.configs.items():
        folder = plan.out_dir / name
        if not ckpt.has_checkpoint(folder):
            continue  # nothing to resume: train() starts this encoding from scratch
        try:
            state = ckpt.read_state(folder)
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"--resume: unreadable checkpoint in {folder}: {err}") from None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # train() warns about changed settings itself
            _check_compatible(config, corpus, state, str(folder))  # ValueError if not
        if state.get("step", 0) > config.steps:
            raise ValueError(
                f"--resume: the checkpoint in {folder} is at step {state['step']}, past "
                f"--steps {config.steps}"
            )


def family(name: str) -> str:
    return registry.encoding_class(name).family


def start_run(plan: EvalPlan, meta: dict[str, Any]) -> None:
    """The first write of a run: clear an old run (``--force``), then write ``run.json``."""
    if plan.clear:
        shutil.rmtree(plan.out_dir)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "kind": RUN_KIND,
        "settings": plan.settings(),
        "corpus": plan.corpus,
        "encodings": plan.encodings,
        "profile": plan.profile.name,
        **meta,
    }
    path = plan.out_dir / RUN_FILE
    if plan.resume and path.exists():
        try:
            old = json.loads(path.read_text())
            record["encodings"] = list(dict.fromkeys(old.get("encodings", []) + plan.encodings))
        except (OSError, ValueError):
            pass
    report.write_json_file(path, record)


def corpus_key(corpus: Any) -> dict[str, Any]:
    """What identifies the training data (compared on ``--resume``)."""
    return {
        "name": str(getattr(corpus, "name", "?")),
        "tokenizer": str(getattr(corpus, "tokenizer", "?")),
        "vocab_size": int(getattr(corpus, "vocab_size", 0)),
    }


def _eval_key(plan: EvalPlan, name: str) -> dict[str, Any]:
    return {
        "config": dataclasses.asdict(plan.configs[name]),
        "lengths": plan.eval_lengths,
        "modes": plan.modes,
        "max_tokens": plan.max_tokens,
        "starts": plan.starts,
        "split": plan.split,
    }


def run_plan(
    plan: EvalPlan,
    corpus: Any,
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Train (or resume) each encoding, then evaluate it at every length and mode.

    Checkpoints go to ``out_dir/<encoding>/`` (``relpos.lab.train.train``); each encoding's
    evaluation is saved there too (``extrapolation.json``), so ``--resume`` after an
    interruption skips finished work. Returns one row per encoding x length x mode.
    """
    from .train import train

    text = getattr(corpus, plan.split)
    rows: list[dict[str, Any]] = []
    for index, name in enumerate(plan.encodings, 1):
        config = plan.configs[name]
        folder = plan.out_dir / name
        key = _eval_key(plan, name)
        cached = _load_eval(folder, key) if plan.resume else None
        if cached is not None:
            log(f"[{index}/{len(plan.encodings)}] {name}: already trained and evaluated (resume)")
            rows.extend(cached)
            continue
        log(
            f"[{index}/{len(plan.encodings)}] {name}: training {config.steps} steps at "
            f"L={plan.train_len}"
        )
        result = train(config, corpus, folder, resume=plan.resume, progress=progress)
        model = result.model
        enc_rows = []
        t0 = time.perf_counter()
        for mode in plan.modes:
            for length in plan.eval_lengths:
                t1 = time.perf_counter()
                r = evaluate_perplexity(
                    model,
                    text,
                    length,
                    mode=mode,
                    start=plan.starts[mode],
                    max_tokens=plan.max_tokens[mode],
                )
                enc_rows.append(
                    _row(plan, name, result, r, length, eval_seconds=time.perf_counter() - t1)
                )
        ppl = "  ".join(
            f"{r['eval_len']}:{r['ppl']:.2f}" for r in enc_rows if r["mode"] == plan.modes[0]
        )
        log(
            f"    loss {result.final_loss:.3f}, {result.tokens_per_second:,.0f} tok/s; "
            f"{plan.modes[0]} ppl {ppl}  (eval {time.perf_counter() - t0:.0f} s)"
        )
        report.write_json_file(folder / EVAL_FILE, {"key": key, "rows": enc_rows})
        rows.extend(enc_rows)
        del model, result
    return rows


def _load_eval(folder: Path, key: dict[str, Any]) -> list[dict[str, Any]] | None:
    try:
        data = json.loads((folder / EVAL_FILE).read_text())
    except (OSError, ValueError):
        return None
    if json.loads(json.dumps(key)) != data.get("key"):
        return None
    return data.get("rows")


def _row(plan: EvalPlan, name: str, result: Any, r: dict[str, Any], length: int, **extra):
    config = plan.configs[name]
    return {
        "encoding": name,
        "family": family(name),
        "train_len": plan.train_len,
        "eval_len": length,
        "mult": length / plan.train_len,
        "mode": r["mode"],
        "ppl": r["ppl"],
        "nll": r["nll"],
        "tokens_scored": r["tokens_scored"],
        "windows": r["windows"],
        "stride": r["stride"],
        "seed": plan.seed,
        "steps": result.steps,
        "final_loss": result.final_loss,
        "train_seconds": result.train_seconds,
        "tokens_per_second": result.tokens_per_second,
        "eval_seconds": extra.get("eval_seconds", 0.0),
        "dim": config.dim,
        "depth": config.depth,
        "heads": config.num_heads,
        "batch": config.batch_size,
        "lr": config.lr,
        "backend": config.backend,
        "encoding_options": json.dumps(config.encoding_options, sort_keys=True),
        "split": plan.split,
        "profile": plan.profile.name,
    }


def run_extrapolation(
    encodings: str | Sequence[str],
    *,
    train_len: int = 128,
    eval_mults: str | Sequence[float] = (1, 2, 4, 8, 16),
    profile: str | Profile = "quick",
    corpus: Any = None,
    out_dir: str | os.PathLike,
    resume: bool = False,
    force: bool = False,
    seed: int = 0,
    steps: int | None = None,
    split: str = "test",
    progress: bool = True,
    log: Callable[[str], None] = print,
    meta: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Plan, validate, train and evaluate; returns the rows (see ``run_plan``).

    ``corpus`` defaults to ``relpos.lab.data.load_corpus()`` (Shakespeare, bytes). The report
    files are written by ``relpos.lab.report.write_report`` (the CLI does both).
    """
    if corpus is None:
        from .data import load_corpus

        corpus = load_corpus()
    plan = plan_extrapolation(
        encodings,
        corpus=corpus,
        out_dir=out_dir,
        train_len=train_len,
        eval_mults=eval_mults,
        profile=profile,
        steps=steps,
        seed=seed,
        resume=resume,
        force=force,
        split=split,
    )
    start_run(plan, meta or {})
    return run_plan(plan, corpus, progress=progress, log=log)


__all__ = [
    "MODES",
    "evaluate_perplexity",
    "window_spans",
    "sliding_stride",
    "parse_encodings",
    "parse_mults",
    "EvalPlan",
    "plan_extrapolation",
    "start_run",
    "run_plan",
    "run_extrapolation",
]
