"""RoPE after a learned per-head transform of q and k: ComplexFormer and HARoPE.

Both transform each head's queries and keys, then rotate them as RoPE, so every backend
(fused SDPA included) runs them. ``HeadwiseRoPE`` holds the shared part.

Grouped-query attention. The transforms have per-head parameters that act on the keys too
(ComplexFormer's phase scale, HARoPE's map). With ``Hkv < H`` key heads every key serves
``H / Hkv`` query heads, so one key transform per group is all that exists: these encodings
average such parameters over each group (``group_mean``; with ``Hkv == H`` this is the
per-head parameter itself). They need the key head count of the call, so they rotate queries
and keys together (``rotate_qk``) and set ``cache_rotated_keys = False``: ``relpos.nn``
caches raw keys and re-rotates the cache.

Sources read: ComplexFormer, shaojintian/complexFormer ``attention/complex_attention.py``;
HARoPE, Studentxll/HARoPE ``model/models_HARoPE.py``.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..options import Refused
from ..registry import register
from .lie import skew_part
from .rope import ROPE_LAYOUT, RoPE

__all__ = ["ComplexFormer", "HARoPE", "HeadwiseRoPE", "group_mean", "repeat_heads", "safe_atan2"]


def group_mean(param: Tensor, kv_heads: int) -> Tensor:
    """Per-query-head parameters ``(H, ...)`` -> one per key head ``(kv_heads, ...)``.

    Heads ``g*G .. g*G + G - 1`` (``G = H / kv_heads``) share key head ``g`` (the order
    ``relpos.attention`` uses for grouped-query attention); their parameters are averaged.
    """
    heads = param.shape[0]
    if kv_heads == heads:
        return param
    return param.reshape(kv_heads, heads // kv_heads, *param.shape[1:]).mean(1)


def repeat_heads(x: Tensor, heads: int) -> Tensor:
    """``(B, Hkv, ...)`` -> ``(B, heads, ...)``: each key head repeated over its query group."""
    if x.shape[1] == heads:
        return x
    return x.repeat_interleave(heads // x.shape[1], dim=1)


class HeadwiseRoPE(RoPE):
    """RoPE after a per-head transform of q and k whose key side is shared by GQA groups.

    Subclasses implement ``head_params(kv_heads)`` (the per-key-head parameters of a call,
    averaged over the ``H / kv_heads`` query heads of each key head with ``group_mean``;
    computed once per call) and ``transform(x, role, params)``; q and k are transformed,
    then rotated as RoPE (with one set of frequencies per call for length-dependent
    scalings). ``rotate`` alone assumes ``kv_heads = H``.
    """

    cache_rotated_keys = False  # the key transform depends on the call's key head count

    def head_params(self, kv_heads: int) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def transform(self, x: Tensor, role: str, params: tuple[Tensor, ...]) -> Tensor:
        raise NotImplementedError

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role not in ("q", "k"):
            return x
        self._check_head_dim(x, role)
        params = self.head_params(x.shape[1] if role == "k" else self.num_heads)
        return super().rotate(self.transform(x, role, params), pos, role)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        self._check_qk(q, k)
        params = self.head_params(k.shape[1])
        seq_len = None
        if self.length_dependent:
            seq_len = self.call_length(("q_pos", q_pos), ("k_pos", k_pos))
        return (
            self._rotate_at(self.transform(q, "q", params), q_pos, seq_len),
            self._rotate_at(self.transform(k, "k", params), k_pos, seq_len),
        )


def safe_atan2(y: Tensor, x: Tensor) -> Tensor:
    """``atan2(y, x)`` whose gradient is 0 rather than NaN at ``x = y = 0``."""
    zero = (x == 0) & (y == 0)
    return torch.atan2(y, torch.where(zero, torch.ones_like(x), x))


@register("complexformer")
class ComplexFormer(HeadwiseRoPE):
    """ComplexFormer / complex multi-head attention (Shao et al. 2025; the
    author's research code read: ``shaojintian/complexFormer``, ``ComplexMultiHeadAttentionV2``).

    Each head's q and k are complex numbers ``z_j = x_j + i x_{j + d/2}`` (half-split
    pairs) in polar form ``r e^{i phi}``, ``r = sqrt(re^2 + im^2 + 1e-9)``. The score is

        s_mn = sum_j r^q_mj r^k_nj cos(delta_hj (phi^q_mj - phi^k_nj) + beta_hj + (m - n) w_j)

    with ``w_j = base^(-2j/d)`` (RoPE's frequencies). It factorises per token:
    ``q -> r e^{i(delta phi + beta)}``, ``k -> r e^{i delta phi}``, then RoPE (half layout),
    so every backend, fused SDPA included, runs it. ``delta = 1, beta = 0`` is RoPE.

    Learned: ``delta (H, d/2)``, initialised ``N(0, 1/sqrt(d/2))`` as in the author's
    ``_init_weights``; ``beta (H, d/2)``, initialised 0. Differences from the author code:
    the logits get the library's ``1/sqrt(d)`` scale (the author uses none: pass
    ``scale=1.0``); no ``(B, H, Lq, Lk, d/2)`` phase tensor is built. With GQA ``delta`` is
    averaged over each query group (it acts on the keys); ``beta`` stays per query head.

    Options: ``base``, ``scaling`` and ``max_position_embeddings`` as for ``rope`` (a scaling
    changes ``w_j``). ``layout`` is ``half`` and ``partial_rotary_factor`` is 1: the complex
    numbers pair channel ``j`` with ``j + d/2`` over the whole head, as the rotation must.

    Shapes: ``x (B, H, L, D)`` with D even, ``pos (B|1, L)``.
    """

    paper = "Shao et al. 2025 (ComplexFormer)"
    option_overrides = {
        "layout": Refused(
            "complexformer's complex numbers are half-split pairs (x_j, x_{j+d/2})",
            default="half",
        ),
        "partial_rotary_factor": Refused(
            "complexformer's polar form covers every channel pair of the head", default=1.0
        ),
    }

    def __init__(self, num_heads: int, head_dim: int, **rope_options) -> None:
        super().__init__(num_heads, head_dim, **rope_options)  # checks head_dim
        half = head_dim // 2
        self.delta = nn.Parameter(torch.randn(num_heads, half) * half**-0.5)
        self.beta = nn.Parameter(torch.zeros(num_heads, half))

    def head_params(self, kv_heads: int) -> tuple[Tensor, ...]:
        return (group_mean(self.delta, kv_heads),)

    def transform(self, x: Tensor, role: str, params: tuple[Tensor, ...]) -> Tensor:
        half = self.head_dim // 2
        re, im = x[..., :half], x[..., half:]
        radius = torch.sqrt(re * re + im * im + 1e-9)
        delta = repeat_heads(params[0][None], x.shape[1])
        phase = delta[:, :, None, :].to(x.dtype) * safe_atan2(im, re)
        if role == "q":
            phase = phase + self.beta[None, :, None, :].to(x.dtype)
        return torch.cat((radius * phase.cos(), radius * phase.sin()), dim=-1)


@register("harope")
class HARoPE(HeadwiseRoPE):
    """HARoPE, head-wise adaptive RoPE (official code read: ``Studentxll/HARoPE``,
    ``SVDBasedMatrix`` and ``Attention.forward``).

    Per head ``M_h = U_h diag(s_h) V_h^T`` with ``U = expm(skew(A_u))``, ``V = expm(skew(A_v))``,
    ``skew(A) = (A - A^T) / 2`` and ``s = softplus(sigma) + 1e-6``; then ``q <- M q``,
    ``k <- M^{-T} k = U diag(1/s) V^T k`` and RoPE on both. The score
    ``q^T M^T R(n - m) M^{-T} k`` depends on ``n - m`` only and equals ``q^T k`` at
    ``n = m``.

    Learned: ``a_u, a_v (H, D, D)`` initialised 0 and ``sigma (H, D)`` initialised
    ``ln(e - 1)`` (``softplus = 1``), so ``M = I`` (up to the 1e-6) and HARoPE starts as
    RoPE. The paper uses 2-D axial RoPE on a DiT latent grid; this class is the 1-D
    sequence form (interleaved pairs by default, as the source). With GQA the parameters are
    averaged over each query group, since ``M^{-T}`` acts on the shared keys. Every RoPE
    option applies to the rotation after the map.

    Args: ``layout`` (default ``"interleaved"``), ``**rope_options`` as for ``rope``.
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "HARoPE (head-wise SVD-parameterised map + RoPE)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        layout: Annotated[str, ROPE_LAYOUT] = "interleaved",
        **rope_options,
    ) -> None:
        super().__init__(num_heads, head_dim, layout=layout, **rope_options)
        d = head_dim
        self.a_u = nn.Parameter(torch.zeros(num_heads, d, d))
        self.a_v = nn.Parameter(torch.zeros(num_heads, d, d))
        self.sigma = nn.Parameter(torch.full((num_heads, d), math.log(math.e - 1)))

    def maps(self, kv_heads: int | None = None) -> tuple[Tensor, ...]:
        """``(M, M^{-T})`` per key head, ``(kv_heads, D, D)`` each (default: per head)."""
        kv_heads = self.num_heads if kv_heads is None else kv_heads
        u = torch.linalg.matrix_exp(skew_part(group_mean(self.a_u, kv_heads)))
        v = torch.linalg.matrix_exp(skew_part(group_mean(self.a_v, kv_heads)))
        s = F.softplus(group_mean(self.sigma, kv_heads)) + 1e-6
        return (u * s[:, None, :]) @ v.mT, (u / s[:, None, :]) @ v.mT

    head_params = maps

    def transform(self, x: Tensor, role: str, params: tuple[Tensor, ...]) -> Tensor:
        m, m_inv_t = params
        mat = repeat_heads((m if role == "q" else m_inv_t)[None], x.shape[1])[0]
        return torch.einsum("hij,bhlj->bhli", mat.to(x.dtype), x)
