"""Two-sided table biases (``TwoSidedTableBias``: DeBERTa's disentangled attention) folded
outside their band: backend ``fold``, path ``fold-band``.

DeBERTa's logit (``relpos.encodings.contextual.deberta``) is

    scale * ( q_i . k_j  +  C[i, idx(d)]  +  P[j, idx(d)] ),   d = q_pos[i] - k_pos[j],

with the per-call products ``C = q . K^r`` (c2p, ``(B, H, Lq, R)``) and ``P = k . Q^r`` (p2c,
``(B, H, Lk, R)``) over the ``R`` table rows the call reaches (``paper_p2c``: ``P`` at
``idx(-d)``). The table row stops changing far from the diagonal (``DeBERTa.saturation``:
``idx(d) = idx(hi)`` for ``d >= hi``, ``idx(lo)`` for ``d <= lo``; with 256 log buckets over
512 positions ``(lo, hi) = (-506, 506)``), so there the bias is a query term plus a key term,

    d >= hi:  C[i, r_hi] + P[j, r_hi] = a_i + b_j,    d <= lo:  a'_i + b'_j,

which folds exactly into two extra channels: ``q~ = [q, a_i, 1]``, ``k~ = [k, 1, b_j]`` (v
zero-padded to the width), one fused SDPA call without a bias. Per block of ``T`` query rows
``s .. e - 1`` the keys split in three (``_Regions.blocks``):

* ``j < a``: every pair has ``d >= hi``: the left fold ``(q~_hi, k~_hi)``;
* ``a <= j < b``: the band, with the bias gathered from ``C`` and ``P`` (one ``(T, S)``
  index of columns per block, shared by batch and heads) and added as the kernel's mask;
* ``j >= b``: every pair has ``d <= lo``: the right fold ``(q~_lo, k~_lo)``.

Causal calls have no right fold (its keys are in the future) and the band runs to the block's
last visible key with the causal mask. The three partial attentions are merged by log-sum-exp
(``flash.merge_partials``). ``_DisentangledFold`` is the autograd function: the forward keeps
only the merged output and log-sum-exp; the backward runs, per block, the flash backward of
each fold given the merged statistics (their extra channels' gradients are the gradients of
``a, b``: columns of ``C`` and ``P``) and the band with explicit logits, whose score gradient
``dS`` is scattered into ``C`` and ``P`` (autograd carries ``dC``, ``dP`` into q, k, the
table, its LayerNorm and projections). Extra memory: ``C``, ``P`` and their gradients
(``(B, H, L, R)`` each) and ``O(T S)`` per block, never ``L x L``.

Applies (``disentangled_refusal``) to DeBERTa calls without a user mask whose positions are one
batch-shared integer range, with or without log buckets (plain clipping saturates too);
``auto`` takes it on CPU above the dense-bias size (even the band alone, with no folded pair,
beats the chunked tile path: no recomputing checkpoint, the fused forward; docs/benchmarks.md)
and below it when the folded regions hold at least ``FOLD_SHARE`` of the pairs
(``disentangled_fold_pays``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..encodings.contextual.table import TwoSidedTableBias
from .call import AttentionCall
from .dense import empty_attention
from .flash import kernel_backward, kernel_forward, merge_partials, use_flash

__all__ = [
    "BLOCK_ROWS",
    "FOLD_SHARE",
    "disentangled_fold_attention",
    "disentangled_fold_pays",
    "disentangled_refusal",
    "folds_disentangled",
]

#: ``auto`` folds a DeBERTa call when at least this share of its pairs lies outside the band
FOLD_SHARE = 0.25
#: query rows per block: the band tile of a block is ``T x (T + hi - lo - 1)`` (its overlap
#: with the folded regions is computed twice over), the kernel calls cost per block
BLOCK_ROWS = 128


def folds_disentangled(encoding: object) -> bool:
    """The encoding declares a ``TwoSidedTableBias`` (``folds_outside_band``: a band plus two
    separable outer regions; DeBERTa's c2p + p2c)."""
    return bool(getattr(encoding, "folds_outside_band", False))


def _two_sided(call: AttentionCall) -> TwoSidedTableBias | None:
    """The call's bias as a ``TwoSidedTableBias``, or None (no such encoding or data)."""
    if not folds_disentangled(call.encoding) or call.ctx is None:
        return None
    return call.encoding.two_sided_bias(call.ctx)


def _position_offset(call: AttentionCall) -> int | None:
    """``q_pos[i] - k_pos[j] - (i - j)`` when both positions are one batch-shared integer
    range (no host sync for defaulted positions), else None."""
    if call.positions is None:
        return None
    q_span, k_span = call.positions.q.span, call.positions.k.span
    if q_span is None or k_span is None:
        return None
    return q_span.start - k_span.start


def disentangled_refusal(call: AttentionCall) -> str | None:
    """Why this DeBERTa call cannot run as ``fold-band`` (naming what stops it), or None."""
    if call.has_user_mask:
        return "backend 'fold' takes causal=True/False only, not a mask or mask_mod"
    empty = call.q.shape[2] == 0 or call.k.shape[2] == 0
    if not empty and (_position_offset(call) is None or _two_sided(call) is None):
        return (
            "backend 'fold' needs q_pos and k_pos that are one batch-shared integer range "
            "(e.g. the defaults); got other positions"
        )
    return None


@dataclass(frozen=True)
class _Regions:
    """Where the folds apply: pair ``(i, j)`` has distance ``d = i - j + c0``; ``d >= hi``
    and ``d <= lo`` are the folded regions; causal calls see keys ``j <= i + off``."""

    lo: int
    hi: int
    c0: int
    off: int
    causal: bool
    length_q: int
    length_k: int
    rows: int

    def blocks(self) -> Iterator[tuple[int, int, int, int, int]]:
        """``(s, e, a, b, c)`` per query block ``s .. e - 1``: left fold over keys ``0 .. a - 1``,
        band ``a .. b - 1``, right fold ``b .. c - 1`` (``c == b``: none)."""
        Lq, Lk = self.length_q, self.length_k
        for s in range(0, Lq, self.rows):
            e = min(s + self.rows, Lq)
            # j < a: s - j + c0 >= hi for every row;  j >= b: (e - 1) - j + c0 <= lo
            a = min(max(s + self.c0 - self.hi + 1, 0), Lk)
            b = min(max(e - 1 + self.c0 - self.lo, a), Lk)
            c = Lk
            if self.causal:
                kend = min(Lk, e + self.off)  # keys after it are masked for the whole block
                a = min(a, max(0, s + self.off + 1))  # the left fold: visible to every row
                b = c = max(a, kend)
            yield s, e, a, b, c

    def folded_pairs(self) -> int:
        """Pairs the folds compute (the rest is the band's)."""
        total = 0
        for s, e, a, b, c in self.blocks():
            total += (e - s) * (a + (c - b))
        return total

    def band_mask(self, s: int, e: int, a: int, b: int, device) -> Tensor | None:
        """The causal mask of a band tile ``(T, S)`` (None without causal)."""
        if not self.causal:
            return None
        i = torch.arange(s, e, device=device)[:, None]
        j = torch.arange(a, b, device=device)[None, :]
        return j <= i + self.off


def _regions(call: AttentionCall, rows: int | None = None) -> _Regions:
    bias = _two_sided(call)
    c0 = _position_offset(call)
    assert bias is not None and c0 is not None
    lo, hi = bias.saturation
    Lq, Lk = call.q.shape[2], call.k.shape[2]
    rows = BLOCK_ROWS if rows is None else rows
    return _Regions(lo, hi, c0, call.causal_offset, call.causal, Lq, Lk, max(1, rows))


def disentangled_fold_pays(call: AttentionCall, min_share: float = FOLD_SHARE) -> bool:
    """``auto`` takes ``fold-band``: it applies, runs on CPU (the fused kernel with its
    log-sum-exp) and folds at least ``min_share`` of the visible pairs."""
    if disentangled_refusal(call) is not None or not use_flash(call.q):
        return False
    Lq, Lk = call.q.shape[2], call.k.shape[2]
    if Lq == 0 or Lk == 0:
        return False
    regions = _regions(call)
    visible = sum((e - s) * c for s, e, _, _, c in regions.blocks())
    return regions.folded_pairs() >= min_share * max(visible, 1)


# ------------------------------------------------------------------------------ columns
@dataclass(frozen=True)
class _Columns:
    """Columns of ``C`` / ``P`` (table rows minus the call's first row): ``lookup[d - dmin]``
    for the c2p term and ``lookup_p`` for the p2c term (``idx(-d)`` with ``paper_p2c``), and the
    folds' constant columns ``(c2p, p2c)`` at ``hi`` and at ``lo``."""

    lookup: Tensor
    lookup_p: Tensor
    dmin: int
    left: tuple[int, int]
    right: tuple[int, int]

    def band(self, s: int, e: int, a: int, b: int, c0: int) -> tuple[Tensor, Tensor]:
        """Columns of the pairs of a band tile: ``(T, S)`` int64 for c2p and for p2c."""
        dev = self.lookup.device
        d = (torch.arange(s, e, device=dev) + (c0 - self.dmin))[:, None] - torch.arange(
            a, b, device=dev
        )[None, :]
        return self.lookup[d], self.lookup_p[d]


def _columns(call: AttentionCall, regions: _Regions) -> _Columns:
    bias = _two_sided(call)
    assert bias is not None
    rows = bias.rows
    n = rows.lookup.shape[0]

    def column(d: int, sign: int = 1) -> int:
        d = sign * d
        return int(rows.lookup[min(max(d, rows.lo), rows.hi) - rows.lo])

    if bias.key_reads_negated:
        # lookup_p[d - dmin] = column of -d (both signs are in the rows' domain)
        d = torch.arange(rows.lo, rows.lo + n, device=rows.lookup.device)
        lookup_p = rows.lookup[(-d).clamp(rows.lo, rows.hi) - rows.lo]
        sign = -1
    else:
        lookup_p, sign = rows.lookup, 1
    return _Columns(
        lookup=rows.lookup,
        lookup_p=lookup_p,
        dmin=rows.lo,
        left=(column(regions.hi), column(regions.hi, sign)),
        right=(column(regions.lo), column(regions.lo, sign)),
    )


def _folded(x: Tensor, extra: tuple[Tensor, Tensor], width: int) -> Tensor:
    """``[x, extra[0], extra[1]]`` zero-padded to ``width`` channels."""
    parts = [x, extra[0][..., None].to(x.dtype), extra[1][..., None].to(x.dtype)]
    pad = width - x.shape[-1] - 2
    if pad:
        parts.append(x.new_zeros(*x.shape[:-1], pad))
    return torch.cat(parts, dim=-1)


def _term(t: Tensor | None, col: int, like: Tensor) -> Tensor:
    """Column ``col`` of a product ``(B, H, N, R)`` or zeros ``(B, H, N)`` for an absent term."""
    return like.new_zeros(like.shape[:3]) if t is None else t[..., col]


# ------------------------------------------------------------------------------ kernel
class _DisentangledFold(torch.autograd.Function):
    """Inputs: ``regions``, ``columns``, ``scale``, ``q (B, H, Lq, D)``, ``k``, ``v`` expanded to
    H heads, ``C (B, H, Lq, R)`` and ``P (B, H, Lk, R)`` (None for an absent term)."""

    @staticmethod
    def forward(ctx, regions, columns, scale, q, k, v, C, P):  # type: ignore[override]
        B, H, Lq, D = q.shape
        Dv = v.shape[-1]
        acc = torch.promote_types(q.dtype, torch.float32)
        W = max(D + 2, Dv)
        ones_q, ones_k = q.new_ones(q.shape[:3]), k.new_ones(k.shape[:3])
        folds = {}
        for side, (cc, cp) in (("left", columns.left), ("right", columns.right)):
            folds[side] = (
                _folded(q, (_term(C, cc, q), ones_q), W),
                _folded(k, (ones_k, _term(P, cp, k)), W),
            )
        v_w = F.pad(v, (0, W - Dv)) if W != Dv else v
        out = torch.zeros(B, H, Lq, Dv, dtype=acc, device=q.device)
        lse = torch.full((B, H, Lq), float("-inf"), dtype=acc, device=q.device)
        for s, e, a, b, c in regions.blocks():
            outs, lses = [], []
            for side, k0, k1 in (("left", 0, a), ("right", b, c)):
                if k1 > k0:
                    qf, kf = folds[side]
                    o, l = kernel_forward(
                        qf[:, :, s:e], kf[:, :, k0:k1], v_w[:, :, k0:k1], None, scale, 1
                    )
                    outs.append(o[..., :Dv])
                    lses.append(l.to(acc))
            if b > a:
                bias = _band_bias(C, P, columns, regions, s, e, a, b, scale, q.dtype)
                ok = regions.band_mask(s, e, a, b, q.device)
                o, l = kernel_forward(
                    q[:, :, s:e], k[:, :, a:b], v[:, :, a:b], ok, scale, 1, bias=bias
                )
                outs.append(o)
                lses.append(l.to(acc))
            if outs:
                o, l, _ = merge_partials(outs, lses)
                out[:, :, s:e] = o
                lse[:, :, s:e] = l
        out = out.to(v.dtype)
        ctx.regions, ctx.columns, ctx.scale = regions, columns, scale
        ctx.has_c, ctx.has_p = C is not None, P is not None
        saved = [q, k, v, out, lse, folds["left"][0], folds["left"][1]]
        saved += [folds["right"][0], folds["right"][1], v_w]
        saved += [C if C is not None else q.new_zeros(0), P if P is not None else q.new_zeros(0)]
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse, qL, kL, qR, kR, v_w, C, P = ctx.saved_tensors
        regions, columns, scale = ctx.regions, ctx.columns, ctx.scale
        C = C if ctx.has_c else None
        P = P if ctx.has_p else None
        B, H, Lq, D = q.shape
        Dv = v.shape[-1]
        W = v_w.shape[-1]
        acc = lse.dtype
        dout = dout.contiguous()
        d_w = F.pad(dout, (0, W - Dv)) if W != Dv else dout
        o_w = F.pad(out, (0, W - Dv)) if W != Dv else out
        dq = torch.zeros_like(q, dtype=acc)
        dk = torch.zeros_like(k, dtype=acc)
        dv = torch.zeros_like(v, dtype=acc)
        dC = torch.zeros_like(C, dtype=acc) if C is not None else None
        dP = torch.zeros_like(P, dtype=acc) if P is not None else None
        frame = lse.masked_fill(lse == float("-inf"), float("inf"))  # dead rows: p = 0
        folds = {"left": (qL, kL, columns.left), "right": (qR, kR, columns.right)}
        for s, e, a, b, c in regions.blocks():
            fr = frame[:, :, s:e]
            for side, k0, k1 in (("left", 0, a), ("right", b, c)):
                if k1 <= k0:
                    continue
                qf, kf, (cc, cp) = folds[side]
                gq, gk, gv = kernel_backward(
                    d_w[:, :, s:e],
                    qf[:, :, s:e],
                    kf[:, :, k0:k1],
                    v_w[:, :, k0:k1],
                    o_w[:, :, s:e],
                    fr,
                    None,
                    scale,
                    1,
                )
                dq[:, :, s:e] += gq[..., :D]
                dk[:, :, k0:k1] += gk[..., :D]
                dv[:, :, k0:k1] += gv[..., :Dv]
                if dC is not None:
                    dC[:, :, s:e, cc] += gq[..., D]
                if dP is not None:
                    dP[:, :, k0:k1, cp] += gk[..., D + 1]
            if b > a:
                bias = _band_bias(C, P, columns, regions, s, e, a, b, scale, q.dtype)
                ok = regions.band_mask(s, e, a, b, q.device)
                gq, gk, gv, ds = kernel_backward(
                    dout[:, :, s:e],
                    q[:, :, s:e],
                    k[:, :, a:b],
                    v[:, :, a:b],
                    out[:, :, s:e],
                    fr,
                    ok,
                    scale,
                    1,
                    bias=bias,
                    score_grad=True,
                )
                dq[:, :, s:e] += gq
                dk[:, :, a:b] += gk
                dv[:, :, a:b] += gv
                col_c, col_p = columns.band(s, e, a, b, regions.c0)
                ds = ds.mul_(scale)
                if dC is not None:
                    dC[:, :, s:e].scatter_add_(-1, col_c.expand_as(ds), ds)
                if dP is not None:
                    dst = ds.transpose(-1, -2)
                    dP[:, :, a:b].scatter_add_(-1, col_p.t().expand_as(dst), dst)
        return (
            None,
            None,
            None,
            dq.to(q.dtype),
            dk.to(k.dtype),
            dv.to(v.dtype),
            dC.to(C.dtype) if dC is not None else None,
            dP.to(P.dtype) if dP is not None else None,
        )


def _band_bias(
    C: Tensor | None,
    P: Tensor | None,
    columns: _Columns,
    regions: _Regions,
    s: int,
    e: int,
    a: int,
    b: int,
    scale: float,
    dtype: torch.dtype,
) -> Tensor:
    """``scale (C[i, idx] + P[j, idx])`` over a band tile: ``(B, H, T, S)`` in ``dtype``."""
    col_c, col_p = columns.band(s, e, a, b, regions.c0)
    bias = None
    if C is not None:
        blk = C[:, :, s:e]
        bias = blk.gather(-1, col_c.expand(*blk.shape[:2], *col_c.shape))
    if P is not None:
        blk = P[:, :, a:b]
        read = blk.gather(-1, col_p.t().expand(*blk.shape[:2], *col_p.shape[::-1]))
        read = read.transpose(-1, -2)
        bias = read.contiguous() if bias is None else bias.add_(read)
    assert bias is not None
    return bias.mul_(scale).to(dtype)


def disentangled_fold_attention(call: AttentionCall) -> Tensor:
    """``fold-band`` (module docstring) in query blocks of ``BLOCK_ROWS``: ``(B, H, Lq, Dv)``.
    Refuses by name a call it cannot fold (``disentangled_refusal``)."""
    reason = disentangled_refusal(call)
    if reason is not None:
        raise ValueError(reason)
    if call.q.shape[2] == 0 or call.k.shape[2] == 0:
        return empty_attention(call)
    bias = _two_sided(call)
    assert bias is not None
    regions = _regions(call)
    columns = _columns(call, regions)
    C = bias.query_read.compute() if bias.query_read is not None else None
    P = bias.key_read.compute() if bias.key_read is not None else None
    k, v = call.expanded_kv()
    if P is not None and P.shape[1] != call.q.shape[1]:  # a shared table read by grouped keys
        P = P.repeat_interleave(call.q.shape[1] // P.shape[1], dim=1)
    return _DisentangledFold.apply(regions, columns, call.scale, call.q, k, v, C, P)
