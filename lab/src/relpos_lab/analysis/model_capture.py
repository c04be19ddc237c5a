"""Models as input to ``relpos analyze``: load one, tokenize text, and capture each attention
layer's rotated queries and keys, logits and weights on it.

``--model`` takes ``smollm2`` (the bundled GGUF), ``random-tiny`` (untrained, for smoke
tests), a path to a Llama-family ``.gguf`` file, a checkpoint folder written by
``relpos extrapolate`` (``out/<encoding>/``, a ``TransformerLM`` over UTF-8 bytes), or
``fresh:<encoding>``: the model ``relpos extrapolate``'s quick profile trains (dim 128,
depth 2, 4 heads, bytes), untrained, seeded. ``model_specs`` reads a comma-separated list and
expands a ``relpos extrapolate`` run folder into its checkpoints (one model per encoding).

``capture_attention(model, tokens)`` runs the model once and, from a forward pre-hook on each
``MultiHeadAttention``, recomputes that layer's projections exactly as its forward does
(``MultiHeadAttention.project``: with its q/k/v convolutions and q/k normalisation), then
rotates them with the layer's encoding (``rotate_qk``) and forms the logits with
``relpos.scores`` (bias included) and the causal softmax. GQA keys are repeated per query head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from relpos.validation import check_int

__all__ = [
    "LayerCapture",
    "FRESH",
    "model_specs",
    "load_analysis_model",
    "text_tokens",
    "attention_layers",
    "capture_attention",
]

#: ``--model fresh:<encoding>``: an untrained model of the quick profile's size
FRESH = "fresh:"


@dataclass
class LayerCapture:
    """One layer on one batch: rotated ``q, k (B, H, L, D)``, ``logits`` and causal
    ``weights (B, H, L, L)``, and the layer's encoding."""

    q: Tensor
    k: Tensor
    logits: Tensor
    weights: Tensor
    encoding: Any


def model_specs(value: str, flag: str = "--model") -> list[str]:
    """The models of a comma-separated ``--model`` value: a folder without a checkpoint of
    its own is a ``relpos extrapolate`` run folder and stands for every checkpoint in it
    (``out/<encoding>/``, sorted). Nothing is loaded."""
    from ..training.checkpoint import has_checkpoint

    specs = [v.strip() for v in value.split(",")]
    if not value.strip() or any(not v for v in specs):
        raise ValueError(f"{flag} must be a comma-separated list of models, got {value!r}")
    out: list[str] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir() and not has_checkpoint(path):
            found = sorted(str(p) for p in path.iterdir() if p.is_dir() and has_checkpoint(p))
            if not found:
                raise ValueError(
                    f"{flag} {spec!r} is a folder without a relpos checkpoint (neither a "
                    "checkpoint folder nor a relpos extrapolate run folder)"
                )
            out.extend(found)
        else:
            out.append(spec)
    if len(set(out)) != len(out):
        raise ValueError(f"{flag} names a model twice: {value!r}")
    return out


def _fresh_model(spec: str, seed: int, length: int) -> tuple[Any, Any, str]:
    from relpos import registry

    from ..training.profiles import get_profile
    from ..training.train import TrainConfig, build_model

    name = spec[len(FRESH) :]
    try:
        registry.encoding_class(name)
    except ValueError as err:
        raise ValueError(f"--model {spec!r}: {err}") from None
    quick = get_profile("quick")
    config = TrainConfig(
        encoding=name,
        encoding_options=quick.encoding_options(name, length, length),
        dim=quick.dim,
        depth=quick.depth,
        num_heads=quick.num_heads,
        seq_len=length,
        init=quick.init,
        tie_embedding=quick.tie_embedding,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build_model(config, 256).eval()
    return model, lambda text: list(text.encode("utf-8")), f"{name} (fresh, seed {seed})"


def load_analysis_model(spec: str, *, seed: int = 0, length: int = 128) -> tuple[Any, Any, str]:
    """``(model, encode, label)``: ``encode(text) -> list[int]``. One-line errors. ``seed``
    and ``length`` (the longest input, for learned tables) size a ``fresh:`` model."""
    if spec.startswith(FRESH):
        return _fresh_model(spec, check_int(seed, "seed", minimum=0), check_int(length, "length"))
    path = Path(spec)
    if path.is_dir():
        from ..training.checkpoint import has_checkpoint
        from ..training.train import load_trained

        if not has_checkpoint(path):
            raise ValueError(f"--model {spec!r} is a folder without a relpos checkpoint")
        model, config, state = load_trained(path)
        if int(state["vocab_size"]) != 256:
            raise ValueError(
                f"--model {spec!r} was trained on a BPE vocabulary ({state['vocab_size']}); "
                "analyze reads byte-level (vocab 256) checkpoints only"
            )
        return model, lambda text: list(text.encode("utf-8")), f"{config.encoding} ({path.name})"
    from ..longctx.models import is_hf, load_model

    if spec not in ("smollm2", "random-tiny") and not is_hf(spec) and not path.is_file():
        raise ValueError(
            f"--model must be smollm2, random-tiny, a .gguf file, a relpos extrapolate "
            f"checkpoint or run folder, or {FRESH}<encoding>; got {spec!r}"
        )
    model, tokenizer, _ = load_model(spec)
    model.eval()

    def encode(text: str) -> list[int]:
        out = tokenizer.encode(text)
        return list(getattr(out, "ids", out))

    return model, encode, spec


def text_tokens(encode: Any, length: int, batch: int = 1) -> Tensor:
    """``(batch, length)`` token windows from the built-in corpus (one window per play)."""
    from ..training.data import builtin_texts

    length, batch = check_int(length, "length"), check_int(batch, "batch")
    rows = []
    for text in builtin_texts().values():
        ids = encode(text[: 40 * length + 10000])
        start = min(len(ids) - length, 1000)
        if start >= 0:
            rows.append(ids[start : start + length])
        if len(rows) == batch:
            break
    if len(rows) < batch:
        raise ValueError(f"the built-in corpus has too few texts of {length} tokens")
    return torch.tensor(rows, dtype=torch.int64)


def attention_layers(model: Any) -> list[Any]:
    from relpos.nn.attention import MultiHeadAttention

    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise ValueError("the model has no relpos MultiHeadAttention layers")
    return layers


def capture_attention(model: Any, tokens: Tensor, pos: Tensor | None = None) -> list[LayerCapture]:
    """Per layer: rotated q, k, logits and causal weights on ``tokens (B, L)``; ``pos``: the
    model's position ids (``(B, L)``, e.g. coupled positions; default ``0..L-1``)."""
    import relpos

    layers = attention_layers(model)
    captured: list[LayerCapture] = []

    def hook(module, args, kwargs):
        x = args[0]
        B, L, _ = x.shape
        pos = kwargs.get("pos")
        if pos is None and len(args) > 1:
            pos = args[1]
        if pos is None:
            pos = torch.arange(L)[None]
        q, k, _ = module.project(x)  # projections, q/k/v convolutions, q/k norm
        enc = module.encoding
        logits = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
        if enc is not None:
            q, k = enc.rotate_qk(q, k, pos, pos)
        k = k.repeat_interleave(module.num_heads // module.num_kv_heads, dim=1)
        mask = torch.ones(L, L, dtype=torch.bool).tril()
        weights = torch.softmax(logits.float().masked_fill(~mask, -math.inf), dim=-1)
        captured.append(LayerCapture(q.float(), k.float(), logits.float(), weights, enc))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in layers]
    try:
        with torch.no_grad():
            model(tokens) if pos is None else model(tokens, pos=pos)
    finally:
        for h in handles:
            h.remove()
    return captured
