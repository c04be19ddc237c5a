"""Inference-time position schedules on RoPE: Dual Chunk Attention, LM-Infinite, Self-Extend.

Each lets a RoPE model trained on ``Lp`` tokens read longer inputs without training by giving
every (query, key) pair rotary positions whose difference stays within what was trained.
The pair's logit is ``<R(a_ij) q_i, R(b_ij) k_j> * scale`` where ``(a_ij, b_ij)`` comes from
one of a few *pieces* (a query rotation and a key rotation each), chosen per pair:

    logit_ij = < q^r_i , k^r_j > * scale,     r = piece_index(i, j)   (-1: masked)

One softmax over the union of pieces is the papers' log-sum-exp merge of per-piece
softmaxes. The engine's piecewise hooks (``Encoding.pieces`` / ``piece_index``) evaluate it on
the ``eager`` and ``chunked`` backends; the rotations are RoPE's own (these classes subclass
``RoPE`` and accept its options: base, layout, partial_rotary_factor, scaling,
max_position_embeddings).

Positions are the sequence coordinates (integers, normally ``0..L-1``); the schedules read
them in absolute terms (chunks, groups, starting tokens), so none is ``relative``. All are
causal: a pair whose key lies after its query is masked. A query's rotation depends on which
key it meets, so keys are cached unrotated (``cache_rotated_keys = False``) and every call
rotates the whole cache.

Each schedule states its layout once, in ``key_segments`` (``Encoding``'s hook: for a block
of queries, the key ranges of every piece and the distance band in which a query sees them).
The element-wise ``piece_index`` is derived from it (``Encoding.piece_index``), and the
engine's chunked backend evaluates the same segments block by block through the fused SDPA
kernel (``relpos.attention.piecewise``): about plain-attention cost instead of the generic
probability path's several times.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar

import torch
from torch import Tensor

from ..base import KeySegment
from ..options import Bool, Float, Int
from ..registry import register
from .rope import RoPE

Piece = tuple[Tensor, Tensor]  # rotary positions (query, key) of one piece


def _floor_div(x: Tensor, n: int) -> Tensor:
    return torch.div(x, n, rounding_mode="floor")


class PiecewiseRoPE(RoPE):
    """Common parent of the RoPE schedules: RoPE rotations at per-piece positions.

    Subclasses give ``piece_positions(q_pos, k_pos)`` (the rotary positions of queries and
    keys for every piece) and ``key_segments`` (which keys each piece scores; the
    element-wise ``piece_index`` is derived from it by ``Encoding``). The
    rotations are ``RoPE.cos_sin`` + ``rotate_pairs``; a length-dependent ``scaling``
    (dynamic NTK, LongRoPE) takes one set of frequencies per call from the largest true
    position, for every piece.
    """

    relative = False
    continuous = False
    causal_only = True
    piecewise = True
    cache_rotated_keys = False

    #: small options under which a short test sequence (about 40 tokens) meets every piece
    test_options: ClassVar[dict[str, Any]] = {}

    @classmethod
    def example_options(cls) -> dict[str, Any]:
        """Options that make a short test (L of about 40) exercise every piece; the defaults
        are sized for real models and reduce to plain RoPE on short inputs."""
        return dict(cls.test_options)

    def piece_positions(self, q_pos: Tensor, k_pos: Tensor) -> list[Piece]:
        """Rotary positions ``(query (Bp, Lq), key (Bp, Lk))`` of every piece."""
        raise NotImplementedError

    def scale_queries(self, q: Tensor, q_pos: Tensor) -> Tensor:
        """A per-query factor applied before rotation (identity; Self-Extend's log scale)."""
        return q

    def logit_factor(self, q_pos: Tensor, k_pos: Tensor) -> float:
        """A factor on every logit of the call (1; DCA's optional ``mscale``)."""
        return 1.0

    def pieces(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> list[Piece]:
        self._check_qk(q, k)
        q = self.scale_queries(q, q_pos)
        seq_len = None
        if self.length_dependent:
            seq_len = int(torch.maximum(q_pos.max(), k_pos.max())) + 1
        factor = self.logit_factor(q_pos, k_pos)
        if factor != 1.0:
            q = q * factor
        # one rotation per (tensor, positions) object: pieces share their key positions
        rotated: list[tuple[Tensor, Tensor, Tensor]] = []

        def rot(x: Tensor, pos: Tensor) -> Tensor:
            for seen_x, seen_pos, out in rotated:
                if seen_x is x and seen_pos is pos:
                    return out
            out = self._rotate_at(x, pos, seq_len)
            rotated.append((x, pos, out))
            return out

        positions = list(self.piece_positions(q_pos, k_pos))
        return [(rot(q, qp), rot(k, kp)) for qp, kp in positions]


@register("dca")
class DualChunkAttention(PiecewiseRoPE):
    """Dual Chunk Attention, DCA (An et al. 2024, "Training-Free Long-Context Scaling of Large
    Language Models", arXiv 2402.17463; HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``).

    The sequence is cut into chunks of ``c = chunk_size - local_window`` positions. Keys sit
    at ``p_k mod c``. A query at ``p`` in chunk ``n = p // c`` meets

    * keys of its own chunk (intra, piece 0) from position ``p mod c``;
    * keys of chunk ``n - 1`` (successive, piece 1) from ``min(p mod c + c, chunk_size)``;
    * keys of chunks ``< n - 1`` (inter, piece 2) from ``min(2c - 1, chunk_size)``;

    so every relative distance stays ``<= chunk_size < pretraining_length``. The paper merges
    the three partial flash-attention outputs by their log-sum-exp; one softmax over the
    union is the same thing.

    Args:
        pretraining_length: ``Lp``, the trained context; default ``max_position_embeddings``,
            else 4096 (ChunkLlama's default).
        chunk_size: ``s`` (default ``3 Lp // 4``); local_window: ``w`` (default ``Lp // 8``).
        base, layout, partial_rotary_factor, scaling, max_position_embeddings: as ``rope``
            (ChunkLlama's ``scaling_factor`` is ``scaling={"rope_type": "linear", ...}``).

        mscale: scale every logit by ``m^2``, ``m = 0.05 ln(L / Lp) + 1`` for calls longer
            than ``Lp`` (``L`` = largest position + 1). ChunkLlama multiplies all its cos/sin
            tables by ``m`` (``get_mscale``; note 0.05, not YaRN's 0.1) once the input outgrows
            the table built for ``Lp``, so q and k carry one factor each; relpos assumes the
            ratio is to ``Lp``. Off by default (optional in ChunkLlama; the paper's
            results did not use it, says the code). A decoding step uses its own ``L``.
    Shapes as ``rope``; positions are integers.
    """

    paper = "An et al. 2024 (Dual Chunk Attention, ChunkLlama)"
    test_options = {"pretraining_length": 16}  # s = 12, w = 2, c = 10

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        pretraining_length: Annotated[
            int | None, Int(minimum=2, optional=True, doc="Lp, the trained context")
        ] = None,
        chunk_size: Annotated[
            int | None, Int(minimum=1, optional=True, doc="s (default 3 Lp // 4)")
        ] = None,
        local_window: Annotated[
            int | None, Int(minimum=0, optional=True, doc="w (default Lp // 8), w < s")
        ] = None,
        mscale: Annotated[bool, Bool(doc="ChunkLlama's get_mscale factor past Lp")] = False,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        self.mscale = mscale
        lp = pretraining_length
        if lp is None:
            lp = self.max_position_embeddings or 4096
        if lp < 2:
            raise ValueError(
                f"pretraining_length (default: max_position_embeddings) must be >= 2, got {lp}"
            )
        s = 3 * lp // 4 if chunk_size is None else chunk_size
        w = lp // 8 if local_window is None else local_window
        if s < 1 or w >= s:
            raise ValueError(
                f"local_window must be smaller than chunk_size (chunk length = chunk_size - "
                f"local_window >= 1), got local_window={w}, chunk_size={s}"
            )
        self.pretraining_length, self.chunk_size, self.local_window = lp, s, w
        self.chunk_len = s - w

    def logit_factor(self, q_pos: Tensor, k_pos: Tensor) -> float:
        if not self.mscale:
            return 1.0
        seq_len = int(torch.maximum(q_pos.max(), k_pos.max())) + 1
        if seq_len <= self.pretraining_length:
            return 1.0
        m = 0.05 * math.log(seq_len / self.pretraining_length) + 1.0
        return m * m

    def piece_positions(self, q_pos: Tensor, k_pos: Tensor) -> list[Piece]:
        c, s = self.chunk_len, self.chunk_size
        key = torch.remainder(k_pos, c)
        intra = torch.remainder(q_pos, c)
        successive = torch.clamp(intra + c, max=s)
        inter = torch.full_like(q_pos, min(2 * c - 1, s))
        return [(intra, key), (successive, key), (inter, key)]

    def next_break(self, position: int) -> int | None:
        return (position // self.chunk_len + 1) * self.chunk_len  # blocks stay in one chunk

    def key_segments(self, first: int | Tensor, last: int | Tensor) -> list[KeySegment]:
        c = self.chunk_len
        start = (first // c) * c  # the block's chunk (next_break keeps a block in one chunk)
        return [
            KeySegment(2, None, start - c, None, 0),  # older chunks: inter
            KeySegment(1, start - c, start, None, 0),  # previous chunk: successive
            KeySegment(0, start, last + 1, None, 0),  # own chunk: intra, causal
        ]

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, chunk_size={self.chunk_size}, "
            f"local_window={self.local_window}, chunk_len={self.chunk_len}"
            + (", mscale=True" if self.mscale else "")
        )


@register("lm-infinite")
class LMInfinite(PiecewiseRoPE):
    """LM-Infinite (Han et al. 2023, "LM-Infinite: Zero-Shot Extreme Length Generalization for
    Large Language Models", arXiv 2308.16137; Glaciohound/LM-Infinite ``models/llama.py``,
    ``models/lambda_attention.py``).

    Lambda-shaped attention with a distance cap. Key ``j`` (position ``p_j``) is visible from
    query ``i`` iff ``0 <= p_i - p_j < local_branch`` (local branch: true RoPE, piece 0) or
    ``p_j < global_branch`` (the starting tokens). Every starting token outside the local
    window is scored at the distance ``D' = min(limit_distance, kv_len - 1)`` (piece 1: the
    query rotated by ``D'`` against the *unrotated* key), as the official code does
    (``models/llama.py`` with ``lambda_attention.py``), also when ``limit_distance`` exceeds
    the window: no starting token is scored at its true distance. ``kv_len - 1`` is the
    largest position of the call, so ``D'`` is ``limit_distance`` once the sequence is
    longer than the cap. With ``limit_distance <= local_branch`` (the README's setting) that
    always holds where a starting token lies outside the window; with a larger cap, a
    KV-cache decoding step at position ``t < limit_distance`` uses ``D' = t`` (as the
    official code does), so it can differ from the same row of one call over a longer
    sequence.

    Starting tokens are those at positions ``< global_branch`` (the first tokens of the
    sequence when positions start at 0).

    Args:
        local_branch: ``n_local``; default ``max_position_embeddings``, else 4096.
        global_branch: ``n_global`` (10, the README's drop-in default; 10-100 behave alike).
        limit_distance: default ``local_branch``.
        base, layout, partial_rotary_factor, scaling, max_position_embeddings: as ``rope``.

    The optional ``triangle_offset`` log penalty and top-k attention of the repo are not
    implemented. Shapes as ``rope``; positions are integers.
    """

    paper = "Han et al. 2023 (LM-Infinite)"
    test_options = {"local_branch": 8, "global_branch": 3, "limit_distance": 6}

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        local_branch: Annotated[int | None, Int(minimum=1, optional=True, doc="n_local")] = None,
        global_branch: Annotated[int, Int(minimum=0, doc="n_global, the starting tokens")] = 10,
        limit_distance: Annotated[
            int | None, Int(minimum=0, optional=True, doc="distance cap (default n_local)")
        ] = None,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        self.local_branch = (
            local_branch if local_branch is not None else (self.max_position_embeddings or 4096)
        )
        self.global_branch = global_branch
        self.limit_distance = self.local_branch if limit_distance is None else limit_distance

    def far_distance(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``D' = min(limit_distance, kv_len - 1)`` (a 0-d tensor, no host sync): the distance
        at which every starting token outside the local window is scored, as the official
        ``models/llama.py`` does. ``kv_len - 1`` is the largest position of the call (the
        last key's; equal to the key count - 1 when positions are ``0 .. L-1``, in a full
        forward and in a KV-cache decoding step alike)."""
        top = torch.maximum(q_pos.max(), k_pos.max()) if k_pos.numel() else q_pos.new_zeros(())
        return top.clamp(min=0, max=self.limit_distance)

    def piece_positions(self, q_pos: Tensor, k_pos: Tensor) -> list[Piece]:
        far = torch.zeros_like(q_pos) + self.far_distance(q_pos, k_pos)
        return [(q_pos, k_pos), (far, torch.zeros_like(k_pos))]

    def key_segments(self, first: int | Tensor, last: int | Tensor) -> list[KeySegment]:
        n_l, n_g = self.local_branch, self.global_branch
        return [
            KeySegment(0, first - n_l + 1, last + 1, 1 - n_l, 0),  # local window: true RoPE
            KeySegment(1, None, n_g, None, -n_l),  # starting tokens beyond it: distance D'
        ]

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, local_branch={self.local_branch}, "
            f"global_branch={self.global_branch}, limit_distance={self.limit_distance}"
        )


@register("self-extend")
class SelfExtend(PiecewiseRoPE):
    """Self-Extend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without
    Tuning", arXiv 2401.01325; datamllab/LongLM ``self_extend_patch/Llama.py``).

    Two rotations: neighbour (piece 0, true RoPE positions) for keys with
    ``p_i - p_j < neighbor_window`` and grouped (piece 1) for the rest, with

        q_grp = p_i // G + W - W / G,     k_grp = p_j // G

    (``G = group_size``, ``W = neighbor_window``; a float when ``G`` does not divide ``W``,
    as in the official code). The grouped distance is then ``W`` at the window's edge and
    grows ``G`` times slower beyond. The official code drops the shift ``W - W/G`` while
    every query position is below ``W``; no pair is grouped then, so it never matters.
    Capacity: ``(Lp - W) * G + W`` tokens.

    Args:
        group_size: ``G`` (``group_size_1``, 8); neighbor_window: ``W`` (``group_size_2``,
            1024).
        log_scale_base: optional; multiplies queries by
            ``max(1, log(p_i + 1) / log(log_scale_base))`` (the repo's ``scale_base``; off by
            default). Needs non-negative positions.
        base, layout, partial_rotary_factor, scaling, max_position_embeddings: as ``rope``.

    Shapes as ``rope``; positions are integers.
    """

    paper = "Jin et al. 2024 (Self-Extend, LongLM)"
    test_options = {"group_size": 4, "neighbor_window": 6}  # W/G fractional: float positions

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        group_size: Annotated[int, Int(minimum=1, doc="G (group_size_1)")] = 8,
        neighbor_window: Annotated[int, Int(minimum=1, doc="W (group_size_2)")] = 1024,
        log_scale_base: Annotated[
            float | None, Float(above=1.0, optional=True, doc="the repo's scale_base")
        ] = None,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        self.group_size = group_size
        self.neighbor_window = neighbor_window
        self.log_scale_base = log_scale_base

    def group_shift(self) -> float | int:
        """``W - W / G``: an int when ``G`` divides ``W``."""
        w, g = self.neighbor_window, self.group_size
        return w - w // g if w % g == 0 else w - w / g

    def piece_positions(self, q_pos: Tensor, k_pos: Tensor) -> list[Piece]:
        g = self.group_size
        shift = self.group_shift()
        q_grp = _floor_div(q_pos, g)
        q_grp = q_grp + shift if isinstance(shift, int) else q_grp.to(torch.float64) + shift
        return [(q_pos, k_pos), (q_grp, _floor_div(k_pos, g))]

    def scale_queries(self, q: Tensor, q_pos: Tensor) -> Tensor:
        if self.log_scale_base is None:
            return q
        if q_pos.numel() and int(q_pos.min()) < 0:
            raise ValueError("log_scale_base needs non-negative query positions (log(p + 1))")
        factor = torch.log1p(q_pos.to(torch.float64)) / math.log(self.log_scale_base)
        return q * factor.clamp(min=1.0)[:, None, :, None].to(q.dtype)

    def key_segments(self, first: int | Tensor, last: int | Tensor) -> list[KeySegment]:
        w = self.neighbor_window
        return [
            KeySegment(1, None, last - w + 1, None, -w),  # grouped
            KeySegment(0, first - w + 1, last + 1, 1 - w, 0),  # neighbours
        ]

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, group_size={self.group_size}, "
            f"neighbor_window={self.neighbor_window}"
        )


__all__ = [
    "PiecewiseRoPE",
    "DualChunkAttention",
    "LMInfinite",
    "SelfExtend",
]
