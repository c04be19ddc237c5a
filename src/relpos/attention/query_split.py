"""Calls split into query blocks, for encodings that bound the query span of one call.

Rows of attention are independent: a call computes the same output as the same call cut
into blocks of consecutive queries, each block attending to the keys it can see. Some
encodings can only encode a bounded range of query positions at once: xPos and
hyperbolic-rope scale queries by ``e^{-a (n - c)}`` around a per-call centre ``c``, which
leaves the activation dtype's range once the queries of one call span more than
``Encoding.query_span_limit(dtype)`` positions (64 x scale_base in float32). ``attention``
cuts such calls here, so that each block has its own centre and every score stays exact at
any span float64 positions allow.

A block of queries ``s .. e-1`` keeps the bottom-right causal alignment of the whole call:

* causal calls give the block the keys ``0 .. e - 1 + Lk - Lq`` (those its last query may
  see); a block of ``e - s`` queries over that many keys is aligned exactly as the rows were
  in the whole call, so ``causal`` and ``mask_mod`` (whose ``q_idx`` is the query's index in
  the key sequence) mean the same thing, and later keys cost nothing;
* non-causal calls keep every key and shift ``mask_mod``'s ``q_idx`` by ``e - Lq``.

A KV ``cache`` is appended to once, before the blocks (which then attend to the cached keys
without a cache). Blocks are found from the query positions of every batch row: the
longest run of consecutive queries whose span is within the limit in every row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..encodings.base import Encoding
from ..positions import normalize_positions
from .call import KeyValueCache, MaskMod, _check_mask, _check_qkv

__all__ = ["query_span_blocks", "split_call"]


def query_span_blocks(q_pos: Tensor, limit: float) -> list[tuple[int, int]]:
    """``[(s, e), ...]`` covering ``0 .. L-1``: runs of consecutive queries whose positions
    (``q_pos (Bp, L)``) span at most ``limit`` in every batch row. Each block holds at least
    one query (a single query spans 0)."""
    pos = q_pos.detach().to(torch.float64)
    L = pos.shape[-1]
    blocks: list[tuple[int, int]] = []
    s = 0
    while s < L:
        # the first index after s whose running span exceeds the limit, in any batch row
        window = pos[:, s:]
        span = window.cummax(-1).values - window.cummin(-1).values  # (Bp, L - s)
        over = (span > limit).any(0)
        e = s + (int(over.nonzero()[0]) if bool(over.any()) else L - s)
        blocks.append((s, e))
        s = e
    return blocks


def _shifted(mask_mod: MaskMod | None, shift: int) -> MaskMod | None:
    if mask_mod is None or shift == 0:
        return mask_mod

    def shifted(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return mask_mod(b, h, q_idx + shift, kv_idx)

    return shifted


def _rows(mask: Tensor | None, s: int, e: int, k_end: int, Lq: int, Lk: int) -> Tensor | None:
    """The block's rows (and visible columns) of a mask broadcastable to (B, H, Lq, Lk)."""
    if mask is None:
        return None
    if mask.shape[-2] == Lq:
        mask = mask[..., s:e, :]
    if mask.shape[-1] == Lk:
        mask = mask[..., :k_end]
    return mask


def split_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: Encoding | None,
    *,
    q_pos: Tensor | None,
    k_pos: Tensor | None,
    causal: bool,
    mask: Tensor | None,
    mask_mod: MaskMod | None,
    cache: KeyValueCache | None,
    **rest: Any,
) -> list[dict[str, Any]] | None:
    """The sub-calls (keyword dicts for ``relpos.attention``) that compute this call in
    query blocks, or None when the encoding takes the whole call at once (no limit, or the
    queries are within it). ``cache`` is appended to here when the call is split (encodings
    with a limit cache raw keys, ``cache_rotated_keys = False``: each block rotates them)."""
    if encoding is None or not isinstance(encoding, Encoding):
        return None
    if not isinstance(q, Tensor) or not q.is_floating_point():
        return None  # prepare_call names what is wrong with q
    limit = encoding.query_span_limit(q.dtype)
    if limit is None:
        return None
    _check_qkv(q, k, v)
    Lq = q.shape[2]
    if Lq <= 1 or q.device.type == "meta":
        return None  # (prepare_call refuses meta tensors by name)
    cached = 0 if cache is None else cache.length
    Lk = cached + k.shape[2]
    if not isinstance(causal, bool):
        return None  # prepare_call names the argument
    qp = normalize_positions(
        q_pos,
        name="q_pos",
        batch=q.shape[0],
        length=Lq,
        dims=encoding.dims,
        continuous=encoding.continuous,
        device=q.device,
        offset=Lk - Lq,
    )
    if qp.dim() != 2 or qp.numel() == 0:
        return None
    blocks = query_span_blocks(qp, limit)
    if len(blocks) == 1:
        return None
    mask = _check_mask(mask, (q.shape[0], q.shape[1], Lq, Lk), q.device)
    kp = normalize_positions(
        k_pos,
        name="k_pos",
        batch=q.shape[0],
        length=k.shape[2],
        dims=encoding.dims,
        continuous=encoding.continuous,
        device=q.device,
        offset=cached,
    )
    if cache is not None:
        k, v, kp = cache.append(k, v, kp)
    calls = []
    for s, e in blocks:
        k_end = max(0, e + Lk - Lq) if causal else Lk
        calls.append(
            dict(
                q=q[:, :, s:e],
                k=k[:, :, :k_end],
                v=v[:, :, :k_end],
                encoding=encoding,
                q_pos=qp[..., s:e],
                k_pos=kp[..., :k_end],
                causal=causal,
                mask=_rows(mask, s, e, k_end, Lq, Lk),
                mask_mod=_shifted(mask_mod, 0 if causal else e - Lq),
                cache=None,
                **rest,
            )
        )
    return calls
