"""Training throughput of relpos's TransformerLM against x-transformers, side by side.

Configuration (docs/benchmarks.md's peer configuration): byte-level vocab 256, dim 128,
depth 4, 4 heads (head_dim 32), MLP ratio 4, pre-norm, an untied output layer (both
libraries' default), L = 128, batch 32, AdamW, fp32 on the CPU; encodings ALiBi and RoPE.
Every case runs the same loop (zero_grad, forward, cross-entropy, backward, clip, step) on
the same random batches; a timed call is ``--steps`` optimizer steps.

Cases per encoding:
* ``relpos``: ``relpos.nn.TransformerLM(256, 128, 4, 4, encoding)`` (its defaults, backend
  auto).
* ``x-transformers``: ``TransformerWrapper(Decoder(..., alibi_pos_bias / rotary_pos_emb))``
  with its default attention, and ``x-transformers-flash`` with ``attn_flash=True`` (SDPA).

Reports tokens/s (median of the repeats) and relpos / x-transformers ratios (> 1 = relpos
faster). x-transformers comes from the ``bench`` extra (``pip install -e '.[bench]'``).

Usage: .venv/bin/python benchmarks/bench_lm_train.py [--quick] [--steps 10]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _common import (
    add_common_args,
    finish_args,
    fmt,
    header,
    log,
    machine_info,
    markdown_table,
    met,
    time_round_robin,
    write_json,
)

import relpos

NAME = "lm_train"
VOCAB, DIM, DEPTH, HEADS, SEQ, BATCH = 256, 128, 4, 4, 128, 32
ENCODINGS = ["alibi", "rope"]


def build(impl: str, encoding: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if impl == "relpos":
        return relpos.nn.TransformerLM(VOCAB, DIM, DEPTH, HEADS, encoding)
    from x_transformers import Decoder, TransformerWrapper

    head_dim = DIM // HEADS
    if encoding == "alibi":
        pos = {"alibi_pos_bias": True}
    else:  # rotate the whole head, as relpos does (x-transformers defaults to half of it)
        pos = {"rotary_pos_emb": True, "rotary_emb_dim": head_dim}
    return TransformerWrapper(
        num_tokens=VOCAB,
        max_seq_len=SEQ,
        use_abs_pos_emb=False,
        tie_embedding=False,
        attn_layers=Decoder(
            dim=DIM,
            depth=DEPTH,
            heads=HEADS,
            attn_dim_head=head_dim,
            attn_flash=impl == "x-transformers-flash",
            **pos,
        ),
    )


def make_steps(model: torch.nn.Module, steps: int) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen) for _ in range(steps)]

    def run() -> None:
        for batch in batches:
            x, y = batch[:, :-1], batch[:, 1:]
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, NAME)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per timed call")
    args = parser.parse_args(argv)
    finish_args(args, NAME, repeats=5, warmup=1)
    if args.steps is None:
        args.steps = 3 if args.quick else 10
    try:
        import x_transformers  # noqa: F401
    except ImportError:
        print("x-transformers is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    impls = ["relpos", "x-transformers", "x-transformers-flash"]
    info = machine_info()
    results: dict = {}
    for encoding in ENCODINGS:
        fns = {impl: make_steps(build(impl, encoding), args.steps) for impl in impls}
        timing = time_round_robin(fns, warmup=args.warmup, repeats=args.repeats)
        for impl in impls:
            tok = args.steps * BATCH * SEQ / timing[impl]["median_s"]
            timing[impl]["tokens_per_s"] = tok
            log(f"  {encoding} {impl}: {tok:,.0f} tokens/s")
        results[encoding] = timing
    settings = {
        "vocab": VOCAB,
        "dim": DIM,
        "depth": DEPTH,
        "heads": HEADS,
        "seq_len": SEQ,
        "batch": BATCH,
        "steps_per_call": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "x_transformers": __import__("importlib.metadata").metadata.version("x-transformers"),
    }
    out = [header("TransformerLM training throughput: relpos vs x-transformers", info, settings)]
    rows, trows = [], []
    for encoding in ENCODINGS:
        r = results[encoding]
        best_peer = max(
            r["x-transformers"]["tokens_per_s"], r["x-transformers-flash"]["tokens_per_s"]
        )
        for impl in impls:
            ratio = r["relpos"]["tokens_per_s"] / r[impl]["tokens_per_s"]
            rows.append([encoding, impl, fmt(r[impl]["tokens_per_s"], 0), fmt(ratio, 2)])
        ratio = r["relpos"]["tokens_per_s"] / best_peer
        trows.append([encoding, fmt(ratio, 2), met(ratio >= 1.0)])
    out.append(markdown_table(["encoding", "implementation", "tokens/s", "relpos / this"], rows))
    out.append("\nTarget: relpos at least as fast as the faster x-transformers configuration.\n")
    out.append(markdown_table(["encoding", "relpos / best x-transformers", "target"], trows))
    text = "\n".join(out)
    print(text)
    write_json(args.json, {"settings": settings, "machine": info, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
