"""The ``Encoding`` base class: the four places a relative positional encoding can act.

Every RPE changes attention through some of

    logit(h, i, j) = < R_h(p_i) q_i , R_h(p_j) k_j > * scale  +  b_h(i, j [, q_i, k_j])

* ``rotate(x, pos, role)`` — the multiplicative part ``R_h(p)`` (roles "q", "k", "v", "o");
* ``bias(ctx, b, h, i, j)`` — the additive part as an element-wise function of index tensors
  (the FlexAttention ``score_mod`` shape), so one formula serves every backend;
* ``prepare(q, k, q_pos, k_pos)`` — per-call precomputation captured by ``bias``;
* ``embed(pos, dim)`` — absolute encodings added to the token embeddings by ``relpos.nn``.

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

    def prepare(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> BiasContext:
        """Per-call precomputation for ``bias``. Positions are expanded to the batch of ``q``."""
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
