"""Running a planned ``relpos extrapolate``: train (or resume) each encoding, evaluate it at
every length and mode, keep each encoding's result in its folder (``--resume`` skips finished
work), and the one-call façade ``run_extrapolation`` (plan, start, run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from relpos import registry

from .. import report
from ..training.perplexity import evaluate_perplexity
from ..training.profiles import Profile
from .plan import EVAL_FILE, RUN_FILE, RUN_KIND, EvalPlan, plan_extrapolation

__all__ = ["start_run", "run_plan", "run_extrapolation"]


def start_run(plan: EvalPlan, meta: dict[str, Any]) -> None:
    """The first write of a run: clear an old run (``--force``), then write ``run.json``.

    ``--force`` clears the folder whatever its ``run.json`` holds (the folder was accepted as a
    run by ``check_out_dir``): a corrupt record never locks a run folder."""
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
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    report.write_json_file(path, record)


def _eval_key(plan: EvalPlan, name: str) -> dict[str, Any]:
    return {
        "config": dataclasses.asdict(plan.configs[name]),
        "lengths": plan.eval_lengths,
        "modes": plan.modes,
        "max_tokens": plan.max_tokens,
        "starts": plan.starts,
        "split": plan.split,
        "data": plan.corpus.get("fingerprint"),
    }


def run_plan(
    plan: EvalPlan,
    corpus: Any = None,
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Train (or resume) each encoding, then evaluate it at every length and mode.

    ``corpus`` defaults to the one the plan was made for. Checkpoints go to
    ``out_dir/<encoding>/`` (``relpos_lab.training.train.train``); each encoding's evaluation is
    saved
    there too (``extrapolation.json``), so ``--resume`` after an interruption skips finished
    work. A resumed checkpoint with other settings (more ``--steps``) is one ``log`` line.
    Returns one row per encoding x length x mode.
    """
    from ..training.train import train

    corpus = plan.source if corpus is None else corpus
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
        result = train(
            config,
            corpus,
            folder,
            resume=plan.resume,
            progress=progress,
            on_change=lambda note: log(f"    note: {note}"),
        )
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
    if not isinstance(data, dict) or json.loads(json.dumps(key)) != data.get("key"):
        return None
    rows = data.get("rows")
    return rows if isinstance(rows, list) and all(isinstance(r, dict) for r in rows) else None


def _row(plan: EvalPlan, name: str, result: Any, r: dict[str, Any], length: int, **extra):
    config = plan.configs[name]
    return {
        "encoding": name,
        "family": registry.encoding_class(name).family,
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
        "init": config.init,
        "head": "tied" if config.tie_embedding else "untied",
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
    data: str | os.PathLike | None = None,
    tokenizer: str = "bytes",
    bpe_vocab_size: int = 2048,
    out_dir: str | os.PathLike,
    resume: bool = False,
    force: bool = False,
    seed: int = 0,
    steps: int | None = None,
    split: str = "test",
    progress: bool = True,
    log: Callable[[str], None] = print,
    meta: dict[str, Any] | None = None,
    on_plan: Callable[[EvalPlan], None] | None = None,
) -> list[dict[str, Any]]:
    """Plan and validate (``plan_extrapolation``: nothing is written before every check has
    passed), then train and evaluate; returns the rows (see ``run_plan``).

    ``corpus`` is loaded from ``data`` / ``tokenizer`` / ``bpe_vocab_size`` when not given
    (default: the built-in Shakespeare, bytes). ``meta`` goes into ``run.json``;
    ``on_plan(plan)`` runs after planning, before the first write (the CLI prints the plan).
    The report files are written by ``relpos_lab.report.write_report``.
    """
    plan = plan_extrapolation(
        encodings,
        corpus=corpus,
        data=data,
        tokenizer=tokenizer,
        bpe_vocab_size=bpe_vocab_size,
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
    if on_plan is not None:
        on_plan(plan)
    start_run(plan, meta or {})
    return run_plan(plan, progress=progress, log=log)
