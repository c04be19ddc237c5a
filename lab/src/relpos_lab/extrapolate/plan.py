"""What a ``relpos extrapolate`` run does, resolved and validated before anything is written.

* ``parse_encodings`` / ``parse_mults``: the comma-separated options (names checked against
  the registry, once);
* ``plan_extrapolation`` -> ``EvalPlan``: every argument checked in one pass (first what needs
  no data: names, numbers, ``--out``, ``--data``, the optional dependencies; then the corpus
  is loaded; then what needs it: the evaluation budget, each encoding's ``TrainConfig``, the
  ``--resume`` checks of ``run.json`` and every checkpoint), nothing written;
* ``encoding_options``: what the profile and the corpus give each encoding, read from the
  encoding's declared options (``option_specs``), never from its name.

The protocol (Press et al. 2022, "Train Short, Test Long", arXiv 2108.12409) and the two evaluation
modes are described in ``relpos_lab.training.perplexity``. For comparable numbers every length
scores the same tokens of the same text span: the budget ``max_tokens`` is the same for every length
and every length's scored span starts at the same token (``eval_budget``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relpos import registry
from relpos.optional import require
from relpos.validation import check_choice, check_int

from .. import report
from ..arguments import parse_float_list, parse_names
from ..training.perplexity import sliding_stride
from ..training.profiles import Profile, get_profile

__all__ = [
    "RUN_FILE",
    "EVAL_FILE",
    "RUN_KIND",
    "SEGMENT_ENDS",
    "CORPUS_PROVIDERS",
    "EvalPlan",
    "parse_encodings",
    "parse_mults",
    "eval_budget",
    "check_out_dir",
    "plan_extrapolation",
    "segment_separators",
    "encoding_options",
    "corpus_key",
]

RUN_FILE = "run.json"  # marks a folder as a relpos extrapolation run (written first)
EVAL_FILE = "extrapolation.json"  # per-encoding evaluation results (resume skips them)
RUN_KIND = "relpos-extrapolate"
SPLITS = ("test", "valid")
TOKENIZERS = ("bytes", "bpe")
#: what ends a segment for encodings that derive positions from token ids (BiPE: sentences and
#: lines, as '.' and newline in the paper's Llama tokenizer)
SEGMENT_ENDS = (".", "\n")


# ------------------------------------------------------------------------------ parsing


def parse_encodings(value: str | Sequence[str]) -> list[str]:
    """Encoding names from ``"rope,alibi"`` or a list, duplicates dropped; an empty value or
    an unknown name raises ``ValueError`` (listing the known names)."""
    if isinstance(value, str):
        names = parse_names(value, "--encodings")
    else:
        names = list(dict.fromkeys(value))
    known = registry.available()
    if not names:
        raise ValueError("--encodings is empty; known encodings: " + ", ".join(known))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown encoding{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))};"
            f" known encodings: {', '.join(known)}"
        )
    return names


def parse_mults(value: str | Sequence[float]) -> list[float]:
    """Evaluation multiples of the train length from ``"1,2,4"`` or a list (positive), sorted
    and without repeats."""
    mults = parse_float_list(
        value, "--eval-mult", expected="positive numbers (e.g. 1,2,4,8,16)", above=0
    )
    return sorted(set(mults))


# ------------------------------------------------------------------------------ the plan


@dataclass
class EvalPlan:
    """Everything one run will do, resolved and validated before anything is written.

    ``source`` is the loaded corpus (``relpos_lab.training.data.Corpus``) the plan was made for."""

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
    source: Any = field(default=None, repr=False, compare=False)

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
            "weight_decay": p.weight_decay,
            "min_lr_ratio": p.min_lr_ratio,
            "qkv_conv": p.qkv_conv,
            "qk_norm": p.qk_norm,
            "init": p.init,
            "tie_embedding": p.tie_embedding,
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
    corpus: Any = None,
    data: str | os.PathLike | None = None,
    tokenizer: str = "bytes",
    bpe_vocab_size: int = 2048,
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
    """Resolve and validate a run (raises ``ValueError``/``TypeError``); writes nothing.

    ``corpus``: a loaded ``Corpus``; without it the corpus is loaded from ``data`` (None: the
    built-in Shakespeare) with ``tokenizer`` / ``bpe_vocab_size``, after every check that needs
    no data has passed (so a bad ``--out`` costs no BPE training).
    """
    from ..training.train import TrainConfig

    # 1. what needs no data
    names = parse_encodings(encodings)
    prof = get_profile(profile) if isinstance(profile, str) else profile
    train_len = check_int(train_len, "--train-len")
    mults = parse_mults(eval_mults)
    lengths: list[int] = []
    for m in mults:
        n = round(train_len * m)
        if n < 1:
            raise ValueError(f"--eval-mult {m:g} gives an evaluation length < 1")
        if n not in lengths:
            lengths.append(n)
    steps = prof.steps if steps is None else check_int(steps, "--steps")
    seed = check_int(seed, "--seed", minimum=0)
    split = check_choice(split, "--split", SPLITS)
    out = Path(out_dir)
    clear = check_out_dir(out, resume=resume, force=force)
    needs = {"safetensors": "the checkpoints"}
    if corpus is None:
        tokenizer = check_choice(tokenizer, "--tokenizer", TOKENIZERS)
        if tokenizer == "bpe":
            bpe_vocab_size = check_int(bpe_vocab_size, "--bpe-vocab-size", minimum=257)
            needs["tokenizers"] = "--tokenizer bpe"
        if data is not None and not Path(data).exists():
            raise ValueError(f"--data {data}: no such file or folder")
    require("relpos extrapolate", needs)

    # 2. the data
    if corpus is None:
        from ..training.data import load_corpus

        # The split does not follow --seed: every seed is evaluated on the same unseen text.
        corpus = load_corpus(data, tokenizer=tokenizer, bpe_vocab_size=bpe_vocab_size)

    # 3. what needs the data
    if corpus.train.numel() <= train_len:
        raise ValueError(
            f"the training split has {corpus.train.numel()} tokens, too few for --train-len "
            f"{train_len}; use a shorter --train-len or more text"
        )
    text = getattr(corpus, split)
    budgets, starts = eval_budget(prof, int(text.numel()), lengths, train_len)
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
        source=corpus,
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
            weight_decay=prof.weight_decay,
            min_lr_ratio=prof.min_lr_ratio,
            seed=seed,
            checkpoint_every=prof.checkpoint_every,
            backend=prof.backend,
            qkv_conv=prof.qkv_conv,
            qk_norm=prof.qk_norm,
            init=prof.init,
            tie_embedding=prof.tie_embedding,
        )
    if resume and out.exists():
        _check_resume(plan, corpus)
    return plan


# ------------------------------------------------------------------------------ options


def segment_separators(corpus: Any) -> list[int]:
    """Ids of the tokens whose text holds a ``SEGMENT_ENDS`` character. With byte tokens these
    are the ids of '.' and newline; a BPE also has merged tokens (".'", newline + spaces) that
    end a sentence or a line."""
    texts = ((i, corpus.decode([i])) for i in range(corpus.vocab_size))
    return [i for i, text in texts if any(end in text for end in SEGMENT_ENDS)]


#: options the lab fills from the corpus when an encoding declares one of these names in its
#: ``option_specs`` and the profile gives none (BiPE's ``separators``: token ids that end a
#: segment)
CORPUS_PROVIDERS = {"separators": segment_separators}


def encoding_options(
    prof: Profile, name: str, corpus: Any, train_len: int, max_len: int
) -> dict[str, Any]:
    """The profile's options for ``name`` (``Profile.encoding_options``), plus every option in
    ``CORPUS_PROVIDERS`` the encoding declares, filled from the corpus when the profile gives
    none."""
    cls = registry.encoding_class(name)
    options = prof.encoding_options(name, train_len, max_len)
    for option, provide in CORPUS_PROVIDERS.items():
        if option in cls.option_specs and option not in options:
            options = {**options, option: provide(corpus)}
    return options


# ------------------------------------------------------------------------------ resume


def corpus_key(corpus: Any) -> dict[str, Any]:
    """What identifies the data (compared on ``--resume``): the resolved path of ``--data``
    (the built-in corpus by name), the tokenizer, and a fingerprint of the content of every
    split (so the same file named another way, or from another folder, is the same data, and
    an edited file is not)."""
    from ..training.data import BUILTIN

    name = str(getattr(corpus, "name", "?"))
    if name != BUILTIN and name != "?":
        name = str(Path(name).resolve())
    digest = hashlib.sha256(f"{corpus.tokenizer}:{corpus.vocab_size}".encode())
    for split in ("train", "valid", "test"):
        tokens = getattr(corpus, split)
        digest.update(f":{split}:{tokens.numel()}:".encode())
        digest.update(tokens.numpy().tobytes())
    return {
        "name": name,
        "tokenizer": str(getattr(corpus, "tokenizer", "?")),
        "vocab_size": int(getattr(corpus, "vocab_size", 0)),
        "fingerprint": digest.hexdigest()[:16],
    }


def read_run_file(out_dir: Path) -> dict[str, Any]:
    """``run.json`` of a run folder, checked (``ValueError`` naming the file otherwise)."""
    path = out_dir / RUN_FILE
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(
            f"--resume: {path} is unreadable ({type(err).__name__}); use --force to start over"
        ) from None
    ok = (
        isinstance(old, dict)
        and isinstance(old.get("settings", {}), dict)
        and isinstance(old.get("corpus", {}), dict)
        and isinstance(old.get("encodings", []), list)
    )
    if not ok:
        raise ValueError(f"--resume: {path} is not a relpos run record; use --force to start over")
    return old


def _same_data(old: dict[str, Any], new: dict[str, Any]) -> bool:
    if "fingerprint" in old:  # the content decides: a moved or renamed file is the same data
        return old["fingerprint"] == new["fingerprint"]
    name = old.get("name")  # a run recorded before fingerprints: the resolved path
    if isinstance(name, str) and name != new["name"] and Path(name).resolve() != Path(new["name"]):
        return False
    return True


def _check_resume(plan: EvalPlan, corpus: Any) -> None:
    """Refuse ``--resume`` into a run with other settings or other data, or with a corrupt
    file, before anything is written."""
    from ..training import checkpoint as ckpt
    from ..training.train import check_compatible

    old = read_run_file(plan.out_dir)
    old_settings = old.get("settings", {})
    diffs = [
        f"{k} {old_settings[k]!r} -> {v!r}"
        for k, v in plan.settings().items()
        if k in old_settings and old_settings[k] != v
    ]
    old_corpus = old.get("corpus", {})
    for k in ("tokenizer", "vocab_size"):
        if k in old_corpus and old_corpus[k] != plan.corpus[k]:
            diffs.append(f"data {k} {old_corpus[k]!r} -> {plan.corpus[k]!r}")
    if not _same_data(old_corpus, plan.corpus):
        diffs.append(f"data {old_corpus.get('name')!r} -> {plan.corpus['name']!r} (other content)")
    if diffs:
        raise ValueError(
            f"--resume: {plan.out_dir} holds a run with other settings ({'; '.join(diffs)}); "
            "use --force to start over or another --out"
        )
    for name, config in plan.configs.items():
        folder = plan.out_dir / name
        if not ckpt.has_checkpoint(folder):
            continue  # nothing to resume: train() starts this encoding from scratch
        state = ckpt.read_state(folder)  # ValueError naming the file and --force
        ckpt.verify_checkpoint(folder)
        check_compatible(config, corpus, state, str(folder))  # ValueError if unusable
        if state["step"] > config.steps:
            raise ValueError(
                f"--resume: the checkpoint in {folder} is at step {state['step']}, past "
                f"--steps {config.steps}"
            )
