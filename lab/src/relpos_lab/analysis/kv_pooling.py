"""Needle retrieval through a chunked (stride-s window pooled) KV cache: the real-model half
of the phase-sensitivity diagnostic (``kv_phase.py`` holds the sanity kernel).

Known from an abstract only (the paper itself was not located; a reconstruction): a
cache compressed in windows of ``s`` tokens gives each token a *phase*
``φ(p) = (p - offset) mod s``; retrieval of a needle then varies with its phase.

The harness (constructed here; every choice below is an assumption, stated so a reader can
change it):

* prompt: the Landmark passkey prompt of ``relpos_lab.training.passkey`` at a fixed token length:
  ``task description | filler | information line | filler | question``; the key is a random
  5-digit integer (the same number of tokens in every prompt, so a batch needs no padding).
  Paired design: every phase of a depth sees the same keys (``random.Random(seed + 1000 x
  depth index)``) and the same filler, so a difference between phases is not a difference
  between key samples (a pooled cache that loses the key leaves the model at its prior for
  the first digit, whose hit rate then only reflects which keys were drawn);
* the *needle* is the information line; its first token sits at phase ``φ`` by placing it
  ``a ≡ φ (mod s)`` tokens into the filler, nearest to ``depth x filler``;
* compression: the context (everything before the question) is prefilled uncompressed, as
  a compressing cache does; then each layer's keys and values over the filler span
  ``[offset, offset + n s)`` are mean-pooled per window of ``s`` tokens. ``offset`` is the
  task description's length: those tokens stay as they are (the usual attention sink), as
  does the remainder of fewer than ``s`` tokens before the question;
* ``pool="before"``: the window's *raw* (unrotated) keys are averaged and the mean is rotated
  at the window's reference position ``w + φ_r`` (``φ_r`` may be fractional);
  ``pool="after"``: the rotated keys are averaged; ``"none"``: the uncompressed cache (the
  reference). Values are averaged either way (RoPE does not rotate values);
* the question and the key's tokens but the last are then run through the compressed cache
  at their true positions (teacher forcing); *accuracy* = every key token is the argmax, as
  greedy decoding would give; *margin* = the key's first digit's logit minus the largest
  other logit at that position (a leading space token, SmolLM2's, is skipped);
  *digit accuracy* = the first digit is the argmax (margin > 0), a softer retrieval measure
  for caches that lose the exact key.

``phase_gap = max_φ acc - min_φ acc`` per depth, averaged over depths,
for the accuracy, the digit accuracy and the margin.
Per (layer, head), the attention mass that the query predicting the key's first digit puts
on the cache entries overlapping the information line is kept too (per-head
needle attention against φ).
One prefill per prompt serves every pooling (the pooled caches are built from it).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from relpos.validation import check_choice, check_float, check_float_sequence, check_int

__all__ = [
    "POOLINGS",
    "NeedlePrompts",
    "PhaseRetrieval",
    "pool_cache",
    "needle_prompts",
    "phase_retrieval",
    "plot_phase_retrieval",
]

POOLINGS = ("none", "before", "after")


def _windows(x: Tensor, start: int, count: int, stride: int) -> Tensor:
    """Mean over each window of ``stride`` tokens of ``x (B, H, L, D)`` from ``start``."""
    span = x[:, :, start : start + count * stride]
    return span.reshape(*x.shape[:2], count, stride, x.shape[-1]).mean(3)


def pool_cache(
    k_raw: Tensor,
    v: Tensor,
    encoding: Any,
    *,
    stride: int,
    offset: int,
    pool: str,
    reference_phase: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """A pooled cache of one layer: ``(k, v, k_pos)`` with rotated keys.

    ``k_raw, v (B, Hkv, C, D)``: the unrotated keys and the values of context positions
    ``0..C-1``. Keys before ``offset`` and after the last whole window stay (rotated at their
    positions); each window ``[offset + w s, offset + (w + 1) s)`` becomes one key and one
    value (module docstring). ``k_pos (1, C')``: the key positions kept for the cache's
    records (a pooled key's window start; RoPE's cached keys are already rotated)."""
    check_choice(pool, "pool", POOLINGS)
    stride = check_int(stride, "stride")
    reference_phase = check_float(reference_phase, "reference_phase")
    C = k_raw.shape[2]
    offset = check_int(offset, "offset", minimum=0, maximum=C)
    pos = torch.arange(C, device=k_raw.device)

    def rotate(k: Tensor, positions: Tensor) -> Tensor:
        return encoding.rotate(k, positions[None], "k")

    count = (C - offset) // stride if pool != "none" else 0
    end = offset + count * stride
    k_rot = rotate(k_raw, pos)
    if count == 0:
        return k_rot, v, pos[None]
    if pool == "after":
        k_mid = _windows(k_rot, offset, count, stride)
    else:
        starts = offset + stride * torch.arange(count, device=k_raw.device, dtype=torch.float64)
        mean = _windows(k_raw, offset, count, stride)
        k_mid = rotate(mean, starts + reference_phase)
    v_mid = _windows(v, offset, count, stride)
    k = torch.cat([k_rot[:, :, :offset], k_mid.to(k_rot.dtype), k_rot[:, :, end:]], dim=2)
    v = torch.cat([v[:, :, :offset], v_mid, v[:, :, end:]], dim=2)
    k_pos = torch.cat([pos[:offset], pos[offset:end:stride], pos[end:]])
    return k, v, k_pos[None]


@dataclass
class NeedlePrompts:
    """Prompts of one (depth, phase) cell: ``context (P, C)`` token ids, ``suffix (P, S)``
    (the question and the key's tokens but the last), ``answer (P, A)`` the key's tokens,
    ``offset`` (the task description's length), the needle's first position per prompt and
    ``digit``, the index of the key's first digit among the answer tokens."""

    context: Tensor
    suffix: Tensor
    answer: Tensor
    offset: int
    needle: list[int]
    digit: int = 0
    needle_length: int = 0

    def rows(self, a: int, b: int) -> NeedlePrompts:
        """Prompts ``a..b-1``."""
        return NeedlePrompts(
            self.context[a:b], self.suffix[a:b], self.answer[a:b], self.offset,
            self.needle[a:b], self.digit, self.needle_length,
        )  # fmt: skip


def needle_prompts(
    encode: Any, *, context: int, stride: int, depth: float, phase: int, prompts: int, seed: int
) -> NeedlePrompts:
    """``prompts`` Landmark passkey prompts whose context has ``context`` tokens and whose
    information line starts at phase ``phase`` (``offset`` = the task description), nearest to
    ``depth`` of the filler. Keys from ``random.Random(seed)``, five digits."""
    from ..training.passkey import FINAL_QUESTION, TASK_DESCRIPTION, garbage, information_line

    stride = check_int(stride, "stride")
    phase = check_int(phase, "phase", minimum=0, maximum=stride - 1)
    depth = check_float(depth, "depth", minimum=0.0, maximum=1.0)
    prompts = check_int(prompts, "prompts")
    head = list(encode(TASK_DESCRIPTION + "\n"))
    newline = list(encode("\n"))
    question = list(encode("\n" + FINAL_QUESTION))
    rng = random.Random(seed)
    keys = [rng.randint(10000, 99999) for _ in range(prompts)]
    lines = [list(encode(information_line(key))) for key in keys]
    answers = [list(encode(" " + str(key))) for key in keys]
    if len({len(x) for x in lines}) != 1 or len({len(x) for x in answers}) != 1:
        raise ValueError(
            "the tokenizer gives 5-digit keys different token counts; needle prompts need "
            "a digit-wise tokenizer (SmolLM2's, bytes)"
        )
    filler_tokens = context - len(head) - 2 * len(newline) - len(lines[0])
    if filler_tokens < 2 * stride:
        raise ValueError(
            f"context must leave at least 2 x stride tokens of filler beside the "
            f"{context - filler_tokens} of the task description and the needle, got {context}"
        )
    filler = list(encode(garbage(8 * filler_tokens + 64)))[:filler_tokens]
    if len(filler) < filler_tokens:
        raise ValueError("the filler text is too short for the requested context")
    target = round(depth * filler_tokens)
    # the needle's first token: offset + a + len(newline) must be = phase (mod stride)
    a = target - ((target + len(newline) - phase) % stride)
    if a < 0:
        a += stride
    a = min(a, filler_tokens - ((filler_tokens + len(newline) - phase) % stride))
    offset = len(head)
    rows, needle = [], []
    for line in lines:
        rows.append(head + filler[:a] + newline + line + newline + filler[a:])
        needle.append(offset + a + len(newline))
    assert all((n - offset) % stride == phase for n in needle)
    suffix = [question + ans[:-1] for ans in answers]
    ones, twos = list(encode(" 11111")), list(encode(" 22222"))
    digit = next(n for n, (x, y) in enumerate(zip(ones, twos, strict=False)) if x != y)
    return NeedlePrompts(
        context=torch.tensor(rows),
        suffix=torch.tensor(suffix),
        answer=torch.tensor(answers),
        offset=offset,
        needle=needle,
        digit=digit,
        needle_length=len(lines[0]),
    )


def _raw_kv(model: Any, tokens: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Each attention layer's unrotated keys and values ``(B, Hkv, C, D)`` on ``tokens``
    (one uncompressed forward; ``MultiHeadAttention.project`` recomputes them)."""
    from .model_capture import attention_layers

    layers = attention_layers(model)
    found: list[tuple[Tensor, Tensor]] = []

    def hook(module, args, kwargs):
        _, k, v = module.project(args[0])
        found.append((k, v))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in layers]
    try:
        with torch.no_grad():
            model.hidden(tokens) if hasattr(model, "hidden") else model(tokens)
    finally:
        for h in handles:
            h.remove()
    return found


def _entry_spans(C: int, offset: int, stride: int, pool: str) -> tuple[Tensor, Tensor]:
    """The context tokens ``[start, end)`` each entry of a pooled cache stands for."""
    pos = torch.arange(C)
    if pool == "none":
        return pos, pos + 1
    count = (C - offset) // stride
    end = offset + count * stride
    windows = torch.arange(offset, end, stride)
    starts = torch.cat([pos[:offset], windows, pos[end:]])
    ends = torch.cat([pos[:offset] + 1, windows + stride, pos[end:] + 1])
    return starts, ends


def _score(
    model: Any, kv: list[tuple[Tensor, Tensor]], cell: NeedlePrompts, encoding: Any, **pooling
) -> tuple[Tensor, Tensor, Tensor]:
    """``(exact (B,) bool, margin (B,) float, needle attention (layers, H) float)`` of the key
    under a pooled cache: the attention mass that the query predicting the key's first digit
    puts on the cache entries overlapping the information line, per layer and head, summed
    over the prompts."""
    from relpos.nn.cache import KVCache, LayerCache

    from .model_capture import attention_layers

    layers = []
    for k_raw, v in kv:
        k, vv, k_pos = pool_cache(k_raw, v, encoding, offset=cell.offset, **pooling)
        layers.append(LayerCache(k=k, v=vv, k_pos=k_pos, rotated=True))
    C, S = cell.context.shape[1], cell.suffix.shape[1]
    A = cell.answer.shape[1]
    pos = torch.arange(C, C + S)[None]
    starts, ends = _entry_spans(C, cell.offset, pooling["stride"], pooling["pool"])
    needle = torch.tensor(cell.needle)[:, None]
    on_needle = (ends[None] > needle) & (starts[None] < needle + cell.needle_length)  # (B, C')
    row = S - A + cell.digit  # the suffix position that predicts the key's first digit
    mass: list[Tensor] = []

    def hook(module, args, kwargs):
        cache = kwargs["cache"]
        q, k_new, _ = module.project(args[0])
        q = encoding.rotate(q[:, :, row : row + 1], pos[:, row : row + 1], "q")
        k_new = encoding.rotate(k_new[:, :, : row + 1], pos[:, : row + 1], "k")
        keys = torch.cat([cache.k, k_new], dim=2)
        keys = keys.repeat_interleave(module.num_heads // module.num_kv_heads, dim=1)
        logits = (q @ keys.transpose(-1, -2)).float() * encoding.default_scale(q.shape[-1])
        weights = torch.softmax(logits, dim=-1)[:, :, 0, : cache.k.shape[2]]  # (B, H, C')
        mass.append((weights * on_needle[:, None]).sum(-1).sum(0))  # (H,)

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in attention_layers(model)]
    try:
        with torch.no_grad():
            logits = model(cell.suffix, pos=pos, cache=KVCache(layers)).float()
    finally:
        for h in handles:
            h.remove()
    scored = logits[:, S - A :]  # the last A positions predict the key's A tokens
    exact = (scored.argmax(-1) == cell.answer).all(-1)
    first = scored[:, cell.digit]
    key = cell.answer[:, cell.digit : cell.digit + 1]
    target = first.gather(1, key)[:, 0]
    other = first.scatter(1, key, float("-inf")).amax(-1)
    return exact, target - other, torch.stack(mass).double()


@dataclass
class PhaseRetrieval:
    """Accuracy and margin per pooling, ``[depth][phase]``, and the phase gap per pooling.

    ``pools``: ``{"none" | "before φr=<x>" | "after": {"accuracy", "digit_accuracy",
    "margin", "phase_gap", "digit_phase_gap", "margin_gap", "needle_attention"}}``;
    ``needle_attention[depth][phase][layer][head]``: the mean attention mass of the query
    that predicts the key's first digit on the cache entries overlapping the information
    line.
    """

    model: str
    stride: int
    context: int
    offset: int
    prompts: int
    depths: list[float]
    reference_phases: list[float]
    seed: int
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def phase_retrieval(
    model: Any,
    encode: Any,
    label: str,
    *,
    stride: int,
    depths: list[float] | tuple[float, ...] = (0.25, 0.5, 0.75),
    reference_phases: list[float] | tuple[float, ...] = (0.0,),
    prompts: int = 20,
    context: int = 256,
    batch: int = 8,
    seed: int = 0,
) -> PhaseRetrieval:
    """Needle accuracy and margin against phase and depth under each pooling (module
    docstring): ``prompts`` prompts per (depth, phase) cell, ``batch`` prompts per forward.
    The model's attention layers must share one rotary encoding that caches rotated keys."""
    from .model_capture import attention_layers

    stride = check_int(stride, "stride")
    depths = check_float_sequence(depths, "depths")
    reference_phases = check_float_sequence(reference_phases, "reference_phases")
    batch = check_int(batch, "batch")
    encodings = {id(m.encoding): m.encoding for m in attention_layers(model)}
    encoding = next(iter(encodings.values()))
    if len(encodings) != 1 or encoding is None or not encoding.has_rotary:
        raise ValueError(f"{label}: needs one rotary encoding shared by every layer")
    if not encoding.cache_rotated_keys or encoding.piecewise:
        raise ValueError(
            f"{label}: its encoding {encoding.name!r} does not cache rotated keys, so a pooled "
            "key has no rotation of its own"
        )
    for r in reference_phases:
        if not 0 <= r <= stride - 1:
            raise ValueError(
                f"reference_phases must lie in [0, stride - 1] = [0, {stride - 1}], got {r:g}"
            )
    pools: list[tuple[str, dict[str, Any]]] = [("none", {"pool": "none"})]
    pools += [
        (f"before φr={r:g}", {"pool": "before", "reference_phase": r}) for r in reference_phases
    ]
    pools.append(("after", {"pool": "after"}))
    shape = (len(depths), stride)
    acc = {name: torch.zeros(shape, dtype=torch.float64) for name, _ in pools}
    margin = {name: torch.zeros(shape, dtype=torch.float64) for name, _ in pools}
    digit = {name: torch.zeros(shape, dtype=torch.float64) for name, _ in pools}
    heads: dict[str, list[list[Tensor]]] = {
        name: [[0.0] * stride for _ in depths] for name, _ in pools
    }
    t0 = time.perf_counter()
    offset = 0
    for di, depth in enumerate(depths):
        for phase in range(stride):
            cell = needle_prompts(
                encode, context=context, stride=stride, depth=depth, phase=phase,
                prompts=prompts, seed=seed + 1000 * di,
            )  # fmt: skip
            offset = cell.offset
            for a in range(0, prompts, batch):
                part = cell.rows(a, a + batch)
                kv = _raw_kv(model, part.context)
                for name, options in pools:
                    exact, m, att = _score(model, kv, part, encoding, stride=stride, **options)
                    acc[name][di, phase] += float(exact.double().sum())
                    margin[name][di, phase] += float(m.double().sum())
                    digit[name][di, phase] += float((m > 0).double().sum())
                    heads[name][di][phase] = heads[name][di][phase] + att
    result = PhaseRetrieval(
        model=label,
        stride=stride,
        context=context,
        offset=offset,
        prompts=prompts,
        depths=list(depths),
        reference_phases=list(reference_phases),
        seed=seed,
    )

    def gap(x: Tensor) -> float:
        return float((x.amax(1) - x.amin(1)).mean())

    for name, _ in pools:
        a, d, m = acc[name] / prompts, digit[name] / prompts, margin[name] / prompts
        result.pools[name] = {
            "accuracy": a.tolist(),
            "digit_accuracy": d.tolist(),
            "margin": m.tolist(),
            "phase_gap": gap(a),
            "digit_phase_gap": gap(d),
            "margin_gap": gap(m),
            # [depth][phase][layer][head]: mean attention mass on the information line
            "needle_attention": [
                [(cell / prompts).tolist() for cell in row] for row in heads[name]
            ],
        }
    result.seconds = time.perf_counter() - t0
    return result


def plot_phase_retrieval(results: list[PhaseRetrieval], path: Any) -> None:
    """Per stride, for each pooling: accuracy (first digit and whole key) against phase per
    depth, the depth x phase heat map of the first digit's margin, and the needle attention
    of the five heads that attend most to the needle in the uncompressed cache, against phase
    (depth mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import save_figure

    pools = [name for r in results[:1] for name in r.pools]
    cols = len(pools)
    fig, axes = plt.subplots(
        3 * len(results), cols, figsize=(4.2 * cols, 3.6 * 3 * len(results)), squeeze=False
    )
    for n, r in enumerate(results):
        # the heads that attend most to the needle in the uncompressed cache
        reference = torch.tensor(r.pools["none"]["needle_attention"]).mean((0, 1))  # (L, H)
        top = reference.flatten().argsort(descending=True)[:5].tolist()
        for c, name in enumerate(pools):
            ax, bx, cx = axes[3 * n, c], axes[3 * n + 1, c], axes[3 * n + 2, c]
            att = torch.tensor(r.pools[name]["needle_attention"]).mean(0)  # (phase, L, H)
            for t in top:
                layer, head = divmod(t, reference.shape[1])
                cx.plot(range(r.stride), att[:, layer, head].tolist(), marker="o",
                        label=f"layer {layer} head {head}")  # fmt: skip
            cx.set_xticks(range(r.stride))
            cx.set_xlabel("needle phase φ")
            cx.set_ylabel("attention on the needle")
            cx.legend(fontsize=6)
            cell = r.pools[name]
            acc, digit = torch.tensor(cell["accuracy"]), torch.tensor(cell["digit_accuracy"])
            width = 0.8 / len(r.depths)
            for d, depth in enumerate(r.depths):
                xs = [p + d * width for p in range(r.stride)]
                ax.bar(xs, digit[d].tolist(), width, label=f"depth {depth:g}: first digit")
                ax.plot(xs, acc[d].tolist(), "k_", markersize=10)
            ax.set_ylim(0, 1.05)
            ax.set_xlabel("needle phase φ")
            ax.set_ylabel("accuracy (bars: first digit; -: whole key)")
            ax.set_title(
                f"s={r.stride} {name}: gap {cell['phase_gap']:.2f} (key), "
                f"{cell['digit_phase_gap']:.2f} (digit)",
                fontsize=8,
            )
            ax.legend(fontsize=6)
            margin = torch.tensor(cell["margin"])
            im = bx.imshow(margin, aspect="auto", cmap="RdBu", vmin=-5, vmax=5)
            bx.set_xticks(range(r.stride))
            bx.set_yticks(range(len(r.depths)), [f"{d:g}" for d in r.depths])
            bx.set_xlabel("needle phase φ")
            bx.set_ylabel("depth")
            bx.set_title("first-digit logit margin", fontsize=8)
            fig.colorbar(im, ax=bx)
    fig.suptitle(f"{results[0].model}: needle retrieval through a pooled KV cache", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
