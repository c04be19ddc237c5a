"""The ``fold`` backend: biases that are piecewise linear in ``q_pos - k_pos`` (every ALiBi
form) folded *exactly* into extra q/k channels, so the fused SDPA kernels run them at the speed
of attention without a bias (spec: efficient.md section 3). The public surface, the low-rank
folds and the full description are in ``relpos.efficient.fold``.

* piece ``b = a_h (d - gamma)`` on ``low <= d <= high`` (``DistanceBias.linear_pieces``):
  ``a_h d = a_h q_pos - a_h k_pos``; the row term is dropped, the key channel is the key index
  ``j`` and the query channel ``c_h = -a_h / scale`` (v zero-padded to the channel width);
* one piece covering every allowed pair (causal ALiBi under a causal mask, ``Lq == Lk``) is
  one ``F.scaled_dot_product_attention`` call with ``is_causal``: differentiable anywhere;
* otherwise each piece is a pass over its band of ``j - i``, cut into query blocks of
  ``FOLD_BLOCK_ROWS`` rows (keys every row sees unmasked, band edges with a ``(T, T)`` mask),
  merged by log-sum-exp after restoring each pass's dropped row term
  (``lse_p += scale c_h (j0 + gamma - I_i)``). ``_FoldedBands`` is the autograd function: on
  CPU the flash kernel with its log-sum-exp and its backward (each pass's gradient is the
  flash backward given the merged output and the merged log-sum-exp in the pass's frame; the
  row terms get ``dO . o_p - (dO . o) W_p``), elsewhere the same blocks as explicit logits.
* half types: the key index as base-64 digits (channel ``a_t 2^(3t)``, query constant
  ``c 2^(3t)``; exact products in the fp32 accumulator), ``c`` rounded to the dtype first.

Rounding: the folded logit carries the dropped row term's magnitude, so its error is about
``u * max|a_h| * Lk / 2`` (``fold_rounding_bound``); ``auto`` takes the fold only while that is
at most ``FOLD_LOGIT_TOLERANCE``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..encodings.base import Encoding
from ..encodings.bias.distance import DistanceBias, LinearPiece
from .call import AttentionCall
from .dense import empty_attention
from .disentangled import disentangled_fold_attention, disentangled_refusal, folds_disentangled
from .flash import kernel_backward as _kernel_backward
from .flash import kernel_forward as _kernel_forward
from .flash import merge_partials

__all__ = [
    "FOLD_BLOCK_ROWS",
    "FOLD_LOGIT_TOLERANCE",
    "exact_fold_attention",
    "exact_fold_pieces",
    "fold_path",
    "fold_refusal",
    "fold_rounding_bound",
    "position_digits",
]

#: query rows per block of a multi-pass fold (the band edges' masks are (T, T))
FOLD_BLOCK_ROWS = 256
#: ``auto`` uses an exact fold only while its rounding bound (nats of logit) is at most this
FOLD_LOGIT_TOLERANCE = 1e-4
DIGIT_BASE = 64  # base-64 digits: every digit and power-of-two multiple is exact in bf16/fp16
_HALF = (torch.float16, torch.bfloat16)


# ------------------------------------------------------------------------------ exact folds
def exact_fold_pieces(encoding: Encoding | None) -> list[LinearPiece] | None:
    """The encoding's bias as linear pieces of the distance when it folds exactly
    (``DistanceBias.linear_pieces``), else None."""
    if not isinstance(encoding, DistanceBias) or encoding.needs_probabilities:
        return None
    return encoding.linear_pieces()


def fold_refusal(call: AttentionCall) -> str | None:
    """Why this call cannot run as an exact fold (a sentence naming what stops it), or None."""
    enc = call.encoding
    if folds_disentangled(enc):
        return disentangled_refusal(call)
    if exact_fold_pieces(enc) is None:
        name = "no encoding" if enc is None else f"encoding {enc.name!r}"
        return (
            f"{name} has no exact fold: backend 'fold' runs biases that are piecewise linear in "
            f"q_pos - k_pos (ALiBi); for others use "
            f"relpos.efficient.folded_attention(..., rank=r) (a low-rank fold with its measured "
            f"weight error) or another backend"
        )
    if enc is not None and enc.has_rotary:
        return f"encoding {enc.name!r} rotates q and k as well: backend 'fold' folds biases only"
    if call.has_user_mask:
        return "backend 'fold' takes causal=True/False only, not a mask or mask_mod"
    empty = call.q.shape[2] == 0 or call.k.shape[2] == 0  # validated, not encoded
    if not empty and call.distance_delta() is None:
        return (
            "backend 'fold' needs q_pos and k_pos that are one batch-shared integer range "
            "(e.g. the defaults); got other positions"
        )
    return None


def fold_rounding_bound(call: AttentionCall) -> float:
    """Bound (nats) on the rounding error of the folded logits of an exact fold: ``u *
    max|slope| * (Lk / 2 + 1)`` (see the module docstring)."""
    pieces = exact_fold_pieces(call.encoding)
    assert pieces is not None
    slope = max(float(p.slope.detach().abs().max()) for p in pieces)
    u = 2.0**-53 if call.q.dtype == torch.float64 else 2.0**-24
    return u * slope * (call.k.shape[2] / 2 + 1)


def position_digits(index: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Key channels holding the integer key indices ``index (L,) >= 0`` exactly in ``dtype``:
    ``(channels (L, n), weights (n,) float64)`` with ``sum_t channels[:, t] * weights[t] ==
    index``. The query side multiplies channel ``t`` by ``c * weights[t]``, so the kernel's
    products sum to ``c * index`` exactly in its fp32 accumulator.

    Half types: base-64 digits ``a_t`` split as channel ``a_t 2^(3t)`` and weight ``2^(3t)``
    (every factor exact in bf16 and fp16, none above 63 * 2^(3t)), ``ceil(log_64(max + 1))``
    of them. fp32 / fp64: one channel (weight 1) while the index is below 2^24."""
    top = int(index.max()) + 1 if index.numel() else 1
    if dtype not in _HALF and top <= 1 << 24:
        return index.to(dtype)[:, None], torch.ones(1, dtype=torch.float64)
    n = max(1, math.ceil(math.log(top, DIGIT_BASE) - 1e-12))
    if DIGIT_BASE**n < top:
        n += 1
    digits, rest = [], index
    for _ in range(n):
        digits.append(rest % DIGIT_BASE)
        rest = rest // DIGIT_BASE
    half = torch.tensor([2.0 ** (3 * t) for t in range(n)], dtype=torch.float64)
    channels = torch.stack(digits, dim=-1).to(torch.float64) * half
    return channels.to(dtype), half


@dataclass
class _Pass:
    """One pass of an exact fold: its band ``lo <= j - i <= hi`` (None: unbounded), the query
    tensor with its channels, and the row term to restore before merging ``(1, H, Lq)``."""

    lo: int | None
    hi: int | None
    q: Tensor
    corr: Tensor


def _band(piece: LinearPiece, call: AttentionCall, delta: int) -> tuple[int | None, int | None]:
    """The band of ``j - i`` where ``piece`` holds (and the causal mask allows)."""
    off = call.causal_offset
    # d = i - j + off + delta, so low <= d <= high  <=>  off+delta-high <= j - i <= off+delta-low
    lo = None if piece.high is None else off + delta - piece.high
    hi = None if piece.low is None else off + delta - piece.low
    if call.causal:
        hi = off if hi is None else min(hi, off)
    Lq, Lk = call.q.shape[2], call.k.shape[2]
    if hi is not None and hi >= Lk - 1:
        hi = None
    if lo is not None and lo <= -(Lq - 1):
        lo = None
    return lo, hi


def _with_channels(x: Tensor, extra: Tensor, width: int) -> Tensor:
    """``[x, extra]`` zero-padded to ``width`` channels, in one new tensor (one copy of x)."""
    pad = width - x.shape[-1] - extra.shape[-1]
    parts = [x, extra]
    if pad:
        parts.append(x.new_zeros(*x.shape[:-1], pad))
    return torch.cat(parts, dim=-1)


def _fold_passes(call: AttentionCall) -> tuple[list[_Pass], Tensor, Tensor, int]:
    """The passes of an exact fold, the key and value tensors with their channels, and the
    value head dim."""
    pieces = exact_fold_pieces(call.encoding)
    delta = call.distance_delta()
    assert pieces is not None and delta is not None
    q, k, v, scale = call.q, call.k, call.v, call.scale
    B, H, Lq, D = q.shape
    Lk, Dv = k.shape[2], v.shape[-1]
    dev, dtype = q.device, q.dtype
    j = torch.arange(Lk, device=dev)
    centre = 0 if dtype in _HALF else (Lk - 1) // 2
    channels, weights = position_digits(j - centre if centre else j, dtype)
    if centre and channels.shape[1] > 1:  # fp32 beyond 2^24 keys: digits of j itself
        centre = 0
        channels, weights = position_digits(j, dtype)
    n = channels.shape[1]
    width = max(D + n, Dv)
    if dev.type == "cuda":
        width = -(-width // 8) * 8  # flash kernels: head dims in multiples of 8
    k_t = _with_channels(k, channels.expand(B, k.shape[1], Lk, n), width)
    v_t = v if width == Dv else F.pad(v, (0, width - Dv))
    # the query's distance origin in key-index units: d = I_i - j, I_i = i + off + delta
    I = torch.arange(Lq, device=dev, dtype=torch.float64) + (call.causal_offset + delta)
    passes = []
    for piece in pieces:
        lo, hi = _band(piece, call, delta)
        if lo is not None and hi is not None and lo > hi:
            continue
        # c j * scale = -a j: the kernel's column term; c rounded to the dtype first
        c = (-piece.slope / scale).to(dtype)
        consts = c[:, None].to(torch.float64) * weights.to(dev)  # (H, n): c 2^(3t)
        q_t = _with_channels(q, consts.to(dtype)[None, :, None, :].expand(B, H, Lq, n), width)
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        # bias = scale c (j - I + gamma) = kernel's scale c (j - centre) + this row term
        corr = scale * c.to(torch.float64)[:, None] * (centre + piece.gamma - I)[None, :]
        passes.append(_Pass(lo, hi, q_t, corr.to(acc)[None]))
    return passes, k_t, v_t, Dv


def _single_pass(passes: list[_Pass], call: AttentionCall) -> bool:
    """One pass that one plain SDPA call computes (no band, or the causal band with
    ``Lq == Lk``)."""
    if len(passes) != 1 or passes[0].lo is not None:
        return False
    return passes[0].hi is None or (passes[0].hi == 0 and call.q.shape[2] == call.k.shape[2])


def fold_path(call: AttentionCall) -> str:
    """``"fold-sdpa"`` (one SDPA call) or ``"fold-passes"`` (band passes merged by
    log-sum-exp) for a call that folds exactly; ``"fold-deberta"`` for DeBERTa's band and
    folded outer regions (``attention/disentangled.py``)."""
    if folds_disentangled(call.encoding):
        return "fold-deberta"
    pieces = exact_fold_pieces(call.encoding)
    delta = call.distance_delta()
    assert pieces is not None and delta is not None
    bands = [_band(p, call, delta) for p in pieces]
    bands = [(lo, hi) for lo, hi in bands if lo is None or hi is None or lo <= hi]
    single = len(bands) == 1 and bands[0][0] is None
    if single and (
        bands[0][1] is None or (bands[0][1] == 0 and call.q.shape[2] == call.k.shape[2])
    ):
        return "fold-sdpa"
    return "fold-passes"


def exact_fold_attention(call: AttentionCall) -> Tensor:
    """The ``fold`` backend: the call's bias folded exactly into q/k channels (module
    docstring). Refuses by name a call it cannot fold (``fold_refusal``). Returns
    ``(B, H, Lq, Dv)``."""
    reason = fold_refusal(call)
    if reason is not None:
        raise ValueError(reason)
    if folds_disentangled(call.encoding):
        return disentangled_fold_attention(call)
    if call.q.shape[2] == 0 or call.k.shape[2] == 0:
        return empty_attention(call)
    passes, k_t, v_t, Dv = _fold_passes(call)
    B, H, Lq = call.q.shape[:3]
    if not passes:  # no row sees a key: zeros, connected to q, k, v (zero gradients)
        zero = 0.0 * (call.q.sum() + call.k.sum() + call.v.sum())
        return call.v.new_zeros(B, H, Lq, Dv) + zero
    if _single_pass(passes, call):
        out = F.scaled_dot_product_attention(
            passes[0].q,
            k_t,
            v_t,
            is_causal=passes[0].hi == 0,
            scale=call.scale,
            enable_gqa=call.groups > 1,
        )
        return out[..., :Dv]
    bands = tuple((p.lo, p.hi) for p in passes)
    geometry = _Geometry(bands, call.scale, call.groups, Lq, call.k.shape[2])
    tensors = [t for p in passes for t in (p.q, p.corr)]
    out = _FoldedBands.apply(geometry, k_t, v_t, *tensors)
    return out[..., :Dv]


# ------------------------------------------------------------------------------ band kernel
@dataclass(frozen=True)
class _Geometry:
    bands: tuple[tuple[int | None, int | None], ...]
    scale: float
    groups: int
    length_q: int
    length_k: int

    def blocks(self):
        """``(s, e, p, a, b, masked)`` per kernel call: query rows ``s:e`` against keys ``a:b``
        in pass ``p``; ``masked`` when the band cuts through that tile."""
        Lq, Lk = self.length_q, self.length_k
        for s in range(0, Lq, FOLD_BLOCK_ROWS):
            e = min(s + FOLD_BLOCK_ROWS, Lq)
            for p, (lo, hi) in enumerate(self.bands):
                u_lo = 0 if lo is None else max(0, s + lo)
                u_hi = Lk if hi is None else min(Lk, e - 1 + hi + 1)
                if u_lo >= u_hi:
                    continue
                f_lo = 0 if lo is None else max(0, e - 1 + lo)
                f_hi = Lk if hi is None else min(Lk, s + hi + 1)
                if f_lo >= f_hi:
                    yield s, e, p, u_lo, u_hi, True
                    continue
                if u_lo < f_lo:
                    yield s, e, p, u_lo, f_lo, True
                yield s, e, p, f_lo, f_hi, False
                if f_hi < u_hi:
                    yield s, e, p, f_hi, u_hi, True

    def allowed(self, s: int, e: int, p: int, a: int, b: int, device) -> Tensor:
        lo, hi = self.bands[p]
        rel = (
            torch.arange(a, b, device=device)[None, :] - torch.arange(s, e, device=device)[:, None]
        )
        ok = torch.ones_like(rel, dtype=torch.bool)
        if lo is not None:
            ok &= rel >= lo
        if hi is not None:
            ok &= rel <= hi
        return ok


class _FoldedBands(torch.autograd.Function):
    """Passes over bands of ``j - i``, merged by log-sum-exp with per-pass row terms.

    Inputs: ``geometry``, ``k (B, Hkv, Lk, W)``, ``v (B, Hkv, Lk, W)``, then per pass
    ``q_p (B, H, Lq, W)`` and ``corr_p (1, H, Lq)`` (the row term added to its log-sum-exp)."""

    @staticmethod
    def forward(ctx, geometry: _Geometry, k: Tensor, v: Tensor, *qc: Tensor) -> Tensor:
        qs, corrs = qc[0::2], qc[1::2]
        B, H, Lq, W = qs[0].shape
        acc = corrs[0].dtype
        n = len(qs)
        out = torch.zeros(B, H, Lq, W, dtype=acc, device=k.device)
        lse = torch.full((B, H, Lq), -math.inf, dtype=acc, device=k.device)
        o_pass = [torch.zeros_like(out) for _ in range(n)]
        l_pass = [lse.clone() for _ in range(n)]
        for s, e, p, a, b, masked in geometry.blocks():
            ok = geometry.allowed(s, e, p, a, b, k.device) if masked else None
            o, l = _kernel_forward(
                qs[p][:, :, s:e], k[:, :, a:b], v[:, :, a:b], ok, geometry.scale, geometry.groups
            )
            l = l.to(acc) + corrs[p][..., s:e]
            # running merge of this pass (an online softmax over its key ranges)
            old = l_pass[p][..., s:e]
            new = torch.logaddexp(old, l)
            safe = new.masked_fill(new == -math.inf, 0.0)
            o_pass[p][:, :, s:e] = torch.exp(old - safe)[..., None] * o_pass[p][
                :, :, s:e
            ] + torch.exp(l - safe)[..., None] * o.to(acc)
            l_pass[p][..., s:e] = new
        # W_p: the pass's share of each row
        out, total, weights = merge_partials(o_pass, l_pass)
        out = out.to(v.dtype)
        ctx.geometry = geometry
        ctx.save_for_backward(k, v, out, total, *qs, *corrs, *o_pass, *weights)
        ctx.n = n
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        n, geometry = ctx.n, ctx.geometry
        k, v, out, total, *rest = ctx.saved_tensors
        qs, corrs = rest[:n], rest[n : 2 * n]
        o_pass, weights = rest[2 * n : 3 * n], rest[3 * n :]
        acc = total.dtype
        dout = dout.contiguous()
        dq = [torch.zeros_like(q, dtype=acc) for q in qs]
        dk = torch.zeros_like(k, dtype=acc)
        dv = torch.zeros_like(v, dtype=acc)
        d_row = (dout.to(acc) * out.to(acc)).sum(-1)
        dcorr = [
            (w * ((dout.to(acc) * op).sum(-1) - d_row)).sum(0, keepdim=True)
            for op, w in zip(o_pass, weights, strict=True)
        ]
        dead = total == -math.inf
        for s, e, p, a, b, masked in geometry.blocks():
            ok = geometry.allowed(s, e, p, a, b, k.device) if masked else None
            frame = (total[..., s:e] - corrs[p][..., s:e]).masked_fill(dead[..., s:e], math.inf)
            gq, gk, gv = _kernel_backward(
                dout[:, :, s:e],
                qs[p][:, :, s:e],
                k[:, :, a:b],
                v[:, :, a:b],
                out[:, :, s:e],
                frame,
                ok,
                geometry.scale,
                geometry.groups,
            )
            dq[p][:, :, s:e] += gq.to(acc)
            dk[:, :, a:b] += gk.to(acc)
            dv[:, :, a:b] += gv.to(acc)
        grads: list[Tensor | None] = [None, dk.to(k.dtype), dv.to(v.dtype)]
        for p in range(n):
            grads += [dq[p].to(qs[p].dtype), dcorr[p].to(corrs[p].dtype)]
        return tuple(grads)
