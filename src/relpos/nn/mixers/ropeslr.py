"""RoPeSLR's low-rank branch: head-wise low-rank features with a learnable 3-D absolute
position embedding (Liu et al. 2026, "RoPeSLR: 3D RoPE-driven Sparse-LowRank Attention for
Efficient Diffusion Transformers", arXiv 2605.20659). A **baseline**, not a relative method: its
positions are absolute.

Only the abstract was available and no official code was found: a reconstruction. The abstract says
RoPeSLR "eschews standard linear attention for a head-wise low-rank parameterization equipped with a
learnable 3D Absolute Positional Embedding (PE) injection". Assumed here (the abstract does not
say):

* the injection is additive, on the inputs of the low-rank branch only, one learnt table per
  axis and head: ``P_h(p) = sum_a E_{h,a}[p_a]``, ``E_{h,a} (size_a, d)``, init ``N(0,
  0.02^2)`` (so the branch is position-aware from the start);
* the head-wise low-rank map is ``phi_h(x) = elu(W_h x) + 1``, ``W_h (r, d)`` per head
  (``HeadwiseLowRankFeatures``), non-negative so the denominator stays > 0;
* the branch is plain linear attention on those features, no rotation:

      z_i = phi(q~_i) . sum_j phi(k~_j) v_j^T / phi(q~_i) . sum_j phi(k~_j),
      q~_i = q_i + P(p_i),  k~_j = k_j + P(p_j)

  summed over the keys the sparse branch does not cover (``relpos.nn.mixers.sparse_lowrank``).

Because ``P`` depends on ``p_i`` and ``p_j`` separately, shifting every position changes the
output (tested): the opposite of RoLA's branch (``relpos.nn.mixers.rola``). Positions are
integers in ``0 .. size_a - 1`` per axis (``ValueError`` otherwise, naming ``pos``).

Shapes: ``q, k (B, H, L, d)``, positions ``(B|1, L, m)`` (``m = len(grid_size)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ...attention.linear.feature_maps import FeatureMap
from ...validation import check_int, check_int_sequence

__all__ = ["GridPositionEmbedding", "ropeslr_features"]


class GridPositionEmbedding(nn.Module):
    """Learnt absolute embedding of an m-D grid position, per head: ``P_h(p) = sum_a
    E_{h,a}[p_a]`` (``tables[a]`` is ``(H, size_a, head_dim)``, init ``N(0, 0.02^2)``,
    from ``seed`` when given).

    ``forward(pos (B|1, L, m) integer) -> (B|1, H, L, head_dim)`` float32."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        grid_size: Sequence[int],
        *,
        std: float = 0.02,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = check_int(num_heads, "num_heads")
        self.head_dim = check_int(head_dim, "head_dim")
        self.grid_size = tuple(check_int_sequence(grid_size, "grid_size"))
        gen = (
            None
            if seed is None
            else torch.Generator().manual_seed(check_int(seed, "seed", minimum=0))
        )
        self.tables = nn.ParameterList(
            nn.Parameter(torch.randn(self.num_heads, n, self.head_dim, generator=gen) * std)
            for n in self.grid_size
        )

    @property
    def dims(self) -> int:
        return len(self.grid_size)

    def check_positions(self, pos: Tensor, name: str = "pos") -> None:
        """``ValueError`` (naming ``name``) unless ``pos`` holds integers inside the grid."""
        if pos.is_floating_point():
            if not bool(torch.all(pos == pos.round())):
                raise ValueError(
                    f"{name} must hold integer grid positions for RoPeSLR's learnt absolute "
                    "embedding"
                )
        if pos.shape[-1] != self.dims:
            raise ValueError(
                f"{name} must have {self.dims} axes (grid_size={self.grid_size}), got "
                f"{pos.shape[-1]}"
            )
        for a, n in enumerate(self.grid_size):
            col = pos[..., a]
            if col.numel() and (bool(col.min() < 0) or bool(col.max() >= n)):
                raise ValueError(
                    f"{name}[..., {a}] must lie in 0..{n - 1} (grid_size={self.grid_size}), "
                    f"got {int(col.min())}..{int(col.max())}"
                )

    def forward(self, pos: Tensor) -> Tensor:
        self.check_positions(pos)
        idx = pos.long()
        out = None
        for a, table in enumerate(self.tables):
            part = table[:, idx[..., a]]  # (H, B, L, D)
            out = part if out is None else out + part
        assert out is not None
        return out.transpose(0, 1)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, grid_size={self.grid_size}"


def ropeslr_features(
    q: Tensor,
    k: Tensor,
    pos: Tensor,
    feature_map: FeatureMap,
    embedding: GridPositionEmbedding,
) -> tuple[Tensor, Tensor]:
    """``(phi(q + P(pos)), phi(k + P(pos)))``, each ``(B, H, L, r)`` (module docstring):
    the features of RoPeSLR's low-rank branch, computed in float32 (float64 for float64
    inputs)."""
    if embedding.num_heads != q.shape[1] or embedding.head_dim != q.shape[-1]:
        raise ValueError(
            f"the position embedding was made for (H, d) = ({embedding.num_heads}, "
            f"{embedding.head_dim}), q has ({q.shape[1]}, {q.shape[-1]})"
        )
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    pe = embedding(pos).to(dtype)
    phi_q, _ = feature_map(q.to(dtype) + pe, "q", 1.0)
    # a key log offset (random features) is one per (batch, head): it cancels in the ratio
    phi_k, _ = feature_map(k.to(dtype) + pe, "k", 1.0)
    return phi_q, phi_k
