"""Perplexity of a language model at a given window length (used by ``relpos extrapolate``).

Two modes (``evaluate_perplexity``):

* ``"nonoverlapping"`` (the ALiBi paper's headline metric, fairseq ``--context-window 0``):
  cut the token stream into windows of ``length`` and score every token of every window,
  each window from scratch.
* ``"sliding"`` (the paper's Appendix B analysis): windows of ``length`` advance by
  ``stride`` and only the last ``stride`` tokens of each window are scored, so every scored
  token sees at least ``length - stride`` earlier tokens.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relpos.validation import check_int

MODES = ("nonoverlapping", "sliding")
# Tokens per forward pass during evaluation (the default batch size). 4096 keeps q and k of a
# dim-128 model below relpos.config.FUSED_ROTARY_MIN_NUMEL, so evaluating RoPE at a new length
# never waits for torch.compile, and bounds the logits to 4096 x vocab floats.
EVAL_BATCH_TOKENS = 4096


def sliding_stride(length: int) -> int:
    """Default stride of the sliding mode: a quarter window (scored tokens see >= 3/4 of it)."""
    return max(1, length // 4)


def window_spans(
    n_tokens: int,
    length: int,
    *,
    mode: str = "nonoverlapping",
    stride: int | None = None,
    start: int | None = None,
    max_tokens: int | None = None,
) -> tuple[list[tuple[int, int, int]], int, int]:
    """The windows an evaluation runs, as ``(input_start, input_end, n_scored)`` triples.

    A window feeds ``tokens[input_start:input_end]`` (``length`` tokens; only a last window
    cut short by ``max_tokens`` is shorter) and scores its last ``n_scored`` predictions (the
    targets are the inputs shifted by one). Scored targets are indexed by the position of the
    token that predicts them: target ``t`` is ``tokens[t + 1]``.
    Returns ``(windows, stride, start)`` with the defaults resolved.
    """
    check_int(length, "length")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "nonoverlapping":
        if stride is not None and stride != length:
            raise ValueError(f"stride is only used by mode='sliding' (got stride={stride})")
        stride = length
        start = 0 if start is None else start
    else:
        stride = sliding_stride(length) if stride is None else check_int(stride, "stride")
        if stride > length:
            raise ValueError(f"stride ({stride}) must be <= length ({length})")
        start = length - stride if start is None else start
        if start < length - stride:
            raise ValueError(
                f"start ({start}) must be >= length - stride ({length - stride}) in sliding "
                "mode, so every scored token has a full window of context"
            )
    check_int(start, "start", minimum=0)
    available = n_tokens - 1 - start  # targets t in [start, n_tokens - 1)
    if available < 1:
        raise ValueError(
            f"the text has {n_tokens} tokens: too short to score anything from token {start} "
            f"(length {length}, mode {mode!r})"
        )
    budget = (
        available if max_tokens is None else min(check_int(max_tokens, "max_tokens"), available)
    )
    end = start + budget  # scored targets: [start, end)
    windows = []
    if mode == "nonoverlapping":
        for s in range(start, end, length):
            e = min(s + length, end)
            windows.append((s, e, e - s))
    else:
        for a in range(start, end, stride):
            b = min(a + stride, end)  # a short last window keeps the full left context
            windows.append((a - (length - stride), b, b - a))
    return windows, stride, start


@torch.no_grad()
def evaluate_perplexity(
    model: nn.Module,
    tokens: Tensor,
    length: int,
    *,
    mode: str = "nonoverlapping",
    stride: int | None = None,
    start: int | None = None,
    max_tokens: int | None = None,
    batch_size: int | None = None,
) -> dict[str, Any]:
    """Perplexity of a causal LM on a token stream, with windows of ``length`` tokens.

    Args:
        model: maps ``(B, T)`` int64 tokens to ``(B, T, vocab)`` logits (``TransformerLM``);
            it runs in eval mode under ``torch.no_grad`` with its own attention backends
            (``auto`` moves biased attention to the O(L)-memory ``chunked`` backend above
            ``relpos.attention.DENSE_BIAS_LIMIT``).
        tokens: 1-D integer tensor, the evaluation text.
        length: window length (the evaluation length).
        mode: ``"nonoverlapping"`` (score every token; each window from scratch) or
            ``"sliding"`` (windows advance by ``stride``; only their last ``stride`` tokens
            are scored, so each scored token sees ``>= length - stride`` earlier tokens).
        stride: sliding mode only; default ``length // 4``.
        start: index of the first scored target (target ``t`` is ``tokens[t + 1]``); default
            0, or ``length - stride`` in sliding mode (the first index with a full window).
        max_tokens: score at most this many targets (a fixed budget makes lengths
            comparable: same text, same number of scored tokens).
        batch_size: windows per forward pass; default ``4096 // length`` (at least 1).

    Returns:
        ``dict(ppl, nll, tokens_scored, windows, length, mode, stride, start)`` where ``nll``
        is the mean negative log-likelihood in nats per scored token and ``ppl = exp(nll)``.
    """
    if not isinstance(tokens, Tensor) or tokens.dim() != 1:
        raise ValueError("tokens must be a 1-D integer tensor")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens must be an integer tensor, got {tokens.dtype}")
    spans, stride, start = window_spans(
        tokens.numel(), length, mode=mode, stride=stride, start=start, max_tokens=max_tokens
    )
    if batch_size is None:
        batch_size = max(1, EVAL_BATCH_TOKENS // length)
    check_int(batch_size, "batch_size")
    device = next(iter(model.parameters()), torch.empty(0)).device
    tokens = tokens.long()
    was_training = model.training
    model.eval()
    total, scored = 0.0, 0
    try:
        # Windows of one (input length, scored count) shape go through together.
        groups: dict[tuple[int, int], list[int]] = {}
        for s, e, n in spans:
            groups.setdefault((e - s, n), []).append(s)
        for (width, n_scored), starts in groups.items():
            offsets = torch.arange(width + 1)
            for b in range(0, len(starts), batch_size):
                first = torch.tensor(starts[b : b + batch_size])
                idx = first[:, None] + offsets[None, :]
                chunk = tokens[idx].to(device)
                logits = model(chunk[:, :-1])[:, -n_scored:]
                targets = chunk[:, -n_scored:]
                nll = F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]).float(),
                    targets.reshape(-1),
                    reduction="sum",
                )
                total += float(nll)
                scored += targets.numel()
    finally:
        model.train(was_training)
    mean = total / scored
    return {
        "ppl": math.exp(mean),
        "nll": mean,
        "tokens_scored": scored,
        "windows": len(spans),
        "length": length,
        "mode": mode,
        "stride": stride,
        "start": start,
    }
