"""Positional attention: attention weights from positions only (Back de Luca, Giapitzakis,
Yang, Velickovic, Fountoulakis, ICML 2025, "Positional Attention: Expressivity and
Learnability of Algorithmic Computation", arXiv 2410.01686).

No code was found; the formula comes from a third-party summary of the paper, not from its
text or code.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from ...functional import sinusoidal_table
from ..base import Encoding
from ..options import Choice, Int
from ..registry import register

__all__ = ["PositionalAttention"]


BASIS = Choice(choices=("one-hot", "sinusoidal"), doc="the fixed positional matrix P")


@register("positional-attention")
class PositionalAttention(Encoding):
    """Positional attention (Back de Luca et al. 2025, arXiv 2410.01686; reconstructed from a
    summary of the paper, no code found).

        A^(h) = softmax( (P W_Q^h)(P W_K^h)^T  [+ mask] ),      out = A^(h) (X W_V^h)

    The logits depend on the positions only: the content queries and keys are replaced by
    ``P(q_pos) W_Q^h`` and ``P(k_pos) W_K^h`` (``rotate_qk``; ``(B, H, L, key_dim)``), the
    values stay ``X W_V``. So the weights are the same for every input, and fused SDPA /
    flex run it without a bias. ``P`` is the fixed positional matrix:

    * ``basis="one-hot"`` (default; ``P = I``): ``P W = W[pos]``, a learned
      query and key vector per position ``0 .. max_positions - 1``;
    * ``basis="sinusoidal"``: ``P = sinusoidal_table(pos, basis_dim)`` (any position, also
      fractional ones).

    Following the formula, the logits are not scaled: ``default_scale`` is 1 (pass ``scale`` to
    change it). ``W`` is initialised ``N(0, s^2)`` with ``P W`` entries of std ``key_dim^-1/4``, so
    the initial logits have unit variance (kept by ``relpos.nn``). Assumptions (no code exists to
    check them against): per-head ``W_Q``, ``W_K`` of width ``key_dim`` (default ``head_dim``),
    one-hot or sinusoidal ``P``, no logit scale. In ``relpos.nn`` models every
    layer builds its q and k from the positions (``TransformerLM(encoding=
    "positional-attention")``).
    """

    paper = "Back de Luca et al. 2025 (positional attention)"
    relative = False
    has_rotary = True
    keeps_own_init = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        basis: Annotated[str, BASIS] = "one-hot",
        max_positions: Annotated[
            int, Int(doc="positions of the one-hot basis (0 .. max_positions - 1)")
        ] = 1024,
        basis_dim: Annotated[int, Int(minimum=2, doc="width of the sinusoidal basis (even)")] = 64,
        key_dim: Annotated[
            int | None, Int(optional=True, doc="width of P W_Q and P W_K (None: head_dim)")
        ] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        if basis == "sinusoidal" and basis_dim % 2:
            raise ValueError(f"basis_dim must be even for the sinusoidal basis, got {basis_dim}")
        self.basis, self.basis_dim = basis, basis_dim
        self.key_dim = head_dim if key_dim is None else key_dim
        rows = max_positions if basis == "one-hot" else basis_dim
        std = self.key_dim**-0.25 * (1.0 if basis == "one-hot" else (2.0 / basis_dim) ** 0.5)
        self.w_q = nn.Parameter(torch.randn(num_heads, rows, self.key_dim) * std)
        self.w_k = nn.Parameter(torch.randn(num_heads, rows, self.key_dim) * std)
        if basis == "one-hot":
            self.max_positions = max_positions
        self.continuous = basis == "sinusoidal"

    @classmethod
    def example_options(cls) -> dict:
        return {"max_positions": 1024}

    def default_scale(self, head_dim: int) -> float:
        """1: the logits are ``(P W_Q)(P W_K)^T`` as they are."""
        return 1.0

    def project(self, pos: Tensor, weight: Tensor) -> Tensor:
        """``P(pos) W`` for positions ``(B|1, L)``: ``(B|1, H, L, key_dim)`` float32."""
        if self.basis == "one-hot":
            self.check_positions(pos, "pos")
            return weight[:, pos].transpose(0, 1)
        table = sinusoidal_table(pos, self.basis_dim).to(weight.dtype)  # (B|1, L, basis_dim)
        return torch.einsum("blp,hpk->bhlk", table, weight)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Content is dropped: ``(P(q_pos) W_Q, P(k_pos) W_K)``, in the dtype of q."""
        return self.rotate(q, q_pos, "q"), self.rotate(k, k_pos, "k")

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        """Queries / keys ``x (B, H|Hkv, L, D)`` -> ``P(pos) W (B, H, L, key_dim)``. ``x`` stays
        in the graph with a zero gradient (optimisers and DDP see every projection)."""
        if role not in ("q", "k"):
            return x
        p = self.project(pos, self.w_q if role == "q" else self.w_k).to(x.dtype)
        return p + 0.0 * x[..., :1].sum(1, keepdim=True)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, basis={self.basis!r}, key_dim={self.key_dim}"
