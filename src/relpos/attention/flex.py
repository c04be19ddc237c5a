"""FlexAttention backend: the encoding's ``bias`` is the ``score_mod``, masks are block masks.

The compiled ``flex_attention`` is created once per process and device type and reused;
score_mod closures share one code object, so new calls with new tensors of the same shapes do
not recompile (dynamo lifts the captured tensors to graph inputs). torch 2.13 has no
FlexAttention backward on CPU: asking for gradients there raises a ``RuntimeError`` that
names the ``chunked`` backend instead.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from .call import AttentionCall

FLEX_RECOMPILE_LIMIT = 64


@lru_cache(maxsize=4)
def compiled_flex_attention(device_type: str = "cpu"):
    """``torch.compile(flex_attention)`` for one device type, built on first use.

    On CUDA shapes are dynamic after the first recompile. On CPU, inductor's dynamic-shape
    FlexAttention kernel fails to build in torch 2.13, so shapes stay static: each new
    (Lq, Lk) compiles once (seconds), and dynamo's per-function recompile limit is raised to
    ``FLEX_RECOMPILE_LIMIT`` so varying lengths do not silently fall back to the unfused,
    O(L^2) ``flex_attention``.
    """
    from torch.nn.attention.flex_attention import flex_attention

    if device_type == "cpu":
        import torch._dynamo.config as dynamo_config

        for name in ("recompile_limit", "cache_size_limit"):
            if getattr(dynamo_config, name, FLEX_RECOMPILE_LIMIT) < FLEX_RECOMPILE_LIMIT:
                setattr(dynamo_config, name, FLEX_RECOMPILE_LIMIT)
        return torch.compile(flex_attention, dynamic=False)
    return torch.compile(flex_attention, dynamic=None)


def flex_available() -> bool:
    """True when FlexAttention can be imported (torch >= 2.5)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _score_mod(call: AttentionCall):
    enc = call.encoding
    dev = call.q.device
    ctx = call.bias_context(
        torch.arange(call.q.shape[2], device=dev), torch.arange(call.k.shape[2], device=dev)
    )

    def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return score + enc.bias(ctx, b, h, i, j).to(score.dtype)

    return score_mod


def _block_mask(call: AttentionCall):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = call.causal_offset
    user, user_mod = call.mask, call.mask_mod
    causal = call.causal
    if user is not None and user.dtype != torch.bool:
        raise ValueError("the flex backend takes a bool mask (True = attend); got a float mask")

    def mask_mod(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        keep = torch.ones((), dtype=torch.bool, device=i.device)
        if causal:
            keep = keep & (j <= i + offset)
        if user is not None:
            keep = keep & user[b, h, i, j]
        if user_mod is not None:  # queries in key coordinates, as on the other backends
            keep = keep & user_mod(b, h, i + offset, j)
        return keep

    B, H, Lq = call.q.shape[:3]
    Lk = call.k.shape[2]
    if not call.has_user_mask:
        return _causal_block_mask(Lq, Lk, str(call.q.device))
    return create_block_mask(mask_mod, B, H, Lq, Lk, device=call.q.device)


@lru_cache(maxsize=32)
def _causal_block_mask(Lq: int, Lk: int, device: str):
    """Bottom-right aligned causal block mask, built once per shape (building costs ~1 s)."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = Lk - Lq

    def causal(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return j <= i + offset

    return create_block_mask(causal, None, None, Lq, Lk, device=device)


def flex_attention_backend(call: AttentionCall) -> Tensor:
    """``(B, H, Lq, Dv)`` through compiled FlexAttention."""
    if not flex_available():
        raise RuntimeError("backend='flex' needs torch >= 2.5 (torch.nn.attention.flex_attention)")
    needs_grad = torch.is_grad_enabled() and (
        call.q.requires_grad
        or call.k.requires_grad
        or call.v.requires_grad
        or (call.encoding is not None and call.encoding.learnable)
    )
    if needs_grad and call.q.device.type == "cpu":
        raise RuntimeError(
            "backend='flex' has no backward on CPU in this torch; use backend='chunked' for "
            "training (or run the forward under torch.no_grad())"
        )
    score_mod = _score_mod(call) if call.has_bias else None
    block_mask = _block_mask(call) if (call.causal or call.has_user_mask) else None
    return compiled_flex_attention(call.q.device.type)(
        call.q,
        call.k,
        call.v,
        score_mod=score_mod,
        block_mask=block_mask,
        scale=call.scale,
        enable_gqa=call.groups > 1,
    )
