"""Biases folded into extra q/k channels, so a fused (flash) kernel runs them at the speed of
attention without a bias (spec: efficient.md section 3; FlashBias, Wu et al. 2025; RIB, Lee et
al. 2026, seed 20).

If ``b(i, j) = f(i) + g(j) + sum_r u_r(i) w_r(j)``, the row term ``f(i)`` is dropped (the
softmax ignores it) and the rest becomes channels::

    q~_i = [q_i, u(i) / scale, 1 / scale],   k~_j = [k_j, w(j), g(j)]
    scale * <q~_i, k~_j> = scale * <q_i, k_j> + b(i, j) - f(i)

so ``F.scaled_dot_product_attention(q~, k~, v~, scale=scale)`` is the biased attention with no
``L x L`` tensor (v is zero-padded to the channel width: the CPU and CUDA flash kernels want one
head dim; the output is sliced back).

**Exact folds** (``relpos.attention.fold``: the engine's ``fold`` backend,
``relpos.attention(..., backend="fold")``; this module re-exports its helpers). A bias that is
piecewise linear in the distance ``d = q_pos - k_pos`` with fixed breakpoints
(``DistanceBias.linear_pieces``: every ALiBi form) folds exactly, one pass per piece:

* piece ``b = a_h (d - gamma)`` on ``low <= d <= high``: ``a_h d = a_h q_pos - a_h k_pos``, so
  the key channel is the key index ``j`` and the query channel ``c_h = -a_h / scale``;
* one piece covering every distance the call's mask allows (causal ALiBi under a causal mask)
  is one plain SDPA call (``is_causal``), differentiable everywhere;
* several pieces (symmetric, asymmetric, shifted ALiBi) are several passes, each restricted to
  the band of ``j - i`` where its piece holds, merged by log-sum-exp **after restoring the
  dropped row term of each pass** (``lse_p += scale c_h (j0 + gamma - I_i)``, ``I_i`` the
  query's position in key-index units): forgetting it gives an error of 1.33 (spec, L = 257).
  A band is cut into query blocks of ``FOLD_BLOCK_ROWS`` rows: keys every row of a block sees
  run unmasked, the band's edges with a small ``(T, T)`` mask. On CPU the passes use the
  flash kernel's log-sum-exp (``aten._scaled_dot_product_flash_attention_for_cpu``) with its
  backward (``_FoldedBands``: each pass's gradient is the flash backward with the merged
  output and the merged log-sum-exp shifted into the pass's frame; the row terms get
  ``dO . o_p - (dO . o) W_p``); elsewhere the same blocks run as explicit logits.

*Low-precision positions.* ``w(j) = j`` is not representable in bf16 above 256 (fp16: 2048):
a naive bf16 fold errs by 3.7 at L = 4096 (spec). For half types the key index is split into
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

**Low-rank folds** (``low_rank_fold`` / ``LowRankFold``; RIB / FlashBias style) for biases that
do not fold exactly (T5, KERPLE, FIRE, sharp ALiBi heads without a causal mask): truncated SVD
of the row-centred bias matrix, or a mass-weighted Fourier fit of a distance-only bias
(``cos``/``sin`` features of ``d``, rank 2 per frequency, weights ``exp(b(d))`` normalised). A
fold states its ``rank`` and the error *it makes in the attention weights*: the largest
total-variation distance, over rows and heads, between ``softmax(b)`` and ``softmax(b~)`` of
the positional logits (``weight_error``); the relative Frobenius error of the bias
(``bias_error``) is kept beside it because it hides the weight error (ALiBi m = 1/2, L = 1024,
rank 8: bias error 1.4e-2, weight error 0.84; spec table). Low-rank folds are never chosen by
``auto``: ``folded_attention`` refuses a bias that does not fold exactly unless ``rank`` is
given.

Shapes: q ``(B, H, Lq, D)``, k ``(B, Hkv, Lk, D)``, v ``(B, Hkv, Lk, Dv)``; factors
``u (H, Lq, r)``, ``w (H, Lk, r)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention.api import attention, scores
from ..attention.call import prepare_call
from ..attention.dense import empty_attention
from ..attention.fold import (
    FOLD_LOGIT_TOLERANCE,
    exact_fold_pieces,
    fold_refusal,
    fold_rounding_bound,
    position_digits,
)
from ..encodings.base import Encoding
from ..validation import check_choice, check_int

__all__ = [
    "FOLD_LOGIT_TOLERANCE",
    "LowRankFold",
    "exact_fold_pieces",
    "fold_refusal",
    "fold_rounding_bound",
    "folded_attention",
    "low_rank_fold",
    "position_digits",
]


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
        bias = scores(q, k, encoding)[0]
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
                f"relpos.efficient.low_rank_fold)"
            )
        return attention(q, k, v, encoding, causal=causal, scale=scale, backend="fold")
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
