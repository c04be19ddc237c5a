"""Biases folded into extra q/k channels, so a fused (flash) kernel runs them at the speed of
attention without a bias (FlashBias: Wu et al. 2025, "FlashBias: Fast Computation of
Attention with Bias", arXiv 2505.12044, official code thuml/FlashBias; RIB: Lee et al. 2026,
"Rank-Factorized Implicit Neural Bias: Scaling Super-Resolution Transformer with
FlashAttention", arXiv 2603.06738).

If ``b(i, j) = f(i) + g(j) + sum_r u_r(i) w_r(j)``, the row term ``f(i)`` is dropped (the
softmax ignores it) and the rest becomes channels::

    q~_i = [q_i, u(i) / scale, 1 / scale],   k~_j = [k_j, w(j), g(j)]
    scale * <q~_i, k~_j> = scale * <q_i, k_j> + b(i, j) - f(i)

so ``F.scaled_dot_product_attention(q~, k~, v~, scale=scale)`` is the biased attention with no
``L x L`` tensor (v is zero-padded to the channel width: the CPU and CUDA flash kernels want one
head dim; the output is sliced back).

**Exact folds** (the engine's ``fold`` backend, ``relpos.attention(..., backend="fold")``). A bias
that is
piecewise linear in the distance ``d = q_pos - k_pos`` with fixed breakpoints
(``DistanceBias.linear_pieces``: every ALiBi form) folds exactly, one pass per piece:

* piece ``b = a_h (d - gamma)`` on ``low <= d <= high``: ``a_h d = a_h q_pos - a_h k_pos``, so
  the key channel is the key index ``j`` and the query channel ``c_h = -a_h / scale``;
* one piece covering every distance the call's mask allows (causal ALiBi under a causal mask)
  is one plain SDPA call (``is_causal``), differentiable everywhere;
* several pieces (symmetric, asymmetric, shifted ALiBi) are several passes, each restricted to
  the band of ``j - i`` where its piece holds, merged by log-sum-exp **after restoring the
  dropped row term of each pass** (``lse_p += scale c_h (j0 + gamma - I_i)``, ``I_i`` the
  query's position in key-index units): forgetting it gives an error of 1.33 (L = 257).
  A band is cut into query blocks of ``FOLD_BLOCK_ROWS`` rows: keys every row of a block sees
  run unmasked, the band's edges with a small ``(T, T)`` mask. On CPU the passes use the
  flash kernel's log-sum-exp (``aten._scaled_dot_product_flash_attention_for_cpu``) with its
  backward (``_FoldedBands``: each pass's gradient is the flash backward with the merged
  output and the merged log-sum-exp shifted into the pass's frame; the row terms get
  ``dO . o_p - (dO . o) W_p``); elsewhere the same blocks run as explicit logits.

*Low-precision positions.* ``w(j) = j`` is not representable in bf16 above 256 (fp16: 2048):
a naive bf16 fold errs by 3.7 at L = 4096. For half types the key index is split into
base-64 digits ``j = sum_t 64^t a_t`` (channels ``a_t 2^(3t)``, query constants
``c 2^(3t)``: every product is exact in the kernel's fp32 accumulator), with ``c`` rounded to
the dtype *first* so that the fold is exactly ``c j`` (a slope that differs from ``a_h`` by the
dtype's rounding, which the row correction uses too). Two digits up to L = 4096, three up to
262,144. For fp32 and fp64 the key index is one channel, centred on the middle key.

*Rounding.* The fold is exact in exact arithmetic; in floating point the folded logit carries
the magnitude ``|a_h| * L / 2`` (the dropped row term is large), so its rounding error is about
``u * max|a_h| * Lk / 2`` nats (``u`` the unit roundoff of the kernel's accumulator: 2^-24 for
fp32 and half types, 2^-53 for fp64): 6e-5 for ALiBi's steepest head (1/2) at L = 4096 in fp32,
measured max output error 1e-4 there (the Toeplitz path: 1e-6). ``fold_rounding_bound``
gives it; ``auto`` uses the fold only when it is exact and this bound is at most
``FOLD_LOGIT_TOLERANCE``.

**Low-rank folds** (``low_rank_fold`` / ``LowRankFold``; RIB / FlashBias style) for biases that do
not fold exactly (T5, KERPLE, FIRE, sharp ALiBi heads without a causal mask): truncated SVD of the
row-centred bias matrix, or a mass-weighted Fourier fit of a distance-only bias (``cos``/``sin``
features of ``d``, rank 2 per frequency, weights ``exp(b(d))`` normalised). A fold states its
``rank`` and the error *it makes in the attention weights*: the largest total-variation distance,
over rows and heads, between ``softmax(b)`` and ``softmax(b~)`` of the positional logits
(``weight_error``); the relative Frobenius error of the bias (``bias_error``) is kept beside it
because it hides the weight error (ALiBi m = 1/2, L = 1024, rank 8: bias error 1.4e-2, weight error
0.84; pinned in tests/attention/test_fold.py). Low-rank folds are never chosen by ``auto``:
``folded_attention`` refuses a bias that does not fold exactly unless ``rank`` is given.

Shapes: q ``(B, H, Lq, D)``, k ``(B, Hkv, Lk, D)``, v ``(B, Hkv, Lk, Dv)``; factors
``u (H, Lq, r)``, ``w (H, Lk, r)``.

The backend's part, in detail:

The ``fold`` backend: biases that are piecewise linear in ``q_pos - k_pos`` (every ALiBi
form) folded *exactly* into extra q/k channels, so the fused SDPA kernels run them at the speed
of attention without a bias. The public surface, the low-rank
folds and the full description are in ``relpos.attention.fold``.

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
from ..validation import check_choice, check_int
from .call import AttentionCall, prepare_call
from .dense import empty_attention
from .disentangled import disentangled_fold_attention, disentangled_refusal, folds_disentangled
from .eager import logits
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
            f"relpos.attention.fold.folded_attention(..., rank=r) (a low-rank fold with its "
            f"measured weight error) or another backend"
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
    log-sum-exp) for a call that folds exactly; ``"fold-band"`` for DeBERTa's band and
    folded outer regions (``attention/disentangled.py``)."""
    if folds_disentangled(call.encoding):
        return "fold-band"
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


# ------------------------------------------------------------------------------ low rank
@dataclass
class LowRankFold:
    """A low-rank fold of one bias over ``(Lq, Lk)`` index grids: ``b(i, j) ~ f(i) +
    sum_r u[h, i, r] w[h, j, r]`` with ``u (H, Lq, r)``, ``w (H, Lk, r)``.

    ``weight_error (H,)``: the largest total-variation distance over query rows between the
    positional softmax of the exact bias and of the fold (no content logits), with the
    causal mask when ``causal``; ``bias_error (H,)``: relative Frobenius error of the
    row-centred bias (shown beside it: it hides the weight error)."""

    u: Tensor
    w: Tensor
    rank: int
    method: str
    causal: bool
    weight_error: Tensor
    bias_error: Tensor

    def __repr__(self) -> str:
        return (
            f"LowRankFold(rank={self.rank}, method={self.method!r}, causal={self.causal}, "
            f"shape={tuple(self.u.shape[1:2]) + tuple(self.w.shape[1:2])}, "
            f"max weight_error={float(self.weight_error.max()):.3g}, "
            f"max bias_error={float(self.bias_error.max()):.3g})"
        )


def _bias_matrix(encoding: Encoding, Lq: int, Lk: int, device) -> Tensor:
    """``(H, Lq, Lk)`` bias over the default positions (queries the last ``Lq`` keys), float64."""
    H, D = encoding.num_heads, encoding.head_dim
    q = torch.zeros(1, H, Lq, D, device=device)
    k = torch.zeros(1, H, Lk, D, device=device)
    with torch.no_grad():  # zero q, k: the logits are the bias alone
        call = prepare_call(
            q,
            k,
            k,
            encoding,
            q_pos=None,
            k_pos=None,
            causal=False,
            mask=None,
            scale=None,
            check_causal=False,
        )
        bias = logits(call)[0]
    return bias.to(torch.float64)


def _masked_softmax(x: Tensor, allowed: Tensor | None) -> Tensor:
    if allowed is not None:
        x = x.masked_fill(~allowed, -math.inf)
    return torch.softmax(x, dim=-1)


def _weight_error(exact: Tensor, approx: Tensor, allowed: Tensor | None) -> Tensor:
    p = _masked_softmax(exact, allowed)
    p_hat = _masked_softmax(approx, allowed)
    return 0.5 * (p - p_hat).abs().sum(-1).amax(-1)


def low_rank_fold(
    encoding: Encoding,
    length_q: int,
    length_k: int | None = None,
    *,
    rank: int,
    method: str = "svd",
    causal: bool = False,
) -> LowRankFold:
    """A rank-``rank`` fold of ``encoding``'s bias over the default positions of an
    ``(length_q, length_k)`` call, with its measured weight error (``LowRankFold``).

    ``method="svd"``: truncated SVD of the row-centred bias ``B - rowmean(B)`` (the row term
    is dropped: the softmax ignores it), factors ``U S^(1/2)``, ``V S^(1/2)``. ``method=
    "fourier"``: distance-only biases, a least-squares fit of ``b(d)`` over the reachable
    distances by ``rank // 2`` frequencies ``w_k = pi k / (Lq + Lk)`` (``cos`` and ``sin`` of
    ``w d``, rank 2 each) weighted by the attention mass ``exp(b(d))`` (normalised): accurate
    where attention looks. The fold is computed without gradients to the encoding."""
    if not isinstance(encoding, Encoding) or not encoding.has_bias:
        raise ValueError("low_rank_fold needs an encoding with an additive bias (has_bias)")
    length_q = check_int(length_q, "length_q", minimum=1)
    length_k = length_q if length_k is None else check_int(length_k, "length_k", minimum=1)
    rank = check_int(rank, "rank (the number of folded channels)", minimum=1)
    method = check_choice(method, "method", ("svd", "fourier"))
    tensors = [*encoding.parameters(), *encoding.buffers()]
    device = tensors[0].device if tensors else torch.device("cpu")
    bias = _bias_matrix(encoding, length_q, length_k, device)  # (H, Lq, Lk)
    off = length_k - length_q
    i = torch.arange(length_q, device=device)[:, None] + off
    j = torch.arange(length_k, device=device)[None, :]
    allowed = (j <= i) if causal else None
    centred = bias - bias.mean(-1, keepdim=True)
    if method == "svd":
        r = min(rank, length_q, length_k)
        U, S, Vh = torch.linalg.svd(centred, full_matrices=False)
        root = S[:, :r].sqrt()
        u = U[:, :, :r] * root[:, None, :]
        w = Vh[:, :r, :].transpose(-1, -2) * root[:, None, :]
        approx = u @ w.transpose(-1, -2)
    else:
        if not encoding.distance_only:
            raise ValueError(
                f"method='fourier' fits a bias of q_pos - k_pos only; encoding "
                f"{encoding.name!r} is not distance-only: use method='svd'"
            )
        r = max(2, rank - rank % 2)
        u, w, approx = _fourier_fold(encoding, bias, i, j, r // 2, causal)
    bias_error = (approx - centred).flatten(1).norm(dim=1) / centred.flatten(1).norm(
        dim=1
    ).clamp_min(1e-300)
    weight_error = _weight_error(bias, approx, allowed)
    return LowRankFold(
        u.float(), w.float(), u.shape[-1], method, causal, weight_error.float(), bias_error.float()
    )


def _fourier_fold(encoding, bias, i, j, n_freq, causal):
    """Mass-weighted Fourier fit of a distance-only bias: per head ``b(d) ~ const + sum_k
    a_k cos(w_k d) + b_k sin(w_k d)``, returned as factors (rank ``2 n_freq``)."""
    H = bias.shape[0]
    d_all = (i - j).flatten()
    d = torch.unique(d_all[(d_all >= 0)] if causal else d_all)
    span = float(i.shape[0] + j.shape[1])
    omega = math.pi * torch.arange(1, n_freq + 1, device=d.device, dtype=torch.float64) / span
    # b(d) per head, read from the matrix (one entry per distance)
    rows = (i - j).flatten()
    first = {int(x): n for n, x in reversed(list(enumerate(rows.tolist())))}
    idx = torch.tensor([first[int(x)] for x in d.tolist()], device=d.device)
    values = bias.flatten(1)[:, idx]  # (H, nd)
    phase = d.to(torch.float64)[:, None] * omega[None, :]
    basis = torch.cat([torch.ones_like(phase[:, :1]), phase.cos(), phase.sin()], dim=1)
    u_all, w_all, approx_all = [], [], []
    for h in range(H):
        mass = torch.exp(values[h] - values[h].max())
        mass = mass / mass.sum() + 1e-12
        sw = mass.sqrt()[:, None]
        coef = torch.linalg.lstsq(basis * sw, (values[h] * sw[:, 0])[:, None]).solution[:, 0]
        a, b = coef[1 : 1 + n_freq], coef[1 + n_freq :]
        wi = i.to(torch.float64) * omega  # (Lq, K)
        wj = j.t().to(torch.float64) * omega  # (Lk, K)
        # a cos w(i-j) + b sin w(i-j) = cos wi (a cos wj - b sin wj) + sin wi (a sin wj + b cos wj)
        u = torch.cat([wi.cos(), wi.sin()], dim=1)
        w = torch.cat([a * wj.cos() - b * wj.sin(), a * wj.sin() + b * wj.cos()], dim=1)
        u_all.append(u)
        w_all.append(w)
        approx_all.append(u @ w.t())
    approx = torch.stack(approx_all)
    approx = approx - approx.mean(-1, keepdim=True)
    return torch.stack(u_all), torch.stack(w_all), approx


def folded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: Encoding,
    *,
    causal: bool = False,
    scale: float | None = None,
    rank: int | None = None,
    method: str = "svd",
) -> Tensor:
    """Attention with ``encoding``'s bias folded into q/k channels, over default positions.

    Exact folds (``exact_fold_pieces``: ALiBi) run when ``rank`` is None (the engine's
    ``fold`` backend, ``relpos.attention(..., backend="fold")``). A bias that does not fold
    exactly is refused unless ``rank`` is given; then ``low_rank_fold`` builds the factors
    for this call's lengths (check ``low_rank_fold(...).weight_error`` before trusting it)
    and one SDPA call runs them. Returns ``(B, H, Lq, Dv)``."""
    if rank is None:
        if exact_fold_pieces(encoding) is None:
            raise ValueError(
                f"encoding {getattr(encoding, 'name', encoding)!r} does not fold exactly into "
                f"q/k channels; pass rank=r for a low-rank fold (and read its weight_error: "
                f"relpos.attention.fold.low_rank_fold)"
            )
        call = prepare_call(
            q, k, v, encoding, q_pos=None, k_pos=None, causal=causal, mask=None, scale=scale
        )
        refusal = fold_refusal(call)
        if refusal is not None:
            raise ValueError(refusal)
        return exact_fold_attention(call)
    if torch.is_grad_enabled() and any(p.requires_grad for p in encoding.parameters()):
        raise ValueError(
            "a low-rank fold is computed without gradients to the encoding's parameters: call "
            "it under torch.no_grad() or freeze the encoding (requires_grad_(False))"
        )
    call = prepare_call(
        q, k, v, encoding, q_pos=None, k_pos=None, causal=causal, mask=None, scale=scale
    )
    if encoding.has_rotary or encoding.needs_probabilities:
        raise ValueError(
            f"encoding {encoding.name!r} does more than add a bias: a low-rank fold takes "
            f"additive biases only"
        )
    if call.q.shape[2] == 0 or call.k.shape[2] == 0:
        return empty_attention(call)
    Lq, Lk = call.q.shape[2], call.k.shape[2]
    fold = low_rank_fold(encoding, Lq, Lk, rank=rank, method=method, causal=causal)
    B, H, _, D = call.q.shape
    Dv, r, dtype = call.v.shape[-1], fold.rank, call.q.dtype
    width = max(D + r, Dv)
    if call.q.device.type == "cuda":
        width = -(-width // 8) * 8
    u = (fold.u.to(call.q.device) / call.scale).to(dtype)
    w = fold.w.to(call.q.device).to(dtype)
    kx, vx = call.expanded_kv()
    q_t = F.pad(torch.cat([call.q, u[None].expand(B, H, Lq, r)], -1), (0, width - D - r))
    k_t = F.pad(torch.cat([kx, w[None].expand(B, H, Lk, r)], -1), (0, width - D - r))
    v_t = F.pad(vx, (0, width - Dv))
    if causal and Lq == Lk:
        out = F.scaled_dot_product_attention(q_t, k_t, v_t, is_causal=True, scale=call.scale)
    else:
        m = call.mask_block(0, Lq, Lk, dtype) if causal else None
        out = F.scaled_dot_product_attention(q_t, k_t, v_t, attn_mask=m, scale=call.scale)
    return out[..., :Dv]
