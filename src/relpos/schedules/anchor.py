"""AnchorAttention (Wang et al. 2024, "When Precision Meets Position: BFloat16 Breaks Down
RoPE in Long-Context Training", arXiv 2411.13476; haonan3/AnchorContext ``train.py``:
``generate_doc_mask_mod`` / ``anchor_attn_mod``, ``rotary_position_ids``).

RoPE in bf16 drifts from relativity as positions grow, and the first token (the attention
sink) carries most of the error. AnchorAttention packs documents behind one shared *anchor*
token (BOS, else EOS) at index 0 with document id 0; documents get ids 1, 2, ... and each
sees itself and the anchor:

    allowed(q, k) = causal(q, k) and (doc(q) == doc(k) or doc(k) == 0)

Rotary positions are *not* reset per document (a global ``arange``). The repo's
FlashAttention variant instead prefixes every document with its own copy of the anchor,
whose rotary position is forced to 0, and masks per document (varlen); the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ..validation import check_int, check_int_tensor

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


class AnchorPacking(NamedTuple):
    """One packed sequence: ``tokens``, ``doc_ids`` and rotary ``positions``, each ``(L,)``."""

    tokens: Tensor
    doc_ids: Tensor
    positions: Tensor


def pack_with_anchor(
    documents: Sequence[Tensor], anchor_token: int, *, per_document: bool = False
) -> AnchorPacking:
    """Pack token-id documents ``(L_d,)`` behind the anchor token.

    * ``per_document=False`` (the FlexAttention form): ``[anchor] + doc_1 + doc_2 + ...``,
      doc ids ``[0, 1.., 2.., ...]``, positions ``0 .. L-1``. Use ``anchor_mask_mod``.
    * ``per_document=True`` (the FlashAttention form): ``[anchor] + doc_1 + [anchor] + doc_2
      ...``, each anchor in its document's id, at position 0, the other tokens at their
      global index. The mask is then plain causal-within-document (``anchor_mask_mod``
      gives it too: no key has id 0).
    """
    check_int(anchor_token, "anchor_token", minimum=None)
    if isinstance(documents, Tensor) or not documents:
        raise ValueError("documents must be a non-empty sequence of 1-D token-id tensors")
    docs = [check_int_tensor(d, f"documents[{n}]", dims=(1,)) for n, d in enumerate(documents)]
    device = docs[0].device
    anchor = torch.tensor([anchor_token], dtype=docs[0].dtype, device=device)
    tokens, ids = [], []
    if not per_document:
        tokens.append(anchor)
        ids.append(torch.zeros(1, dtype=torch.int64, device=device))
    for n, d in enumerate(docs, start=1):
        part = torch.cat([anchor.to(d.dtype), d]) if per_document else d
        tokens.append(part)
        ids.append(torch.full((part.numel(),), n, dtype=torch.int64, device=device))
    tok, doc = torch.cat(tokens), torch.cat(ids)
    pos = torch.arange(tok.numel(), device=device)
    if per_document:
        pos = torch.where(doc != torch.cat([doc.new_full((1,), -1), doc[:-1]]), 0, pos)
    return AnchorPacking(tok, doc, pos)


def anchor_mask_mod(doc_ids: Tensor, *, causal: bool = True) -> MaskMod:
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` for ``doc_ids (L,)`` or
    ``(B, L)``: ``(doc(q) == doc(k) or doc(k) == 0) and q_idx >= kv_idx``. It is
    element-wise on broadcasting index tensors, so it also evaluates any tile of the mask
    without an ``L x L`` tensor: pass it as ``relpos.attention(..., mask_mod=...)`` (or to
    ``MultiHeadAttention`` / ``TransformerLM``). Query and key indices address the same
    sequence (self-attention over ``doc_ids``; relpos passes queries in key coordinates, so
    cached decoding reuses it)."""
    ids = check_int_tensor(doc_ids, "doc_ids")
    ids = ids if ids.dim() == 2 else ids[None]

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        bb = b if ids.shape[0] > 1 else torch.zeros_like(b)
        dq, dk = ids[bb, q_idx], ids[bb, kv_idx]
        allowed = (dq == dk) | (dk == 0)
        return allowed & (q_idx >= kv_idx) if causal else allowed

    return mask_mod


def anchor_mask(doc_ids: Tensor, *, num_queries: int | None = None, causal: bool = True) -> Tensor:
    """The dense bool mask ``(B|1, 1, Lq, L)`` of ``anchor_mask_mod`` for
    ``relpos.attention(..., mask=...)`` (True = attend). ``num_queries`` keeps the last
    ``Lq`` query rows (decoding with a KV cache over all ``L`` keys). O(L^2) memory: for long
    sequences pass ``mask_mod=anchor_mask_mod(doc_ids)`` instead."""
    ids = check_int_tensor(doc_ids, "doc_ids")
    length = ids.shape[-1]
    lq = length if num_queries is None else check_int(num_queries, "num_queries", minimum=0)
    if lq > length:
        raise ValueError(f"num_queries ({lq}) must be <= the number of keys ({length})")
    dev = ids.device
    b = torch.arange(ids.shape[0] if ids.dim() == 2 else 1, device=dev)[:, None, None, None]
    q = torch.arange(length - lq, length, device=dev)[None, None, :, None]
    k = torch.arange(length, device=dev)[None, None, None, :]
    return anchor_mask_mod(ids, causal=causal)(b, torch.zeros_like(b), q, k)


__all__ = ["AnchorPacking", "pack_with_anchor", "anchor_mask_mod", "anchor_mask"]
