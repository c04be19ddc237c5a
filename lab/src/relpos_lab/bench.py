"""``relpos bench``: a grid of encodings x backends x lengths (x dtypes), each case timed and
its peak memory measured beside no-bias SDPA in the same run.

For each length and dtype the baseline ``F.scaled_dot_product_attention(q, k, v)`` (no bias,
same causal flag) and every ``relpos.attention(q, k, v, enc, backend=...)`` case are timed
round robin (``relpos_lab.measure.time_round_robin``: a load spike hits every case), then the
extra peak memory of one call of each is measured (``measure.measure_peak``: in this process,
after ``malloc_trim``; the benchmark scripts in ``benchmarks/`` measure in child processes for
isolated numbers). ``--train`` times forward + backward into q, k, v and the encoding's
parameters. A backend that refuses a case (``fold`` for a bias that does not fold exactly,
``sdpa``/``flex`` for value terms, ``flex`` without a compiler) is recorded as refused with
its one-line reason, not as an error.

Writes into ``--out``: ``results.json`` (every sample, the machine, the command),
``results.csv`` (one row per case), ``time_vs_length.png`` and ``memory_vs_length.png``
(log-log, one panel per encoding and dtype, one line per backend and the baseline), and
prints a markdown table of ratios (time / baseline time) that begins with the machine.
Every flag is checked, and ``--out`` too, before anything runs.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from relpos.optional import missing_plot_note

from . import measure
from .arguments import parse_int, parse_int_list, parse_names
from .auto_bench import CONFIRM_ROUNDS
from .io import atomic_write, check_output_dir

__all__ = ["add_arguments", "run_command", "run_bench", "BenchPlan"]

BASELINE = "sdpa-nobias"
BACKEND_NAMES = ("auto", "eager", "sdpa", "chunked", "flex", "fold")
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DEFAULTS = {
    "encodings": "alibi,kerple-log,t5,fire",
    "backends": "auto,chunked,fold",
    "lengths": "1024,2048,4096",
}
QUICK = {"encodings": "alibi,fire", "backends": "auto,chunked,fold", "lengths": "256,512,1024"}
#: the eager backend forms (B, H, L, L) logits: skipped above this many elements
EAGER_LIMIT = 1 << 27


class BenchPlan:
    """The checked grid of one ``relpos bench`` run."""

    def __init__(self, args: argparse.Namespace) -> None:
        import relpos

        quick = bool(args.quick)

        def pick(name: str) -> str:
            return getattr(args, name) or (QUICK if quick else DEFAULTS)[name]

        self.encodings = parse_names(pick("encodings"), "--encodings")
        for name in self.encodings:
            relpos.registry.encoding_class(name)  # unknown -> ValueError naming the known
        self.backends = parse_names(pick("backends"), "--backends")
        for b in self.backends:
            if b not in BACKEND_NAMES:
                raise ValueError(f"--backends: unknown backend {b!r}; choose from {BACKEND_NAMES}")
        self.lengths = parse_int_list(pick("lengths"), "--lengths")
        self.dtypes = parse_names(args.dtypes or "float32", "--dtypes")
        for d in self.dtypes:
            if d not in DTYPES:
                raise ValueError(f"--dtypes: unknown dtype {d!r}; choose from {tuple(DTYPES)}")
        self.batch = parse_int(args.batch, "--batch")
        self.heads = parse_int(args.heads, "--heads")
        self.head_dim = parse_int(args.head_dim, "--head-dim")
        self.repeats = parse_int(args.repeats or ("3" if quick else "5"), "--repeats")
        self.warmup = parse_int(args.warmup or "1", "--warmup", minimum=0)
        self.threads = None if args.threads is None else parse_int(args.threads, "--threads")
        self.causal = not args.bidirectional
        self.train = bool(args.train)
        self.memory = not args.no_memory
        self.device = torch.device(args.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
        self.out = check_output_dir(args.out)
        for name in self.encodings:  # options and head count are valid for every encoding
            relpos.create(name, num_heads=self.heads, head_dim=self.head_dim)

    def settings(self) -> dict[str, Any]:
        return {
            "encodings": self.encodings,
            "backends": self.backends,
            "lengths": self.lengths,
            "dtypes": self.dtypes,
            "batch": self.batch,
            "heads": self.heads,
            "head_dim": self.head_dim,
            "causal": self.causal,
            "train": self.train,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "device": str(self.device),
        }


def _case_fn(plan: BenchPlan, q, k, v, enc, backend: str | None):
    """A zero-argument callable: one forward (or forward + backward with ``--train``)."""
    import relpos

    params = [] if enc is None else [p for p in enc.parameters() if p.requires_grad]

    def forward():
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=plan.causal)
        return relpos.attention(q, k, v, enc, causal=plan.causal, backend=backend)

    if not plan.train:

        def run():
            with torch.no_grad():
                return forward()

        return run
    leaves = [q, k, v, *params]

    def step():
        for t in leaves:
            t.grad = None
        out = forward()
        out.sum().backward()
        return out.detach()

    return step


def _inputs(plan: BenchPlan, L: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    shape = (plan.batch, plan.heads, L, plan.head_dim)
    return [
        torch.randn(shape, generator=g).to(plan.device, dtype).requires_grad_(plan.train)
        for _ in range(3)
    ]


def _refusal(plan: BenchPlan, q, k, v, enc, backend: str) -> str | None:
    """Why ``backend`` cannot run this case (its one-line error), or None."""
    import relpos

    if backend == "eager" and plan.batch * plan.heads * q.shape[2] * k.shape[2] > EAGER_LIMIT:
        return f"skipped: eager forms B*H*L*L > {EAGER_LIMIT} logits"
    try:
        with torch.no_grad():
            relpos.attention.plan(q, k, v, enc, causal=plan.causal, backend=backend)
            if backend == "flex":  # compiles here, once, outside the timing
                relpos.attention(q, k, v, enc, causal=plan.causal, backend=backend)
    except (ValueError, TypeError, RuntimeError) as err:
        return " ".join(str(err).split())[:300]
    return None


def run_bench(plan: BenchPlan, log=print) -> dict[str, Any]:
    """Run the grid; returns ``{"machine", "settings", "cases": [...]}``."""
    import relpos

    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    info = measure.machine_info()
    cases: list[dict[str, Any]] = []
    for dname in plan.dtypes:
        dtype = DTYPES[dname]
        for L in plan.lengths:
            q, k, v = _inputs(plan, L, dtype)
            fns: dict[str, Any] = {BASELINE: _case_fn(plan, q, k, v, None, None)}
            rows: dict[str, dict[str, Any]] = {
                BASELINE: {"encoding": "-", "backend": BASELINE, "path": "fused"}
            }
            for name in plan.encodings:
                torch.manual_seed(0)
                enc = relpos.create(name, num_heads=plan.heads, head_dim=plan.head_dim)
                enc = enc.to(plan.device)
                for backend in plan.backends:
                    key = f"{name}/{backend}"
                    row = {"encoding": name, "backend": backend}
                    reason = _refusal(plan, q, k, v, enc, backend)
                    if reason is not None:
                        row["refused"] = reason
                    else:
                        with torch.no_grad():
                            chosen, path = relpos.attention.plan(
                                q, k, v, enc, causal=plan.causal, backend=backend
                            )
                        row["path"] = f"{chosen}/{path}" if backend == "auto" else path
                        fns[key] = _case_fn(plan, q, k, v, enc, backend)
                    rows[key] = row
            log(f"relpos bench: {dname} L={L}: timing {len(fns)} cases")
            timing = measure.time_round_robin(fns, warmup=plan.warmup, repeats=plan.repeats)
            base = timing[BASELINE]["median_s"]
            gc.collect()  # once per length: the memory baselines hold live data only
            for key, row in rows.items():
                row.update(dtype=dname, length=L)
                if key in timing:
                    row.update(timing[key])
                    row["ratio"] = timing[key]["median_s"] / base
                    if plan.memory:
                        row["memory"] = measure.measure_peak(fns[key], collect=False)
                        row["extra_mb"] = row["memory"]["extra_mb"]
                cases.append(row)
            del q, k, v, fns
    info["loadavg_end"] = list(os.getloadavg())
    return {"machine": info, "settings": plan.settings(), "cases": cases}


# ------------------------------------------------------------------------------ output
def markdown(result: dict[str, Any], command: str) -> str:
    """The report: command, machine, settings, then one table row per case."""
    info, settings = result["machine"], result["settings"]
    what = "forward + backward" if settings["train"] else "forward (no grad)"
    lines = [
        "## relpos bench",
        "",
        f"- command: `{command}`",
        f"- machine: {measure.machine_line(info)}; at the end "
        + " ".join(f"{x:.2f}" for x in info.get("loadavg_end", [])),
        f"- {what}, B={settings['batch']}, H={settings['heads']}, D={settings['head_dim']}, "
        f"causal={settings['causal']}, device {settings['device']}, median of "
        f"{settings['repeats']} round-robin repeats after {settings['warmup']} warm-up; ratio "
        f"= time / `{BASELINE}` (SDPA without a bias, same run, same length and dtype)",
        "",
        "| encoding | backend | path | dtype | L | ms | ratio | extra MB |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in result["cases"]:
        if "refused" in r:
            ms = ratio = mb = "-"
            path = f"refused: {r['refused'][:90]}"
        else:
            ms, ratio = f"{r['median_s'] * 1e3:.2f}", f"{r['ratio']:.2f}"
            mb = f"{r['extra_mb']:.1f}" if "extra_mb" in r else "-"
            path = r.get("path", "")
        lines.append(
            f"| {r['encoding']} | {r['backend']} | {path} | {r['dtype']} | {r['length']} | "
            f"{ms} | {ratio} | {mb} |"
        )
    return "\n".join(lines)


CSV_FIELDS = [
    "encoding",
    "backend",
    "path",
    "dtype",
    "length",
    "median_s",
    "min_s",
    "max_s",
    "ratio",
    "extra_mb",
    "refused",
]


def write_csv(path: Path, result: dict[str, Any]) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            for r in result["cases"]:
                w.writerow(r)

    atomic_write(path, write)


def write_plots(out: Path, result: dict[str, Any]) -> list[str]:
    """``time_vs_length.png`` and ``memory_vs_length.png`` (log-log); [] without matplotlib."""
    if missing_plot_note("plots") is not None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [r for r in result["cases"] if "median_s" in r]
    panels = sorted({(r["encoding"], r["dtype"]) for r in cases if r["encoding"] != "-"})
    written = []
    for metric, label, fname in (
        ("median_s", "time per call (s)", "time_vs_length.png"),
        ("extra_mb", "extra peak memory (MB)", "memory_vs_length.png"),
    ):
        if not any(metric in r for r in cases) or not panels:
            continue
        n = len(panels)
        cols = min(n, 3)
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
        for ax, (enc, dt) in zip(axes.flat, panels, strict=False):
            lines = {BASELINE: [r for r in cases if r["backend"] == BASELINE and r["dtype"] == dt]}
            for r in cases:
                if r["encoding"] == enc and r["dtype"] == dt:
                    lines.setdefault(r["backend"], []).append(r)
            for backend, rs in lines.items():
                pts = sorted((r["length"], r[metric]) for r in rs if r.get(metric, 0) > 0)
                if pts:
                    style = "k--" if backend == BASELINE else "o-"
                    ax.plot(*zip(*pts, strict=True), style, label=backend)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{enc} ({dt})")
            ax.set_xlabel("L")
            ax.set_ylabel(label)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()

        def save(tmp: str, fig=fig) -> None:
            fig.savefig(tmp, format="png", dpi=110)

        atomic_write(out / fname, save)
        plt.close(fig)
        written.append(fname)
    return written


# ------------------------------------------------------------------------------ command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--encodings",
        default=None,
        help=f"default {DEFAULTS['encodings']}; with --auto-vs-best / --calibrate a name may "
        "carry options, name:option=value (fire:init_L=1.0)",
    )
    parser.add_argument(
        "--backends",
        default=None,
        help=f"of {', '.join(BACKEND_NAMES)}; default {DEFAULTS['backends']}",
    )
    parser.add_argument("--lengths", default=None, help=f"default {DEFAULTS['lengths']}")
    parser.add_argument(
        "--dtypes",
        default=None,
        help=f"of {', '.join(DTYPES)}; default float32 (float32,bfloat16 with --auto-vs-best)",
    )
    parser.add_argument("--batch", default="1")
    parser.add_argument("--heads", default="8")
    parser.add_argument("--head-dim", default="64")
    parser.add_argument("--bidirectional", action="store_true", help="no causal mask")
    parser.add_argument("--train", action="store_true", help="time forward + backward")
    parser.add_argument("--repeats", default=None, help="timed rounds (default 5, quick 3)")
    parser.add_argument("--warmup", default=None, help="untimed rounds (default 1)")
    parser.add_argument("--threads", default=None, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['encodings']} x {QUICK['backends']} at "
        f"L = {QUICK['lengths']}, 3 repeats: under two minutes; with --auto-vs-best: "
        f"alibi, fire, t5, rope at L = 128, 1024, under three minutes",
    )
    parser.add_argument("--out", default="runs/bench-cli", help="output folder")
    grid = parser.add_argument_group(
        "auto against the best backend (relpos_lab.auto_bench)",
        "--auto-vs-best times auto and every eligible backend over encoding families x "
        "lengths x masks x modes x dtypes; --calibrate times the candidates of "
        "representative calls and writes the policy table auto reads",
    )
    what = grid.add_mutually_exclusive_group()
    what.add_argument(
        "--auto-vs-best",
        action="store_true",
        help="report auto / best per call, its distribution and worst case",
    )
    what.add_argument(
        "--calibrate",
        action="store_true",
        help="measure the crossovers and write this machine's policy table",
    )
    grid.add_argument("--masks", default="causal,full", help="of causal, full")
    grid.add_argument("--modes", default="forward,train", help="of forward, train")
    grid.add_argument(
        "--flex-lengths",
        default=None,
        help="lengths at which compiled flex is timed on CPU (it compiles per shape); default none",
    )
    grid.add_argument(
        "--confirm",
        default=None,
        help="--auto-vs-best: rounds more for a call whose auto / best is above the target "
        "after --repeats rounds (auto, the best, the backend auto ran, the baseline; medians "
        f"over every round); default {CONFIRM_ROUNDS}, 0 for none. --calibrate: the rounds "
        "of a second measurement, after the grid, of every call at a length where a key's "
        "representatives disagree on the fastest backend (and of a third where the two "
        "disagree; medians over every round); default --repeats, 0 for none",
    )
    grid.add_argument(
        "--clock",
        default=None,
        choices=("cpu", "wall"),
        help="what a sample reads: process CPU time (default on CPU: a loaded machine's "
        "waits are not counted) or wall-clock time (default on CUDA)",
    )
    grid.add_argument(
        "--resume",
        action="store_true",
        help="reuse the calls already measured in --out/rows.jsonl (written as the grid runs)",
    )
    grid.add_argument(
        "--table",
        default=None,
        help="--calibrate: where to write the table (default: this machine's table path, "
        "relpos.attention.policy.machine_table_path())",
    )
    grid.add_argument(
        "--merge",
        action="store_true",
        help="--calibrate: the keys this run measures replace those of the table at --table "
        "(each key whole), the other keys are kept, and the run is recorded in its meta; "
        "one encoding's calls can fall into several kinds, and each key replaced is printed "
        "with the encodings and lengths that measured it",
    )


def run_command(args: argparse.Namespace) -> int:
    command = shlex.join(["relpos", *getattr(args, "argv", sys.argv[1:])])
    if args.auto_vs_best or args.calibrate:
        from . import auto_bench

        return auto_bench.run_command(args, command)
    plan = BenchPlan(args)
    result = run_bench(plan, log=lambda m: print(m, file=sys.stderr, flush=True))
    result["command"] = command
    report = markdown(result, command)
    plan.out.mkdir(parents=True, exist_ok=True)
    atomic_write(
        plan.out / "results.json",
        lambda tmp: Path(tmp).write_text(json.dumps(result, indent=2, default=str)),
    )
    write_csv(plan.out / "results.csv", result)
    atomic_write(plan.out / "report.md", lambda tmp: Path(tmp).write_text(report + "\n"))
    plots = write_plots(plan.out, result)
    print(report)
    note = missing_plot_note("plots")
    if note:
        print(note)
    print(
        f"wrote {plan.out}/results.json, results.csv, report.md"
        + (", " + ", ".join(plots) if plots else "")
    )
    return 0
