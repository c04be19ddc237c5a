"""Rotary variants: learned, masked, input-dependent, value-rotating and head-wise RoPEs.

Every class here is RoPE (``rotary.RoPE``: Su et al. 2021) with one change, and reuses its
frequencies (``functional.rope_frequencies``), angles (``functional.rope_angles``) and pair
rotation (``functional.apply_rotary``):

* ``lerope``: learned per-frequency scale (LeRoPE);
* ``hope``: high frequencies only, the rest are identity ("NoPE") pairs (HoPE, Chen et al.);
* ``p-rope``: the fraction ``p`` of highest frequencies (Barbero et al., HF ``proportional``);
* ``rove``: values rotated with the keys, outputs rotated back (RoVE);
* ``complexformer``: per-head learned phase scale and offset in polar form (ComplexFormer);
* ``carope``: token-dependent frequencies, phases summed over the prefix (CARoPE);
* ``harope``: a head-wise SVD-parameterised linear map before the rotation (HARoPE);
* ``hyperbolic-rope``: rotation times the decaying light-cone factor of a Lorentz boost
  (Hyperbolic HoPE, Dai et al.).

Formulas, authority levels and pitfalls: ``../shared/spec/formulas-rotary.md`` sections 12-20.

Grouped-query attention. Some variants have per-head parameters that act on the keys too
(ComplexFormer's phase scale, CARoPE's frequency projection, HARoPE's map). With ``Hkv < H``
key heads every key serves ``H / Hkv`` query heads, so one key transform per group is all
that exists: these encodings average such parameters over each group (``group_mean``; with
``Hkv == H`` this is the per-head parameter itself). They need the key head count of the
call, so they rotate queries and keys together (``rotate_qk``) and set
``cache_rotated_keys = False``: ``relpos.nn`` caches raw keys and re-rotates the cache.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...functional import rope_angles
from ...registry import register
from .lie import skew_part
from .rope import RoPE, XPos, rotate_pairs

# --------------------------------------------------------------------------- shared helpers


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


def inverse_softplus(y: float) -> float:
    """``x`` with ``softplus(x) = y`` (``y > 0``), stable for small and large ``y``."""
    return y + math.log(-math.expm1(-y))


# --------------------------------------------------------------------------- frequency variants


@register("lerope")
class LeRoPE(RoPE):
    """LeRoPE: RoPE with a learned scale per frequency (spec §12; Authority C, no code found).

    ``theta_i = exp(u_i) * base^(-2i/d)`` with ``u`` learned, ``(d/2,)``, initialised to 0
    (plain RoPE at init). Assumed, since the abstract states only "a scalar per frequency":
    a multiplicative scale in log space (the spec's recommendation; it keeps gradients
    well-scaled and the frequencies positive), shared by all heads of a layer. Any
    ``theta`` keeps the score relative. Angles are formed in float32 (float64 for
    fractional or > 2^24 positions), as for RoPE; the gradient of ``u_i`` grows with the
    position.

    Args: ``base``, ``layout``, ``partial_rotary_factor`` as for ``rope``.
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``; parameter ``log_scale (r/2,)``.
    """

    paper = "LeRoPE (learned per-frequency scale)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: float = 10000.0,
        layout: str = "half",
        partial_rotary_factor: float = 1.0,
    ) -> None:
        super().__init__(
            num_heads,
            head_dim,
            base=base,
            layout=layout,
            partial_rotary_factor=partial_rotary_factor,
        )
        self.log_scale = nn.Parameter(torch.zeros(self.inv_freq.numel()))

    @property
    def learned_inv_freq(self) -> Tensor:
        """The frequencies in use: ``inv_freq * exp(log_scale)``, ``(r/2,)``."""
        return self.inv_freq * self.log_scale.exp()

    def cos_sin(self, pos: Tensor, seq_len: int | None = None) -> tuple[Tensor, Tensor]:
        ang = rope_angles(pos, self.learned_inv_freq)[:, None]
        return ang.cos(), ang.sin()


def high_frequency_pairs(inv_freq: Tensor, train_length: float) -> int:
    """HoPE's cutoff: the number of pairs whose wavelength ``2 pi / theta_i`` fits in
    ``train_length`` (the frequencies are sorted from high to low)."""
    return int((2 * math.pi / inv_freq.double() <= train_length).sum())


@register("hope")
class HoPE(RoPE):
    """HoPE, high-frequency rotary PE (Chen et al. 2024, arXiv 2410.21216; spec §13).

    ``R(m) = diag(R(m theta_0), ..., R(m theta_{r-1}), I, ..., I)``: the ``r`` highest
    frequencies rotate (``theta_i = base^(-2i/d)``, exponent over the head dim); the other
    pairs are identity, position-independent channels. With no low frequency the score has
    no long-term decay: every remaining component oscillates with a period that fits in the
    training length, the removed ones are constant in the distance.

    Authority C: the paper's cutoff rule was not found in a primary source. Two cutoffs are
    offered: ``rotated_pairs = r`` explicitly, or ``train_length = L``, keeping the pairs with
    wavelength ``2 pi / theta_i <= L`` (the default, ``L = 4096``). With an explicit ``r``
    this equals ``p-rope`` with ``p = 2 r / head_dim``.

    Args:
        base, layout: as for ``rope``.
        train_length: keep the pairs whose wavelength fits in it (default 4096).
        rotated_pairs: keep exactly this many pairs instead (``0 .. head_dim // 2``).
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "Chen et al. 2024 (HoPE, high-frequency RoPE)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: float = 10000.0,
        layout: str = "half",
        train_length: float | None = None,
        rotated_pairs: int | None = None,
    ) -> None:
        super().__init__(num_heads, head_dim, base=base, layout=layout)
        pairs = self.inv_freq.numel()
        if train_length is not None and rotated_pairs is not None:
            raise ValueError("give either train_length or rotated_pairs, not both")
        if rotated_pairs is None:
            length = 4096 if train_length is None else train_length
            if isinstance(length, bool) or not isinstance(length, (int, float)) or length <= 0:
                raise ValueError(f"train_length must be a positive number, got {length!r}")
            rotated_pairs = high_frequency_pairs(self.inv_freq, length)
            self.train_length: float | None = float(length)
        else:
            if (
                isinstance(rotated_pairs, bool)
                or not isinstance(rotated_pairs, int)
                or not 0 <= rotated_pairs <= pairs
            ):
                raise ValueError(
                    f"rotated_pairs must be an int in [0, {pairs}] (head_dim // 2), "
                    f"got {rotated_pairs!r}"
                )
            self.train_length = None
        self.rotated_pairs = rotated_pairs
        keep = torch.arange(pairs) < rotated_pairs
        self.inv_freq = torch.where(keep, self.inv_freq, torch.zeros_like(self.inv_freq))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rotated_pairs={self.rotated_pairs}"


@register("p-rope")
class PRoPE(RoPE):
    """p-RoPE (Barbero et al. 2024, "Round and Round We Go!", arXiv 2410.06205; spec §14).

    Keeps the fraction ``p`` of highest frequencies and sets the rest to 0 (identity
    "NoPE" pairs): ``r = int(p * head_dim // 2)``, ``theta_i = base^(-2i/head_dim)`` for
    ``i < r`` (exponent over **head_dim**, unlike partial rotary), else 0. This is Hugging
    Face's ``"proportional"`` rope type (Gemma 4: ``p = 0.25``, ``base = 1e6`` on global
    layers), computed by ``relpos.rope_scaling.proportional``.

    Args: ``p`` in ``[0, 1]`` (default 0.25), ``base``, ``layout`` as for ``rope``.
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "Barbero et al. 2024 (p-RoPE)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        p: float = 0.25,
        base: float = 10000.0,
        layout: str = "half",
    ) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a number in [0, 1], got {p!r}")
        self.p = float(p)
        super().__init__(
            num_heads,
            head_dim,
            base=base,
            layout=layout,
            scaling={"rope_type": "proportional", "partial_rotary_factor": float(p)},
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, p={self.p:g}"


# --------------------------------------------------------------------------- value rotation


@register("rove")
class RoVE(RoPE):
    """RoVE, rotary value embeddings (García-Castellanos et al. 2026, arXiv 2606.11275;
    spec §18, Authority B: paper text).

    Scores are RoPE's. Values are rotated with their key's rotation and the aggregated output
    is rotated back by the query's:

        o_m = R(m)^T sum_n a_mn R(n) v_n = sum_n a_mn R(n - m) v_n

    so the value path is an "attentive convolution" with kernel ``R(n - m)`` and stays
    relative. Parameter-free. ``relpos.attention`` calls ``rotate(v, k_pos, "v")`` before and
    ``rotate(out, q_pos, "o")`` after the backend, so every backend (fused SDPA included)
    and the KV cache (which stores ``R(n) v_n``) work unchanged. Values need the head dim of
    q and k (same pairs and frequencies). Not HF RoFormer's ``rotary_value``, which never
    rotates the output back.

    Args: ``base``, ``layout``, ``partial_rotary_factor`` as for ``rope``.
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "García-Castellanos et al. 2026 (RoVE)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: float = 10000.0,
        layout: str = "half",
        partial_rotary_factor: float = 1.0,
    ) -> None:
        super().__init__(
            num_heads,
            head_dim,
            base=base,
            layout=layout,
            partial_rotary_factor=partial_rotary_factor,
        )

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role in ("q", "k"):
            return super().rotate(x, pos, role)
        if role not in ("v", "o"):
            return x
        self._check_head_dim(x, "v" if role == "v" else "the output", "value head_dim")
        return self._rotate_at(x, pos, inverse=role == "o")


# --------------------------------------------------------------------------- head-wise variants


class HeadwiseRoPE(RoPE):
    """RoPE after a per-head transform of q and k whose key side is shared by GQA groups.

    Subclasses implement ``head_params(kv_heads)`` (the per-key-head parameters of a call,
    averaged over the ``H / kv_heads`` query heads of each key head with ``group_mean``;
    computed once per call) and ``transform(x, role, params)``; q and k are transformed,
    then rotated as RoPE. ``rotate`` alone assumes ``kv_heads = H``.
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
        return (
            super().rotate(self.transform(q, "q", params), q_pos, "q"),
            super().rotate(self.transform(k, "k", params), k_pos, "k"),
        )


def safe_atan2(y: Tensor, x: Tensor) -> Tensor:
    """``atan2(y, x)`` whose gradient is 0 rather than NaN at ``x = y = 0``."""
    zero = (x == 0) & (y == 0)
    return torch.atan2(y, torch.where(zero, torch.ones_like(x), x))


@register("complexformer")
class ComplexFormer(HeadwiseRoPE):
    """ComplexFormer / complex multi-head attention (Shao et al. 2025; spec §17, Authority B:
    author's repo ``shaojintian/complexFormer``, ``ComplexMultiHeadAttentionV2``).

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

    Shapes: ``x (B, H, L, D)`` with D even, ``pos (B|1, L)``.
    """

    paper = "Shao et al. 2025 (ComplexFormer)"

    def __init__(self, num_heads: int, head_dim: int, *, base: float = 10000.0) -> None:
        super().__init__(num_heads, head_dim, base=base, layout="half")  # checks head_dim
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
    """HARoPE, head-wise adaptive RoPE (spec §20, Authority A: ``Studentxll/HARoPE``,
    ``SVDBasedMatrix`` and ``Attention.forward``).

    Per head ``M_h = U_h diag(s_h) V_h^T`` with ``U = expm(skew(A_u))``, ``V = expm(skew(A_v))``,
    ``skew(A) = (A - A^T) / 2`` and ``s = softplus(sigma) + 1e-6``; then ``q <- M q``,
    ``k <- M^{-T} k = U diag(1/s) V^T k`` and RoPE on both. The score
    ``q^T M^T R(n - m) M^{-T} k`` depends on ``n - m`` only and equals ``q^T k`` at
    ``n = m``.

    Learned: ``a_u, a_v (H, D, D)`` initialised 0 and ``sigma (H, D)`` initialised
    ``ln(e - 1)`` (``softplus = 1``), so ``M = I`` (up to the 1e-6) and HARoPE starts as
    RoPE. The paper uses 2-D axial RoPE on a DiT latent grid; this class is the 1-D
    sequence form (interleaved pairs, as the source). With GQA the parameters are averaged
    over each query group, since ``M^{-T}`` acts on the shared keys.

    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "HARoPE (head-wise SVD-parameterised map + RoPE)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: float = 10000.0,
        layout: str = "interleaved",
    ) -> None:
        super().__init__(num_heads, head_dim, base=base, layout=layout)
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


# --------------------------------------------------------------------------- context-aware


@register("carope")
class CARoPE(RoPE):
    """CARoPE, context-aware RoPE (Veisi et al. 2025, arXiv 2507.23083; spec §16,
    Authority B: paper text, no code).

    Token-dependent frequencies: ``f_t = 1 / (softplus(z_t) + 1)`` in ``(0, 1)`` per head,
    pair ``i`` turns at ``f_t^i`` (RoPE is ``f = theta_1 = base^(-2/d)``, as
    ``theta_i = theta_1^i``), and the phase is a sum over the prefix.

    What relpos assumes (the hooks see q, k and positions, not the layer input):

    * ``z_t = k_t . w_h + c_h``: the frequency is read from the token's *pre-rotation key*
      (the paper projects the layer input ``x_t W``, ``W (d_model, H)``, no bias);
      ``w = freq_weight (H, D)`` ~ N(0, 0.02^2) and ``c = freq_bias (H,)`` with
      ``f = theta_1`` at ``z = c``, so the encoding starts near RoPE (the spec's "RoPE at
      init" needs such a bias).
    * Phases integrate over positions: ``phi_i(j) = sum_{t <= j} f_t^i (p_t - p_{t-1})``
      with ``p_{-1} = 0`` (0-based, including the token itself). With unit steps from 0 this
      is the paper's ``sum_{t=1}^{m} f_t^i``; with ``f = theta_1`` it is RoPE at any
      positions.
    * A query takes the phase of its own token: query ``i`` is key ``i + Lk - Lq`` (the
      bottom-right alignment ``relpos.attention`` uses), plus ``f^i`` times any difference
      between its position and that key's. Cross-attention with unrelated queries and keys
      is not meaningful; ``Lq > Lk`` raises.

    Consequences: phases of key ``j`` depend on keys ``<= j`` only, so causal decoding is
    exact, but keys cannot be cached rotated (``cache_rotated_keys = False``: ``relpos.nn``
    re-rotates the cache). The score depends on the tokens and position gaps between query
    and key, not on ``q_pos - k_pos`` alone: ``relative = False``. It is still unchanged
    when every position moves by the same constant. Powers ``f^i`` and the prefix sums are
    formed in float64 (they underflow / accumulate error in float32), the phases reduced
    modulo ``2 pi`` before the cast. With GQA, ``w`` and ``c`` are averaged over each query
    group (a key head has one frequency).

    Args: ``base``, ``layout`` as for ``rope``; ``init_std``: std of ``w`` at init.
    Shapes: ``q (B, H, Lq, D)``, ``k (B, Hkv, Lk, D)``, ``q_pos (B|1, Lq)``, ``k_pos (B|1, Lk)``.
    """

    paper = "Veisi et al. 2025 (CARoPE)"
    relative = False
    cache_rotated_keys = False

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: float = 10000.0,
        layout: str = "half",
        init_std: float = 0.02,
    ) -> None:
        super().__init__(num_heads, head_dim, base=base, layout=layout)
        if isinstance(init_std, bool) or not isinstance(init_std, (int, float)) or init_std < 0:
            raise ValueError(f"init_std must be a number >= 0, got {init_std!r}")
        theta_1 = self.base ** (-2.0 / head_dim)
        self.freq_weight = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)
        self.freq_bias = nn.Parameter(torch.full((num_heads,), inverse_softplus(1 / theta_1 - 1)))

    def log_frequencies(self, k: Tensor) -> Tensor:
        """``log f (B, Hkv, Lk)``, ``f`` in (0, 1), from pre-rotation keys ``k (B, Hkv, Lk, D)``."""
        kv_heads = k.shape[1]
        w = group_mean(self.freq_weight, kv_heads)
        c = group_mean(self.freq_bias, kv_heads)
        z = torch.einsum("bhld,hd->bhl", k.float(), w) + c[None, :, None]
        return -torch.log1p(F.softplus(z))

    def phases(
        self, k: Tensor, k_pos: Tensor, q_pos: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Key phases ``(B, Hkv, Lk, r/2)`` and, given ``q_pos (B|1, Lq)``, query phases
        ``(B, Hkv, Lq, r/2)``; float64, not reduced."""
        log_f = self.log_frequencies(k).double()
        pairs = torch.arange(self.inv_freq.numel(), dtype=torch.float64, device=k.device)
        powers = torch.exp(log_f[..., None] * pairs)  # f^i, (B, Hkv, Lk, F)
        kp = k_pos.double()
        steps = torch.cat((kp[:, :1], kp[:, 1:] - kp[:, :-1]), dim=1)
        k_phase = torch.cumsum(powers * steps[:, None, :, None], dim=2)
        if q_pos is None:
            return k_phase, None
        offset = k.shape[2] - q_pos.shape[1]
        gap = (q_pos.double() - kp[:, offset:])[:, None, :, None]
        return k_phase, k_phase[:, :, offset:] + powers[:, :, offset:] * gap

    def _rotate_by(self, x: Tensor, phase: Tensor) -> Tensor:
        phase = torch.remainder(phase, 2 * math.pi).float()
        phase = repeat_heads(phase, x.shape[1])
        return rotate_pairs(x, phase.cos(), phase.sin(), self.layout)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        self._check_qk(q, k)
        if q.shape[2] > k.shape[2]:
            raise ValueError(
                f"carope gives each query the phase of its own token, the key at index "
                f"i + Lk - Lq: q has length {q.shape[2]} > k length {k.shape[2]}"
            )
        k_phase, q_phase = self.phases(k, k_pos, q_pos)
        assert q_phase is not None
        return self._rotate_by(q, q_phase), self._rotate_by(k, k_phase)

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role == "k":
            self._check_head_dim(x, role)
            return self._rotate_by(x, self.phases(x, pos)[0])
        if role == "q":
            raise RuntimeError(
                "carope rotates queries with the phases of their keys: use rotate_qk "
                "(relpos.attention does)"
            )
        return x


# --------------------------------------------------------------------------- hyperbolic


@register("hyperbolic-rope")
class HyperbolicRoPE(XPos):
    """Hyperbolic rotary PE, "HoPE" of Dai et al. 2025 (arXiv 2509.05218; spec §15,
    Authority C: abstract only, no code). Not the HoPE of ``hope``.

    The abstract: RoPE's rotations become Lorentz transformations built from hyperbolic
    functions, RoPE is a special case, attention decays monotonically with distance. A 2x2
    boost ``B(phi) = [[cosh, sinh], [sinh, cosh]]`` is relative only under the Minkowski
    form ``B(a)^T eta B(b) = eta B(b - a)``, ``eta = diag(1, -1)``; along its light-cone
    directions ``(1, +-1)`` it scales by ``e^{+-phi}``, so a score ``q^T eta B((n - m)k) k``
    has one sector that decays and one that grows with distance.

    What relpos assumes: only the decaying light-cone sector is kept, one rapidity rate
    ``kappa_i > 0`` per RoPE pair. The query at ``m`` is scaled by ``e^{-kappa_i m}`` and
    the key at ``n`` by ``e^{+kappa_i n}`` on top of the rotation by ``p theta_i``, so pair
    ``i`` of the score is ``e^{-kappa_i (m - n)}`` times its RoPE term: for keys in the past
    the envelope decays strictly monotonically, ``kappa = 0`` is RoPE. Learned:
    ``log_rate (r/2,)``, ``kappa = exp(log_rate)`` (positive), initialised to
    ``-ln(zeta_i) / scale_base`` with xPos's ``zeta_i``: at init this *is* xPos, of which
    the assumed form is the learned, continuous-position generalisation.

    Like xPos it is causal (future keys would grow) and centres the exponents on the
    midpoint of each call's key positions (they cancel in ``q . k``; without it
    ``e^{kappa p}`` overflows for large p), so keys are cached raw
    (``cache_rotated_keys = False``).

    Args: ``base``, ``layout`` as for ``rope``; ``scale_base``: xPos's ``B`` for the init.
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "Dai et al. 2025 (Hyperbolic HoPE)"
    continuous = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: float = 10000.0,
        layout: str = "half",
        scale_base: float = 512.0,
    ) -> None:
        super().__init__(num_heads, head_dim, base=base, scale_base=scale_base, layout=layout)
        rates = -torch.log(self.zeta.double()) / self.scale_base
        self.log_rate = nn.Parameter(torch.log(rates).float())

    @property
    def rates(self) -> Tensor:
        """``kappa (r/2,)``: the decay rate of each pair's envelope per unit distance."""
        return self.log_rate.exp()

    def _envelope(self, pos: Tensor, center: Tensor, sign: float) -> Tensor:
        """``e^(-sign kappa (pos - center))`` in place of xPos's ``zeta^(sign (pos - c) / B)``."""
        rel = (pos.to(torch.float64) - center)[:, None, :, None]
        return torch.exp(-sign * rel * self.rates.to(torch.float64)).to(torch.float32)

    def extra_repr(self) -> str:
        return RoPE.extra_repr(self)
