"""``relpos bench --auto-vs-best`` and ``relpos bench --calibrate``: whether
``backend="auto"`` runs the fastest correct backend, and the measurements its policy table is
derived from.

Both walk a grid, encoding x length x causal / bidirectional x forward / training step x
dtype, and time every backend that runs a call correctly beside no-bias SDPA with the same
mask and mode, in interleaved rounds (``measure.time_round_robin``: the backends of one call
in turn, the order rotating every round, so a load spike hits all of them); medians, and
ratios to the no-bias call of the same rounds.

``--auto-vs-best`` adds ``auto`` to every call and reports ``auto / best``, where *best* is
the fastest **eligible** backend: one that runs the call (its first, untimed call is the
check), forms no ``Lq x Lk`` tensor above ``DENSE_BIAS_LIMIT`` elements (``eager`` always
does; ``sdpa`` does for a score term) and rounds no further than ``FOLD_LOGIT_TOLERANCE``
(``fold``): what ``auto`` may choose. These rules are applied here from public facts, not
read from the policy, so the report checks the policy too (a choice outside the eligible
set is flagged). Printed: one row per call (auto's backend and path, the best, auto / best,
ratios to no-bias SDPA), the distribution of auto / best and its worst case.

``--calibrate`` times the candidates ``auto`` chooses among (``relpos.attention.api.facts``)
for representative calls of every kind (``CALIBRATION_CASES``) and writes the policy table
(``relpos.attention.policy.derive_table``) to this machine's table path, which ``auto``
reads from then on (``--table PATH`` writes elsewhere, e.g. the shipped table).

Compiled FlexAttention compiles once per shape (tens of seconds on a CPU): it is timed only
at ``--flex-lengths`` (none by default), and elsewhere it is listed as not timed.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import measure
from .arguments import parse_int, parse_int_list, parse_names
from .io import check_output_dir, write_json

__all__ = [
    "EncodingCase",
    "FAMILY_CASES",
    "CALIBRATION_CASES",
    "GridPlan",
    "call_kwargs",
    "run_grid",
    "summarize",
    "markdown",
    "calibration_points",
    "run_command",
]

BASELINE = "sdpa-nobias"
CLOCK_TEXT = {
    "cpu": "process CPU time (waits for a core on a loaded machine not counted)",
    "wall": "wall-clock time",
}
BACKENDS = ("eager", "sdpa", "chunked", "flex", "fold")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TARGET = 1.10  # auto within this factor of the best eligible backend
CONFIRM_ROUNDS = 6  # --auto-vs-best: rounds more for a call above TARGET (GridPlan.confirm)
BATCH_S = 0.004  # a sample of a short call lasts at least this long (the baseline's time)
MAX_BATCH = 64


@dataclass(frozen=True)
class EncodingCase:
    """One encoding of the grid: a registered name with options, shown as ``label``."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        if not self.options:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.options)})"

    def create(self, heads: int, head_dim: int):
        import relpos

        torch.manual_seed(0)
        return relpos.create(self.name, num_heads=heads, head_dim=head_dim, **dict(self.options))


#: one encoding per family of ``relpos.encodings`` and per path of the engine: biases (the
#: fold, per-distance tables, FIRE's table below its threshold and pairs above), rotary,
#: piecewise RoPE schedules, value-term tables, row-dependent terms, DeBERTa's band,
#: contextual / spatial / document / graph tables, absolute and no encoding, a spatial
#: bias that is not a table (gaussian-shift), camera rotations (GTA's per-token transforms,
#: PRoPE's projective ones), echo and the orthogonal-function rotations (legendre)
FAMILY_CASES = tuple(
    EncodingCase(n)
    for n in (
        "alibi",
        "fire",
        "kerple-log",
        "t5",
        "rope",
        "dca",
        "shaw",
        "cope",
        "deberta",
        "transformer-xl",
        "swin-2d",
        "layoutlmv2",
        "graph-spd",
        "learned",
        "nope",
        "gaussian-shift",
        "gta",
        "echo",
        "legendre",
    )
) + (EncodingCase("prope", (("image_size", (32.0, 32.0)),)),)
QUICK_CASES = tuple(EncodingCase(n) for n in ("alibi", "fire", "t5", "rope"))
#: representatives of every kind of call the policy distinguishes (``policy.KINDS``):
#: plain (rope; and the encodings whose rotations or transforms cost apart from the kernel:
#: gta, prope, echo, legendre, learned and nope's absolute terms), toeplitz (alibi with its
#: fold; in the forward also kerple-log, T5 and FIRE below its threshold), learned-toeplitz
#: (the training steps of those three, whose table takes gradients), row-affine (FIRE's
#: forward above its threshold, from the first length on with a threshold of 1), tile
#: (FIRE's training steps above it; transformer-xl's table reads; swin-2d's, layoutlmv2's
#: and graph-spd's tables and gaussian-shift's computed bias, whose costs differ), band
#: (deberta), probabilities (shaw), piecewise-sdpa (dca), row-suffix (cope). Where a key's
#: ranking costs one of them more than ``policy.ENCODING_KEY_ABOVE``, that encoding gets its
#: own key (``policy.derive_table``).
CALIBRATION_CASES = (
    EncodingCase("rope"),
    EncodingCase("gta"),
    EncodingCase("prope", (("image_size", (32.0, 32.0)),)),
    EncodingCase("echo"),
    EncodingCase("legendre"),
    EncodingCase("learned"),
    EncodingCase("nope"),
    EncodingCase("alibi"),
    EncodingCase("kerple-log"),
    EncodingCase("t5"),
    EncodingCase("fire"),
    EncodingCase("fire", (("init_L", 1.0),)),
    EncodingCase("transformer-xl"),
    EncodingCase("swin-2d"),
    EncodingCase("layoutlmv2"),
    EncodingCase("graph-spd"),
    EncodingCase("gaussian-shift"),
    EncodingCase("deberta"),
    EncodingCase("shaw"),
    EncodingCase("dca"),
    EncodingCase("cope"),
)
LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
#: calibration stops at 4096: beyond it only O(L)-memory candidates remain (chunked, fold,
#: flex), ranked as at 4096
CALIBRATION_LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (128, 1024)


# ------------------------------------------------------------------------------ the grid
@dataclass
class GridPlan:
    """The checked settings of one grid run."""

    cases: tuple[EncodingCase, ...]
    lengths: tuple[int, ...]
    dtypes: tuple[str, ...]
    masks: tuple[bool, ...]  # causal flags
    modes: tuple[bool, ...]  # training-step flags
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    repeats: int = 5
    warmup: int = 1
    #: --auto-vs-best: rounds more for a call whose auto / best is above ``TARGET`` after
    #: ``repeats`` rounds (auto, the best, the backend auto ran and the baseline; medians over
    #: every round); --calibrate: the rounds of each further measurement, after the grid, of
    #: the calls ``disputed_rows`` names (``remeasure_disputed``)
    confirm: int = 0
    flex_lengths: tuple[int, ...] = ()
    with_auto: bool = True
    calibrate: bool = False
    device: str = "cpu"
    clock: str = "cpu"

    def settings(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["cases"] = [c.label for c in self.cases]
        return out


def lift_positions(enc, pos: torch.Tensor) -> torch.Tensor:
    """1-D positions ``(L,)`` as the encoding's ``(1, L, m)`` (axis ``a`` reads
    ``(a + 2) p + a``, reduced into a learned table if there is one)."""
    if enc.dims == 1:
        return pos
    axes = [pos] + [(a + 2) * pos + a for a in range(1, enc.dims)]
    if enc.max_positions is not None:
        axes = [axes[0]] + [x % enc.max_positions for x in axes[1:]]
    return torch.stack(axes, dim=-1)[None]


def call_kwargs(enc, batch: int, length: int, causal: bool, device: str) -> dict[str, Any]:
    """Keyword arguments of ``relpos.attention`` for a call of ``length`` tokens: positions
    for m-D encodings or a learned table shorter than ``length`` (else the defaults), and
    the encoding's example inputs."""
    kw: dict[str, Any] = {"causal": causal}
    pos = torch.arange(length, device=device)
    changed = False
    if enc.max_positions is not None and length > enc.max_positions:
        pos, changed = pos % enc.max_positions, True
    if enc.dims > 1:
        pos, changed = lift_positions(enc, pos), True
    if changed:
        kw["q_pos"] = kw["k_pos"] = pos
    if enc.required_inputs or enc.needs_inputs:
        gen = torch.Generator().manual_seed(0)
        inputs = enc.example_inputs(batch, length, length, gen)
        kw["inputs"] = {k: v.to(device) for k, v in inputs.items()}
    return kw


def _ineligible(plan: GridPlan, enc, backend: str, q, k, v, kw) -> str | None:
    """Why ``backend`` is not one ``auto`` may choose for this call (memory, rounding), or
    None. Refusals are found by running it."""
    from relpos.attention.api import DENSE_BIAS_LIMIT
    from relpos.attention.call import prepare_call
    from relpos.attention.fold import (
        FOLD_LOGIT_TOLERANCE,
        exact_fold_pieces,
        fold_refusal,
        fold_rounding_bound,
    )

    Lq, Lk = q.shape[2], k.shape[2]
    elements = q.shape[0] * q.shape[1] * Lq * Lk
    scored = enc.has_bias or enc.needs_probabilities
    if elements > DENSE_BIAS_LIMIT and (backend == "eager" or (backend == "sdpa" and scored)):
        return f"forms a {Lq} x {Lk} tensor above DENSE_BIAS_LIMIT"
    if backend == "flex" and plan.device == "cpu" and Lq not in plan.flex_lengths:
        return "not timed (compiles per shape: --flex-lengths)"
    if backend == "fold" and exact_fold_pieces(enc) is not None:
        call = prepare_call(q, k, v, enc, mask=None, scale=None, **_positional(kw))
        if fold_refusal(call) is None and fold_rounding_bound(call) > FOLD_LOGIT_TOLERANCE:
            return f"rounds beyond FOLD_LOGIT_TOLERANCE ({FOLD_LOGIT_TOLERANCE:g} nats)"
    return None


def _positional(kw: dict[str, Any]) -> dict[str, Any]:
    return {
        "q_pos": kw.get("q_pos"),
        "k_pos": kw.get("k_pos"),
        "causal": kw["causal"],
        "inputs": kw.get("inputs"),
    }


def _step(fn: Callable[[], torch.Tensor], leaves: list[torch.Tensor], train: bool):
    """A zero-argument callable: the forward under no_grad, or forward + backward."""
    if not train:

        def forward():
            with torch.no_grad():
                return fn()

        return forward

    def step():
        for t in leaves:
            t.grad = None
        out = fn()
        out.float().sum().backward()
        return out.detach()

    return step


def _inputs(plan: GridPlan, length: int, dtype: torch.dtype, train: bool):
    g = torch.Generator().manual_seed(0)
    shape = (plan.batch, plan.heads, length, plan.head_dim)
    return [
        torch.randn(shape, generator=g).to(plan.device, dtype).requires_grad_(train)
        for _ in range(3)
    ]


def _batch(fn: Callable[[], object], n: int) -> Callable[[], object]:
    if n == 1:
        return fn

    def run() -> None:
        for _ in range(n):
            fn()

    return run


def _first_call(fn: Callable[[], object]) -> tuple[float | None, str | None]:
    """Seconds of the first call (compilation included), or the refusal's one line."""
    t0 = time.perf_counter()
    try:
        fn()
    except (ValueError, TypeError, RuntimeError, NotImplementedError) as err:
        return None, " ".join(f"{type(err).__name__}: {err}".split())[:240]
    return time.perf_counter() - t0, None


def _grad_mode(train: bool):
    return torch.enable_grad() if train else torch.no_grad()


def run_case(plan: GridPlan, case: EncodingCase, length: int, causal: bool, train: bool,
             dname: str, log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """One call of the grid: every backend (and auto) timed beside no-bias SDPA."""
    import relpos
    from relpos.attention import api

    dtype = DTYPES[dname]
    row: dict[str, Any] = {
        "encoding": case.label,
        "length": length,
        "causal": causal,
        "mode": "train" if train else "forward",
        "dtype": dname,
    }
    try:
        enc = case.create(plan.heads, plan.head_dim).to(plan.device)
    except (ValueError, TypeError) as err:
        return {**row, "skipped": f"cannot create: {err}"[:240]}
    if enc.causal_only and not causal:
        return {**row, "skipped": "causal-only encoding"}
    q, k, v = _inputs(plan, length, dtype, train)
    try:
        kw = call_kwargs(enc, plan.batch, length, causal, plan.device)
        with _grad_mode(train):
            auto_choice = api.plan(q, k, v, enc, **kw)
            facts = api.facts(q, k, v, enc, **kw) if plan.calibrate else None
    except (ValueError, TypeError, RuntimeError) as err:
        return {**row, "skipped": " ".join(str(err).split())[:240]}
    params = [p for p in enc.parameters() if p.requires_grad]
    leaves = [q, k, v, *params]

    def call(backend: str):
        return lambda: relpos.attention(q, k, v, enc, backend=backend, **kw)

    fns = {BASELINE: _step(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                           [q, k, v], train)}  # fmt: skip
    names = list(facts.candidates) if facts is not None else list(BACKENDS)
    if facts is not None:
        timed = [b for b in names if b != "flex" or length in plan.flex_lengths]
        if len(timed) < 2:  # nothing to choose between: no measurement needed
            return {**row, "skipped": f"one candidate to time: {timed}"}
    notes: dict[str, str] = {}
    first: dict[str, float] = {}
    for backend in names:
        reason = None if facts is not None else _ineligible(plan, enc, backend, q, k, v, kw)
        if facts is not None and backend == "flex" and length not in plan.flex_lengths:
            reason = "not timed (compiles per shape: --flex-lengths)"
        if reason is None:
            fn = _step(call(backend), leaves, train)
            seconds, reason = _first_call(fn)
            if reason is None:
                fns[backend] = fn
                first[backend] = seconds
        if reason is not None:
            notes[backend] = reason
    if plan.with_auto:
        fns["auto"] = _step(call("auto"), leaves, train)
        seconds, reason = _first_call(fns["auto"])
        if reason is not None:  # auto must never refuse a call another backend runs
            notes["auto"] = reason
            del fns["auto"]
    # short calls are timed in batches of ``n`` (at least BATCH_S of the baseline per sample)
    per_call, _ = measure.time_once(fns[BASELINE], plan.clock)
    n = max(1, min(MAX_BATCH, math.ceil(BATCH_S / max(per_call, 1e-7))))
    batched = {b: _batch(fn, n) for b, fn in fns.items()}
    samples = _time_rounds(batched, plan.warmup, plan.repeats, plan.clock, n)
    row["batch"] = n
    row["first_call_s"] = first
    row["notes"] = notes
    row["auto_plan"] = list(auto_choice)
    if facts is not None:
        row["key"], row["elements"] = facts.key, facts.elements
        row["encoding_name"] = facts.encoding  # the name auto's encoding keys use
    _rate(row, samples)
    ran = auto_choice[0]
    if plan.confirm and row.get("auto_over_best", 0.0) > TARGET:
        # above the target after the first rounds: auto, the best, the backend auto ran and
        # the baseline are timed ``confirm`` rounds more, and their medians span every round
        again = {b: batched[b] for b in dict.fromkeys((BASELINE, "auto", row["best"], ran))
                 if b in batched}  # fmt: skip
        first_ratio = row["auto_over_best"]
        more = _time_rounds(again, 0, plan.confirm, plan.clock, n)
        for b, extra in more.items():
            samples[b] = samples[b] + extra
        _rate(row, samples)
        row["confirmed"] = {"rounds": plan.confirm, "first_auto_over_best": first_ratio}
    if "auto_over_best" in row:
        if ran not in row["times"] and ran not in notes:
            row["auto_outside_eligible"] = True
        elif ran in notes:
            row["auto_outside_eligible"] = notes[ran]
    log(_progress(row))
    return row


def _time_rounds(fns: dict[str, Callable[[], object]], warmup: int, repeats: int, clock: str,
                 n: int) -> dict[str, list[float]]:  # fmt: skip
    """Seconds per call of each of ``fns`` (each runs ``n`` calls), over interleaved rounds."""
    timing = measure.time_round_robin(fns, warmup=warmup, repeats=repeats, clock=clock)
    return {b: [x / n for x in t["samples_s"]] for b, t in timing.items()}


def _rate(row: dict[str, Any], samples: dict[str, list[float]]) -> None:
    """The medians, ratios to the baseline, the best eligible backend and auto / best of
    ``row`` from the ``samples`` taken so far."""
    times = {b: statistics.median(s) for b, s in samples.items()}
    base = times.pop(BASELINE)
    row["baseline_s"] = base
    row["times"] = times
    row["ratios"] = {b: t / base for b, t in times.items()}
    row["samples"] = dict(samples)
    eligible = {b: t for b, t in times.items() if b != "auto"}
    if eligible:
        best = min(eligible, key=eligible.__getitem__)
        row["best"] = best
        if "auto" in times:
            row["auto_over_best"] = times["auto"] / eligible[best]


def _progress(row: dict[str, Any]) -> str:
    what = f"{row['encoding']} L={row['length']} {'causal' if row['causal'] else 'full'} "
    what += f"{row['mode']} {row['dtype']}"
    if "auto_over_best" in row:
        return (
            f"  {what}: auto={'/'.join(row['auto_plan'])} best={row['best']} "
            f"auto/best={row['auto_over_best']:.2f}"
        )
    return f"  {what}: " + ", ".join(f"{b}={r:.2f}" for b, r in row.get("ratios", {}).items())


def row_key(row: dict[str, Any]) -> tuple:
    """What identifies a call of the grid."""
    return (row["encoding"], row["length"], row["causal"], row["mode"], row["dtype"])


def run_grid(
    plan: GridPlan,
    log: Callable[[str], None] = print,
    sink: Callable[[dict[str, Any]], None] | None = None,
    done: dict[tuple, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Every call of the grid (``run_case``); ``{"machine", "settings", "rows"}``. ``sink``
    gets each row as it is measured; rows found in ``done`` (by ``row_key``) are reused."""
    info = measure.machine_info()
    rows = []
    t0 = time.perf_counter()
    for dname in plan.dtypes:
        for train in plan.modes:
            for causal in plan.masks:
                for length in plan.lengths:
                    for case in plan.cases:
                        mode = "train" if train else "forward"
                        key = (case.label, length, causal, mode, dname)
                        if done and key in done:
                            rows.append(done[key])
                            continue
                        row = run_case(plan, case, length, causal, train, dname, log)
                        rows.append(row)
                        if sink is not None:
                            sink(row)
    info["loadavg_end"] = list(os.getloadavg())
    info["wall_s"] = time.perf_counter() - t0
    return {"machine": info, "settings": plan.settings(), "rows": rows}


# ------------------------------------------------------------------------------ second look
def disputed_rows(rows: list[dict[str, Any]]) -> list[int]:
    """The calibration rows (indices) worth a second measurement: every row of a key and
    size where the representatives disagree on the fastest backend. One disturbed
    measurement (another process on the core, for a second) decides those: it flips the
    key's ranking or writes an encoding key (where they agree, the key's ranking puts their
    common fastest backend first)."""
    groups: dict[tuple[str, int], list[int]] = {}
    for i, r in enumerate(rows):
        if "key" in r and r.get("times"):
            groups.setdefault((r["key"], r["elements"]), []).append(i)
    disputed = (m for m in groups.values() if len({rows[i]["best"] for i in m}) > 1)
    return sorted(i for members in disputed for i in members)


def pooled(measurements: list[dict[str, Any]]) -> dict[str, Any]:
    """One call measured several times, as one row: every backend's (and the baseline's)
    median over the rounds of all the measurements; each measurement's medians are kept
    under ``measurements``. A measurement that could not run adds nothing."""
    ran = [m for m in measurements if m.get("samples")]
    if len(ran) < 2:
        return measurements[0]
    samples = {b: [x for m in ran for x in m["samples"].get(b, ())] for b in ran[0]["samples"]}
    row = {k: v for k, v in ran[0].items() if k not in ("samples", "best")}
    _rate(row, {b: s for b, s in samples.items() if s})
    row["measurements"] = [{"times": m["times"], "baseline_s": m["baseline_s"]} for m in ran]
    return row


def remeasure_disputed(
    plan: GridPlan, rows: list[dict[str, Any]], log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """``rows`` with each of ``disputed_rows`` measured again (``plan.confirm`` rounds), and
    a third time where the two measurements disagree on the fastest backend; the rows pool
    every round (``pooled``), so one disturbed measurement of three is outvoted."""
    if not plan.confirm:
        return rows
    cases = {c.label: c for c in plan.cases}
    again_plan = dataclasses.replace(plan, repeats=plan.confirm)
    out = list(rows)
    disputed = disputed_rows(rows)
    log(f"measuring {len(disputed)} calls again (their key's representatives disagree)")
    for i in disputed:
        r = rows[i]
        args = (cases[r["encoding"]], r["length"], r["causal"], r["mode"] == "train", r["dtype"])
        measurements = [r, run_case(again_plan, *args, log)]
        if measurements[1].get("best", r["best"]) != r["best"]:
            measurements.append(run_case(again_plan, *args, log))
        out[i] = pooled(measurements)
        log(_progress(out[i]) + f" (measured {len(measurements)} times, pooled)")
    return out


# ------------------------------------------------------------------------------ reports
def summarize(rows: list[dict[str, Any]], target: float = TARGET) -> dict[str, Any]:
    """The distribution of auto / best over the rows that have it, and the worst row."""
    rated = [r for r in rows if "auto_over_best" in r]
    if not rated:
        return {"cases": 0}
    values = sorted(r["auto_over_best"] for r in rated)

    def quantile(p: float) -> float:
        return values[min(len(values) - 1, max(0, math.ceil(p * len(values)) - 1))]

    worst = max(rated, key=lambda r: r["auto_over_best"])
    # where auto ran the best backend, auto / best is the noise of the measurement
    other = [r for r in rated if r["auto_plan"][0] != r["best"]]
    return {
        "same_backend": len(rated) - len(other),
        "other_backend_max": max((r["auto_over_best"] for r in other), default=None),
        "cases": len(values),
        "median": statistics.median(values),
        "p90": quantile(0.9),
        "max": values[-1],
        "within_target": sum(v <= target for v in values),
        "confirmed": sum(1 for r in rated if r.get("confirmed")),
        "target": target,
        "worst": {k: worst[k] for k in ("encoding", "length", "causal", "mode", "dtype")}
        | {"auto": "/".join(worst["auto_plan"]), "best": worst["best"]},
        "outside_eligible": [
            f"{r['encoding']} L={r['length']} {r['mode']} {r['dtype']}: {'/'.join(r['auto_plan'])}"
            for r in rows
            if r.get("auto_outside_eligible")
        ],
    }


def _ratio_cell(ratio: float, confirmed: dict[str, Any] | None) -> str:
    cell = f"**{ratio:.2f}**" if ratio > TARGET else f"{ratio:.2f}"
    if confirmed:
        cell = f"{confirmed['first_auto_over_best']:.2f} -> {cell}"
    return cell


def markdown(result: dict[str, Any], command: str) -> str:
    """The report: command, machine, the rows, the summary."""
    info, settings, rows = result["machine"], result["settings"], result["rows"]
    title = "relpos bench --calibrate" if settings["calibrate"] else "relpos bench --auto-vs-best"
    end = " ".join(f"{x:.2f}" for x in info.get("loadavg_end", []))
    lines = [
        f"## {title}",
        "",
        f"- command: `{command}`",
        f"- machine: {measure.machine_line(info)}; at the end {end}; wall time "
        f"{info.get('wall_s', 0):.0f} s",
        f"- B={settings['batch']}, H={settings['heads']}, D={settings['head_dim']}, device "
        f"{settings['device']}; median of {settings['repeats']} interleaved rounds after "
        f"{settings['warmup']} warm-up, {CLOCK_TEXT[settings['clock']]}"
        + (
            f"; a call above {TARGET:.2f}x after them: auto, the best, the backend auto ran "
            f"and the baseline {settings['confirm']} rounds more, medians over every round "
            f"(auto/best shows first -> all rounds)"
            if settings.get("confirm")
            else ""
        )
        + f"; short calls timed "
        f"in batches of at least {BATCH_S * 1e3:g} ms; ratios to no-bias SDPA (same mask, "
        f"mode, dtype, rounds); training step = forward + backward into q, k, v and the "
        f"encoding's parameters",
        "",
    ]
    backends = [b for b in (*BACKENDS, "auto") if any(b in r.get("ratios", {}) for r in rows)]
    head = "| encoding | L | mask | mode | dtype | " + " | ".join(backends)
    if settings["with_auto"]:
        head += " | auto runs | best | auto/best |"
    else:
        head += " | key |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        mask = "causal" if r["causal"] else "full"
        cells = [r["encoding"], str(r["length"]), mask, r["mode"], r["dtype"]]
        if "skipped" in r:
            lines.append("| " + " | ".join(cells) + f" | skipped: {r['skipped'][:80]} |")
            continue
        cells += [f"{r['ratios'][b]:.2f}" if b in r["ratios"] else "-" for b in backends]
        if settings["with_auto"]:
            ratio = r.get("auto_over_best")
            flag = " (!)" if r.get("auto_outside_eligible") else ""
            cells += [
                "/".join(r["auto_plan"]) + flag,
                r.get("best", "-"),
                "-" if ratio is None else _ratio_cell(ratio, r.get("confirmed")),
            ]
        else:
            cells.append(r.get("key", "-"))
        lines.append("| " + " | ".join(cells) + " |")
    if settings["with_auto"]:
        s = summarize(rows)
        lines.append("")
        if s["cases"]:
            w = s["worst"]
            lines += [
                f"auto / best over {s['cases']} calls: median {s['median']:.2f}, 90th "
                f"percentile {s['p90']:.2f}, worst {s['max']:.2f} ({w['encoding']} "
                f"L={w['length']} {'causal' if w['causal'] else 'full'} {w['mode']} "
                f"{w['dtype']}: auto ran {w['auto']}, best {w['best']}); "
                f"{s['within_target']} of {s['cases']} within {s['target']:.2f}x"
                + (f" ({s['confirmed']} timed again)" if s.get("confirmed") else "")
                + ". auto ran the "
                f"measured best backend in {s['same_backend']} calls (there auto / best is "
                f"the measurement's noise)"
                + (
                    f"; where it ran another, auto / best was at most {s['other_backend_max']:.2f}."
                    if s["other_backend_max"] is not None
                    else "."
                ),
            ]
            if s["outside_eligible"]:
                lines.append("auto chose a backend outside the eligible set (!): "
                             + "; ".join(s["outside_eligible"]))  # fmt: skip
        notes = sorted({n for r in rows for n in r.get("notes", {}).values()})
        if notes:
            lines += ["", "Backends not timed: " + "; ".join(n[:120] for n in notes[:12])]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ calibration
def calibration_points(rows: list[dict[str, Any]]):
    """``policy.Point`` s from the rows of a ``--calibrate`` grid."""
    from relpos.attention.policy import Point

    return [
        Point(r["key"], r["elements"], r["encoding"], dict(r["times"]), r.get("encoding_name", ""))
        for r in rows
        if "key" in r and r.get("times")
    ]


def merged_rows(*runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of several ``--calibrate`` runs (each its ``rows.jsonl``, oldest first) as
    one grid: a call measured again (same ``row_key``) keeps only its latest row, so a run
    that adds lengths or encodings extends the earlier grid and one that repeats a call
    replaces it. ``derive_table`` over the result ranks every key from all of them."""
    out: dict[tuple, dict[str, Any]] = {}
    for rows in runs:
        for row in rows:
            out.pop(row_key(row), None)
            out[row_key(row)] = row
    return list(out.values())


def calibration_meta(result: dict[str, Any], command: str) -> dict[str, Any]:
    info = result["machine"]
    keep = ("cpu", "usable_cpus", "torch", "torch_threads", "loadavg_start", "loadavg_end")
    s = result["settings"]
    return {
        "measured": time.strftime("%Y-%m-%d"),
        "command": command,
        "machine": {k: info.get(k) for k in keep},
        "grid": {k: s[k] for k in ("cases", "lengths", "dtypes", "batch", "heads", "head_dim")}
        | {"repeats": s["repeats"], "flex_lengths": s["flex_lengths"]},
        "git": info.get("git"),
    }


def measured_by(rows: list[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """Per key of a ``--calibrate`` grid, the cases and lengths whose calls measured it: one
    case's calls can fall into several kinds (DeBERTa is ``tile`` where the fold is not a
    candidate, ``band`` where it is), and a merge replaces each of them whole. ``encodings``:
    the registered names of the cases (their encoding keys are replaced too)."""
    keys: dict[str, dict[str, set]] = {}
    for r in rows:
        if "key" in r and r.get("times"):
            k = keys.setdefault(r["key"], {"cases": set(), "encodings": set(), "lengths": set()})
            k["cases"].add(r["encoding"])
            k["lengths"].add(r["length"])
            if r.get("encoding_name"):
                k["encodings"].add(r["encoding_name"])
    return {k: {n: sorted(v) for n, v in d.items()} for k, d in sorted(keys.items())}


def merged_table(
    base, measured, meta: dict[str, Any], by: dict[str, dict[str, list]] | None = None
):
    """``base`` (a ``policy.PolicyTable``) with every key ``measured`` has replaced by the
    measured segments, whole (a key is measured over its lengths, not spliced), and with the
    encoding keys under it of the encodings that measured it (``by``, ``measured_by``)
    replaced too: by the run's, or dropped where the run found the key's ranking good
    enough for that encoding; the other keys and ``base``'s meta kept, and ``meta`` with the
    keys that changed (and ``by``) appended to its ``merged`` list."""
    from relpos.attention import policy

    remeasured = {
        policy.encoding_key(key, name)
        for key, d in (by or {}).items()
        for name in d.get("encodings", ())
    }
    kept = {k: segs for k, segs in base.entries.items() if k not in remeasured}
    entries = {**kept, **measured.entries}
    changed = sorted(
        k
        for k in set(measured.entries) | (remeasured & set(base.entries))
        if base.entries.get(k) != entries.get(k)
    )
    record = {**meta, "keys": sorted(measured.entries), "changed": changed}
    if by is not None:
        record["measured_by"] = by
    merged = [*base.meta.get("merged", []), record]
    return policy.PolicyTable(entries, "merged", {**base.meta, "merged": merged})


# ------------------------------------------------------------------------------ command
def parse_case(text: str) -> EncodingCase:
    """``name`` or ``name:option=value[:option=value ...]`` (``fire:init_L=1.0``: FIRE with
    its threshold at 1, the calibration's representative of FIRE above its threshold); values
    are Python literals (numbers, booleans, strings), else taken as strings."""
    name, *items = text.split(":")
    options = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--encodings: {text!r}: expected name:option=value, got {item!r}")
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip()
        options.append((key.strip(), value))
    return EncodingCase(name.strip(), tuple(options))


def grid_plan(args: argparse.Namespace) -> GridPlan:
    """The ``GridPlan`` of ``relpos bench --auto-vs-best`` / ``--calibrate`` (flags checked)."""
    import relpos

    calibrate = bool(args.calibrate)
    quick = bool(args.quick)
    if args.encodings:
        cases = tuple(parse_case(n) for n in parse_names(args.encodings, "--encodings"))
        for c in cases:
            relpos.registry.encoding_class(c.name)  # unknown -> ValueError naming the known
    else:
        cases = CALIBRATION_CASES if calibrate else QUICK_CASES if quick else FAMILY_CASES
    lengths = tuple(
        parse_int_list(args.lengths, "--lengths")
        if args.lengths
        else QUICK_LENGTHS
        if quick
        else CALIBRATION_LENGTHS
        if calibrate
        else LENGTHS
    )
    dtypes = tuple(parse_names(args.dtypes or "float32,bfloat16", "--dtypes"))
    for d in dtypes:
        if d not in DTYPES:
            raise ValueError(f"--dtypes: unknown dtype {d!r}; choose from {tuple(DTYPES)}")
    masks = []
    for m in parse_names(args.masks, "--masks"):
        if m not in ("causal", "full"):
            raise ValueError(f"--masks: unknown mask {m!r}; choose from ('causal', 'full')")
        masks.append(m == "causal")
    modes = []
    for m in parse_names(args.modes, "--modes"):
        if m not in ("forward", "train"):
            raise ValueError(f"--modes: unknown mode {m!r}; choose from ('forward', 'train')")
        modes.append(m == "train")
    flex = () if args.flex_lengths in (None, "", "none") else parse_int_list(
        args.flex_lengths, "--flex-lengths"
    )  # fmt: skip
    repeats = parse_int(args.repeats or ("3" if quick else "5"), "--repeats")
    plan = GridPlan(
        cases=cases,
        lengths=lengths,
        dtypes=dtypes,
        masks=tuple(masks),
        modes=tuple(modes),
        batch=parse_int(args.batch, "--batch"),
        heads=parse_int(args.heads, "--heads"),
        head_dim=parse_int(args.head_dim, "--head-dim"),
        repeats=repeats,
        warmup=parse_int(args.warmup or "1", "--warmup", minimum=0),
        confirm=(
            (repeats if calibrate else CONFIRM_ROUNDS)
            if args.confirm is None
            else parse_int(args.confirm, "--confirm", minimum=0)
        ),
        flex_lengths=tuple(flex),
        with_auto=not calibrate,
        calibrate=calibrate,
        device=args.device,
        clock=args.clock or ("wall" if args.device == "cuda" else "cpu"),
    )
    if plan.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if plan.device == "cuda" and plan.clock == "cpu":
        raise ValueError("--clock cpu: CUDA work does not run on the process's CPU time; use wall")
    for c in plan.cases:
        c.create(plan.heads, plan.head_dim)  # options and head count are valid
    return plan


def run_command(args: argparse.Namespace, command: str) -> int:
    """``relpos bench --auto-vs-best`` / ``--calibrate``: run, print, write files."""
    plan = grid_plan(args)
    out = check_output_dir(args.out)
    table_path = None
    if plan.calibrate:
        from relpos.attention import policy

        table_path = Path(args.table) if args.table else policy.machine_table_path()
        if table_path is None:
            raise ValueError(
                f"--calibrate: ${policy.TABLE_ENV} is empty (no machine table); pass --table PATH"
            )
        if args.merge:
            policy.load_table(table_path)  # a missing or broken table is named before any work
    elif args.merge:
        raise ValueError("--merge: only with --calibrate (it merges measured keys into --table)")
    if args.threads is not None:
        torch.set_num_threads(parse_int(args.threads, "--threads"))
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "rows.jsonl"
    done = {}
    if args.resume and partial.exists():
        for line in partial.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done[row_key(row)] = row
        print(f"relpos bench: resuming, {len(done)} calls from {partial}", file=sys.stderr)
    elif partial.exists():
        partial.unlink()

    def sink(row: dict[str, Any]) -> None:
        with open(partial, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    result = run_grid(plan, log=log, sink=sink, done=done)
    if plan.calibrate:
        result["rows"] = remeasure_disputed(plan, result["rows"], log)
    result["command"] = command
    if plan.with_auto:
        result["summary"] = summarize(result["rows"])
    report = markdown(result, command)
    write_json(out / "results.json", result)
    (out / "report.md").write_text(report + "\n")
    print(report)
    written = [f"{out}/results.json", f"{out}/report.md"]
    if table_path is not None:
        from relpos.attention import policy

        meta = calibration_meta(result, command)
        table = policy.derive_table(calibration_points(result["rows"]), meta)
        for key in sorted(k for k in table.entries if k != policy.general_key(k)):
            print(f"encoding key {key}: its key's ranking costs it more than "
                  f"{policy.ENCODING_KEY_ABOVE:.2f}x at some length")  # fmt: skip
        if args.merge:
            by = measured_by(result["rows"])
            table = merged_table(policy.load_table(table_path), table, meta, by)
            for key, d in by.items():  # what replaced each key: check it is what you meant
                lengths = ",".join(map(str, d["lengths"]))
                print(f"merged {key}: {', '.join(d['cases'])} at L = {lengths}")
        policy.write_table(table, table_path)
        policy.reload()
        written.append(f"{table_path} (policy table, {len(table.entries)} keys)")
    print("wrote " + ", ".join(written))
    return 0
