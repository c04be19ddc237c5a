"""More additive biases: Sandwich, dynamic position bias, Cable, URPE.

* ``sandwich`` (Chi et al. 2023): the inner product of sinusoidal embeddings as a bias,
  scaled per head ALiBi-style (parameter-free, distance-only).
* ``dynamic-position-bias`` (CrossFormer / x-transformers): an MLP over (log-)distances.
* ``cable`` (context-aware biases): per-token learned slopes, accumulated along the sequence.
* ``urpe`` (Luo et al. 2022): a Toeplitz bias plus a Toeplitz matrix that multiplies the
  softmax weights.

The two distance-only biases with a costly per-distance formula (Sandwich's sum of cosines, the
MLP) share ``TabulatedDistanceBias``: each call evaluates the formula once per distinct
integer distance and every backend gathers from that table, so the chunked backend's Toeplitz
path stays O(L) and FlexAttention gets a pointwise ``score_mod``.
Formulas, authority levels and reference values: ``../shared/spec/formulas-bias.md``
sections 5 (Sandwich), 7 (Cable), 20 (URPE).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...functional import _check_bool, _check_int
from ...registry import register
from ..base import BiasContext, Encoding
from .distance import DistanceBias


def _accurate_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device has it (tables are O(L): exactness is cheap), else float32."""
    return torch.float32 if device.type == "mps" else torch.float64


def _distance_range(ctx: BiasContext) -> tuple[int, int] | None:
    """Smallest and largest ``q_pos - k_pos`` of the call (integer positions), else None."""
    if ctx.q_pos.is_floating_point() or ctx.q_pos.numel() == 0 or ctx.k_pos.numel() == 0:
        return None
    low = ctx.q_pos.amin(1) - ctx.k_pos.amax(1)
    high = ctx.q_pos.amax(1) - ctx.k_pos.amin(1)
    return int(low.min()), int(high.max())


# --------------------------------------------------------------------------- shared parent
class TabulatedDistanceBias(DistanceBias):
    """A distance-only bias evaluated once per distinct distance of each call.

    Subclasses give ``table_at(distance (n,)) -> (H, n)`` (all heads at once) and an
    element-wise ``bias_at_distance`` (used for floating positions, or when the positions of
    a call are so sparse that their distances span more than ``table_limit`` values).
    ``prepare`` tabulates the bias over the call's distance range ``[low, high]``
    (``extra["table"] (H, high - low + 1)``, ``extra["low"]``); ``bias`` gathers from it, a
    pointwise ``score_mod`` for FlexAttention. The chunked Toeplitz path and the dense SDPA
    bias call ``distance_table`` directly: one evaluation per distance there too.
    """

    #: tabulate at most max(4 (Lq + Lk), 65536) distances per call
    TABLE_MIN = 1 << 16

    def table_at(self, distance: Tensor) -> Tensor:
        """The bias of every head at integer ``distance (n,)``: ``(H, n)``."""
        raise NotImplementedError

    def distance_table(self, low: int, high: int, device: torch.device) -> Tensor:
        return self.table_at(torch.arange(low, high + 1, device=device))

    def table_limit(self, length_q: int, length_k: int) -> int:
        return max(4 * (length_q + length_k), self.TABLE_MIN)

    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor] | None = None,
    ) -> BiasContext:
        ctx = super().prepare(q, k, q_pos, k_pos, inputs)
        span = _distance_range(ctx)
        if span is not None and span[1] - span[0] < self.table_limit(q.shape[2], k.shape[2]):
            ctx.extra["table"] = self.distance_table(span[0], span[1], q.device)
            ctx.extra["low"] = torch.tensor(span[0], device=q.device)
        return ctx

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        distance = ctx.q_pos[b, i] - ctx.k_pos[b, j]
        table = ctx.extra.get("table")
        if table is None:
            return self.bias_at_distance(h, distance)
        return table[h, distance - ctx.extra["low"]]


# --------------------------------------------------------------------------- Sandwich
@register("sandwich")
class Sandwich(TabulatedDistanceBias):
    """Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of
    Receptive Field Analysis", arXiv 2212.10356). Parameter-free.

    ``b_h(n) = (sum_{k=1}^{d/2} cos(n / base^(2k/d)) - d/2) / (8 (h + 1) / H)`` with
    ``n = |i - j|`` and heads ``h = 0 .. H-1``: the inner product ``p_i . p_j`` of sinusoidal
    embeddings minus its maximum ``d/2``, compressed per head like ALiBi's slopes. Note the
    frequency index starts at ``k = 1`` (as the NeMo port, spec section 5, authority B: no
    code by the authors was found). ``dim`` (``d``) defaults to ``head_dim`` (NeMo's
    ``hidden_size`` per head; the OpenNLPLab reproduction uses ``2 * head_dim``) and must be
    even. ``b <= 0``, ``b(0) = 0``; the bias is symmetric in ``i - j`` (NeMo's causal form
    zeroes future distances, which the causal mask hides anyway). Added after the
    ``1/sqrt(d)`` scaling, not scaled.
    """

    paper = "Chi et al. 2023 (Sandwich)"
    continuous = True

    def __init__(
        self, num_heads: int, head_dim: int, *, dim: int | None = None, base: float = 10000.0
    ) -> None:
        super().__init__(num_heads, head_dim)
        dim = head_dim if dim is None else dim
        if _check_int(dim, "dim") % 2:
            raise ValueError(f"dim must be even (d/2 frequencies), got {dim}")
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
            raise ValueError(f"base must be a number > 1, got {base!r}")
        self.dim, self.base = dim, float(base)
        k = torch.arange(1, dim // 2 + 1, dtype=torch.float64)
        self.register_buffer("inv_freq", base ** (-2.0 * k / dim), persistent=False)
        compression = 8.0 * torch.arange(1, num_heads + 1, dtype=torch.float64) / num_heads
        self.register_buffer("compression", compression, persistent=False)

    def _inner_product(self, n: Tensor) -> Tensor:
        """``sum_k cos(n w_k) - d/2`` for ``n >= 0`` (any shape; 0-d inside FlexAttention)."""
        inv_freq = self.inv_freq.to(n.dtype)
        if n.dim() == 0:  # FlexAttention's score_mod must stay pointwise: unrolled sum
            total = torch.zeros_like(n)
            for w in range(inv_freq.shape[0]):
                total = total + torch.cos(n * inv_freq[w])
            return total - self.dim / 2
        return torch.cos(n[..., None] * inv_freq).sum(-1) - self.dim / 2

    def table_at(self, distance: Tensor) -> Tensor:
        wide = _accurate_dtype(distance.device)
        n = distance.abs().to(wide)
        out = self._inner_product(n)[None, :] / self.compression.to(wide)[:, None]
        return out.float()

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        n = distance.abs().float()
        return self._inner_product(n) / self.compression.float()[h]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, dim={self.dim}, base={self.base}"


# --------------------------------------------------------------------------- dynamic bias
@register("dynamic-position-bias")
class DynamicPositionBias(TabulatedDistanceBias):
    """Dynamic position bias: a continuous MLP over (log-)distances (CrossFormer, Wang et al.
    2021, arXiv 2108.00154, ``DynamicPosBias``; 1-D as lucidrains/x-transformers
    ``DynamicPositionBias``). No spec section: authority B (x-transformers read).

    ``b_h(i, j) = MLP(x)_h`` with ``x = i - j`` (signed), or ``sign(x) log(|x| + 1)`` with
    ``log_distance=True``. ``MLP = [Linear(1, w), (LayerNorm), act] + (depth - 1) x
    [Linear(w, w), (LayerNorm), act] + Linear(w, H)``; ``act`` SiLU (x-transformers) or ReLU
    (CrossFormer), ``norm`` adds the LayerNorms (CrossFormer has them). Defaults are
    x-transformers': ``depth = 2``, ``width = num_heads * head_dim // 4`` (its ``dim // 4``),
    no norm, no log. PyTorch's default Linear init. Integer positions only (as both sources);
    each call evaluates the MLP once per distinct distance (``TabulatedDistanceBias``), O(L).
    Positions so sparse that a call spans more than ``table_limit`` distances are evaluated
    pair by pair instead: eager, sdpa and chunked handle that, FlexAttention cannot compile
    an MLP inside its ``score_mod`` (use ``chunked`` for such calls).
    """

    paper = "Wang et al. 2021 (CrossFormer dynamic position bias)"
    ACTIVATIONS = {"silu": nn.SiLU, "relu": nn.ReLU}
    own_init_modules = ("mlp.0",)  # the scalar-input layer keeps PyTorch's init in models

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        width: int | None = None,
        depth: int = 2,
        log_distance: bool = False,
        norm: bool = False,
        activation: str = "silu",
    ) -> None:
        super().__init__(num_heads, head_dim)
        width = max(num_heads * head_dim // 4, 1) if width is None else width
        _check_int(width, "width")
        _check_int(depth, "depth")
        self.log_distance = _check_bool(log_distance, "log_distance")
        _check_bool(norm, "norm")
        if activation not in self.ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(self.ACTIVATIONS)}, got {activation!r}"
            )
        layers: list[nn.Module] = []
        for n_in in [1] + [width] * (depth - 1):
            layers.append(nn.Linear(n_in, width))
            if norm:
                layers.append(nn.LayerNorm(width))
            layers.append(self.ACTIVATIONS[activation]())
        layers.append(nn.Linear(width, num_heads))
        self.mlp = nn.Sequential(*layers)
        self.width, self.depth, self.norm, self.activation = width, depth, norm, activation

    def mlp_input(self, distance: Tensor) -> Tensor:
        """``x = i - j`` or ``sign(x) log(|x| + 1)``, as a float tensor of the same shape."""
        x = distance.to(self.mlp[0].weight.dtype)
        return torch.sign(x) * torch.log1p(x.abs()) if self.log_distance else x

    def table_at(self, distance: Tensor) -> Tensor:
        return self.mlp(self.mlp_input(distance)[:, None]).t()

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        # Element-wise fallback (sparse positions): every head at every distance, then pick h.
        every = self.mlp(self.mlp_input(distance)[..., None])  # (..., H)
        h = h.expand(torch.broadcast_shapes(h.shape, distance.shape))
        every = every.expand(*h.shape, self.num_heads)
        return torch.gather(every, -1, h[..., None]).squeeze(-1)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, width={self.width}, depth={self.depth}, "
            f"log_distance={self.log_distance}, norm={self.norm}, activation={self.activation!r}"
        )


# --------------------------------------------------------------------------- Cable
@register("cable")
class Cable(Encoding):
    """Cable, context-aware biases for length extrapolation (axiomlab/Cable, ``src/Cable.py``;
    spec section 7, authority A).

    Per token ``t`` and head ``h`` a learned score ``u_{t,h}``; its softplus is the token's
    own "slope", accumulated along the sequence:

        c_{t,h} = sum_{s <= t} softplus(u_{s,h})        (the official b = -c)
        b_h(i, j) = -(c_{i,h} - c_{j,h}) = -sum_{s=j+1}^{i} softplus(u_{s,h})   for j <= i

    ``<= 0``, ``0`` on the diagonal; ALiBi is the case ``softplus(u) = m_h``. ``i`` and ``j``
    index tokens in sequence order (query ``i`` is key token ``i + Lk - Lq``, the causal
    alignment), so positions are not read at all. For future keys (non-causal calls) relpos
    uses ``-|c_i - c_j|`` (a symmetric extension; the paper is decoder-only and masks them).

    What ``u`` is computed from. The official code applies ``Linear(n_embd, H)`` to the layer
    input ``x`` (after ``ln_1``). At the attention level relpos has the keys, so by default
    ``u_{t,h} = w_h . k_{t,g(h)} + beta_h`` with ``w (H, head_dim)``, ``beta (H,)``, and
    ``g(h)`` the key head of query head ``h`` (grouped-query attention). Since
    ``k = W_k x``, this is the official projection restricted to the row space of ``W_k``;
    it needs nothing but the keys, so decoding with a KV cache works unchanged (each call
    re-accumulates ``c`` over the cached keys, O(L)). With ``input_dim=C`` the encoding owns
    the official ``Linear(C, H)`` and reads the hidden states as
    ``inputs={"x": (B, Lk, C)}`` (the ``Lk`` key tokens; with a KV cache the caller keeps
    ``x`` of every cached token). Init: nanoGPT's (weights ``N(0, 0.02^2)``, bias 0), so
    ``softplus(u) ~ ln 2`` at init: ALiBi with slope ~0.693 on every head.

    Scale: the official code does not divide ``q . k`` by ``sqrt(d)`` (``q / sqrt(C / n_embd)``
    with ``C == n_embd``); relpos follows it by default (``default_scale = 1``) and
    ``scaled=True`` restores ``1/sqrt(head_dim)``. A ``scale=`` passed to ``relpos.attention``
    overrides both.
    """

    paper = "Cable (axiomlab, context-aware biases for length extrapolation)"
    family = "bias"
    has_bias = True
    continuous = True
    optional_inputs = {
        "x": "(B, Lk, input_dim) float hidden states of the key tokens (needs input_dim=...)"
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        input_dim: int | None = None,
        scaled: bool = False,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.scaled = _check_bool(scaled, "scaled")
        if isinstance(init_std, bool) or not isinstance(init_std, (int, float)) or init_std < 0:
            raise ValueError(f"init_std must be a non-negative number, got {init_std!r}")
        self.input_dim = None if input_dim is None else _check_int(input_dim, "input_dim")
        if self.input_dim is None:
            self.weight = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)
            self.bias_u = nn.Parameter(torch.zeros(num_heads))
        else:
            self.proj = nn.Linear(self.input_dim, num_heads)
            nn.init.normal_(self.proj.weight, std=init_std)
            nn.init.zeros_(self.proj.bias)

    def default_scale(self, head_dim: int) -> float:
        return head_dim**-0.5 if self.scaled else 1.0

    def token_scores(self, k: Tensor, inputs: dict[str, Tensor]) -> Tensor:
        """``u (B, H, Lk)``: from ``inputs["x"]`` with ``input_dim``, else from the keys."""
        x = inputs.get("x")
        if self.input_dim is None:
            if x is not None:
                raise ValueError(
                    "inputs['x'] is read only by a cable encoding created with input_dim=C "
                    "(the hidden size of x); this one computes its scores from the keys"
                )
            keys = k.repeat_interleave(self.num_heads // k.shape[1], dim=1)
            return (
                torch.einsum("bhld,hd->bhl", keys.to(self.weight.dtype), self.weight)
                + (self.bias_u[:, None])
            )
        B, Lk = k.shape[0], k.shape[2]
        if x is None:
            raise ValueError(
                f"this cable encoding (input_dim={self.input_dim}) needs "
                f"inputs={{'x': (B, Lk, {self.input_dim}) hidden states of the key tokens}}"
            )
        if not x.is_floating_point():
            raise TypeError(f"inputs['x'] must be a floating-point tensor, got {x.dtype}")
        if x.shape != (B, Lk, self.input_dim):
            raise ValueError(
                f"inputs['x'] must have shape (B, Lk, input_dim) = {(B, Lk, self.input_dim)}, "
                f"got {tuple(x.shape)}"
            )
        return self.proj(x.to(self.proj.weight.dtype)).transpose(1, 2)

    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor] | None = None,
    ) -> BiasContext:
        ctx = super().prepare(q, k, q_pos, k_pos, inputs)
        Lq, Lk = q.shape[2], k.shape[2]
        if Lq > Lk:
            raise ValueError(
                f"cable reads each query's token among the keys (query i is key i + Lk - Lq): "
                f"q has {Lq} queries but k only {Lk} keys"
            )
        u = self.token_scores(k, inputs or {})
        # cumulative "position" c_t in float64 (float32 elsewhere), stored in float32
        c = torch.cumsum(F.softplus(u).to(_accurate_dtype(u.device)), dim=-1).float()
        ctx.extra["c_k"] = c
        ctx.extra["c_q"] = c[..., Lk - Lq :]
        return ctx

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return -(ctx.extra["c_q"][b, h, i] - ctx.extra["c_k"][b, h, j]).abs()

    def extra_repr(self) -> str:
        out = f"{super().extra_repr()}, scaled={self.scaled}"
        return out + (f", input_dim={self.input_dim}" if self.input_dim is not None else "")


# --------------------------------------------------------------------------- URPE
def urpe_bucket(
    relative_position: Tensor, num_buckets: int = 64, max_distance: int = 128
) -> Tensor:
    """URPE's signed bucket of ``relative_position = j - i`` (lsj2408/URPE
    ``relative_position_bucket``, then ``bucket[bucket >= 0] += 2`` and the shift to 0), in
    ``[0, num_buckets]``.

    With ``half = num_buckets // 2`` and ``exact = half // 2``: ``n = |j - i|`` is its own
    bucket below ``exact``, then ``exact + floor(log(n / exact) / log(max_distance / exact) *
    (half - exact))`` capped at ``half - 1``; the sign is kept, ``+2`` for ``j >= i``, and
    everything moves up by ``half - 1`` (the official code subtracts the table's minimum,
    which is ``-(half - 1)`` once ``max_seq_len`` reaches the capped bucket).
    """
    half = num_buckets // 2
    exact = half // 2
    n = relative_position.abs()
    large = exact + (
        torch.log(n.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (half - exact)
    ).to(torch.long)
    large = large.clamp(max=half - 1)
    bucket = torch.where(n < exact, n, large) * torch.sign(relative_position)
    return torch.where(bucket >= 0, bucket + 2, bucket) + (half - 1)


@register("urpe")
class URPE(DistanceBias):
    """URPE, universal RPE (Luo et al. 2022, "Your Transformer May Not be as Powerful as You
    Expect", arXiv 2205.13401; lsj2408/URPE; spec section 20, authority A).

        Attn = ( softmax(Q K^T / sqrt(d) + B) * C ) V          (element-wise *, no renormalising)

    with Toeplitz ``B_h(i, j) = beta[idx(j - i), h]`` and ``C_h(i, j) = gamma[idx(j - i), h]``.
    Rows of ``softmax * C`` need not sum to 1: that is the point of URPE. ``beta`` is
    initialised ``N(0, 0.02^2)`` (BERT init) and ``gamma`` to 1 (``--constant-init-ur-attn``),
    so training starts as plain RPE attention.

    Tables: by default one row per offset (the paper's ``--rel-pos-unique --ur-attn-unique``),
    ``(2 max_length - 1, H)`` each, ``idx = j - i + max_length - 1``; a call whose distances
    exceed ``max_length - 1`` raises ``ValueError`` (any absolute positions are fine).
    ``num_buckets=n`` uses the official signed buckets instead (``urpe_bucket``, ``n + 1``
    rows, any length; official default ``n = 64``, ``max_distance = 128``). The official code
    computes B and C once and shares them across layers: share one encoding module
    (``relpos.nn.TransformerLM`` does by default). Padded keys get weight 0 from the mask.
    Needs the attention weights: backends ``eager`` and ``chunked`` only.
    """

    paper = "Luo et al. 2022 (URPE)"
    multiplies_probs = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_length: int = 2048,
        num_buckets: int | None = None,
        max_distance: int = 128,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.max_length = _check_int(max_length, "max_length")
        if num_buckets is not None:
            _check_int(num_buckets, "num_buckets")
            _check_int(max_distance, "max_distance")
            if num_buckets < 4 or max_distance <= num_buckets // 4:
                raise ValueError(
                    f"num_buckets must be >= 4 and max_distance > num_buckets // 4, got "
                    f"num_buckets={num_buckets}, max_distance={max_distance}"
                )
        if isinstance(init_std, bool) or not isinstance(init_std, (int, float)) or init_std < 0:
            raise ValueError(f"init_std must be a non-negative number, got {init_std!r}")
        self.num_buckets, self.max_distance = num_buckets, max_distance
        rows = 2 * max_length - 1 if num_buckets is None else num_buckets + 1
        self.beta = nn.Parameter(torch.randn(rows, num_heads) * init_std)
        self.gamma = nn.Parameter(torch.ones(rows, num_heads))

    def index(self, distance: Tensor) -> Tensor:
        """Table row of ``distance = i - j`` (offset ``j - i = -distance``)."""
        if self.num_buckets is None:
            return self.max_length - 1 - distance
        return urpe_bucket(-distance, self.num_buckets, self.max_distance)

    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor] | None = None,
    ) -> BiasContext:
        ctx = super().prepare(q, k, q_pos, k_pos, inputs)
        span = _distance_range(ctx)
        if self.num_buckets is None and span is not None:
            far = max(-span[0], span[1])
            if far >= self.max_length:
                raise ValueError(
                    f"q_pos and k_pos are up to {far} apart, but urpe has tables for offsets "
                    f"-{self.max_length - 1}..{self.max_length - 1} (max_length="
                    f"{self.max_length}); create it with a larger max_length or num_buckets"
                )
        return ctx

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        return self.beta[self.index(distance), h]

    def prob_multiplier(
        self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        return self.gamma[self.index(ctx.q_pos[b, i] - ctx.k_pos[b, j]), h]

    def extra_repr(self) -> str:
        if self.num_buckets is None:
            return f"{super().extra_repr()}, max_length={self.max_length}"
        return (
            f"{super().extra_repr()}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}"
        )


__all__ = [
    "TabulatedDistanceBias",
    "Sandwich",
    "DynamicPositionBias",
    "Cable",
    "URPE",
    "urpe_bucket",
]
