"""``ProjectedHeads``: the q / kv / out projections of a self-attention layer that works on
head-split tensors outside ``MultiHeadAttention`` (the ``relpos.efficient`` layers:
``RelFlexformerAttention``, ``RoLAAttention``, ``SparseLowRankAttention``).

``x (B, L, dim)`` -> ``q, k, v (B, H, L, dim / H)`` through ``q_proj`` and one ``kv_proj``
(``dim -> 2 dim``, split in halves); a head-split output ``(B, H, L, dim / H)`` -> ``(B, L,
dim)`` through ``out_proj``. A mixin for ``nn.Module`` subclasses that set ``dim``,
``num_heads`` and ``head_dim`` and call ``_build_projections`` where their weights are
created (so the parameter order, and the initial weights under a seed, stay the layer's own).
"""

from __future__ import annotations

from torch import Tensor, nn


class ProjectedHeads:
    """Mixin: ``q_proj``, ``kv_proj``, ``out_proj`` and the head split / merge around them."""

    dim: int
    num_heads: int
    head_dim: int
    q_proj: nn.Linear
    kv_proj: nn.Linear
    out_proj: nn.Linear

    def _build_projections(self, bias: bool) -> None:
        self.q_proj = nn.Linear(self.dim, self.dim, bias=bias)
        self.kv_proj = nn.Linear(self.dim, 2 * self.dim, bias=bias)
        self.out_proj = nn.Linear(self.dim, self.dim, bias=bias)

    def _heads(self, t: Tensor) -> Tensor:
        """``(B, L, dim)`` -> ``(B, H, L, head_dim)``."""
        B, L, _ = t.shape
        return t.view(B, L, self.num_heads, self.head_dim).transpose(1, 2)

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, L, {self.dim}), got {tuple(x.shape)}")

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``q, k, v (B, H, L, head_dim)`` of ``x (B, L, dim)`` (shape checked)."""
        self._check_input(x)
        q = self._heads(self.q_proj(x))
        k, v = (self._heads(t) for t in self.kv_proj(x).chunk(2, dim=-1))
        return q, k, v

    def _merge(self, out: Tensor) -> Tensor:
        """``(B, H, L, head_dim)`` -> ``out_proj`` of ``(B, L, dim)``."""
        B, _, L, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, L, self.dim))
