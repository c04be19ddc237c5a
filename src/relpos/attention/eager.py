"""Reference backend: materialise the (B, H, Lq, Lk) logits, softmax, weight the values.

Every encoding runs here; the other backends are tested against it. O(L^2) memory.
"""

from __future__ import annotations

from torch import Tensor

from .call import AttentionCall
from .dense import block_attention, block_logits, empty_attention


def logits(call: AttentionCall) -> Tensor:
    """``q k^T * scale + bias`` (piecewise logits included), without masks:
    ``(B, H, Lq, Lk)`` (dtype of q)."""
    return block_logits(call, 0, call.q.shape[2], call.k.shape[2])


def eager_attention(call: AttentionCall) -> Tensor:
    """Softmax attention from the full logit matrix. Returns ``(B, H, Lq, Dv)``."""
    if call.q.shape[2] == 0 or call.k.shape[2] == 0:
        return empty_attention(call)
    return block_attention(call, 0, call.q.shape[2], call.k.shape[2])
