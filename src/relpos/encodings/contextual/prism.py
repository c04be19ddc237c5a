"""PRISM: probabilistic relative-position implicit superposition (P. Lee 2025, "PRISM:
Probabilistic Relative-position Implicit Superposition Model", arXiv 2506.00920).

Each token's position is a probability histogram, advanced token by token by a
content-conditioned shift kernel (a differentiable histogram filter); the bias of a pair is
a distance function averaged over the distribution of their position difference. Only the
abstract was available and no code was found: the formulas below are a reconstruction, checked
by tests/encodings/contextual/test_prism.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...functional import alibi_slopes
from ..base import BiasContext, Encoding
from ..options import Choice, Int
from ..registry import register

__all__ = [
    "PRISM",
    "PRISMData",
    "position_histograms",
    "corrected_histograms",
    "likelihood_basis",
    "difference_distribution",
]


def _convolve(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b)[n] = sum_s a[n - s] b[s]`` over the last axis (``bins`` each, float64, by
    FFT), with the mass beyond the last bin folded into it (an absorbing last bin)."""
    bins = a.shape[-1]
    full = torch.fft.irfft(torch.fft.rfft(a, 2 * bins) * torch.fft.rfft(b, 2 * bins), 2 * bins)
    head, tail = full[..., : bins - 1], full[..., bins - 1 :].sum(-1, keepdim=True)
    return torch.cat([head, tail], dim=-1)


def position_histograms(kernels: Tensor, bins: int) -> Tensor:
    """The histogram filter ``pi_0 = delta_0``, ``pi_t = pi_{t-1} * kappa_{t-1}`` for shift
    kernels ``kernels (..., L, S)`` (distributions over forward shifts ``0 .. S-1``): the
    histograms ``(..., L, bins)`` float64 of every token's position, mass beyond ``bins - 1``
    held in the last bin. Kernels are normalised, so the histograms stay normalised.

    Convolution is associative, so the prefix ``pi_t = delta_0 * kappa_0 * ... * kappa_{t-1}``
    is a parallel (Hillis-Steele) scan: ``ceil(log2 L)`` batched FFT convolutions."""
    *lead, length, shifts = kernels.shape
    x = kernels.new_zeros(*lead, length, bins, dtype=torch.float64)
    x[..., 0, 0] = 1.0  # token 0 is at position 0
    if length > 1:
        width = min(shifts, bins)
        k = kernels[..., :-1, :width].to(torch.float64)
        if shifts > bins:  # shifts past the last bin land in it
            k = torch.cat([k[..., :-1], kernels[..., :-1, bins - 1 :].sum(-1, keepdim=True)], -1)
        x = torch.cat([x[..., :1, :], F.pad(k, (0, bins - width))], dim=-2)
    step = 1
    while step < length:
        x = torch.cat([x[..., :step, :], _convolve(x[..., :-step, :], x[..., step:, :])], dim=-2)
        step *= 2
    return x


def _shift(pi: Tensor, kernel: Tensor) -> Tensor:
    """The prediction step ``(pi * kappa)[b] = sum_s kappa[s] pi[b - s]`` for ``pi (..., bins)``
    and ``kernel (..., S)``, the mass beyond the last bin kept in it."""
    bins = pi.shape[-1]
    out = pi * kernel[..., :1]
    for s in range(1, kernel.shape[-1]):
        moved = F.pad(pi[..., : max(bins - s, 0)], (min(s, bins), 0))
        moved[..., -1] = moved[..., -1] + pi[..., max(bins - s, 0) :].sum(-1)
        out = out + kernel[..., s : s + 1] * moved
    return out


def corrected_histograms(kernels: Tensor, likelihoods: Tensor) -> Tensor:
    """The histogram filter with a correction step, token by token (float64):

        pi_0 = normalise(delta_0 . l_0) = delta_0
        pi_t = normalise((pi_{t-1} * kappa_{t-1}) . l_t)     ("." element-wise)

    for shift kernels ``kernels (..., L, S)`` (``position_histograms``' form) and
    likelihoods ``likelihoods (..., L, bins)`` (positive; ``l_t[b]`` = how well token t fits
    at position b). Returns ``(..., L, bins)``. A constant ``l`` gives
    ``position_histograms`` exactly (up to rounding); the multiply-normalise step is not a
    convolution, so there is no parallel scan: L sequential steps of O(bins S)."""
    *lead, length, shifts = kernels.shape
    bins = likelihoods.shape[-1]
    if likelihoods.shape[-2] != length:
        raise ValueError(
            f"likelihoods must have one row per token ({length}), got {likelihoods.shape[-2]}"
        )
    k = kernels.to(torch.float64)
    ell = likelihoods.to(torch.float64)
    pi = torch.zeros(*lead, bins, dtype=torch.float64, device=kernels.device)
    pi[..., 0] = 1.0
    out = [pi]
    for t in range(1, length):
        pred = _shift(pi, k[..., t - 1, :]) * ell[..., t, :]
        pi = pred / pred.sum(-1, keepdim=True)
        out.append(pi)
    return torch.stack(out, dim=-2)


def likelihood_basis(bins: int, size: int) -> Tensor:
    """``psi (size, bins)``: ``psi_r(b) = cos(pi r (b + 1/2) / bins)`` for r = 1..size, the
    smooth functions of a counted position the correction's log-likelihood is built from (a
    constant term would cancel in the normalisation)."""
    b = torch.arange(bins, dtype=torch.float64) + 0.5
    r = torch.arange(1, size + 1, dtype=torch.float64)[:, None]
    return torch.cos(torch.pi * r * b / bins)


def difference_distribution(pi_i: Tensor, pi_j: Tensor) -> Tensor:
    """``P(Delta = delta) = sum_b pi_i[b] pi_j[b - delta]`` for two histograms ``(bins,)``:
    ``(2 bins - 1,)`` over ``delta = -(bins - 1) .. bins - 1``."""
    bins = pi_i.shape[-1]
    outer = pi_i[:, None] * pi_j[None, :]  # [b, c]: delta = b - c
    delta = torch.arange(bins)[:, None] - torch.arange(bins)[None, :]
    out = pi_i.new_zeros(2 * bins - 1)
    return out.index_add(0, (delta + bins - 1).flatten(), outer.flatten())


@dataclass
class PRISMData:
    """``a = pi_q F_h (B, H, Lq, bins)`` and the key histograms ``pi_k (B, H, Lk, bins)``:
    the bias is ``a_i . pi_k_j``."""

    a: Tensor
    pi_k: Tensor
    dtype: torch.dtype  # of the bias: the activations' (at least float32)


@dataclass
class PRISMBlock:
    bias: Tensor
    i0: int
    j0: int


CORRECTION = Choice(choices=("none", "learned"), doc="the filter's correction step pi * l(x_t)")


@register("prism")
class PRISM(Encoding):
    """PRISM (P. Lee 2025, arXiv 2506.00920; a reconstruction from the abstract).

        kappa_t   = softmax(k_t W_h + c_h)            (S,) shifts 0 .. S-1 of token t's step
        pi_0      = delta_0,   pi_t = pi_{t-1} * kappa_{t-1}       (bins,) position histograms
        P(Delta_ij = delta) = sum_b pi_i[b] pi_j[b - delta]
        b_h(i, j) = sum_delta P(Delta_ij = delta) f_h(delta) = pi_i^T F_h pi_j,
                    F_h[b, c] = f_h(b - c)

    The kernels read the keys (the token's representation in the layer); query ``i`` takes the
    histogram of its own token, key index ``i + Lk - Lq`` (self-attention, also with a KV
    cache: histograms are causal, so a cached step equals the full forward), hence
    ``Lq <= Lk``. ``kernel="counting"`` fixes ``kappa = delta_1`` (every token counts 1): the
    histograms are one-hot and the bias is ``f_h(i - j)`` exactly. ``distance``: ``"alibi"``
    (``f_h(delta) = -m_h |delta|``, ALiBi's slopes, fixed) or ``"learned"`` (a table over
    ``delta``, initialised to the same). Mass beyond ``bins - 1`` stays in the last bin, so
    counted distances saturate there; memory ``O(B H L bins)``, time ``O(L bins^2)`` per head.
    Positions are not read (shift-invariant). The learned kernel starts near counting
    (``W = 0``, ``c`` puts probability ~0.98 on shift 1).

    Correction step (``correction="learned"``, off by default so the registered method is the
    prediction-only filter above): the reconstruction's ``pi * l(x_t)`` as the measurement update of
    a histogram (discrete Bayes) filter,

        l_t       = softmax_b(sum_r (k_t U_h)_r psi_r(b))     (bins,) token t's likelihood
        pi_t      = normalise((pi_{t-1} * kappa_{t-1}) . l_t)

    with ``psi_r(b) = cos(pi r (b + 1/2) / bins)``, r = 1..``correction_basis``
    (``likelihood_basis``) and ``U (H, D, R)`` zero-initialised: ``l`` starts uniform, so a
    fresh model with the correction equals one without it. Token t is corrected by its own
    likelihood after the shift of token t - 1 (predict, then observe), so the histograms stay
    causal (a KV-cache step equals the full forward). The filter then runs token by token
    (``corrected_histograms``, O(L bins S) sequential steps) instead of the parallel scan.

    Assumptions (no code or formula text found): kernels from a linear map of the keys, shifts
    ``0 .. max_shift`` only (forward), query histograms from the query's own key,
    ``|delta|`` for keys after the query; for the correction, the likelihood's form (a
    softmax over bins of a key-linear combination of a cosine basis) and the order (predict
    with token t - 1's kernel, correct with token t's likelihood) are this reconstruction's.

    Sources tried: the stored pages of arXiv 2506.00920 (v1, v2 HTML) and its
    listings return the abstract and the first lines of the introduction only; no code
    repository was found (the v1 note says code "will follow in v2"). A third-party summary
    (sciencestack.ai) says the histogram "forms a position stream via sinusoidal embeddings",
    reads the update as a non-stationary HMM / CRF and adds a "copy branch": if so, the paper
    feeds an expected sinusoid into the residual stream rather than (or besides) the
    attention bias used here. Unverified, so the correction step and that stream are not
    built.
    """

    paper = "P. Lee 2025 (PRISM)"
    has_bias = True
    continuous = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        bins: Annotated[
            int, Int(minimum=2, doc="histogram bins (counted positions 0 .. bins - 1)")
        ] = 512,
        max_shift: Annotated[int, Int(minimum=1, doc="largest step of a token's shift kernel")] = 2,
        kernel: Annotated[
            str, Choice(choices=("learned", "counting"), doc="content kernels or delta_1")
        ] = "learned",
        distance: Annotated[
            str, Choice(choices=("alibi", "learned"), doc="the distance function f_h")
        ] = "alibi",
        correction: Annotated[str, CORRECTION] = "none",
        correction_basis: Annotated[
            int, Int(minimum=1, doc="cosine functions of the correction's l")
        ] = 8,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.bins, self.max_shift, self.kernel, self.distance = bins, max_shift, kernel, distance
        self.correction, self.correction_basis = correction, correction_basis
        if correction == "learned":
            self.correction_weight = nn.Parameter(
                torch.zeros(num_heads, head_dim, correction_basis)
            )
            self.register_buffer(
                "basis", likelihood_basis(bins, correction_basis).float(), persistent=False
            )
        if kernel == "learned":
            self.kernel_weight = nn.Parameter(torch.zeros(num_heads, head_dim, max_shift + 1))
            bias = torch.zeros(num_heads, max_shift + 1)
            bias[:, 1] = 5.0
            self.kernel_bias = nn.Parameter(bias)
        delta = torch.arange(-(bins - 1), bins, dtype=torch.float32)
        table = -alibi_slopes(num_heads)[:, None] * delta.abs()[None, :]  # (H, 2 bins - 1)
        if distance == "learned":
            self.table = nn.Parameter(table)
        else:
            self.register_buffer("table", table, persistent=False)

    @classmethod
    def example_options(cls) -> dict:
        return {"bins": 24}  # the suite's sequences saturate the last bin

    def kernels(self, k: Tensor) -> Tensor:
        """Shift kernels ``(B, H, Lk, max_shift + 1)`` of keys ``k (B, H, Lk, D)``."""
        if self.kernel == "counting":
            out = k.new_zeros(*k.shape[:3], self.max_shift + 1)
            out[..., 1] = 1.0
            return out
        logits = torch.einsum("bhld,hds->bhls", k, self.kernel_weight.to(k.dtype))
        return torch.softmax(logits + self.kernel_bias.to(k.dtype)[None, :, None], dim=-1)

    def likelihoods(self, k: Tensor) -> Tensor:
        """The correction's likelihoods ``(B, H, Lk, bins)`` float64 of keys ``k (B, H, Lk,
        D)``: a softmax over bins (``correction="learned"``)."""
        if self.correction != "learned":
            raise ValueError("likelihoods(): the correction step is off (correction='none')")
        a = torch.einsum("bhld,hdr->bhlr", k.to(torch.float64), self.correction_weight.double())
        return torch.softmax(a @ self.basis.to(torch.float64), dim=-1)

    def histograms(self, k: Tensor) -> Tensor:
        """Every key token's position histogram ``(B, H, Lk, bins)`` float64."""
        if self.correction == "learned":
            return corrected_histograms(self.kernels(k), self.likelihoods(k))
        return position_histograms(self.kernels(k), self.bins)

    def distance_matrix(self) -> Tensor:
        """``F_h[b, c] = f_h(b - c)``: ``(H, bins, bins)``."""
        b = torch.arange(self.bins, device=self.table.device)
        return self.table[:, b[:, None] - b[None, :] + self.bins - 1]

    def precompute(self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]):
        lq, lk = q.shape[2], k.shape[2]
        if lq > lk:
            raise ValueError(
                f"prism reads each query's position histogram at its own token among the keys "
                f"(self-attention, queries the last Lq keys): needs Lq <= Lk, got Lq={lq} > "
                f"Lk={lk}"
            )
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        pi = self.histograms(k)  # (B, H, Lk, bins) float64
        pi_q = pi[:, :, lk - lq :]
        a = torch.matmul(pi_q, self.distance_matrix().to(torch.float64))
        return PRISMData(a=a, pi_k=pi, dtype=torch.promote_types(q.dtype, torch.float32))

    def block_context(self, ctx: BiasContext, i: Tensor, j: Tensor) -> BiasContext:
        data = ctx.data
        i0, j0 = int(i[0]) if i.numel() else 0, int(j[0]) if j.numel() else 0
        a = data.a[:, :, i0 : i0 + i.numel()]
        pi_k = data.pi_k[:, :, j0 : j0 + j.numel()]
        bias = torch.matmul(a, pi_k.transpose(-1, -2)).to(data.dtype)
        return BiasContext(
            q_pos=ctx.q_pos,
            k_pos=ctx.k_pos,
            data=PRISMBlock(bias, i0, j0),
            scale=ctx.scale,
            positions=ctx.positions,
        )

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        blk = ctx.data
        return blk.bias[b, h, i - blk.i0, j - blk.j0]

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, bins={self.bins}, max_shift={self.max_shift}, "
            f"kernel={self.kernel!r}, distance={self.distance!r}, "
            f"correction={self.correction!r}"
        )
