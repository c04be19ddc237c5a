"""The engine's piecewise-RoPE kernel: piecewise logits through the fused SDPA kernel.

A piecewise encoding (``Encoding.pieces`` / ``key_segments``; the RoPE schedules DCA,
LM-Infinite and Self-Extend in ``relpos.encodings.rotary.schedules``) scores pair ``(i, j)``
with ``<q^r_i, k^r_j>``, ``r = piece_index(i, j)``. The engine's generic probability path
(``attention.dense.block_attention``) materialises each block's logits;
``piecewise_sdpa_attention`` gets the same result from SDPA calls, laying the key copies of
each piece out on channel slots (or, for CPU inference, one flash call per key range and
piece merged by log-sum-exp). The chunked backend calls it for every call with pieces and
nothing else that changes the weights (``runs_piecewise``).

The layout comes from the encoding's declared segments (``Encoding.key_segments`` returning
``KeySegment`` s per query block) when the positions are ranges and there is no user mask;
otherwise from the element-wise ``piece_index`` (which ``Encoding`` derives from the same
segments).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..encodings.base import KeySegment
from .call import AttentionCall, QueryBlock, run_blocks

# query rows per block of piecewise_sdpa_attention: Lk / 4, at least PIECEWISE_MIN_ROWS (fewer,
# larger kernel calls: per-call overhead dominated 256-row blocks on a busy 2-core machine), at
# most PIECEWISE_BLOCK_ELEMENTS / Lk (the block's mask and scores)
PIECEWISE_BLOCK_ELEMENTS = 1 << 24
PIECEWISE_MIN_ROWS = 256


def runs_piecewise(call: AttentionCall) -> bool:
    """The call has pieces and nothing else that changes the weights (no bias, value term,
    weight multiplier, ``softcap`` or ``sinks``) and one layout for every head (not
    ``selects``): ``piecewise_sdpa_attention`` computes it."""
    enc = call.encoding
    return (
        enc is not None
        and call.pieces is not None
        and not call.score_features
        and not (call.has_bias or enc.has_value_term or enc.multiplies_probs or enc.selects)
    )


def piecewise_sdpa_attention(call: AttentionCall) -> Tensor:
    """Piecewise logits through the fused SDPA kernel: the result of the engine's
    probability path (``dense.block_attention``), several times faster.

    For a block of query rows, keys are copied once per piece that scores them for some row
    of the block, and laid out on ``R`` channel slots: ``q_aug = [q^0 | .. | q^{R-1}]``, a
    copy for piece ``r`` holds ``k^r`` in slot ``r`` and zeros elsewhere, so
    ``<q_aug_i, k_aug_(j, r)> = <q^r_i, k^r_j>``. A boolean mask lets row ``i`` see copy
    ``(j, r)`` only where ``piece_index(i, j) == r`` and the causal / user masks allow
    ``j``; values are zero-padded to the same width (the CPU flash kernel needs one head
    dim). One SDPA call per block is one softmax over the union of pieces.

    Positions that are one batch-shared integer range and no user mask take the *segment*
    layout: the encoding's ``key_segments`` names, per block, the key ranges of each piece
    and the distance band in which a row sees them, so the copies are slices and the mask
    two comparisons (LM-Infinite then costs O(L * window), not O(L^2)). Anything else takes
    the *per-pair* layout from ``piece_index`` over the block. For CPU inference (no
    gradients) the segment layout skips the slots: one flash-kernel call per key range and
    piece, merged by log-sum-exp as the papers do (plain-attention multiply-adds).

    Cost: about ``R`` times the multiply-adds of plain attention over the visited keys,
    O(block x L) memory, differentiable (blocks run under activation checkpointing when
    gradients are on). The piece layout must not depend on the head.
    """
    enc = call.encoding
    if not runs_piecewise(call):
        raise ValueError("piecewise_sdpa_attention takes piecewise logits only")
    assert enc is not None and call.pieces is not None and call.positions is not None
    B = call.q.shape[0]
    Lk = call.k.shape[2]
    rows = max(PIECEWISE_MIN_ROWS, min(Lk // 4, PIECEWISE_BLOCK_ELEMENTS // max(Lk, 1)))
    q_span, k_span = call.positions.q.span, call.positions.k.span
    tensors = [t for qk in call.pieces for t in qk] + [call.v]
    if (
        not call.has_user_mask
        and q_span is not None
        and k_span is not None
        and enc.key_segments(q_span.start, q_span.start) is not None
    ):
        q0, k0 = q_span.start, k_span.start

        def breaks(row: int) -> int | None:
            cut = enc.next_break(q0 + row)
            return None if cut is None else cut - q0

        kind = _LSEBlock if _lse_ok(call) else _SegmentBlock
        return run_blocks(kind(call, q0, k0), call.blocks(rows, breaks), *tensors)
    if call.positions.batch_shared:
        batches = [slice(None)]
    else:
        batches = [slice(b, b + 1) for b in range(B)]
    outs = [
        run_blocks(_PairBlock(call, bs), call.blocks(rows), *(t[bs] for t in tensors))
        for bs in batches
    ]
    return torch.cat(outs, dim=0)


def _sdpa_slots(call: AttentionCall, tensors: tuple[Tensor, ...], s: int, e: int, copies):
    """SDPA over slot-laid-out copies: ``copies`` is a list of ``(piece, key index tensor or
    slice, additive mask (.., T, n))``."""
    n_pieces = len(tensors) // 2
    v = tensors[-1]
    D, Dv = call.q.shape[-1], v.shape[-1]
    width = max(n_pieces * D, Dv)
    ks, vs, masks = [], [], []
    for r, cols, mask in copies:
        kr = tensors[2 * r + 1]
        kc = kr[:, :, cols] if isinstance(cols, slice) else kr.index_select(2, cols)
        ks.append(F.pad(kc, (r * D, width - (r + 1) * D)))
        vs.append(v[:, :, cols] if isinstance(cols, slice) else v.index_select(2, cols))
        masks.append(mask)
    q_aug = torch.cat([tensors[2 * r][:, :, s:e] for r in range(n_pieces)], dim=-1)
    q_aug = F.pad(q_aug, (0, width - n_pieces * D))
    k_aug = torch.cat(ks, dim=2)
    v_aug = F.pad(torch.cat(vs, dim=2), (0, width - Dv))
    shape = torch.broadcast_shapes(*(m.shape[:-1] for m in masks))
    mask = torch.cat([m.expand(*shape, m.shape[-1]) for m in masks], dim=-1)
    if call.groups > 1:
        k_aug = k_aug.repeat_interleave(call.groups, dim=1)
        v_aug = v_aug.repeat_interleave(call.groups, dim=1)
    out = F.scaled_dot_product_attention(q_aug, k_aug, v_aug, attn_mask=mask, scale=call.scale)
    return out[..., :Dv]


class _PairBlock:
    """Query rows ``start:end``, per-pair layout from ``piece_index`` (a ``checkpoint``
    callable)."""

    def __init__(self, call: AttentionCall, bs: slice) -> None:
        self.call, self.bs = call, bs

    def __call__(self, block: QueryBlock, *tensors: Tensor) -> Tensor:
        call, (s, e, kend) = self.call, block
        enc, ctx = call.encoding, call.ctx
        assert enc is not None and ctx is not None
        if kend == 0:
            return _dead_block(call, tensors, s, e)
        dev = tensors[-1].device
        b = torch.tensor([0 if self.bs.start is None else self.bs.start], device=dev)
        b = b[:, None, None, None]
        i = torch.arange(s, e, device=dev)[None, None, :, None]
        j = torch.arange(kend, device=dev)[None, None, None, :]
        index = enc.piece_index(ctx, b, torch.zeros_like(b), i, j)[0, 0]  # (T, S)
        allowed = call.mask_block(s, e, kend, torch.float32)
        if allowed is not None and allowed.dim() == 4:
            allowed = allowed[self.bs]
        copies = []
        for r in range(len(tensors) // 2):
            hit = index == r
            cols = hit.any(dim=0).nonzero().squeeze(1)
            if cols.numel():
                m = torch.where(hit[:, cols], 0.0, float("-inf"))
                if allowed is not None:
                    m = m + allowed.index_select(-1, cols)
                copies.append((r, cols, m.to(tensors[0].dtype)))
        if not copies:
            return _dead_block(call, tensors, s, e)
        return _sdpa_slots(call, tensors, s, e, copies)


class _SegmentBlock:
    """A block of query rows with positions ``q0 + row``, keys ``k0 + j``: the layout from
    the encoding's ``key_segments`` (slices and a distance-band mask)."""

    def __init__(self, call: AttentionCall, q0: int, k0: int) -> None:
        self.call, self.q0, self.k0 = call, q0, k0

    def segments(self, s: int, e: int) -> list[KeySegment]:
        enc = self.call.encoding
        assert enc is not None
        segments = enc.key_segments(self.q0 + s, self.q0 + e - 1)
        assert segments is not None
        return segments

    def __call__(self, block: QueryBlock, *tensors: Tensor) -> Tensor:
        call, q0, k0 = self.call, self.q0, self.k0
        s, e = block.start, block.end
        Lk = call.k.shape[2]
        dev = tensors[-1].device
        causal_max = call.causal_offset + k0 - q0 if call.causal else None  # on p_j - p_i
        t = torch.arange(q0 + s, q0 + e, device=dev)[:, None]
        copies = []
        for seg in self.segments(s, e):
            lo = 0 if seg.lo is None else min(max(seg.lo - k0, 0), Lk)
            hi = Lk if seg.hi is None else min(max(seg.hi - k0, 0), Lk)
            d_max = seg.d_max if causal_max is None else min_opt(seg.d_max, causal_max)
            if lo >= hi or (d_max is not None and seg.d_min is not None and seg.d_min > d_max):
                continue
            d = torch.arange(k0 + lo, k0 + hi, device=dev)[None, :] - t
            ok = torch.ones_like(d, dtype=torch.bool)
            if d_max is not None:
                ok &= d <= d_max
            if seg.d_min is not None:
                ok &= d >= seg.d_min
            copies.append((seg.piece, slice(lo, hi), ok))
        if not copies:
            return _dead_block(call, tensors, s, e)
        return _sdpa_slots(call, tensors, s, e, copies)


def _dead_block(call: AttentionCall, tensors: tuple[Tensor, ...], s: int, e: int) -> Tensor:
    """Output of a query block that sees no key (causal with ``Lq > Lk``, a fully masked
    row): zeros, as every backend gives for such rows (docs/numerics.md)."""
    B, H = tensors[0].shape[:2]
    return tensors[-1].new_zeros(B, H, e - s, tensors[-1].shape[-1])


def min_opt(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def _lse_ok(call: AttentionCall) -> bool:
    """The log-sum-exp merge uses the CPU flash kernel's private op, which returns the
    log-sum-exp but no gradient for it: inference on CPU only, and only for values of the
    queries' head size (the kernel takes one head size for q, k and v)."""
    return (
        call.q.device.type == "cpu"
        and not torch.is_grad_enabled()
        and call.v.shape[-1] == call.q.shape[-1]
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
    )


class _LSEBlock(_SegmentBlock):
    """The segment layout without slots: one flash-kernel call per key range and piece (its
    fully visible part without a mask, its band edges with one), merged by their
    log-sum-exp as in the papers (ChunkLlama's ``merge_attn_outputs``). Same multiply-adds as
    plain attention; CPU inference only (``_lse_ok``)."""

    def __call__(self, block: QueryBlock, *tensors: Tensor) -> Tensor:
        call, q0, k0 = self.call, self.q0, self.k0
        s, e = block.start, block.end
        Lk, dev, dtype = call.k.shape[2], tensors[-1].device, tensors[0].dtype
        first, last = q0 + s, q0 + e - 1
        causal_max = call.causal_offset + k0 - q0 if call.causal else None
        B, H, T, g = call.q.shape[0], call.q.shape[1], e - s, call.groups
        v = tensors[-1]
        outs, lses = [], []
        for seg in self.segments(s, e):
            lo = 0 if seg.lo is None else min(max(seg.lo - k0, 0), Lk)
            hi = Lk if seg.hi is None else min(max(seg.hi - k0, 0), Lk)
            d_min = seg.d_min
            d_max = seg.d_max if causal_max is None else min_opt(seg.d_max, causal_max)
            if lo >= hi or (d_max is not None and d_min is not None and d_min > d_max):
                continue
            # keys every row of the block sees: d_min <= p_j - last and p_j - first <= d_max
            full_lo = lo if d_min is None else min(max(lo, last + d_min - k0), hi)
            full_hi = hi if d_max is None else max(min(hi, first + d_max - k0 + 1), lo)
            if full_lo >= full_hi:
                ranges = [(lo, hi, True)]
            else:
                ranges = [(lo, full_lo, True), (full_lo, full_hi, False), (full_hi, hi, True)]
            q = tensors[2 * seg.piece][:, :, s:e]
            q = q.reshape(B, H // g, g * T, q.shape[-1])  # GQA: query heads of a group as rows
            k = tensors[2 * seg.piece + 1]
            for a, b, partial in ranges:
                if a >= b:
                    continue
                mask = None
                if partial:
                    d = torch.arange(k0 + a, k0 + b, device=dev)[None, :]
                    d = d - torch.arange(first, last + 1, device=dev)[:, None]
                    ok = torch.ones_like(d, dtype=torch.bool)
                    if d_max is not None:
                        ok &= d <= d_max
                    if d_min is not None:
                        ok &= d >= d_min
                    if not bool(ok.any()):
                        continue
                    mask = torch.zeros(ok.shape, dtype=dtype, device=dev).masked_fill(
                        ~ok, -math.inf
                    )
                    mask = mask.repeat(g, 1)
                out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k[:, :, a:b], v[:, :, a:b], attn_mask=mask, scale=call.scale
                )
                if mask is not None:  # rows that see no key of the range: lse = -inf
                    lse = lse.masked_fill(~ok.any(-1).repeat(g), -math.inf)
                outs.append(out.reshape(B, H, T, -1))
                lses.append(lse.reshape(B, H, T))
        if not outs:
            return _dead_block(call, tensors, s, e)
        # merged in float32 for half types, in the input dtype otherwise (float64 stays exact)
        acc = torch.promote_types(dtype, torch.float32)
        lse = torch.stack(lses).to(acc)
        total = torch.logsumexp(lse, dim=0)
        # a row that sees no key in any range: every lse is -inf, its weights 0 (not NaN)
        weight = torch.exp(lse - total.masked_fill(total == -math.inf, 0.0))
        return sum(w[..., None] * o.to(acc) for w, o in zip(weight, outs, strict=True)).to(v.dtype)


__all__ = ["KeySegment", "piecewise_sdpa_attention", "runs_piecewise"]
