"""``SparseLowRankAttention``: a block-sparse softmax branch with RoPE plus a zero-initialised
low-rank branch over the blocks it does not cover (RoLA, seed 26; RoPeSLR, seed 96, as a
baseline; combined as SLA, arXiv 2509.24006). ``relpos.efficient.sparse_lowrank`` holds the
math and states what was assumed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from ..efficient.feature_maps import FeatureMap, HeadwiseLowRankFeatures, LowRankFeatures
from ..efficient.rola import rotary_schedule, select_frequencies
from ..efficient.ropeslr import GridPositionEmbedding
from ..efficient.sparse_lowrank import (
    LOWRANK_BRANCHES,
    BlockSelection,
    rotate_queries_keys,
    select_blocks,
    sparse_lowrank_attention,
)
from ..encodings.base import Encoding
from ..validation import check_bool, check_choice, check_float, check_int, check_int_sequence
from .attention import build_encoding
from .head_projections import ProjectedHeads

__all__ = ["SparseLowRankAttention"]


class SparseLowRankAttention(ProjectedHeads, nn.Module):
    """Multi-head sparse + low-rank self-attention (``relpos.efficient.sparse_lowrank``).

    ``O = O_sparse + W O_lowrank`` per head, then ``out_proj``: ``O_sparse`` is softmax
    attention of the encoding-rotated q, k over the covered key blocks (the local
    neighbourhood plus the top pooled-score blocks, ``1 - sparsity`` of the visible blocks),
    ``O_lowrank`` the low-rank linear attention over the other keys, and ``W`` a
    ``(head_dim, head_dim)`` projection shared by the heads, initialised to zero (the layer
    starts as block-sparse attention; SLA's ``proj_l``, here without a bias so that a row
    with no visible key stays 0).

    Args:
        dim, num_heads: model width and heads.
        encoding: the model's rotary encoding: ``"rope"``, ``"rope-axial"`` with
            ``encoding_options={"dims": 3}`` (Wan2.1 / HunyuanVideo 3-D RoPE), ``"m-rope"``,
            ... or an instance.
        lowrank: ``"rola"`` (RoPE outside a low-rank feature map, on ``rank / 2`` pairs of
            the encoding's schedule chosen by ``frequency_subset``: relative) or
            ``"ropeslr"`` (head-wise low-rank features plus a learnt absolute position
            embedding of a grid of ``grid_size``: absolute, a baseline).
        rank: the low-rank bottleneck ``r`` (default ``head_dim``; even for RoLA).
        block_size, sparsity, local_radius: the block pattern (``select_blocks``).
        grid_size: RoPeSLR's table sizes per position axis (one per ``encoding.dims``);
            positions must lie inside.
        feature_map: a ``FeatureMap`` with ``rank`` features instead of the default one.
        seed: seeds the default feature map and position tables.
        checkpoint_chunks: recompute the sparse branch's chunks in the backward pass (O(L)
            training memory instead of O(L K b), for about one more forward of the branch).

    ``forward(x (B, L, dim), pos=None, causal=False, mask=None, selection=None) -> (B, L,
    dim)``: positions ``(L[, m])`` or ``(B|1, L[, m])`` (default ``0..L-1`` on every axis;
    a 3-D grid: ``relpos.positions_nd.grid_positions(T, H, W)``), ``mask (B, L)`` bool
    (False: padded token), ``selection`` a fixed ``BlockSelection``. No KV cache: the block
    selection reads the whole sequence.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        encoding: str | Encoding = "rope",
        *,
        encoding_options: dict[str, Any] | None = None,
        lowrank: str = "rola",
        rank: int | None = None,
        block_size: int = 64,
        sparsity: float = 0.9,
        local_radius: int | None = 0,
        frequency_subset: str | Sequence[int] = "lowest",
        grid_size: Sequence[int] | None = None,
        feature_map: FeatureMap | None = None,
        seed: int | None = None,
        bias: bool = False,
        checkpoint_chunks: bool = False,
    ) -> None:
        super().__init__()
        dim, num_heads = check_int(dim, "dim"), check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.lowrank = check_choice(lowrank, "lowrank", LOWRANK_BRANCHES)
        self.checkpoint_chunks = check_bool(checkpoint_chunks, "checkpoint_chunks")
        self.block_size = check_int(block_size, "block_size")
        self.sparsity = check_float(sparsity, "sparsity", minimum=0.0, maximum=1.0)
        if local_radius is not None:
            local_radius = check_int(local_radius, "local_radius", minimum=0)
        self.local_radius = local_radius
        self.frequency_subset = frequency_subset
        enc = build_encoding(encoding, num_heads, self.head_dim, encoding_options or {})
        assert enc is not None
        schedule = rotary_schedule(enc)  # a rotary encoding with one schedule, or refused
        self.encoding = enc
        if feature_map is not None:
            if rank is not None and rank != feature_map.num_features:
                raise ValueError(
                    f"rank ({rank}) must equal the feature map's num_features "
                    f"({feature_map.num_features})"
                )
        else:
            rank = self.head_dim if rank is None else check_int(rank, "rank", minimum=2)
            if self.lowrank == "rola":
                feature_map = LowRankFeatures(self.head_dim, rank, seed=seed)
            else:
                feature_map = HeadwiseLowRankFeatures(num_heads, self.head_dim, rank, seed=seed)
        self.feature_map = feature_map
        self.rank = feature_map.num_features
        self.position_embedding: GridPositionEmbedding | None = None
        if self.lowrank == "rola":
            if grid_size is not None:
                raise ValueError("grid_size is RoPeSLR's (lowrank='ropeslr'); RoLA adds no tables")
            select_frequencies(schedule, self.rank, frequency_subset)  # checks now
        else:
            if grid_size is None:
                raise ValueError(
                    "lowrank='ropeslr' needs grid_size: the learnt table size per position "
                    f"axis ({enc.dims} axes for encoding {enc.name!r})"
                )
            sizes = check_int_sequence(grid_size, "grid_size", length=enc.dims)
            self.position_embedding = GridPositionEmbedding(
                num_heads, self.head_dim, sizes, seed=seed
            )
        self._build_projections(bias)
        self.lowrank_proj = nn.Linear(self.head_dim, self.head_dim, bias=False)
        nn.init.zeros_(self.lowrank_proj.weight)

    def select(
        self, x: Tensor, pos: Tensor | None = None, causal: bool = False, mask: Tensor | None = None
    ) -> BlockSelection:
        """The block pattern ``forward`` would use for ``x`` (for inspection or reuse)."""
        q, k = self._heads(self.q_proj(x)), self._heads(self.kv_proj(x)[..., : self.dim])
        dims = self.position_embedding.dims if self.position_embedding else self.encoding.dims
        rq, rk, _ = rotate_queries_keys(self.encoding, q, k, pos, max(1, dims))
        return select_blocks(
            rq,
            rk,
            block_size=self.block_size,
            sparsity=self.sparsity,
            local_radius=self.local_radius,
            causal=causal,
            key_valid=mask,
        )

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        causal: bool = False,
        mask: Tensor | None = None,
        selection: BlockSelection | None = None,
    ) -> Tensor:
        q, k, v = self._project(x)
        out = sparse_lowrank_attention(
            q,
            k,
            v,
            self.encoding,
            self.feature_map,
            block_size=self.block_size,
            sparsity=self.sparsity,
            local_radius=self.local_radius,
            causal=causal,
            pos=pos,
            key_valid=mask,
            lowrank=self.lowrank,
            frequency_subset=self.frequency_subset,
            position_embedding=self.position_embedding,
            projection=self.lowrank_proj,
            selection=selection,
            checkpoint_chunks=self.checkpoint_chunks,
        )
        assert isinstance(out, Tensor)
        return self._merge(out)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, lowrank={self.lowrank!r}, "
            f"rank={self.rank}, block_size={self.block_size}, sparsity={self.sparsity}, "
            f"local_radius={self.local_radius}"
        )
