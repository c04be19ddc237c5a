"""DeBERTa attention training step: relpos (auto backend) vs transformers DisentangledSelfAttention.

fp32, B=1, hidden 768 = H 12 x D 64 (deberta-v3-base), ``pos_att_type`` c2p|p2c,
``position_buckets`` 256, ``max_relative_positions`` 512, ``share_att_key`` True, the relative
table LayerNorm-ed (v3), no mask (an encoder over a full sequence), L in --lengths
(1024 2048 4096). One step = drop the old gradients, forward from the hidden states
``x (B, L, 768)``, ``loss = (out * g).sum()`` with a fixed random ``g``, backward into ``x`` and
every parameter.

* ``naive`` (baseline): ``transformers``' ``DisentangledSelfAttention`` itself: the content
  scores and the c2p / p2c terms as full ``(B*H, L, L)`` tensors (bmm against the projected
  table, then ``gather`` over every pair), an all-ones ``(B, 1, L, L)`` attention mask as the
  encoder passes it (allocated before the step), softmax, bmm.
* ``relpos``: the same module's ``query_proj`` / ``key_proj`` / ``value_proj``, then
  ``relpos.attention(q, k, v, enc)`` with a ``deberta`` encoding whose projections are *tied*
  to the module's (``tie_projections``, v3's shared keys) and whose table and LayerNorm are the
  ones the module is given: both sides train exactly the same parameters. ``auto`` picks
  ``fold`` (path ``fold-band``) on CPU when the pairs outside DeBERTa's band (``|i - j| >=
  506`` here) are at least a quarter of the call: those run as two folded q/k channels on the
  fused kernel, the band gathers the ``(B, H, L, R)`` products (``R <= 512``).
* ``chunked``: the same with ``backend="chunked"`` (its ``tile`` path: the previous ``auto``
  choice, every pair gathered, recomputing tiles under a checkpoint), for comparison.

Reports seconds per step (median), the ratio relpos / naive, the extra peak memory of one step
in fresh child processes and the ratio naive / relpos. The naive step is skipped at a length
where its estimated peak (``NAIVE_LL_TENSORS`` fp32 (B*H, L, L) tensors) exceeds 80 % of the
available memory. Before timing, outputs and gradients are compared once at L=CHECK_L.

Usage: .venv/bin/python benchmarks/bench_deberta.py [--quick] [--lengths 1024 2048 4096] [--forward]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import (
    MB,
    add_common_args,
    child_args,
    finish_args,
    fmt,
    header,
    log,
    machine_info,
    markdown_table,
    measure_memory,
    memory_child,
    time_once,
    time_round_robin,
    write_json,
)

import relpos
from relpos.attention import plan

NAME = "deberta"
B, H, D = 1, 12, 64
HIDDEN = H * D
BUCKETS, MAX_REL = 256, 512
LENGTHS = [1024, 2048, 4096]
QUICK_LENGTHS = [256, 512]
IMPLS = ["naive", "relpos", "chunked"]
CHECK_L = 1024  # auto takes fold-band here (above the dense-bias size)
NAIVE_LL_TENSORS = 12  # rough count of live fp32 (B*H, L, L) tensors in the naive step


class Problem:
    """The transformers module, a relpos encoding sharing its parameters, inputs, weights g."""

    def __init__(self, L: int) -> None:
        from transformers import DebertaV2Config
        from transformers.models.deberta_v2.modeling_deberta_v2 import (
            DisentangledSelfAttention,
        )

        torch.manual_seed(0)
        config = DebertaV2Config(
            hidden_size=HIDDEN,
            num_attention_heads=H,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=BUCKETS,
            max_relative_positions=MAX_REL,
            share_att_key=True,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            layer_norm_eps=1e-7,
        )
        self.hf = DisentangledSelfAttention(config)
        with torch.no_grad():
            for module in self.hf.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0, 0.02)
                    module.bias.normal_(0, 0.02)
        self.enc = relpos.create(
            "deberta",
            num_heads=H,
            head_dim=D,
            position_buckets=BUCKETS,
            max_relative_positions=MAX_REL,
            share_att_key=True,
            clamp_buckets=False,  # transformers' buckets (equal to the clamp below L = 512)
        )
        self.enc.tie_projections(query_proj=self.hf.query_proj, key_proj=self.hf.key_proj)
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(B, L, HIDDEN, generator=gen).requires_grad_()
        self.g = torch.randn(B, L, HIDDEN, generator=gen)
        self.mask: torch.Tensor | None = None
        self.L = L

    def naive_mask(self) -> torch.Tensor:
        if self.mask is None:
            self.mask = torch.ones(B, 1, self.L, self.L, dtype=torch.bool)
        return self.mask

    def leaves(self) -> dict[str, torch.Tensor]:
        params = {f"hf.{n}": p for n, p in self.hf.named_parameters()}
        seen = {id(p) for p in params.values()}  # the tied projections appear once, as hf.*
        params.update({f"enc.{n}": p for n, p in self.enc.named_parameters() if id(p) not in seen})
        return {"x": self.x, **params}

    def zero_grad(self) -> None:
        for t in self.leaves().values():
            t.grad = None


def heads(t: torch.Tensor) -> torch.Tensor:
    return t.view(B, -1, H, D).transpose(1, 2)


def relpos_qkv(p: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(heads(getattr(p.hf, n)(p.x)) for n in ("query_proj", "key_proj", "value_proj"))


def forward(impl: str, p: Problem) -> torch.Tensor:
    if impl == "naive":
        rel = p.enc.table_rows(0, 2 * BUCKETS - 1, p.x.device)  # LayerNorm(rel_embeddings)
        out, _ = p.hf(p.x, p.naive_mask(), rel_embeddings=rel)
        return out
    if impl in ("relpos", "chunked"):
        q, k, v = relpos_qkv(p)
        out = relpos.attention(q, k, v, p.enc, backend="auto" if impl == "relpos" else impl)
        return out.transpose(1, 2).reshape(B, -1, HIDDEN)
    raise ValueError(f"unknown impl {impl!r}; impls: {IMPLS}")


def auto_backend(L: int) -> str:
    """``backend/path`` that ``auto`` takes for the relpos step at length L."""
    p = Problem(L)
    q, k, v = relpos_qkv(p)
    return "/".join(plan(q.detach(), k.detach(), v.detach(), p.enc))


#: ``--forward``: time inference (the forward under ``torch.no_grad()``) instead of a step
FORWARD_ONLY = False


def make_step(impl: str, p: Problem) -> Callable[[], None]:
    def step() -> None:
        p.zero_grad()
        out = forward(impl, p)
        (out * p.g).sum().backward()

    def infer() -> None:
        with torch.no_grad():
            forward(impl, p)

    return infer if FORWARD_ONLY else step


def gradient_check(L: int) -> list[dict]:
    """Max relative difference (max |relpos - naive| / max |naive|) of the output and of every
    gradient, from identical inputs and parameters."""
    grads, outs = {}, {}
    for impl in ("naive", "relpos"):
        p = Problem(L)
        out = forward(impl, p)
        (out * p.g).sum().backward()
        outs[impl] = out.detach()
        grads[impl] = {n: t.grad for n, t in p.leaves().items()}

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))

    rows = [
        {
            "tensor": "output",
            "max_abs": float(outs["naive"].abs().max()),
            "rel": rel(outs["relpos"], outs["naive"]),
        }
    ]
    for name, ref in grads["naive"].items():
        got = grads["relpos"][name]
        row = {"tensor": f"grad {name}", "max_abs": None, "rel": None}
        if ref is None or got is None:
            row["missing"] = [i for i in grads if grads[i][name] is None]
        else:
            row.update(max_abs=float(ref.abs().max()), rel=rel(got, ref))
        rows.append(row)
    return rows


def available_bytes() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024.0
    except OSError:
        pass
    return float("inf")


def naive_fits(L: int) -> tuple[bool, float]:
    need = NAIVE_LL_TENSORS * B * H * L * L * 4.0
    return need <= 0.8 * available_bytes(), need


# ------------------------------------------------------------------------------ runs
def run_length(L: int, impls: list[str], args) -> dict:
    p = Problem(L)
    steps = {impl: make_step(impl, p) for impl in impls}
    first = {impl: time_once(steps[impl])[0] for impl in impls}
    timing = time_round_robin(steps, warmup=args.warmup, repeats=args.repeats)
    for impl in impls:
        timing[impl]["first_call_s"] = first[impl]
        log(f"  L={L} {impl}: {timing[impl]['median_s']:.3f} s/step")
    return timing


def report(args, info: dict, results: dict, mem: dict, checks: list, backends: dict) -> str:
    settings = {
        "B": B,
        "H": H,
        "D": D,
        "dtype": "float32",
        "position_buckets": BUCKETS,
        "max_relative_positions": MAX_REL,
        "pos_att_type": "c2p|p2c",
        "share_att_key": True,
        "causal": False,
        "lengths": args.lengths,
        "loss": "none: forward only, torch.no_grad()"
        if FORWARD_ONLY
        else "(out * g).sum(), g fixed random",
        "warmup": args.warmup,
        "repeats": args.repeats,
    }
    what = "inference (forward)" if FORWARD_ONLY else "training step"
    out = [header(f"DeBERTa attention {what}: relpos vs transformers", info, settings)]
    out.append(
        "\ns/step = median seconds per forward + backward (forward only with --forward; "
        "naive, relpos and chunked timed in "
        "turn, round robin); time ratio = relpos / naive; chunked = relpos with "
        "backend='chunked' (the previous auto choice); extra MB = steady-state extra peak "
        "resident memory of one step in a fresh child process (1 MB = 10^6 bytes); memory "
        "ratio = naive / relpos; backend/path = what relpos' `auto` chose."
    )
    rows = []
    for L in args.lengths:
        r = results[L]
        naive, chunk = r.get("naive"), r.get("chunked")
        t_ratio = r["relpos"]["median_s"] / naive["median_s"] if naive else None
        c_ratio = chunk["median_s"] / naive["median_s"] if naive and chunk else None
        vs_chunk = r["relpos"]["median_s"] / chunk["median_s"] if chunk else None
        mn, mr = mem.get(("naive", L), {}), mem.get(("relpos", L), {})
        mc = mem.get(("chunked", L), {})
        en, er, ec = mn.get("extra_mb"), mr.get("extra_mb"), mc.get("extra_mb")
        m_ratio = en / er if en is not None and er else None

        def mb(x, m):
            return fmt(x, 1) if x is not None else m.get("error", "not measured")

        rows.append(
            [
                L,
                backends[L],
                fmt(naive["median_s"], 3) if naive else r.get("naive_skipped", "skipped"),
                fmt(r["relpos"]["median_s"], 3),
                fmt(chunk["median_s"], 3) if chunk else "-",
                fmt(t_ratio, 2),
                fmt(c_ratio, 2),
                fmt(vs_chunk, 2),
                mb(en, mn),
                mb(er, mr),
                mb(ec, mc),
                fmt(m_ratio, 1),
            ]
        )
    out.append("")
    out.append(
        markdown_table(
            [
                "L",
                "relpos backend/path",
                "naive s/step",
                "relpos s/step",
                "chunked s/step",
                "time ratio",
                "chunked / naive",
                "relpos / chunked",
                "naive extra MB",
                "relpos extra MB",
                "chunked extra MB",
                "memory ratio",
            ],
            rows,
        )
    )
    check_l = min(CHECK_L, args.lengths[0])
    out.append(f"\n### Agreement at L={check_l} (max |relpos - naive| / max |naive|)\n")
    crow = [
        [
            row["tensor"],
            fmt(row["max_abs"], 4) if row["max_abs"] is not None else "n/a",
            f"{row['rel']:.1e}" if row["rel"] is not None else f"no gradient in {row['missing']}",
        ]
        for row in checks
    ]
    out.append(markdown_table(["tensor", "max |naive|", "max rel diff"], crow))
    return "\n".join(out)


def memory_child_main(args) -> None:
    (L,) = args.lengths
    p = Problem(L)
    if args.case == "naive":
        p.naive_mask()  # the encoder's mask exists before the step (part of the baseline)
    memory_child(make_step(args.case, p), before_baseline=p.zero_grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, NAME)
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument(
        "--forward", action="store_true", help="time inference (forward under no_grad)"
    )
    args = parser.parse_args()
    global FORWARD_ONLY
    FORWARD_ONLY = args.forward
    if args.lengths is None:
        args.lengths = QUICK_LENGTHS if args.quick else LENGTHS
    args.lengths = sorted(args.lengths)
    finish_args(args, NAME, repeats=3, warmup=1)
    if args.measure_memory:
        memory_child_main(args)
        return
    info = machine_info()
    checks = gradient_check(min(CHECK_L, args.lengths[0]))
    log(f"agreement at L={min(CHECK_L, args.lengths[0])}: {checks}")
    plan, backends = {}, {}
    for L in args.lengths:
        fits, need = naive_fits(L)
        plan[L] = IMPLS if fits else ["relpos", "chunked"]
        backends[L] = auto_backend(L)
        if not fits:
            log(f"L={L}: naive skipped (estimated {need / MB:.0f} MB > 80% of available)")
    mem: dict = {}
    if not args.no_memory:
        for L in args.lengths:
            for impl in plan[L]:
                extra = ["--forward"] if FORWARD_ONLY else []
                m = measure_memory(__file__, impl, [*child_args(), *extra, "--lengths", str(L)])
                mem[(impl, L)] = m
                log(f"memory {impl} L={L}: {m}")
    results = {}
    for L in args.lengths:
        results[L] = run_length(L, plan[L], args)
        if "naive" not in plan[L]:
            results[L]["naive_skipped"] = "skipped (memory)"
    info["loadavg_end"] = list(os.getloadavg())
    text = report(args, info, results, mem, checks, backends)
    print(text)
    write_json(
        args.json,
        {
            "benchmark": NAME,
            "machine": info,
            "settings": {"B": B, "H": H, "D": D, "lengths": args.lengths},
            "warmup": args.warmup,
            "repeats": args.repeats,
            "backends": backends,
            "results": {str(L): r for L, r in results.items()},
            "memory": {f"{i}@{L}": m for (i, L), m in mem.items()},
            "agreement": {"L": min(CHECK_L, args.lengths[0]), "rows": checks},
            "markdown": text,
        },
    )


if __name__ == "__main__":
    main()
