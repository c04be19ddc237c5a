"""Reference backend: materialise the (B, H, Lq, Lk) logits, softmax, weight the values.

Every encoding runs here; the other backends are tested against it. O(L^2) memory.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .call import AttentionCall


def logits(call: AttentionCall) -> Tensor:
    """``q k^T * scale + bias``, without masks: ``(B, H, Lq, Lk)`` (dtype of q)."""
    k, _ = call.expanded_kv()
    out = torch.matmul(call.q, k.transpose(-1, -2)) * call.scale
    if call.has_bias:
        dev = call.q.device
        i = torch.arange(call.q.shape[2], device=dev)
        j = torch.arange(call.k.shape[2], device=dev)
        out = out + call.bias_block(i, j).to(out.dtype)
    return out


def eager_attention(call: AttentionCall) -> Tensor:
    """Softmax attention from the full logit matrix. Returns ``(B, H, Lq, Dv)``."""
    s = logits(call)
    m = call.mask_block(0, call.q.shape[2], call.k.shape[2], s.dtype)
    if m is not None:
        s = s + m
    _, v = call.expanded_kv()
    return torch.matmul(torch.softmax(s, dim=-1), v)
