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

``piecewise_sdpa_attention`` (``PiecewiseRoPE.fast_attention``) evaluates the same attention
through the fused SDPA kernel, from the key ranges each schedule declares per query block
(``key_segments``): about plain-attention cost instead of the generic path's several times
(numbers in the helper's report; the backends do not call it yet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..positions import as_span
from ..registry import register
from .base import BiasContext
from .rotary import RoPE

if TYPE_CHECKING:
    from ..attention.call import AttentionCall

Piece = tuple[Tensor, Tensor]  # rotary positions (query, key) of one piece


@dataclass(frozen=True)
class KeySegment:
    """Keys at positions ``lo <= p_j < hi`` (None: unbounded), scored with ``piece`` by every
    query ``i`` of a block with ``d_min <= p_j - p_i <= d_max`` (None: unbounded)."""

    piece: int
    lo: int | None
    hi: int | None
    d_min: int | None
    d_max: int | None


def _positive_int(value: object, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _floor_div(x: Tensor, n: int) -> Tensor:
    return torch.div(x, n, rounding_mode="floor")


class PiecewiseRoPE(RoPE):
    """Common parent of the RoPE schedules: RoPE rotations at per-piece positions.

    Subclasses give ``piece_positions(q_pos, k_pos)`` (the rotary positions of queries and
    keys for every piece) and ``piece_index`` (which piece scores pair ``(i, j)``). The
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

    def key_segments(self, first: int, last: int) -> list[KeySegment]:
        """For a block of queries at positions ``first .. last`` (consecutive integers):
        the key ranges of every piece and the distance band in which a query of the block
        sees them (``piecewise_sdpa_attention``). Must agree with ``piece_index``."""
        raise NotImplementedError

    def next_break(self, position: int) -> int | None:
        """The first query position after ``position`` where a block of
        ``piecewise_sdpa_attention`` must end (None: anywhere)."""
        return None

    def fast_attention(self, call: AttentionCall) -> Tensor | None:
        """This call's attention through ``piecewise_sdpa_attention`` (the fused kernel) — the
        same result as the engine's probability path, several times faster; the chunked
        backend (and ``auto`` above the dense limit) calls it."""
        return piecewise_sdpa_attention(call)

    def pieces(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> list[Piece]:
        self._check_qk(q, k)
        q = self.scale_queries(q, q_pos)
        seq_len = None
        if self.length_dependent:
            seq_len = int(torch.maximum(q_pos.max(), k_pos.max())) + 1
        rotated: dict[tuple[int, int], Tensor] = {}  # one rotation per (tensor, positions)

        def rot(x: Tensor, pos: Tensor) -> Tensor:
            key = (id(x), id(pos))
            if key not in rotated:
                rotated[key] = self._rotate_at(x, pos, seq_len)
            return rotated[key]

        return [(rot(q, qp), rot(k, kp)) for qp, kp in self.piece_positions(q_pos, k_pos)]


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

    Not implemented: the optional query temperature ``0.05 ln(L / Lp) + 1`` of some ports.
    Shapes as ``rope``; positions are integers.
    """

    paper = "An et al. 2024 (Dual Chunk Attention, ChunkLlama)"
    test_options = {"pretraining_length": 16}  # s = 12, w = 2, c = 10 (spec R.11)

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        pretraining_length: int | None = None,
        chunk_size: int | None = None,
        local_window: int | None = None,
        base: float = 10000.0,
        layout: str = "half",
        partial_rotary_factor: float = 1.0,
        scaling: dict | None = None,
        max_position_embeddings: int | None = None,
    ) -> None:
        super().__init__(
            num_heads,
            head_dim,
            base=base,
            layout=layout,
            partial_rotary_factor=partial_rotary_factor,
            scaling=scaling,
            max_position_embeddings=max_position_embeddings,
        )
        if pretraining_length is None:
            pretraining_length = max_position_embeddings or 4096
        lp = _positive_int(pretraining_length, "pretraining_length", minimum=2)
        s = _positive_int(3 * lp // 4 if chunk_size is None else chunk_size, "chunk_size")
        w = lp // 8 if local_window is None else local_window
        w = _positive_int(w, "local_window", minimum=0)
        if w >= s:
            raise ValueError(
                f"local_window must be smaller than chunk_size (chunk length = chunk_size - "
                f"local_window >= 1), got local_window={w}, chunk_size={s}"
            )
        self.pretraining_length, self.chunk_size, self.local_window = lp, s, w
        self.chunk_len = s - w

    def piece_positions(self, q_pos: Tensor, k_pos: Tensor) -> list[Piece]:
        c, s = self.chunk_len, self.chunk_size
        key = torch.remainder(k_pos, c)
        intra = torch.remainder(q_pos, c)
        successive = torch.clamp(intra + c, max=s)
        inter = torch.full_like(q_pos, min(2 * c - 1, s))
        return [(intra, key), (successive, key), (inter, key)]

    def piece_index(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        qp, kp = ctx.q_pos[b, i], ctx.k_pos[b, j]
        cq, ck = _floor_div(qp, self.chunk_len), _floor_div(kp, self.chunk_len)
        piece = torch.where(ck == cq, 0, torch.where(ck == cq - 1, 1, 2))
        return torch.where(kp > qp, -1, piece)

    def next_break(self, position: int) -> int | None:
        return (position // self.chunk_len + 1) * self.chunk_len  # blocks stay in one chunk

    def key_segments(self, first: int, last: int) -> list[KeySegment]:
        c = self.chunk_len
        start = (first // c) * c  # the block's chunk
        return [
            KeySegment(2, None, start - c, None, 0),  # older chunks: inter
            KeySegment(1, start - c, start, None, 0),  # previous chunk: successive
            KeySegment(0, start, last + 1, None, 0),  # own chunk: intra, causal
        ]

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, chunk_size={self.chunk_size}, "
            f"local_window={self.local_window}, chunk_len={self.chunk_len}"
        )


@register("lm-infinite")
class LMInfinite(PiecewiseRoPE):
    """LM-Infinite (Han et al. 2023, "LM-Infinite: Zero-Shot Extreme Length Generalization for
    Large Language Models", arXiv 2308.16137; Glaciohound/LM-Infinite ``models/llama.py``,
    ``models/lambda_attention.py``).

    Lambda-shaped attention with a distance cap. Key ``j`` (position ``p_j``) is visible from
    query ``i`` iff ``0 <= p_i - p_j < local_branch`` (local branch: true RoPE, piece 0) or
    ``p_j < global_branch`` (the starting tokens). A starting token outside the local window
    is scored at distance ``min(p_i - p_j, limit_distance)``: the true rotation below the
    limit, else (piece 1) the query rotated by ``limit_distance`` against the *unrotated*
    key, as the official code does. The official code uses ``min(limit, kv_len - 1)`` as
    that distance, which depends on the length of the call; it equals ``limit_distance``
    whenever ``limit_distance <= local_branch`` (the README's setting), and relpos keeps the
    per-pair cap so a KV-cache decode equals the full forward.

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
        local_branch: int | None = None,
        global_branch: int = 10,
        limit_distance: int | None = None,
        base: float = 10000.0,
        layout: str = "half",
        partial_rotary_factor: float = 1.0,
        scaling: dict | None = None,
        max_position_embeddings: int | None = None,
    ) -> None:
        super().__init__(
            num_heads,
            head_dim,
            base=base,
            layout=layout,
            partial_rotary_factor=partial_rotary_factor,
            scaling=scaling,
            max_position_embeddings=max_position_embeddings,
        )
        if local_branch is None:
            local_branch = max_position_embeddings or 4096
        self.local_branch = _positive_int(local_branch, "local_branch")
        self.global_branch = _positive_int(global_branch, "global_branch", minimum=0)
        limit = self.local_branch if limit_distance is None else limit_distance
        self.limit_distance = _positive_int(limit, "limit_distance", minimum=0)

    def piece_positions(self, q_pos: Tensor, k_pos: Tensor) -> list[Piece]:
        capped = torch.full_like(q_pos, self.limit_distance)
        return [(q_pos, k_pos), (capped, torch.zeros_like(k_pos))]

    def piece_index(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        qp, kp = ctx.q_pos[b, i], ctx.k_pos[b, j]
        d = qp - kp
        starting = torch.where(d < self.limit_distance, 0, 1)
        piece = torch.where(kp < self.global_branch, starting, -1)
        piece = torch.where(d < self.local_branch, 0, piece)
        return torch.where(d < 0, -1, piece)

    def key_segments(self, first: int, last: int) -> list[KeySegment]:
        n_l, n_g, limit = self.local_branch, self.global_branch, self.limit_distance
        return [
            KeySegment(0, first - n_l + 1, last + 1, 1 - n_l, 0),  # local window
            KeySegment(0, None, n_g, 1 - limit, -n_l),  # starting tokens below the cap
            KeySegment(1, None, n_g, None, -max(n_l, limit)),  # starting tokens, capped
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
        group_size: int = 8,
        neighbor_window: int = 1024,
        log_scale_base: float | None = None,
        base: float = 10000.0,
        layout: str = "half",
        partial_rotary_factor: float = 1.0,
        scaling: dict | None = None,
        max_position_embeddings: int | None = None,
    ) -> None:
        super().__init__(
            num_heads,
            head_dim,
            base=base,
            layout=layout,
            partial_rotary_factor=partial_rotary_factor,
            scaling=scaling,
            max_position_embeddings=max_position_embeddings,
        )
        self.group_size = _positive_int(group_size, "group_size")
        self.neighbor_window = _positive_int(neighbor_window, "neighbor_window")
        if log_scale_base is not None and (
            isinstance(log_scale_base, bool)
            or not isinstance(log_scale_base, (int, float))
            or not log_scale_base > 1
        ):
            raise ValueError(f"log_scale_base must be a number > 1 or None, got {log_scale_base!r}")
        self.log_scale_base = None if log_scale_base is None else float(log_scale_base)

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

    def piece_index(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        d = ctx.q_pos[b, i] - ctx.k_pos[b, j]
        return torch.where(d < 0, -1, torch.where(d < self.neighbor_window, 0, 1))

    def key_segments(self, first: int, last: int) -> list[KeySegment]:
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


# ---------------------------------------------------------------------------- fast evaluation
# query rows per block of piecewise_sdpa_attention: Lk / 4, at least PIECEWISE_MIN_ROWS (fewer,
# larger kernel calls: per-call overhead dominated 256-row blocks on a busy 2-core machine), at
# most PIECEWISE_BLOCK_ELEMENTS / Lk (the block's mask and scores)
PIECEWISE_BLOCK_ELEMENTS = 1 << 24
PIECEWISE_MIN_ROWS = 256


def piecewise_sdpa_attention(call: AttentionCall) -> Tensor:
    """Piecewise logits through the fused SDPA kernel: the result of the engine's
    probability path (``dense.block_attention``), several times faster.

    For a block of query rows, keys are copied once per piece that scores them for some row
    of the block, and laid out on ``R`` channel slots: ``q_aug = [q^0 | .. | q^{R-1}]``, a
    copy for piece ``r`` holds ``k^r`` in slot ``r`` and zeros elsewhere, so
    ``<q_aug_i, k_aug_(j, r)> = <q^r_i, k^r_j>``. A boolean mask lets row ``i`` see copy
    ``(j, r)`` only where ``piece_index(i, j) == r`` and the causal / user masks allow
    ``j``; values are zero-padded to the same width (the CPU flash kernel needs one head
    dim). One SDPA call per block is one softmax over the union of pieces.

    Positions that are one batch-shared integer range and no user mask take the *segment*
    layout: the encoding's ``key_segments`` names, per block, the key ranges of each piece
    and the distance band in which a row sees them, so the copies are slices and the mask
    two comparisons (LM-Infinite then costs O(L * window), not O(L^2)). Anything else takes
    the *per-pair* layout from ``piece_index`` over the block. For CPU inference (no
    gradients) the segment layout skips the slots: one flash-kernel call per key range and
    piece, merged by log-sum-exp as the papers do (plain-attention multiply-adds).

    Cost: about ``R`` times the multiply-adds of plain attention over the visited keys,
    O(block x L) memory, differentiable (blocks run under activation checkpointing when
    gradients are on). The encoding must have no bias, value term or weight multiplier,
    and a ``piece_index`` that does not depend on the head.
    """
    enc = call.encoding
    assert enc is not None and call.pieces is not None and call.ctx is not None
    if call.has_bias or enc.has_value_term or enc.multiplies_probs:
        raise ValueError("piecewise_sdpa_attention takes piecewise logits only")
    B, _, Lq, _ = call.q.shape
    Lk = call.k.shape[2]
    rows = max(PIECEWISE_MIN_ROWS, min(Lk // 4, PIECEWISE_BLOCK_ELEMENTS // max(Lk, 1)))
    q_span, k_span = as_span(call.ctx.q_pos), as_span(call.ctx.k_pos)
    segmented = (
        isinstance(enc, PiecewiseRoPE) and q_span is not None and k_span is not None
    ) and not call.has_user_mask
    batches = [slice(None)]
    if not segmented and call.ctx.q_pos.shape[0] > 1 and not _shared(call):
        batches = [slice(b, b + 1) for b in range(B)]
    outs = []
    for bs in batches:
        parts, s = [], 0
        while s < Lq:
            e = min(s + rows, Lq)
            if segmented:
                assert q_span is not None and k_span is not None and isinstance(enc, PiecewiseRoPE)
                cut = enc.next_break(q_span.start + s)
                if cut is not None:
                    e = min(e, max(s + 1, cut - q_span.start))
                kind = _LSEBlock if _lse_ok(call) else _SegmentBlock
                block = kind(call, s, e, q_span.start, k_span.start)
            else:
                block = _PairBlock(call, bs, s, e)
            args = [t[bs] for qk in call.pieces for t in qk] + [call.v[bs]]
            if torch.is_grad_enabled():
                parts.append(checkpoint(block, *args, use_reentrant=False))
            else:
                parts.append(block(*args))
            s = e
        outs.append(torch.cat(parts, dim=2))
    return torch.cat(outs, dim=0)


def _shared(call: AttentionCall) -> bool:
    assert call.ctx is not None
    qp, kp = call.ctx.q_pos, call.ctx.k_pos
    return bool((qp == qp[:1]).all() and (kp == kp[:1]).all())


def _sdpa_slots(call: AttentionCall, tensors: tuple[Tensor, ...], s: int, e: int, copies):
    """SDPA over slot-laid-out copies: ``copies`` is a list of ``(piece, key index tensor or
    slice, additive mask (.., T, n))``."""
    n_pieces = len(tensors) // 2
    v = tensors[-1]
    D, Dv = call.q.shape[-1], v.shape[-1]
    width = max(n_pieces * D, Dv)
    ks, vs, masks = [], [], []
    for r, cols, mask in copies:
        kr = tensors[2 * r + 1]
        kc = kr[:, :, cols] if isinstance(cols, slice) else kr.index_select(2, cols)
        ks.append(F.pad(kc, (r * D, width - (r + 1) * D)))
        vs.append(v[:, :, cols] if isinstance(cols, slice) else v.index_select(2, cols))
        masks.append(mask)
    q_aug = torch.cat([tensors[2 * r][:, :, s:e] for r in range(n_pieces)], dim=-1)
    q_aug = F.pad(q_aug, (0, width - n_pieces * D))
    k_aug = torch.cat(ks, dim=2)
    v_aug = F.pad(torch.cat(vs, dim=2), (0, width - Dv))
    shape = torch.broadcast_shapes(*(m.shape[:-1] for m in masks))
    mask = torch.cat([m.expand(*shape, m.shape[-1]) for m in masks], dim=-1)
    if call.groups > 1:
        k_aug = k_aug.repeat_interleave(call.groups, dim=1)
        v_aug = v_aug.repeat_interleave(call.groups, dim=1)
    out = F.scaled_dot_product_attention(q_aug, k_aug, v_aug, attn_mask=mask, scale=call.scale)
    return out[..., :Dv]


class _PairBlock:
    """Query rows ``start:end``, per-pair layout from ``piece_index`` (a ``checkpoint``
    callable)."""

    def __init__(self, call: AttentionCall, bs: slice, start: int, end: int) -> None:
        self.call, self.bs, self.start, self.end = call, bs, start, end

    def __call__(self, *tensors: Tensor) -> Tensor:
        call, s, e = self.call, self.start, self.end
        enc, ctx = call.encoding, call.ctx
        assert enc is not None and ctx is not None
        kend = min(call.k.shape[2], e + call.causal_offset) if call.causal else call.k.shape[2]
        dev = tensors[-1].device
        b = torch.tensor([0 if self.bs.start is None else self.bs.start], device=dev)
        b = b[:, None, None, None]
        i = torch.arange(s, e, device=dev)[None, None, :, None]
        j = torch.arange(kend, device=dev)[None, None, None, :]
        index = enc.piece_index(ctx, b, torch.zeros_like(b), i, j)[0, 0]  # (T, S)
        allowed = call.mask_block(s, e, kend, torch.float32)
        if allowed is not None and allowed.dim() == 4:
            allowed = allowed[self.bs]
        copies = []
        for r in range(len(tensors) // 2):
            hit = index == r
            cols = hit.any(dim=0).nonzero().squeeze(1)
            if cols.numel():
                m = torch.where(hit[:, cols], 0.0, float("-inf"))
                if allowed is not None:
                    m = m + allowed.index_select(-1, cols)
                copies.append((r, cols, m.to(tensors[0].dtype)))
        return _sdpa_slots(call, tensors, s, e, copies)


class _SegmentBlock:
    """Query rows ``start:end`` with positions ``q0 + t``, keys ``k0 + j``: the layout from
    the encoding's ``key_segments`` (slices and a distance-band mask)."""

    def __init__(self, call: AttentionCall, start: int, end: int, q0: int, k0: int) -> None:
        self.call, self.start, self.end, self.q0, self.k0 = call, start, end, q0, k0

    def __call__(self, *tensors: Tensor) -> Tensor:
        call, s, e, q0, k0 = self.call, self.start, self.end, self.q0, self.k0
        enc = call.encoding
        assert isinstance(enc, PiecewiseRoPE)
        Lk = call.k.shape[2]
        dev = tensors[-1].device
        causal_max = call.causal_offset + k0 - q0 if call.causal else None  # on p_j - p_i
        t = torch.arange(q0 + s, q0 + e, device=dev)[:, None]
        copies = []
        for seg in enc.key_segments(q0 + s, q0 + e - 1):
            lo = 0 if seg.lo is None else min(max(seg.lo - k0, 0), Lk)
            hi = Lk if seg.hi is None else min(max(seg.hi - k0, 0), Lk)
            d_max = seg.d_max if causal_max is None else min_opt(seg.d_max, causal_max)
            if lo >= hi or (d_max is not None and seg.d_min is not None and seg.d_min > d_max):
                continue
            d = torch.arange(k0 + lo, k0 + hi, device=dev)[None, :] - t
            ok = torch.ones_like(d, dtype=torch.bool)
            if d_max is not None:
                ok &= d <= d_max
            if seg.d_min is not None:
                ok &= d >= seg.d_min
            copies.append((seg.piece, slice(lo, hi), ok))
        if not copies:
            raise ValueError("piecewise_sdpa_attention: a query block sees no key")
        return _sdpa_slots(call, tensors, s, e, copies)


def min_opt(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def _lse_ok(call: AttentionCall) -> bool:
    """The log-sum-exp merge uses the CPU flash kernel's private op, which returns the
    log-sum-exp but no gradient for it: inference on CPU only."""
    return (
        call.q.device.type == "cpu"
        and not torch.is_grad_enabled()
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
    )


class _LSEBlock(_SegmentBlock):
    """The segment layout without slots: one flash-kernel call per key range and piece (its
    fully visible part without a mask, its band edges with one), merged by their
    log-sum-exp as in the papers (ChunkLlama's ``merge_attn_outputs``). Same multiply-adds as
    plain attention; CPU inference only (``_lse_ok``)."""

    def __call__(self, *tensors: Tensor) -> Tensor:
        call, s, e, q0, k0 = self.call, self.start, self.end, self.q0, self.k0
        enc = call.encoding
        assert isinstance(enc, PiecewiseRoPE)
        Lk, dev, dtype = call.k.shape[2], tensors[-1].device, tensors[0].dtype
        first, last = q0 + s, q0 + e - 1
        causal_max = call.causal_offset + k0 - q0 if call.causal else None
        B, H, T, g = call.q.shape[0], call.q.shape[1], e - s, call.groups
        v = tensors[-1]
        outs, lses = [], []
        for seg in enc.key_segments(first, last):
            lo = 0 if seg.lo is None else min(max(seg.lo - k0, 0), Lk)
            hi = Lk if seg.hi is None else min(max(seg.hi - k0, 0), Lk)
            d_min = seg.d_min
            d_max = seg.d_max if causal_max is None else min_opt(seg.d_max, causal_max)
            if lo >= hi or (d_max is not None and d_min is not None and d_min > d_max):
                continue
            # keys every row of the block sees: d_min <= p_j - last and p_j - first <= d_max
            full_lo = lo if d_min is None else min(max(lo, last + d_min - k0), hi)
            full_hi = hi if d_max is None else max(min(hi, first + d_max - k0 + 1), lo)
            if full_lo >= full_hi:
                ranges = [(lo, hi, True)]
            else:
                ranges = [(lo, full_lo, True), (full_lo, full_hi, False), (full_hi, hi, True)]
            q = tensors[2 * seg.piece][:, :, s:e]
            q = q.reshape(B, H // g, g * T, q.shape[-1])  # GQA: query heads of a group as rows
            k = tensors[2 * seg.piece + 1]
            for a, b, partial in ranges:
                if a >= b:
                    continue
                mask = None
                if partial:
                    d = torch.arange(k0 + a, k0 + b, device=dev)[None, :]
                    d = d - torch.arange(first, last + 1, device=dev)[:, None]
                    ok = torch.ones_like(d, dtype=torch.bool)
                    if d_max is not None:
                        ok &= d <= d_max
                    if d_min is not None:
                        ok &= d >= d_min
                    if not bool(ok.any()):
                        continue
                    mask = torch.zeros(ok.shape, dtype=dtype, device=dev).masked_fill(
                        ~ok, -math.inf
                    )
                    mask = mask.repeat(g, 1)
                out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k[:, :, a:b], v[:, :, a:b], attn_mask=mask, scale=call.scale
                )
                if mask is not None:  # rows that see no key of the range: lse = -inf
                    lse = lse.masked_fill(~ok.any(-1).repeat(g), -math.inf)
                outs.append(out.reshape(B, H, T, -1))
                lses.append(lse.reshape(B, H, T))
        if not outs:
            raise ValueError("piecewise_sdpa_attention: a query block sees no key")
        lse = torch.stack(lses)
        weight = torch.exp(lse - torch.logsumexp(lse, dim=0))
        return sum(
            w[..., None] * o.to(torch.float32) for w, o in zip(weight, outs, strict=True)
        ).to(v.dtype)


__all__ = [
    "PiecewiseRoPE",
    "KeySegment",
    "DualChunkAttention",
    "LMInfinite",
    "SelfExtend",
    "piecewise_sdpa_attention",
]
