"""``torch.nn.functional.scaled_dot_product_attention`` backend.

For encodings without a bias (rotary, none, absolute) this is the fast path: flash kernels
on CPU and GPU, no L x L tensor when the only mask is causal with ``Lq == Lk``. With a bias
it materialises the (B, H, Lq, Lk) bias as a float mask, which ``auto`` allows only below
``relpos.attention.api.DENSE_BIAS_LIMIT`` elements.
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


def sdpa_attention(call: AttentionCall) -> Tensor:
    """Returns ``(B, H, Lq, Dv)``."""
    Lq, Lk = call.q.shape[2], call.k.shape[2]
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
