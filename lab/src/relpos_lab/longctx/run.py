"""Running ``relpos longctx``: the inputs, the measurements, and resuming a run.

* inputs: the held-out text (``heldout_text``), the passkey keys (``trial_keys``, the same
  for every method) and prompts (``build_prompts``);
* ``tail_perplexity``: perplexity of the same final tokens given ``length`` tokens of context;
* ``run_longctx``: every method at every length into a ``RunState`` (rows and trials),
  calling back after each measurement so an interrupted run keeps what it measured;
* ``start_run``: clears an old run (``--force``) or loads it (``--resume``), writes ``run.json``.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from relpos import registry

from ..report import write_json_file
from ..training.passkey import (
    PasskeyPrompt,
    passkey_prompt,
    passkey_segments,
    random_key,
    run_passkey,
)
from .methods import METHODS, PINE_DOCUMENTS
from .plan import RUN_FILE, RUN_KIND, LongctxPlan

__all__ = [
    "heldout_text",
    "trial_keys",
    "build_prompts",
    "tail_perplexity",
    "RunState",
    "run_longctx",
    "start_run",
]


# ------------------------------------------------------------------------------ inputs


def heldout_text(data: str | os.PathLike | None = None) -> tuple[str, str]:
    """``(name, text)``: the test plays of the built-in Shakespeare split
    (``relpos_lab.training.data``, the same split as ``relpos extrapolate``), or all of ``data``."""
    from ..training.data import (
        BUILTIN,
        DOCUMENT_SEPARATOR,
        builtin_texts,
        read_texts,
        split_documents,
    )

    if data is None:
        test = split_documents(builtin_texts())["test"]
        return f"{BUILTIN} (test plays: {', '.join(test)})", DOCUMENT_SEPARATOR.join(test.values())
    return os.fspath(data), DOCUMENT_SEPARATOR.join(read_texts(data).values())


def trial_keys(length: int, depths: Sequence[float], seeds: int) -> list[tuple[float, int, int]]:
    """``(depth, seed, key)`` of every passkey trial at ``length``: keys drawn from
    ``random.Random("passkey:{seed}:{length}:{depth}")``, the same for every method."""
    out = []
    for seed in range(seeds):
        for depth in depths:
            rng = random.Random(f"passkey:{seed}:{length}:{depth}")
            out.append((depth, seed, random_key(rng)))
    return out


def build_prompts(
    plan: LongctxPlan, tokenizer: Any, lengths: Sequence[int] | None = None
) -> dict[int, list[tuple[PasskeyPrompt, int]]]:
    """``{length: [(prompt, seed), ...]}``: the passkey prompts of every trial (``trial_keys``),
    shared by all methods. ``ValueError`` when a length is too short for the prompt."""
    out = {}
    for length in plan.lengths if lengths is None else lengths:
        out[length] = [
            (passkey_prompt(tokenizer, length, key=key, depth=depth), seed)
            for depth, seed, key in trial_keys(length, plan.depths, plan.seeds)
        ]
    return out


@torch.no_grad()
def tail_perplexity(
    model: Any,
    tokens: Tensor,
    length: int,
    score: int,
    *,
    end: int | None = None,
    inputs: dict[str, Tensor] | None = None,
) -> dict[str, Any]:
    """Perplexity of the ``score`` targets ending at ``tokens[end]`` given the ``length``
    input tokens before each window end: the window is ``tokens[end - length : end + 1]``
    (default ``end = length``). With one ``end`` for every length, every length scores the
    same tokens and only the context before them grows (``model.token_nll``). ``inputs``: the
    encoding's per-call tensors for the ``length`` input tokens."""
    end = length if end is None else end
    if end < length:
        raise ValueError(f"end ({end}) must be >= length ({length})")
    if tokens.numel() < end + 1:
        raise ValueError(
            f"the held-out text has {tokens.numel()} tokens; length {length} needs {end + 1}"
        )
    score = min(score, length)
    window = tokens[end - length : end + 1][None].to(next(iter(model.parameters())).device)
    t0 = time.perf_counter()
    extra = {} if inputs is None else {"inputs": inputs}
    nll = model.token_nll(window, start=length - score, **extra)
    seconds = time.perf_counter() - t0
    mean = float(nll.double().mean())
    return {"ppl": math.exp(mean), "nll": mean, "ppl_tokens": score, "ppl_seconds": seconds}


# ------------------------------------------------------------------------------ the run


@dataclass
class RunState:
    """Rows (one per method x length) and passkey trials measured so far."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)

    def done(self, method: str, length: int) -> bool:
        return any(r["method"] == method and r["length"] == length for r in self.rows)


def _options_text(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True) if options else ""


def run_longctx(
    plan: LongctxPlan,
    model: Any,
    tokenizer: Any,
    heldout: Tensor,
    *,
    state: RunState | None = None,
    prompts: dict[int, list[tuple[PasskeyPrompt, int]]] | None = None,
    on_measurement: Callable[[RunState], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> RunState:
    """Measure every method at every length (length by length, so short lengths finish
    first). ``model`` is a ``LlamaLM`` (its encoding is swapped per method and restored to the
    first method's at the end); ``heldout`` the held-out token ids; ``prompts`` passkey
    prompts built beforehand (``build_prompts``; built here when missing). ``on_measurement``
    is called after each method x length (the CLI writes the report there)."""
    state = state or RunState()
    prompts = dict(prompts or {})
    original = (model.encoding_name, dict(model.encoding_options))
    end = max(plan.lengths)  # every length scores the perplexity of the same tokens
    try:
        for length in plan.lengths:
            for name in plan.methods:
                if state.done(name, length):
                    continue
                method = METHODS[name]
                model.set_encoding(method.encoding, **method.options)
                row: dict[str, Any] = {
                    "method": name,
                    "encoding": method.encoding,
                    "options": _options_text(method.options),
                    "length": length,
                }
                t0 = time.perf_counter()
                segments = _reads_segments(method.encoding)
                if plan.ppl_tokens:
                    # running text has no documents: PINE sees one prefix (plain RoPE)
                    ppl_inputs = _text_segments(length, heldout.device) if segments else None
                    row.update(
                        tail_perplexity(
                            model, heldout, length, plan.ppl_tokens, end=end, inputs=ppl_inputs
                        )
                    )
                if plan.seeds:
                    if length not in prompts:
                        prompts[length] = build_prompts(plan, tokenizer, [length])[length]
                    results = []
                    for prompt, seed in prompts[length]:
                        inputs = None
                        if segments:  # PINE: prefix, the filler as documents, the question
                            ids = passkey_segments(tokenizer, prompt, PINE_DOCUMENTS)
                            inputs = {"segments": torch.tensor([ids])}
                        result = run_passkey(
                            model,
                            tokenizer,
                            prompt,
                            max_new_tokens=plan.max_new_tokens,
                            inputs=inputs,
                        )
                        result.update(method=name, length=length, seed=seed)
                        results.append(result)
                    state.trials.extend(results)
                    correct = sum(r["correct"] for r in results)
                    row.update(
                        passkey_correct=correct,
                        passkey_trials=len(results),
                        passkey_accuracy=correct / len(results),
                        prompt_tokens=round(
                            sum(r["prompt_tokens"] for r in results) / len(results)
                        ),
                        passkey_seconds=sum(r["seconds"] for r in results) / len(results),
                    )
                row["seconds"] = time.perf_counter() - t0
                state.rows.append(row)
                if log is not None:
                    log(_measurement_line(row))
                if on_measurement is not None:
                    on_measurement(state)
    finally:
        model.set_encoding(original[0], **original[1])
    return state


def _reads_segments(encoding: str) -> bool:
    """The method's encoding reads ``inputs['segments']`` (PINE)."""
    return "segments" in registry.encoding_class(encoding).required_inputs


def _text_segments(length: int, device: torch.device) -> dict[str, Tensor]:
    """PINE's segments for running text: a prefix and a one-token suffix (no documents)."""
    ids = torch.full((1, length), -1, dtype=torch.long, device=device)
    ids[0, -1] = 0
    return {"segments": ids}


def _measurement_line(row: dict[str, Any]) -> str:
    parts = [f"  {row['length']:>6} tokens  {row['method']:<12}"]
    if "passkey_trials" in row:
        parts.append(
            f"passkey {row['passkey_correct']}/{row['passkey_trials']} "
            f"({row['passkey_seconds']:.1f} s per prompt)"
        )
    if "ppl" in row:
        parts.append(f"ppl {row['ppl']:.2f} ({row['ppl_seconds']:.1f} s)")
    return "  ".join(parts)


# ------------------------------------------------------------------------------ resume


def start_run(plan: LongctxPlan, meta: dict[str, Any]) -> RunState:
    """The first write: clear an old run (``--force``) or continue it (``--resume``: what the
    plan read back), then write ``run.json``."""
    if plan.clear:
        shutil.rmtree(plan.out_dir)
    state = RunState()
    if plan.resume:  # checked and read by plan_longctx (read_previous)
        state = RunState(list(plan.previous["rows"]), list(plan.previous["trials"]))
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    record = {"kind": RUN_KIND, "settings": plan.settings(), **meta}
    write_json_file(plan.out_dir / RUN_FILE, record)
    return state
