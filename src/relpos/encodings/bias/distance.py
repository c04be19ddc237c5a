"""Additive biases from positions alone: ALiBi, T5 buckets, KERPLE, FIRE.

Each ``bias_at_distance`` (or ``bias``) reads like the paper's formula and is written once;
backends broadcast it over full grids, tiles, per-distance tables, or call it as a
FlexAttention ``score_mod``. ``distance = q_pos - k_pos`` (>= 0 for keys in the past).
All biases are added after the ``1/sqrt(d)`` scaling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...functional import alibi_slopes, t5_bucket
from ...registry import register
from ..base import BiasContext, Encoding


def _per_head(
    values: float | list[float] | Tensor | None, num_heads: int, name: str
) -> Tensor | None:
    """Optional per-head initial values: a scalar, a list of H values, or None."""
    if values is None:
        return None
    t = torch.as_tensor(values, dtype=torch.float32)
    if t.dim() == 0:
        t = t.expand(num_heads).clone()
    if t.shape != (num_heads,):
        raise ValueError(
            f"{name} must be a scalar or {num_heads} per-head values, got {tuple(t.shape)}"
        )
    return t


def _inverse_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


class DistanceBias(Encoding):
    """Base of biases that depend on ``q_pos - k_pos`` only."""

    family = "bias"
    has_bias = True
    relative = True
    distance_only = True


@register("alibi")
class ALiBi(DistanceBias):
    """ALiBi (Press et al. 2021, "Train Short, Test Long", arXiv 2108.12409).

    ``b_h(i, j) = -m_h * d`` with ``d = i - j``: the causal form, the paper's. Slopes ``m_h``
    from ``functional.alibi_slopes`` (exact for any head count). relpos uses the explicit
    ``-m (i - j)`` matrix, not the ``m * j`` trick that is exact only under a causal mask.

    ``bidirectional`` picks the encoder form (formulas-bias.md section 1):

    * ``False`` / ``"causal"``: ``-m_h d`` (future keys get ``+m_h |d|``; mask them).
    * ``True`` / ``"symmetric"``: ``-m_h |d|``, the maintainers' encoder form (issue #5, NeMo).
    * ``"asymmetric"``: ``-m_h d`` for past keys (``d >= 0``) and ``-m'_h |d|`` for future
      keys, with a second slope set ``m'``: the even-indexed slopes of a ``2 T``-head model
      (``alibi_slopes(2 T)[0::2]``, ``T = total_heads``), which lie between the standard ones
      on the log scale (``m'_h = 2^(4/T) m_h`` for ``T`` a power of two). The paper and the
      spec give no slopes for this form (authority C); this default keeps the past side
      identical to ALiBi and tells the two sides apart in every head.
    * ``"shifted"``: ``-m_h (|d| - 0.5 [d > 0])``, the deterministic encoder ALiBi of
      google-deepmind/randomized_positional_encodings (formulas-bias.md section 22): past keys
      get half a slope more than future keys at the same distance.

    ``learnable_slopes=True`` makes the slopes (both sets) per-head parameters initialised to
    the values above and kept positive as ``m = exp(log_m)`` (as x-transformers'
    ``LearnedAlibiPositionalBias``; the spec has no learnable form).

    Tensor parallelism: a shard that holds heads ``head_offset .. head_offset + H - 1`` of a
    model with ``total_heads`` heads gets exactly those heads' slopes
    (``alibi_slopes(total_heads)[head_offset : head_offset + H]``); concatenating the shards'
    ``slopes`` gives the full model's.
    """

    paper = "Press et al. 2021 (ALiBi)"
    continuous = True
    FORMS = ("causal", "symmetric", "asymmetric", "shifted")

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        bidirectional: bool | str = False,
        learnable_slopes: bool = False,
        head_offset: int = 0,
        total_heads: int | None = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.form = self._form(bidirectional)
        if not isinstance(learnable_slopes, bool):
            raise TypeError(f"learnable_slopes must be a bool, got {learnable_slopes!r}")
        total = num_heads if total_heads is None else total_heads
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise ValueError(f"total_heads must be a positive int or None, got {total_heads!r}")
        if isinstance(head_offset, bool) or not isinstance(head_offset, int) or head_offset < 0:
            raise ValueError(f"head_offset must be a non-negative int, got {head_offset!r}")
        if head_offset + num_heads > total:
            raise ValueError(
                f"head_offset + num_heads must be <= total_heads: this shard holds heads "
                f"{head_offset}..{head_offset + num_heads - 1} of total_heads={total}"
            )
        self.head_offset, self.total_heads = head_offset, total
        self.learnable_slopes = learnable_slopes
        shard = slice(head_offset, head_offset + num_heads)
        self._slope_set("slopes", alibi_slopes(total)[shard])
        if self.form == "asymmetric":
            self._slope_set("future_slopes", alibi_slopes(2 * total)[0::2][shard])

    @classmethod
    def _form(cls, bidirectional: bool | str) -> str:
        if bidirectional is False:
            return "causal"
        if bidirectional is True:
            return "symmetric"
        if isinstance(bidirectional, str) and bidirectional in cls.FORMS:
            return bidirectional
        raise ValueError(
            f"bidirectional must be a bool or one of {', '.join(map(repr, cls.FORMS))}, "
            f"got {bidirectional!r}"
        )

    def _slope_set(self, name: str, values: Tensor) -> None:
        """Fixed slopes as a (non-persistent) buffer, learnable ones as ``log_<name>``."""
        if self.learnable_slopes:
            setattr(self, f"log_{name}", nn.Parameter(values.log()))
        else:
            self.register_buffer(f"_{name}", values, persistent=False)

    def _get(self, name: str) -> Tensor:
        if self.learnable_slopes:
            return getattr(self, f"log_{name}").exp()
        return getattr(self, f"_{name}")

    @property
    def bidirectional(self) -> bool:
        """Whether the bias is meant for non-causal attention (any form but ``"causal"``)."""
        return self.form != "causal"

    @property
    def slopes(self) -> Tensor:
        """``(H,)`` slopes ``m_h`` (of past keys, for the asymmetric form)."""
        return self._get("slopes")

    @property
    def future_slopes(self) -> Tensor:
        """``(H,)`` slopes of future keys: ``m'`` for the asymmetric form, ``m`` otherwise."""
        return self._get("future_slopes") if self.form == "asymmetric" else self.slopes

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        m = self.slopes
        d = distance.to(m.dtype)
        if self.form == "causal":
            return -m[h] * d
        if self.form == "symmetric":
            return -m[h] * d.abs()
        if self.form == "shifted":
            return -m[h] * (d.abs() - 0.5 * (d > 0).to(d.dtype))
        return -torch.where(d >= 0, m[h] * d, self.future_slopes[h] * -d)

    def extra_repr(self) -> str:
        out = f"{super().extra_repr()}, bidirectional={self.form!r}"
        if self.learnable_slopes:
            out += ", learnable_slopes=True"
        if self.total_heads != self.num_heads:
            out += f", head_offset={self.head_offset}, total_heads={self.total_heads}"
        return out


@register("t5")
class T5Bias(DistanceBias):
    """T5 relative-position buckets (Raffel et al. 2020; HF ``T5Attention.compute_bias``).

    ``b_h(i, j) = B[bucket(j - i), h]`` with a learned table ``B (num_buckets, H)`` initialised
    ``N(0, (num_heads * head_dim)^-1)`` (HF: ``factor * d_model^-0.5``). ``bidirectional`` picks
    the encoder (two-sided) or decoder (causal) bucketing; ``functional.t5_bucket`` has details.
    """

    paper = "Raffel et al. 2020 (T5)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        bidirectional: bool = False,
        num_buckets: int = 32,
        max_distance: int = 128,
    ) -> None:
        super().__init__(num_heads, head_dim)
        t5_bucket(
            torch.zeros(1, dtype=torch.long), num_buckets=num_buckets, max_distance=max_distance
        )
        self.bidirectional = bool(bidirectional)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        std = (num_heads * head_dim) ** -0.5
        self.table = nn.Parameter(torch.randn(num_buckets, num_heads) * std)

    def bucket(self, distance: Tensor) -> Tensor:
        """Bucket of ``relative_position = k_pos - q_pos = -distance``."""
        return t5_bucket(
            -distance,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        return self.table[self.bucket(distance), h]

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, bidirectional={self.bidirectional}, "
            f"num_buckets={self.num_buckets}, max_distance={self.max_distance}"
        )


class _Kerple(DistanceBias):
    """Shared parametrisation: per-head ``r1 > eps`` as ``eps + softplus(raw)``."""

    eps = 1e-2
    paper = "Chi et al. 2022 (KERPLE)"

    def _positive(self, init: Tensor) -> nn.Parameter:
        return nn.Parameter(_inverse_softplus((init - self.eps).clamp(min=1e-4)))

    @staticmethod
    def _abs_float(distance: Tensor, like: Tensor) -> Tensor:
        return distance.abs().to(like.dtype)


@register("kerple-log")
class KerpleLog(_Kerple):
    """KERPLE, logarithmic variant (Chi et al. 2022, arXiv 2205.09921; chijames/KERPLE).

    ``b_h(n) = -r1_h * log(1 + r2_h * n)`` with ``n = |i - j|``, per-head learned ``r1, r2 > 0``.
    Official init: ``r1 ~ 2 U(0,1)``, ``r2 ~ U(0,1)``; the official code clamps at 1e-2 each
    step, relpos keeps the constraint by parametrisation ``r = 1e-2 + softplus(raw)``.
    Causal LMs mask j > i; the ``|i - j|`` form is the bidirectional extension.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        r1: float | list[float] | None = None,
        r2: float | list[float] | None = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        r1_init = _per_head(r1, num_heads, "r1")
        r2_init = _per_head(r2, num_heads, "r2")
        if r1_init is None:
            r1_init = torch.rand(num_heads) * 2
        if r2_init is None:
            r2_init = torch.rand(num_heads)
        self.raw_r1 = self._positive(r1_init)
        self.raw_r2 = self._positive(r2_init)

    @property
    def r1(self) -> Tensor:
        return self.eps + F.softplus(self.raw_r1)

    @property
    def r2(self) -> Tensor:
        return self.eps + F.softplus(self.raw_r2)

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        r1, r2 = self.r1, self.r2
        n = self._abs_float(distance, r1)
        return -r1[h] * torch.log1p(r2[h] * n)


@register("kerple-power")
class KerplePower(_Kerple):
    """KERPLE, power variant (Chi et al. 2022, arXiv 2205.09921; chijames/KERPLE).

    ``b_h(n) = -r1_h * n^(p_h)`` with ``n = |i - j|``, ``r1 > 0`` (``1e-2 + softplus``) and the
    exponent kept in the official range ``[1e-2, 2]`` as ``p = 1e-2 + (2 - 1e-2) sigmoid(raw)``
    (a floor, so a saturated sigmoid cannot freeze the exponent at 0). Official init:
    ``r1 ~ U(0,1)``, ``p ~ 2 U(0,1)``.
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        r1: float | list[float] | None = None,
        power: float | list[float] | None = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        r1_init = _per_head(r1, num_heads, "r1")
        p_init = _per_head(power, num_heads, "power")
        if r1_init is None:
            r1_init = torch.rand(num_heads)
        if p_init is None:
            p_init = torch.rand(num_heads) * 2
        if bool(((p_init <= 0) | (p_init > 2)).any()):
            raise ValueError(f"power must lie in (0, 2], got {p_init.tolist()}")
        self.raw_r1 = self._positive(r1_init)
        frac = ((p_init - self.eps) / (2 - self.eps)).clamp(1e-6, 1 - 1e-6)
        self.raw_power = nn.Parameter(torch.log(frac) - torch.log1p(-frac))

    @property
    def r1(self) -> Tensor:
        return self.eps + F.softplus(self.raw_r1)

    @property
    def power(self) -> Tensor:
        """Exponent in ``[1e-2, 2]`` (the official clamp range), as ``eps + (2 - eps) sigmoid``."""
        return self.eps + (2 - self.eps) * torch.sigmoid(self.raw_power)

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        r1, p = self.r1, self.power
        n = self._abs_float(distance, r1)
        # n = 0 gives 0; clamp so pow's gradient w.r.t. p (n^p log n) stays finite there.
        powered = torch.pow(n.clamp(min=1.0), p[h])
        return torch.where(n == 0, torch.zeros_like(powered), -r1[h] * powered)


@register("fire")
class FIRE(Encoding):
    """FIRE, functional interpolation (Li et al. 2023, arXiv 2310.04418; paper appendix code).

    ``b_h(i, j) = f_theta( psi(i - j) / (psi(max(L, i)) + 1e-6) )_h``, ``psi(x) = log(|c x| + 1)``,
    ``f_theta = Linear(1, 32) -> ReLU -> Linear(32, H)``; learnable ``c`` (init 0.1) and threshold
    ``L = |L_multiplier * 512|`` (multiplier init 1). ``i`` is the absolute query position
    ("progressive interpolation"), so FIRE is not strictly relative. Follows the paper's
    ``max(L, i)`` (one public re-implementation uses ``min``).
    """

    family = "bias"
    paper = "Li et al. 2023 (FIRE)"
    has_bias = True
    own_init_modules = ("mlp_in",)  # the scalar-input layer keeps PyTorch's init in models
    relative = False
    continuous = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.mlp_in = nn.Linear(1, mlp_width)
        self.mlp_out = nn.Linear(mlp_width, num_heads)
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.register_buffer("init_L", torch.tensor(float(init_L)))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        self.eps = float(eps)

    def psi(self, x: Tensor) -> Tensor:
        return torch.log(torch.abs(self.c * x) + 1)

    def mlp_input(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``psi(i - j) / (psi(max(L, i)) + eps)``: in [0, 1] for every ``j <= i``."""
        i = q_pos.to(self.c.dtype)
        normaliser = self.psi(torch.maximum(self.threshold(), i)) + self.eps
        return self.psi(i - k_pos.to(self.c.dtype)) / normaliser

    def threshold(self) -> Tensor:
        """The learned threshold ``L = |L_multiplier * init_L|``."""
        return torch.abs(self.L_multiplier * self.init_L)

    def is_distance_only(self, ctx: BiasContext) -> bool:
        # Below the threshold the normaliser is psi(L) for every query: a function of i - j.
        if ctx.q_pos.numel() == 0 or ctx.q_pos.is_floating_point():
            return False
        return bool(ctx.q_pos.max() < self.threshold())

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        """FIRE for queries below the threshold (normaliser ``psi(L)``)."""
        u = self.psi(distance.to(self.c.dtype)) / (self.psi(self.threshold()) + self.eps)
        return self.readout(u, h)

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return self.readout(self.mlp_input(ctx.q_pos[b, i], ctx.k_pos[b, j]), h)

    def readout(self, u: Tensor, h: Tensor) -> Tensor:
        """``f_theta(u)`` for head(s) ``h`` (broadcast against ``u``)."""
        w_in, b_in = self.mlp_in.weight[:, 0], self.mlp_in.bias
        w_out, b_out = self.mlp_out.weight[h], self.mlp_out.bias[h]
        if h.dim() == 0:
            # One score at a time (FlexAttention's score_mod must be pointwise): unrolled sum.
            out = b_out
            for unit in range(w_in.shape[0]):
                out = out + torch.relu(u * w_in[unit] + b_in[unit]) * w_out[unit]
            return out
        hidden = torch.relu(u[..., None] * w_in + b_in)
        every_head = torch.arange(self.num_heads, device=h.device).view(1, -1, 1, 1)
        if u.dim() == 4 and u.shape[1] == 1 and h.shape == every_head.shape:
            if torch.equal(h, every_head):
                # A (B, 1, T, S) grid for all heads: one (.., 32) @ (32, H) matmul, no
                # (B, H, T, S, 32) broadcast.
                out = torch.matmul(hidden[:, 0], self.mlp_out.weight.t()) + self.mlp_out.bias
                return out.permute(0, 3, 1, 2)
        # Other index shapes: contract the hidden units with head h's output row.
        return torch.einsum("...k,...k->...", hidden, w_out) + b_out


__all__ = ["ALiBi", "T5Bias", "KerpleLog", "KerplePower", "FIRE"]
