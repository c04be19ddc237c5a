"""``torch.nn.functional.scaled_dot_product_attention`` backend.

For encodings without a bias (rotary, none, absolute) this is the fast path: flash kernels
on CPU and GPU, no L x L tensor when the only mask is causal with ``Lq == Lk``. With a bias
it materialises the (B, H, Lq, Lk) bias as a float mask, which ``auto`` allows only below
``relpos.attention.api.DENSE_BIAS_LIMIT`` elements.

Attention sinks run exactly as one more key: a zero key and a zero value appended to every
head, whose column of the float mask holds the head's sink logit (``q . 0 * scale = 0``
exactly, so its logit is the sink; its value adds nothing), which materialises the mask as
a bias does. Softcapping cannot run here (the kernel adds a mask to ``q k^T`` and has no
tanh of the logits): the engine refuses it by name (``api.BACKEND_FEATURES``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import frozen_cache
from .call import AttentionCall


def dense_bias(call: AttentionCall) -> Tensor:
    """The ``(B|1, H, Lq, Lk)`` bias. Distance-only biases over range positions gather from
    their per-distance table (``H * (Lq + Lk)`` evaluations instead of one per pair)."""
    Lq, Lk = call.q.shape[2], call.k.shape[2]
    dev = call.q.device
    i = torch.arange(Lq, device=dev)
    j = torch.arange(Lk, device=dev)
    table = call.distance_table(causal=False)
    if table is None:
        return call.bias_block(i, j)
    return table[:, i[:, None] - j[None, :] + (Lk - 1)][None]


def _score_mask(call: AttentionCall) -> Tensor | None:
    """The float mask SDPA adds: the dense bias plus the causal and user masks (None when
    there is nothing to add)."""
    Lq, Lk = call.q.shape[2], call.k.shape[2]
    bias = dense_bias(call).to(call.q.dtype) if call.has_bias else None
    if (call.causal and Lq > 1) or call.has_user_mask:
        m = call.mask_block(0, Lq, Lk, call.q.dtype)
        if m is not None:
            bias = m if bias is None else bias + m
    return bias


def _sink_attention(call: AttentionCall) -> Tensor:
    """Attention with sinks: the sink as an appended zero key and value whose mask column is
    the head's sink logit (see the module docstring)."""
    assert call.sinks is not None
    B, H, Lq = call.q.shape[:3]
    Lk = call.k.shape[2]
    dtype = call.q.dtype
    mask = _score_mask(call) if (call.has_bias or call.causal or call.has_user_mask) else None
    if mask is None:
        mask = call.q.new_zeros(1, 1, Lq, Lk)
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    rows = mask.shape[0]
    mask = mask.expand(rows, H, Lq, Lk)
    sink = call.sinks.to(dtype).view(1, H, 1, 1).expand(rows, H, Lq, 1)
    mask = torch.cat([mask, sink], dim=-1)
    k = F.pad(call.k, (0, 0, 0, 1))
    v = F.pad(call.v, (0, 0, 0, 1))
    return F.scaled_dot_product_attention(
        call.q, k, v, attn_mask=mask, scale=call.scale, enable_gqa=call.groups > 1
    )


def sdpa_attention(call: AttentionCall) -> Tensor:
    """Returns ``(B, H, Lq, Dv)``."""
    if call.softcap is not None:
        raise ValueError(
            "backend 'sdpa' cannot apply softcap: its kernel adds a mask to q k^T and has no "
            "tanh of the logits; use backend 'eager', 'chunked', 'flex' or 'auto'"
        )
    Lq, Lk = call.q.shape[2], call.k.shape[2]
    if call.sinks is not None and Lq and Lk:
        return _sink_attention(call)
    is_causal = call.causal and Lq == Lk and not call.has_user_mask and not call.has_bias
    bias = None
    if is_causal:
        pass
    elif call.has_bias and not call.has_user_mask and call.distance_delta() is not None:
        # a function of the encoding's state and the call's lengths only: kept while the
        # encoding is unchanged (``frozen_cache``)
        assert call.encoding is not None
        key = ("sdpa_mask", Lq, Lk, call.distance_delta(), call.causal, call.q.dtype)
        bias = frozen_cache.cached(
            call.encoding, (*key, call.q.device), lambda: _score_mask(call), call.encoding_state()
        )
    else:
        bias = _score_mask(call)
    return F.scaled_dot_product_attention(
        call.q,
        call.k,
        call.v,
        attn_mask=bias,
        is_causal=is_causal,
        scale=call.scale,
        enable_gqa=call.groups > 1,
    )
