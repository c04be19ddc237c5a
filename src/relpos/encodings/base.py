"""The ``Encoding`` base class: the four places a relative positional encoding can act.

Every RPE changes attention through some of

    logit(h, i, j) = < R_h(p_i) q_i , R_h(p_j) k_j > * scale  +  b_h(i, j [, q_i, k_j])

* ``rotate(x, pos, role)`` — the multiplicative part ``R_h(p)`` (roles "q", "k", "v", "o");
* ``bias(ctx, b, h, i, j)`` — the additive part as an element-wise function of index tensors
  (the FlexAttention ``score_mod`` shape), so one formula serves every backend;
* ``prepare(q, k, q_pos, k_pos, inputs)`` — per-call precomputation captured by ``bias``
  (e.g. ``q @ E_rel^T``), reading optional per-call ``inputs`` (graphs, boxes);
* ``embed(pos, dim)`` — absolute encodings added to the token embeddings by ``relpos.nn``.

Three further hooks change the attention weights themselves (backends that only take an
additive score modification, SDPA and FlexAttention, cannot run them; ``eager`` and
``chunked`` can, see ``needs_probabilities``):

* ``value_term(ctx, p, b, h, i, j)`` — an extra output term ``sum_j p_ij a^V_ij`` (Shaw's
  relative value embeddings, iRPE contextual values);
* ``prob_multiplier(ctx, b, h, i, j)`` — an element-wise factor on the softmax weights (URPE);
* ``pieces(q, k, q_pos, k_pos)`` + ``piece_index(ctx, b, h, i, j)`` — piecewise rotary logits:
  the logit of pair (i, j) is ``<q^r_i, k^r_j>`` for the piece ``r = piece_index(i, j)``
  (-1 masks the pair). Dual Chunk Attention, Self-Extend and LM-Infinite are of this form;
  one softmax over the union of pieces equals merging the pieces by log-sum-exp.

Subclasses set capability flags (class attributes) that backends read to pick a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn


@dataclass
class BiasContext:
    """What ``prepare`` computes once per call and ``bias`` reads.

    ``q_pos`` and ``k_pos`` are expanded to the batch: ``(B, Lq[, m])`` and ``(B, Lk[, m])``.
    ``extra`` holds encoding-specific precomputations (e.g. ``q @ E_rel^T``).
    """

    q_pos: Tensor
    k_pos: Tensor
    extra: dict[str, Tensor] = field(default_factory=dict)
    #: the logit scale of the call (set by the backends after ``prepare``): bias terms that
    #: read q or k (``q @ E_rel^T``) are multiplied by it, as the content term is.
    scale: float = 1.0


class Encoding(nn.Module):
    """Base class of every relpos encoding. Identity everywhere unless a subclass overrides.

    Capability flags:
        family: "none", "absolute", "rotary" or "bias".
        relative: logits depend on positions only through ``q_pos - k_pos``.
        distance_only: ``bias`` is ``bias_at_distance(h, q_pos - k_pos)``; lets the chunked
            backend tabulate it per distance (O(L) memory, Toeplitz views, diagonal-sum grads).
        causal_only: meant for causal attention only (a warning-free contract, see docs).
        dims: number of position axes (1 for sequences).
        continuous: accepts floating-point positions.
        has_rotary / has_bias / adds_to_input: which of the hooks are active.
        max_positions: for learned tables, positions must lie in ``[0, max_positions)``.
        cache_rotated_keys: keys may be cached after ``rotate`` (their rotation never depends
            on later tokens). False makes ``relpos.nn`` cache raw keys and re-rotate.
        has_value_term / multiplies_probs / piecewise: which of the weight-changing hooks are
            active (see the module docstring); any of them sets ``needs_probabilities``.
        required_inputs / optional_inputs: per-call tensors the encoding reads, passed as
            ``relpos.attention(..., inputs={name: tensor})``: ``{name: expected form}``.
    """

    name: ClassVar[str] = ""
    family: ClassVar[str] = "none"
    paper: ClassVar[str] = ""
    relative: ClassVar[bool] = True
    distance_only: ClassVar[bool] = False
    causal_only: ClassVar[bool] = False
    dims: ClassVar[int] = 1
    continuous: ClassVar[bool] = False
    has_rotary: ClassVar[bool] = False
    has_bias: ClassVar[bool] = False
    adds_to_input: ClassVar[bool] = False
    cache_rotated_keys: ClassVar[bool] = True
    has_value_term: ClassVar[bool] = False
    multiplies_probs: ClassVar[bool] = False
    piecewise: ClassVar[bool] = False
    required_inputs: ClassVar[dict[str, str]] = {}
    optional_inputs: ClassVar[dict[str, str]] = {}
    #: True when the encoding cannot run without per-call inputs even though each of them is
    #: optional (graphs: an adjacency *or* precomputed distances)
    needs_inputs: ClassVar[bool] = False

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        for arg, value in (("num_heads", num_heads), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{arg} must be a positive int, got {value!r}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.max_positions: int | None = None

    # ----------------------------------------------------------------- capabilities
    @property
    def learnable(self) -> bool:
        """True when the encoding has trainable parameters."""
        return any(p.requires_grad for p in self.parameters())

    @property
    def needs_probabilities(self) -> bool:
        """The encoding changes the attention weights beyond an additive score term (value
        terms, multiplied probabilities, piecewise logits): only the ``eager`` and
        ``chunked`` backends run it."""
        return self.has_value_term or self.multiplies_probs or self.piecewise

    @property
    def needs_context(self) -> bool:
        """Whether the backends must call ``prepare`` (any hook that reads a ``BiasContext``)."""
        return self.has_bias or self.needs_probabilities

    def default_scale(self, head_dim: int) -> float:
        """The logit scale used when the caller passes ``scale=None``: ``head_dim ** -0.5``
        (DeBERTa overrides it: three terms share ``1/sqrt(3 d)``)."""
        return head_dim**-0.5

    @classmethod
    def example_options(cls) -> dict:
        """Options for short tests (L of a few dozen) that exercise every part of the
        encoding; the defaults may be sized for real models (e.g. DCA's chunks) and reduce to
        a simpler encoding at test lengths. The conformance suite uses them."""
        return {}

    def fast_attention(self, call) -> Tensor | None:
        """An optional faster exact evaluation of this call for encodings with
        ``needs_probabilities`` (``call``: an ``AttentionCall``), used by the chunked backend
        instead of its generic probability path; None = use the generic path."""
        return None

    @classmethod
    def example_inputs(
        cls, batch: int, length_q: int, length_k: int, generator: torch.Generator
    ) -> dict[str, Tensor]:
        """Valid random ``inputs`` for a call of these lengths (tests, docs). Encodings with
        ``required_inputs`` override this."""
        return {}

    # ----------------------------------------------------------------- hooks
    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        """Multiplicative part. ``x (B, H, L, D)``, ``pos (B|1, L[, m])``. Identity here."""
        return x

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Rotate queries and keys together (override when the pair shares state, e.g. xPos
        centres both on one reference position). Default: ``rotate`` each."""
        return self.rotate(q, q_pos, "q"), self.rotate(k, k_pos, "k")

    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor] | None = None,
    ) -> BiasContext:
        """Per-call precomputation for ``bias``. Positions are expanded to the batch of ``q``.

        ``inputs`` holds the per-call tensors named in ``required_inputs`` /
        ``optional_inputs`` (already checked for presence by the backends)."""
        batch = q.shape[0]
        return BiasContext(
            q_pos=q_pos.expand(batch, *q_pos.shape[1:]),
            k_pos=k_pos.expand(batch, *k_pos.shape[1:]),
        )

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """Additive logit bias at (batch b, head h, query index i, key index j).

        The index tensors broadcast against each other (full grids, tiles, or 0-d tensors
        inside FlexAttention). The default reads positions from ``ctx`` and calls
        ``bias_at_distance`` for ``distance_only`` encodings.
        """
        if not self.distance_only:
            raise RuntimeError(f"encoding {self.name!r} has no additive bias")
        return self.bias_at_distance(h, ctx.q_pos[b, i] - ctx.k_pos[b, j])

    def is_distance_only(self, ctx: BiasContext) -> bool:
        """Whether, for this call, ``bias == bias_at_distance(h, q_pos - k_pos)``.

        True for ``distance_only`` encodings; an encoding may also say so for some calls only
        (FIRE, while every query position lies below its threshold).
        """
        return self.distance_only

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        """Bias of head ``h`` at ``distance = q_pos - k_pos`` (distance-only encodings)."""
        raise RuntimeError(f"encoding {self.name!r} is not a distance-only bias")

    def distance_table(self, low: int, high: int, device: torch.device) -> Tensor:
        """``bias_at_distance`` tabulated for distances ``low .. high``: shape ``(H, n)``."""
        h = torch.arange(self.num_heads, device=device)[:, None]
        d = torch.arange(low, high + 1, device=device)[None, :]
        return self.bias_at_distance(h, d).expand(self.num_heads, d.shape[1])

    def value_term(
        self, ctx: BiasContext, p: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        """Extra output ``(B, H, T, Dv)`` from the softmax weights ``p (B, H, T, S)`` of query
        indices ``i (T,)`` and key indices ``j (S,)`` (``b``, ``h`` are index grids as for
        ``bias``). Summed over key blocks, so it must be linear in ``p``."""
        raise RuntimeError(f"encoding {self.name!r} has no value term")

    def prob_multiplier(
        self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        """Element-wise factor applied to the softmax weights before they weight the values."""
        raise RuntimeError(f"encoding {self.name!r} does not multiply the attention weights")

    def pieces(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> list[tuple[Tensor, Tensor]]:
        """Piecewise encodings: the rotated ``(q_r, k_r)`` of every piece ``r``."""
        raise RuntimeError(f"encoding {self.name!r} is not piecewise")

    def piece_index(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """Piecewise encodings: which piece gives the logit of (b, h, i, j); -1 = masked."""
        raise RuntimeError(f"encoding {self.name!r} is not piecewise")

    def embed(self, pos: Tensor, dim: int) -> Tensor:
        """Absolute embedding ``(B|1, L, dim)`` added to token embeddings (absolute family)."""
        raise RuntimeError(f"encoding {self.name!r} adds nothing to the input")

    def check_positions(self, pos: Tensor, name: str) -> None:
        """Raise if ``pos`` lies outside a learned table. Called by every backend."""
        if self.max_positions is None or pos.numel() == 0:
            return
        lo, hi = int(pos.min()), int(pos.max())
        if lo < 0 or hi >= self.max_positions:
            raise ValueError(
                f"{name} spans positions {lo}..{hi}, but encoding {self.name!r} has a learned "
                f"table for positions 0..{self.max_positions - 1} (max_positions="
                f"{self.max_positions})"
            )

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}"
