"""Training-free context extension of a pretrained RoPE model: ``relpos longctx``.

The model is SmolLM2-135M-Instruct (``relpos.interop.load_gguf``: 30 layers, RoPE base 1e5,
trained context 8192). Each *method* swaps the positional encoding of every layer
(``LlamaLM.set_encoding``), the weights stay; no method is fine-tuned. At each prompt length
the run measures

* **passkey retrieval** (``relpos.lab.passkey``): Landmark-format prompts of that many tokens
  with the key at several depths (and seeds), greedy decoding, accuracy = the first generated
  integer equals the key (Mohtashami & Jaggi 2023; the protocol of PI, NTK and YaRN);
* **perplexity** on held-out text (the test plays of the built-in Shakespeare, or ``--data``)
  scored with the model's own tokenizer: the same last ``ppl_tokens`` tokens of one text span,
  given ``length`` tokens of context, so a method that handles long context keeps its
  perplexity flat or lowers it, and one that breaks sends it up.

Methods (``METHODS``; adding one = one entry ``name -> Method(encoding, options)``; the model
adds its own ``base``, ``layout`` and ``max_position_embeddings`` where the encoding takes
them, see ``LlamaLM.encoding_defaults``):

* ``baseline``: RoPE as trained;
* ``pi``: position interpolation x2 (Chen et al. 2023, arXiv 2306.15595; HF ``linear``);
* ``ntk``: NTK-aware base x2 (bloc97 2023);
* ``dynamic-ntk``: dynamic NTK x2 (emozilla 2023; HF ``dynamic``), frequencies from the
  length of each call;
* ``yarn``: YaRN x2 (Peng et al. 2023, arXiv 2309.00071; HF ``yarn``);
* ``lm-infinite``: LM-Infinite (Han et al. 2023, arXiv 2308.16137): a local branch of the
  trained length plus the first 10 tokens, distances capped at the trained length;
* ``dca``: Dual Chunk Attention (An et al. 2024, arXiv 2402.17463), chunks of 3/4 of the
  trained length with a local window of 1/8;
* ``self-extend``: Self-Extend (Jin et al. 2024, arXiv 2401.01325), groups of 8 beyond a
  neighbour window of 1024.

The last three are piecewise RoPE schedules: they run on the ``chunked`` backend (O(L x block)
memory), about 5x slower than the rotary-only methods on SDPA, so the profiles run the first
five and the schedules are opt-in (``--methods all`` or by name).

Formulas: ../shared/spec/formulas-rotary.md §3-6. What the full profile should show (measured
with ``transformers`` on the same file, greedy): the baseline finds the key at 4K and 8K and
fails at 12K and 16K; PI x2 fails already at 4K; dynamic NTK x2 and YaRN x2 find it at 12K and
16K.

Memory: rotary encodings run through SDPA's flash kernels (O(L)); the LM head only sees the
last position while decoding and the scored positions for perplexity (``LlamaLM.token_nll``
chunks them), so no ``L x L`` or ``L x vocab`` tensor is built at 16K tokens.

Outputs (each written atomically into ``out_dir``, and rewritten after every measurement so
an interrupted run keeps what it measured; ``--resume`` skips finished measurements):
``results.json`` (meta, rows, per-trial details), ``results.csv`` (one row per method x
length), ``longctx.png`` (accuracy and perplexity vs length), ``report.md``.
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
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .. import registry
from ..io import atomic_write
from . import report
from .passkey import MAX_NEW_TOKENS, PasskeyPrompt, passkey_prompt, random_key, run_passkey

RUN_FILE = "run.json"
RUN_KIND = "relpos-longctx"
PLOT_FILE = "longctx.png"


# ------------------------------------------------------------------------------ methods


class Method(NamedTuple):
    """A context-extension method: a relpos encoding name and its options."""

    encoding: str
    options: dict[str, Any]
    label: str = ""


METHODS: dict[str, Method] = {
    "baseline": Method("rope", {}, "RoPE as trained"),
    "pi": Method(
        "rope", {"scaling": {"rope_type": "linear", "factor": 2.0}}, "position interpolation x2"
    ),
    "ntk": Method("rope", {"scaling": {"rope_type": "ntk", "factor": 2.0}}, "NTK-aware x2"),
    "dynamic-ntk": Method(
        "rope", {"scaling": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic NTK x2"
    ),
    "yarn": Method("rope", {"scaling": {"rope_type": "yarn", "factor": 2.0}}, "YaRN x2"),
    # RoPE schedules (relpos.encodings.rotary_schedules), sized from the trained context Lp
    "lm-infinite": Method("lm-infinite", {"global_branch": 10}, "LM-Infinite, local Lp + 10"),
    "dca": Method("dca", {}, "Dual Chunk Attention, chunk 3Lp/4"),
    "self-extend": Method(
        "self-extend", {"group_size": 8, "neighbor_window": 1024}, "Self-Extend G=8, W=1024"
    ),
}


def available_methods() -> list[str]:
    """Methods whose encoding is registered (in ``METHODS`` order)."""
    names = set(registry.available())
    return [name for name, m in METHODS.items() if m.encoding in names]


def method_cost(name: str) -> float:
    """Relative forward time of a method: ``PIECEWISE_COST`` for encodings that change the
    attention weights beyond a score term (piecewise schedules: chunked backend), else 1."""
    cls = registry.encoding_class(METHODS[name].encoding)
    slow = cls.piecewise or cls.has_value_term or cls.multiplies_probs
    return PIECEWISE_COST if slow else 1.0


def parse_methods(value: str | Sequence[str]) -> list[str]:
    """Method names from ``"baseline,yarn"`` (``"all"``: every available method) or a list;
    unknown names raise ``ValueError``."""
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    known = available_methods()
    names = [m for n in names for m in (known if n == "all" else [n])]
    names = list(dict.fromkeys(n for n in names if n))
    if not names:
        raise ValueError(f"--methods is empty; known methods: {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown method{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"known methods: {', '.join(known)}"
        )
    return names


def _numbers(value: str | Sequence[Any], flag: str, kind: type) -> list[Any]:
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        if isinstance(item, str):
            item = item.strip()
            if not item:
                continue
        try:
            number = kind(item)
        except (TypeError, ValueError):
            raise ValueError(f"{flag} must be comma-separated numbers, got {value!r}") from None
        out.append(number)
    if not out:
        raise ValueError(f"{flag} is empty")
    return out


def parse_lengths(value: str | Sequence[int]) -> list[int]:
    """Prompt lengths in tokens (``"1024,2048"``; a ``k``/``K`` suffix means x1024), sorted."""
    items = value.split(",") if isinstance(value, str) else list(value)
    parsed: list[int] = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        mult = 1024 if text[-1] in "kK" else 1
        number = _numbers(text[:-1] if mult > 1 else text, "--lengths", float)[0]
        if number != int(number) and mult == 1:
            raise ValueError(f"--lengths must be whole numbers of tokens, got {text!r}")
        length = int(number * mult)
        if length < 64:
            raise ValueError(f"--lengths must be >= 64 tokens, got {text!r}")
        parsed.append(length)
    if not parsed:
        raise ValueError("--lengths is empty")
    return sorted(set(parsed))


def parse_depths(value: str | Sequence[float]) -> list[float]:
    """Key depths in [0, 1] (``"0.1,0.5,0.9"``)."""
    depths = _numbers(value, "--depths", float)
    bad = [d for d in depths if not 0 <= d <= 1]
    if bad:
        raise ValueError(f"--depths must lie in [0, 1], got {bad[0]!r}")
    return list(dict.fromkeys(depths))


# ------------------------------------------------------------------------------ profiles


# The rotary-only methods (SDPA, minutes per length); the piecewise schedules are opt-in.
ROPE_SCALINGS = ("baseline", "pi", "ntk", "dynamic-ntk", "yarn")
# Forward time of the piecewise schedules (chunked backend) relative to the rotary-only
# methods (SDPA); measured: Self-Extend at 2K tokens 79 s CPU vs 16 s for RoPE.
PIECEWISE_COST = 5.0


@dataclass(frozen=True)
class LongctxProfile:
    """A preset of ``relpos longctx``: methods, lengths, passkey trials, perplexity budget."""

    name: str
    description: str
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    seeds: int
    ppl_tokens: int
    methods: tuple[str, ...] = ROPE_SCALINGS
    # SmolLM2-135M forward on a quiet 2-core CPU, seconds = a * L + b * L^2 (fit to 6-8 s at
    # 2K tokens and about 90-100 s at 16K with SDPA)
    seconds_per_token: float = 3.0e-3
    seconds_per_token2: float = 2.0e-7


PROFILES: dict[str, LongctxProfile] = {
    "quick": LongctxProfile(
        name="quick",
        description="1K and 2K tokens, 2 passkey depths: a few minutes on 2 cores",
        lengths=(1024, 2048),
        depths=(0.25, 0.75),
        seeds=1,
        ppl_tokens=256,
    ),
    "full": LongctxProfile(
        name="full",
        description="2K..16K tokens (past the trained 8K), 3 depths: about 1.5 h on 2 cores",
        lengths=(2048, 4096, 8192, 12288, 16384),
        depths=(0.1, 0.5, 0.9),
        seeds=1,
        ppl_tokens=1024,
    ),
}


def get_profile(name: str) -> LongctxProfile:
    try:
        return PROFILES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown profile {name!r}; known profiles: {', '.join(PROFILES)}"
        ) from None


# ------------------------------------------------------------------------------ the plan


@dataclass
class LongctxPlan:
    """A validated run: what to measure and where to write it."""

    methods: list[str]
    lengths: list[int]
    depths: list[float]
    seeds: int
    ppl_tokens: int
    out_dir: Path
    profile: LongctxProfile
    max_new_tokens: int = MAX_NEW_TOKENS
    resume: bool = False
    clear: bool = False
    model: str = "smollm2"
    data: str | None = None

    @property
    def trials(self) -> int:
        return len(self.depths) * self.seeds

    def settings(self) -> dict[str, Any]:
        """What the measurements depend on (compared on ``--resume``)."""
        return {
            "depths": self.depths,
            "seeds": self.seeds,
            "ppl_tokens": self.ppl_tokens,
            "max_new_tokens": self.max_new_tokens,
            "model": self.model,
            "data": self.data,
            "max_length": max(self.lengths),
        }

    def estimate_seconds(self) -> float:
        """Rough wall time on a quiet 2-core CPU: one perplexity forward and ``trials``
        passkey prefills per method and length."""
        p = self.profile
        per_method = sum(
            p.seconds_per_token * n + p.seconds_per_token2 * n * n for n in self.lengths
        )
        passes = (1 if self.ppl_tokens else 0) + self.trials
        cost = sum(method_cost(name) for name in self.methods)
        return 10.0 + cost * passes * per_method


def check_out_dir(out_dir: Path, *, resume: bool, force: bool) -> bool:
    """Validate ``--out``; returns True when ``--force`` will clear an old run."""
    return report.check_run_folder(
        out_dir,
        resume=resume,
        force=force,
        run_file=RUN_FILE,
        run_kind=RUN_KIND,
        what="relpos longctx run",
    )


def plan_longctx(
    *,
    methods: str | Sequence[str] | None = None,
    profile: str | LongctxProfile = "quick",
    lengths: str | Sequence[int] | None = None,
    depths: str | Sequence[float] | None = None,
    seeds: int | None = None,
    ppl_tokens: int | None = None,
    out_dir: str | os.PathLike | None = None,
    resume: bool = False,
    force: bool = False,
    model: str = "smollm2",
    data: str | None = None,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> LongctxPlan:
    """Resolve and validate a run (raises ``ValueError``); writes nothing."""
    prof = profile if isinstance(profile, LongctxProfile) else get_profile(profile)
    names = parse_methods(methods if methods is not None else prof.methods)
    lens = parse_lengths(lengths) if lengths is not None else list(prof.lengths)
    deps = parse_depths(depths) if depths is not None else list(prof.depths)
    n_seeds = prof.seeds if seeds is None else seeds
    n_ppl = prof.ppl_tokens if ppl_tokens is None else ppl_tokens
    for flag, value, low in (("--seeds", n_seeds, 0), ("--ppl-tokens", n_ppl, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{flag} must be an integer >= {low}, got {value!r}")
    if n_seeds == 0 and n_ppl == 0:
        raise ValueError("--seeds 0 and --ppl-tokens 0 leave nothing to measure")
    out = Path(out_dir or f"runs/longctx-{prof.name}")
    clear = check_out_dir(out, resume=resume, force=force)
    if data is not None and not Path(data).exists():
        raise ValueError(f"--data {data}: no such file or folder")
    if model not in ("smollm2", "random-tiny") and not Path(model).is_file():
        raise ValueError(f"--model must be smollm2, random-tiny or a .gguf file, got {model!r}")
    return LongctxPlan(
        methods=names,
        lengths=lens,
        depths=deps,
        seeds=n_seeds,
        ppl_tokens=n_ppl,
        out_dir=out,
        profile=prof,
        max_new_tokens=max_new_tokens,
        resume=resume,
        clear=clear,
        model=model,
        data=data,
    )


# ------------------------------------------------------------------------------ inputs


def heldout_text(data: str | os.PathLike | None = None) -> tuple[str, str]:
    """``(name, text)``: the test plays of the built-in Shakespeare split
    (``relpos.lab.data``, the same split as ``relpos extrapolate``), or all of ``data``."""
    from .data import BUILTIN, DOCUMENT_SEPARATOR, builtin_texts, read_texts, split_documents

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
    model: Any, tokens: Tensor, length: int, score: int, *, end: int | None = None
) -> dict[str, Any]:
    """Perplexity of the ``score`` targets ending at ``tokens[end]`` given the ``length``
    input tokens before each window end: the window is ``tokens[end - length : end + 1]``
    (default ``end = length``). With one ``end`` for every length, every length scores the
    same tokens and only the context before them grows (``model.token_nll``)."""
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
    nll = model.token_nll(window, start=length - score)
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
                if plan.ppl_tokens:
                    row.update(tail_perplexity(model, heldout, length, plan.ppl_tokens, end=end))
                if plan.seeds:
                    if length not in prompts:
                        prompts[length] = build_prompts(plan, tokenizer, [length])[length]
                    results = []
                    for prompt, seed in prompts[length]:
                        result = run_passkey(
                            model, tokenizer, prompt, max_new_tokens=plan.max_new_tokens
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
    """The first write: clear an old run (``--force``) or load it (``--resume``, same
    settings only), then write ``run.json``."""
    if plan.clear:
        shutil.rmtree(plan.out_dir)
    state = RunState()
    if plan.resume and (plan.out_dir / RUN_FILE).exists():
        old = json.loads((plan.out_dir / RUN_FILE).read_text())
        if old.get("settings") != plan.settings():
            raise ValueError(
                f"--resume: {plan.out_dir} was run with other settings ({old.get('settings')}); "
                "use --force to replace it"
            )
        try:
            saved = json.loads((plan.out_dir / "results.json").read_text())
            state = RunState(list(saved.get("rows", [])), list(saved.get("trials", [])))
        except (OSError, ValueError):
            pass
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    record = {"kind": RUN_KIND, "settings": plan.settings(), **meta}
    report.write_json_file(plan.out_dir / RUN_FILE, record)
    return state


# ------------------------------------------------------------------------------ report

CSV_COLUMNS = (
    "method",
    "encoding",
    "options",
    "length",
    "passkey_accuracy",
    "passkey_correct",
    "passkey_trials",
    "prompt_tokens",
    "passkey_seconds",
    "ppl",
    "nll",
    "ppl_tokens",
    "ppl_seconds",
    "seconds",
)


def _grid(rows: Sequence[dict[str, Any]], key: str) -> dict[str, dict[int, Any]]:
    grid: dict[str, dict[int, Any]] = {}
    for r in rows:
        if key in r:
            grid.setdefault(r["method"], {})[int(r["length"])] = r
    return grid


def _lengths(rows: Sequence[dict[str, Any]]) -> list[int]:
    return sorted({int(r["length"]) for r in rows})


def _cell(r: dict[str, Any] | None, key: str) -> str:
    if r is None:
        return "-"
    if key == "passkey":
        return f"{r['passkey_correct']}/{r['passkey_trials']}"
    return f"{r['ppl']:.2f}"


def markdown_tables(rows: Sequence[dict[str, Any]], trained: int | None = None) -> str:
    """Passkey and perplexity tables (methods x lengths) in markdown."""
    lengths = _lengths(rows)
    parts = []
    for key, title, field_name in (
        ("passkey", "passkey retrieval (correct / trials)", "passkey_trials"),
        ("ppl", "perplexity of the same final tokens given `length` tokens", "ppl"),
    ):
        grid = _grid(rows, field_name)
        if not grid:
            continue
        head = ["method", *[_length_label(n, trained) for n in lengths]]
        lines = [
            f"**{title}**",
            "",
            "| " + " | ".join(head) + " |",
            "|---|" + "---:|" * len(lengths),
        ]
        for name, cells in grid.items():
            lines.append(
                "| "
                + " | ".join([f"`{name}`", *[_cell(cells.get(n), key) for n in lengths]])
                + " |"
            )
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _length_label(n: int, trained: int | None, sep: str = " ") -> str:
    return f"{n}" if not trained else f"{n}{sep}({n / trained:.3g}x)"


def print_table(rows: Sequence[dict[str, Any]], trained: int | None = None, file: Any = None):
    """The passkey and perplexity tables in the terminal (rich when installed)."""
    if not rows:
        return
    lengths = _lengths(rows)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(markdown_tables(rows, trained), file=file)
        return
    console = Console(file=file) if file is not None else Console()
    passkey, ppl = _grid(rows, "passkey_trials"), _grid(rows, "ppl")
    parts = [p for p, grid in (("passkey", passkey), ("ppl", ppl)) if grid]
    table = Table(
        title=" and ".join(
            {"passkey": "passkey (correct/trials)", "ppl": "perplexity"}[p] for p in parts
        ),
        caption=f"trained context {trained} tokens" if trained else None,
    )
    table.add_column("method", no_wrap=True)
    for n in lengths:
        table.add_column(_length_label(n, trained, "\n"), justify="right")
    for name in dict.fromkeys(r["method"] for r in rows):
        out = []
        for n in lengths:
            cells = []
            r = passkey.get(name, {}).get(n)
            if "passkey" in parts:
                text = _cell(r, "passkey")
                if r is not None:
                    text = f"[{'green' if r['passkey_accuracy'] >= 0.5 else 'red'}]{text}[/]"
                cells.append(text)
            if "ppl" in parts:
                cells.append(_cell(ppl.get(name, {}).get(n), "ppl"))
            out.append("  ".join(cells))
        table.add_row(name, *out)
    console.print(table)


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    report.write_csv(path, rows, CSV_COLUMNS)


def plot(path: Path, rows: Sequence[dict[str, Any]], trained: int | None = None) -> None:
    """Passkey accuracy (left) and perplexity (right, log scale) against prompt length (log2
    axis), one line per method; the trained context dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    lengths = _lengths(rows)
    panels = [
        (key, title)
        for key, title in (
            ("passkey_trials", "passkey retrieval accuracy (%)"),
            ("ppl", "perplexity of the final tokens (log scale)"),
        )
        if _grid(rows, key)
    ]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels) + 1.6, 4.0), squeeze=False)
    colors = plt.get_cmap("tab10")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    handles = {}
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        grid = _grid(rows, key)
        for k, name in enumerate(methods):
            cells = grid.get(name, {})
            if not cells:
                continue
            xs = sorted(cells)
            if key == "ppl":
                ys = [cells[x]["ppl"] for x in xs]
            else:
                ys = [100 * cells[x]["passkey_accuracy"] for x in xs]
            (line,) = ax.plot(
                xs, ys, marker="o", markersize=3.5, linewidth=1.6, color=colors(k % 10), label=name
            )
            handles.setdefault(name, line)
        if trained:
            ax.axvline(trained, color="0.35", linestyle="--", linewidth=1.0)
        ax.set_xscale("log", base=2)
        if key == "ppl":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        else:
            ax.set_ylim(-5, 105)
        ax.set_xlim(lengths[0] / 1.25, lengths[-1] * 1.25)
        ax.xaxis.set_major_locator(FixedLocator(lengths))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(plain)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    labels = [
        f"{n} ({METHODS[n].label})" if n in METHODS and METHODS[n].label else n for n in handles
    ]
    fig.legend(list(handles.values()), labels, loc="center right", fontsize=8, frameon=False)
    suffix = f"; trained context {trained} tokens (dashed)" if trained else ""
    fig.suptitle(f"training-free context extension{suffix}", fontsize=10)
    width = 4.8 * len(panels) + 1.6
    fig.tight_layout(rect=(0, 0, 1 - 2.6 / width, 1))

    def write(tmp: str) -> None:
        fig.savefig(tmp, dpi=100, format="png")

    try:
        atomic_write(path, write)
    finally:
        plt.close(fig)


HOW_TO_READ = """\
Every method runs the same pretrained weights; only the rotary encoding changes, nothing is
fine-tuned. *Passkey*: a random key hides at several depths inside filler text of the given
length (Landmark format); the model must repeat it (greedy decoding, first integer). A method
that extends the context keeps finding it past the trained length. *Perplexity*: the same final
{ppl_tokens} tokens of held-out text, scored with `length` tokens of context; it should stay
flat or fall as the context grows, and rises when positions past the trained length confuse
the model.
"""


def write_markdown(path: Path, state: RunState, meta: dict[str, Any]) -> None:
    trained = meta.get("model", {}).get("max_position_embeddings")
    settings = meta.get("settings", {})
    lines = [
        "# relpos longctx: training-free context extension",
        "",
        "```sh",
        str(meta.get("command", "relpos longctx")),
        "```",
        "",
        f"Model: {meta.get('model', {}).get('name', '?')} (trained context {trained}). "
        f"Held-out text: {meta.get('data', {}).get('name', '?')}. Passkey depths "
        f"{settings.get('depths')}, {settings.get('seeds')} seed(s) per depth.",
        "",
        markdown_tables(state.rows, trained).rstrip("\n"),
        "",
        f"![passkey accuracy and perplexity vs length]({PLOT_FILE})",
        "",
        "## How to read it",
        "",
        HOW_TO_READ.format(ppl_tokens=settings.get("ppl_tokens", "?")).rstrip("\n"),
        "",
    ]
    wall = meta.get("wall_seconds")
    if isinstance(wall, (int, float)):
        lines += [f"Wall time {wall:.0f} s. Raw numbers: `results.csv`, `results.json`.", ""]
    report._write_text(path, "\n".join(lines))


def write_outputs(
    out_dir: Path, state: RunState, meta: dict[str, Any], *, final: bool = True
) -> dict[str, Path]:
    """Write results.json and results.csv, and with ``final`` also longctx.png and report.md
    (each atomically). The run calls it with ``final=False`` after every measurement."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "csv": out_dir / "results.csv",
        "png": out_dir / PLOT_FILE,
        "md": out_dir / "report.md",
    }
    data = {"meta": meta, "rows": state.rows, "trials": state.trials}
    report.write_json_file(paths["json"], data)
    write_csv(paths["csv"], state.rows)
    if final:
        trained = meta.get("model", {}).get("max_position_embeddings")
        if state.rows:
            plot(paths["png"], state.rows, trained)
        write_markdown(paths["md"], state, meta)
    return paths


# ------------------------------------------------------------------------------ models


class ByteTokenizer:
    """UTF-8 bytes as token ids (the ``random-tiny`` smoke-test model's tokenizer)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def random_tiny_model(seed: int = 0) -> tuple[Any, ByteTokenizer]:
    """A randomly initialised 2-layer ``LlamaLM`` over bytes (smoke tests of the pipeline)."""
    from ..nn.llama import LlamaConfig, LlamaLM

    config = LlamaConfig(
        vocab_size=256,
        dim=32,
        depth=2,
        num_heads=4,
        num_kv_heads=2,
        hidden_dim=64,
        rope_base=10000.0,
        max_position_embeddings=256,
        name="random-tiny (untrained)",
    )
    torch.manual_seed(seed)
    return LlamaLM(config).eval(), ByteTokenizer()


def load_model(name: str) -> tuple[Any, Any, float]:
    """``(model, tokenizer, seconds)`` for ``--model``: ``smollm2`` (the bundled GGUF),
    a path to a Llama-family ``.gguf`` file, or ``random-tiny`` (untrained, for smoke tests)."""
    t0 = time.perf_counter()
    if name == "random-tiny":
        model, tokenizer = random_tiny_model()
    else:
        from ..interop.gguf import load_gguf

        if name != "smollm2" and not Path(name).is_file():
            raise ValueError(f"--model must be smollm2, random-tiny or a .gguf file, got {name!r}")
        model, tokenizer, _ = load_gguf(None if name == "smollm2" else name)
    return model, tokenizer, time.perf_counter() - t0


# ------------------------------------------------------------------------------ command


def add_arguments(parser: Any) -> None:
    """The options of ``relpos longctx`` (numbers are parsed by ``run_command``)."""
    add = parser.add_argument
    add(
        "--methods",
        help=f"comma-separated methods or all (default: {','.join(ROPE_SCALINGS)}; known: "
        f"{', '.join(METHODS)})",
    )
    add("--profile", default="quick", help="quick (default, minutes) or full (2K..16K, ~1.5 h)")
    add("--lengths", help="prompt lengths in tokens, e.g. 2048,4k,16k (default: the profile's)")
    add("--depths", help="passkey depths in [0, 1], e.g. 0.1,0.5,0.9 (default: the profile's)")
    add("--seeds", help="passkey keys per depth (default: the profile's; 0 = no passkey)")
    add("--ppl-tokens", help="perplexity: final tokens scored (default: the profile's; 0 = none)")
    add("--model", default="smollm2", help="smollm2 (default), a .gguf file, or random-tiny")
    add("--data", help="held-out UTF-8 text file or folder (default: Shakespeare test plays)")
    add("--out", help="run folder (default runs/longctx-PROFILE)")
    add("--resume", action="store_true", help="continue the run in --out")
    add("--force", action="store_true", help="replace the run in --out")
    add("--no-progress", action="store_true", help="no line per measurement")


def _int_option(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{flag} must be an integer, got {value!r}") from None
    if number < 0:
        raise ValueError(f"{flag} must be >= 0, got {value!r}")
    return number


def run_command(args: Any) -> int:
    """``relpos longctx``: plan (all validation first), load, measure, report."""
    import shlex
    import sys

    t0 = time.perf_counter()
    plan = plan_longctx(
        methods=args.methods,
        profile=args.profile,
        lengths=args.lengths,
        depths=args.depths,
        seeds=_int_option(args.seeds, "--seeds"),
        ppl_tokens=_int_option(args.ppl_tokens, "--ppl-tokens"),
        out_dir=args.out,
        resume=args.resume,
        force=args.force,
        model=args.model,
        data=args.data,
    )
    argv = getattr(args, "argv", None)
    command = "relpos " + (shlex.join(argv) if argv else "longctx")
    print(
        f"relpos longctx, profile {plan.profile.name}: {len(plan.methods)} methods "
        f"({', '.join(plan.methods)})"
    )
    print(
        f"  lengths {', '.join(map(str, plan.lengths))}; passkey {len(plan.depths)} depths x "
        f"{plan.seeds} seed(s); perplexity of the final {plan.ppl_tokens} tokens"
    )
    print(
        f"  estimated time: ~{plan.estimate_seconds() / 60:.1f} min on a quiet 2-core CPU "
        f"(this machine: {os.cpu_count()} CPUs); out: {plan.out_dir}"
    )

    data_name, text = heldout_text(plan.data)
    model, tokenizer, load_seconds = load_model(plan.model)
    from .passkey import as_encoder

    encode = as_encoder(tokenizer)
    # Tokenize only what the longest window needs (about 5 characters per token, doubled).
    need = max(plan.lengths) + 1
    chars = 10 * need
    heldout = torch.tensor(encode(text[:chars]), dtype=torch.int64)
    while heldout.numel() < need and chars < len(text):
        chars *= 2
        heldout = torch.tensor(encode(text[:chars]), dtype=torch.int64)
    if plan.ppl_tokens and heldout.numel() < need:
        raise ValueError(
            f"the held-out text {data_name!r} has {heldout.numel()} tokens; the longest length "
            f"needs {need}"
        )
    config = model.config
    print(
        f"  model: {config.name or plan.model} ({config.depth} layers, d={config.dim}, "
        f"{config.num_heads}/{config.num_kv_heads} heads, trained context "
        f"{config.max_position_embeddings}), loaded in {load_seconds:.1f} s"
    )
    meta = report.run_metadata(
        command=command,
        profile=plan.profile.name,
        settings=plan.settings(),
        methods={
            n: {
                "encoding": METHODS[n].encoding,
                "options": METHODS[n].options,
                "label": METHODS[n].label,
            }
            for n in plan.methods
        },
        lengths=plan.lengths,
        model={**config.to_dict(), "source": plan.model, "load_seconds": load_seconds},
        data={"name": data_name, "tokens_used": need},
    )
    prompts = build_prompts(plan, tokenizer) if plan.seeds else {}
    state = start_run(plan, {"command": command})

    def save(current: RunState, final: bool = False) -> None:
        meta["wall_seconds"] = time.perf_counter() - t0
        write_outputs(plan.out_dir, current, meta, final=final)

    try:
        state = run_longctx(
            plan,
            model,
            tokenizer,
            heldout,
            state=state,
            prompts=prompts,
            on_measurement=save,
            log=None if args.no_progress else print,
        )
    except KeyboardInterrupt:
        save(state, final=True)
        print(f"relpos: interrupted; continue with: {command} --resume", file=sys.stderr)
        return 130
    save(state, final=True)
    print_table(state.rows, config.max_position_embeddings)
    print(f"wall time {meta['wall_seconds']:.0f} s")
    print(f"report: {plan.out_dir / 'report.md'}")
    return 0


__all__ = [
    "METHODS",
    "Method",
    "ROPE_SCALINGS",
    "method_cost",
    "PROFILES",
    "LongctxPlan",
    "LongctxProfile",
    "RunState",
    "available_methods",
    "parse_methods",
    "parse_lengths",
    "parse_depths",
    "plan_longctx",
    "heldout_text",
    "trial_keys",
    "build_prompts",
    "tail_perplexity",
    "run_longctx",
    "start_run",
    "write_outputs",
    "print_table",
    "markdown_tables",
    "load_model",
    "random_tiny_model",
    "add_arguments",
    "run_command",
]
