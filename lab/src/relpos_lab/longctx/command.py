"""The ``relpos longctx`` command: its options (``add_arguments``) and ``run_command``
(plan, load, measure, report)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from relpos.optional import missing_plot_note

from ..arguments import optional_int
from ..report import run_metadata
from ..training.runtime import RaiseOnSignal, exit_code, resume_command
from .methods import METHODS, ROPE_SCALINGS
from .models import load_model
from .plan import plan_longctx
from .report import print_table, write_outputs
from .run import RunState, build_prompts, heldout_text, run_longctx, start_run

__all__ = ["add_arguments", "run_command"]


def add_arguments(parser: Any) -> None:
    """The options of ``relpos longctx`` (numbers are parsed by ``run_command``)."""
    add = parser.add_argument
    add(
        "--methods",
        help=f"comma-separated methods or all (default: {','.join(ROPE_SCALINGS)}; known: "
        f"{', '.join(METHODS)})",
    )
    add("--profile", help="quick (default, minutes) or full (2K..16K, ~1.5 h)")
    add("--quick", action="store_true", help="the quick profile (same as --profile quick)")
    add("--lengths", help="prompt lengths in tokens, e.g. 2048,4k,16k (default: the profile's)")
    add("--depths", help="passkey depths in [0, 1], e.g. 0.1,0.5,0.9 (default: the profile's)")
    add("--seeds", help="passkey keys per depth (default: the profile's; 0 = no passkey)")
    add("--ppl-tokens", help="perplexity: final tokens scored (default: the profile's; 0 = none)")
    add(
        "--model",
        default="smollm2",
        help="smollm2 (default), a .gguf file, random-tiny, or hf:<smollm2, transformers model "
        "folder, config .json or .gguf> (a transformers model, patched by relpos.interop.hf)",
    )
    add("--data", help="held-out UTF-8 text file or folder (default: Shakespeare test plays)")
    add("--out", help="run folder (default runs/longctx-PROFILE)")
    add("--resume", action="store_true", help="continue the run in --out")
    add("--force", action="store_true", help="replace the run in --out")
    add("--no-progress", action="store_true", help="no line per measurement")


def run_command(args: Any) -> int:
    """``relpos longctx``: plan (all validation first), load, measure, report."""
    import shlex
    import sys

    t0 = time.perf_counter()
    if getattr(args, "quick", False) and args.profile not in (None, "quick"):
        raise ValueError(
            f"--quick is --profile quick; it cannot be combined with --profile {args.profile}"
        )
    plan = plan_longctx(
        methods=args.methods,
        profile=args.profile or "quick",
        lengths=args.lengths,
        depths=args.depths,
        seeds=optional_int(args.seeds, "--seeds", minimum=None),
        ppl_tokens=optional_int(args.ppl_tokens, "--ppl-tokens", minimum=None),
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

    note = missing_plot_note("longctx.png")
    if note:
        print(f"  {note}")
    data_name, text = heldout_text(plan.data)
    model, tokenizer, load_seconds = load_model(plan.model)
    from ..training.passkey import as_encoder

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
    meta = run_metadata(
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
        with RaiseOnSignal():
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
    except KeyboardInterrupt as stop:
        save(state, final=True)
        hint = resume_command(getattr(args, "argv", None), "longctx")
        print(f"relpos: interrupted; continue with: {hint}", file=sys.stderr)
        return exit_code(getattr(stop, "signum", None))
    save(state, final=True)
    print_table(state.rows, config.max_position_embeddings)
    print(f"wall time {meta['wall_seconds']:.0f} s")
    if note:
        print(note)
    print(f"report: {plan.out_dir / 'report.md'}")
    return 0
