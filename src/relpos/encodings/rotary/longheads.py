"""LongHeads (Lu et al. 2024, arXiv 2402.10685): per-head chunk selection from the raw q.k,
a selecting piecewise RoPE schedule (``longheads``). See ``LongHeads``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..base import BiasContext
from ..options import Bool, Int
from ..registry import register
from .schedules import Piece, PiecewiseRoPE, _floor_div

__all__ = ["LongHeads", "LongHeadsSelection"]


def _softmax_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale: float) -> Tensor:
    """``softmax(q k^T * scale)`` over the ``allowed`` keys (every row has one) ``@ v``."""
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale
    return torch.matmul(torch.softmax(logits.masked_fill(~allowed, -torch.inf), -1), v)


@dataclass
class LongHeadsSelection:
    """The per-call layout of ``longheads`` (``ctx.data``).

    ``rank (B, H, Lq, G)`` int32: the rank ``0 .. k - 1`` of chunk ``g`` in the selection of
    query ``i`` and head ``h`` (-1: not selected; all -1 for queries that do not select), or
    None when no query of the call selects (plain RoPE). ``exclude_diagonal``: the official
    prefill (selecting queries do not see their own key)."""

    rank: Tensor | None
    exclude_diagonal: bool = False


BEGIN_SELECTIVE_LENGTH = Int(minimum=1, optional=True, doc="B >= A, first position that selects")


@register("longheads")
class LongHeads(PiecewiseRoPE):
    """LongHeads: each head attends to the context chunks its query selects (Lu et al. 2024).

    Lu, Zhou, He, Zhao, Ji, Gui, Zhang, Huang ("LongHeads: Multi-Head Attention is Secretly a
    Long Context Processor", arXiv 2402.10685; official code LuLuLuyi/LongHeads,
    ``modeling_longheads/modeling_llama.py``, ``LlamaAttention.forward``). Training-free context
    extension: every head of every layer reads an in-distribution number of tokens,
    ``atten_length = k w``, made of ``k`` chunks of ``w = window_size`` tokens that its query
    chooses by query-chunk correlation. The official code was read.

    Chunks are ``c(p) = p // w`` of the sequence positions. Per head:

    1. Chunk features from the *raw* q, k, v of the chunk's own tokens, rotated at their local
       positions ``p mod w`` (``~``): bidirectional attention inside the chunk
       ``o_t = softmax_t'(~q_t . ~k_t' / sqrt(d)) v_t'``, its mean ``vbar_c = mean_t o_t``, and the
       chunk key ``kappa_c = sum_t softmax_t(vbar_c . ~k_t / sqrt(d)) ~k_t`` (a value-space vector
       queries the keys, as in the official code; so ``v`` and ``k`` share ``head_dim``).
    2. Scores ``q_i . kappa_g``: the raw query, unscaled and unrotated.
    3. A query at ``p_i >= begin_selective_length`` in chunk ``c`` selects ``k`` chunks: ``0``,
       ``c - 1`` and ``c`` are forced, the other ``k - 3`` are the best-scoring of ``1 .. c - 2``;
       sorted ascending, chunk ``g`` gets its rank ``r``.
    4. Positions: the key ``j`` of the chunk of rank ``r`` is rotated at ``r w + (p_j mod w)``,
       the query at ``(k - 1) w + (p_i mod w)``, so every rotary distance is below ``k w``; its own
       chunk (rank ``k - 1``) is at true distances, causal.
    5. Queries below ``begin_selective_length`` attend causally with plain RoPE.

    relpos form: a piecewise schedule (``PiecewiseRoPE``) that *selects*. Piece
    ``m < k`` rotates queries at ``m w + (p_i mod w)`` and keys at ``p_j mod w`` (the chunk of rank
    ``r`` is read by piece ``m = k - 1 - r``: the same relative rotation with one key copy); piece
    ``k`` is plain RoPE. ``select_pieces`` computes the features from the raw q/k/v and stores
    ``LongHeadsSelection`` (the rank of every chunk for every query and head) as ``ctx.data``;
    ``piece_index`` reads it. The logits of a query are then exactly the official ones: one
    softmax over its selected keys.

    Prefill and decode (the official code's asymmetry). In prefill the official code truncates a
    query's selected keys to ``[:rel]`` with ``rel = (k - 1) w + (p_i mod w)`` (its own index in the
    concatenation), so **a prefill query does not attend to itself**; in decode it does.
    relpos includes the diagonal in both (a decoding step then equals the same row of a full
    forward); ``official_prefill=True`` drops the diagonal of the selecting queries of calls with
    more than one query, as the official prefill does. The official code also computes the chunk
    feature of the partial last chunk over zero padding and, when a decoding step completes a
    chunk, places its query at ``(k - 1) w``: neither matters here, since relpos forms features
    over the tokens present (only chunks ``<= c - 2`` are ever scored, and those are complete
    for consecutive positions) and places every query by ``p_i mod w``.

    Past queries: the features need the queries of earlier tokens, so a KV cache keeps them
    (``reads_past_queries``; the official code caches ``past_query`` too). Keys without a query
    in the call (``Lq < Lk`` outside a cache) count with a zero query (uniform attention inside
    their chunk). Keys are cached raw (``cache_rotated_keys = False``).

    Cost: ``k + 1`` query rotations, two key rotations; on the engine's probability path each
    query block forms ``k + 1`` logit blocks (``eager`` / ``chunked``). The features take
    O(Lk w) work for one batch-shared consecutive key range, O(Lk^2) otherwise. A call whose
    queries all lie below ``begin_selective_length`` is plain RoPE at plain cost.

    Args:
        window_size: ``w`` (default ``min(256, A // 16)``: the official 256 for ``A >= 4096``).
        atten_length: ``A = k w``, the tokens each head reads (default
            ``max_position_embeddings``, else 4096); a multiple of ``w`` with ``k >= 3``.
        begin_selective_length: ``B``, the first query position that selects (default ``A``;
            at least ``A``, as the official defaults: below it the official top-k would pick
            masked chunks).
        official_prefill: drop the diagonal of selecting queries in calls with ``Lq > 1``.
        base, layout, partial_rotary_factor, scaling, max_position_embeddings: as ``rope``.

    Shapes as ``rope``; positions are non-negative integers (sequence coordinates).
    """

    paper = "Lu et al. 2024 (LongHeads)"
    selects = True
    reads_past_queries = True
    # w = 4, k = 4: a 48-token test has selecting queries from position 16 with a real choice
    test_options = {"window_size": 4, "atten_length": 16}

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        window_size: Annotated[
            int | None, Int(minimum=1, optional=True, doc="w (default min(256, A // 16))")
        ] = None,
        atten_length: Annotated[
            int | None, Int(minimum=3, optional=True, doc="A = k w, tokens each head reads")
        ] = None,
        begin_selective_length: Annotated[int | None, BEGIN_SELECTIVE_LENGTH] = None,
        official_prefill: Annotated[
            bool, Bool(doc="prefill queries do not see themselves (official code)")
        ] = False,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        a = atten_length if atten_length is not None else (self.max_position_embeddings or 4096)
        if window_size is None:
            window_size = max(1, min(256, a // 16))
        if a % window_size or a // window_size < 3:
            raise ValueError(
                f"atten_length (default: max_position_embeddings) must be a multiple k * "
                f"window_size with k >= 3 chunks (chunk 0, the previous and the own chunk are "
                f"always read), got atten_length={a}, window_size={window_size}"
            )
        b = a if begin_selective_length is None else begin_selective_length
        if b < a:
            raise ValueError(
                f"begin_selective_length must be >= atten_length ({a}): a query must have at "
                f"least k = atten_length / window_size earlier chunks to choose from, got {b}"
            )
        self.window_size, self.atten_length, self.begin_selective_length = window_size, a, b
        self.chunks = a // window_size
        self.official_prefill = official_prefill

    # ----------------------------------------------------------------- pieces
    def selecting(self, q_pos: Tensor) -> bool:
        """Whether some query of the call selects chunks (``p_i >= begin_selective_length``)."""
        return q_pos.numel() > 0 and int(q_pos.max()) >= self.begin_selective_length

    def piece_positions(self, q_pos: Tensor, k_pos: Tensor) -> list[Piece]:
        if not self.selecting(q_pos):
            return [(q_pos, k_pos)]
        w = self.window_size
        local_q, local_k = torch.remainder(q_pos, w), torch.remainder(k_pos, w)
        return [(m * w + local_q, local_k) for m in range(self.chunks)] + [(q_pos, k_pos)]

    def select_pieces(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor],
        *,
        past_queries: Tensor | None = None,
    ) -> tuple[list[Piece], LongHeadsSelection]:
        if k_pos.numel() and int(k_pos.min()) < 0:
            raise ValueError("longheads needs non-negative positions (chunks are p // window)")
        pieces = self.pieces(q, k, q_pos, k_pos)
        exclude = self.official_prefill and q.shape[2] > 1
        if len(pieces) == 1:
            return pieces, LongHeadsSelection(None, exclude)
        if v.shape[-1] != q.shape[-1]:
            raise ValueError(
                f"longheads needs v with the head_dim of q and k ({q.shape[-1]}): a chunk's "
                f"mean value queries its keys, got v head_dim {v.shape[-1]}"
            )
        with torch.no_grad():
            kappa, present = self.chunk_keys(q, k, v, k_pos, past_queries)
            rank = self.chunk_ranks(q, q_pos, kappa, present)
        return pieces, LongHeadsSelection(rank, exclude)

    # ----------------------------------------------------------------- selection
    def chunk_keys(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        k_pos: Tensor,
        past_queries: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The chunk keys ``kappa (B, H, G, D)`` and which chunks hold a key ``(B, G)``
        (``G = max(p_j) // w + 1``) from the raw ``q (B, H, Lq, D)``, ``k, v (B, Hkv, Lk, D)``;
        ``past_queries (B, H, P, D)`` are the queries of the first ``P`` keys (KV cache),
        keys without a query count with a zero one."""
        B, H, Lq, D = q.shape
        Lk, w = k.shape[2], self.window_size
        groups = H // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if Lq >= Lk:  # bottom-right alignment: the last Lk queries are the keys' own
            queries = q[:, :, Lq - Lk :]
        else:
            parts = [] if past_queries is None else [past_queries[:, :, : Lk - Lq]]
            missing = Lk - Lq - (0 if past_queries is None else parts[0].shape[2])
            if missing > 0:
                parts.append(q.new_zeros(B, H, missing, D))
            queries = torch.cat([*parts, q], dim=2)  # the query of every key
        kp = k_pos.expand(B, Lk)
        local = torch.remainder(kp, w)
        ql, kl = self._rotate_at(queries, local), self._rotate_at(k, local)
        chunk = _floor_div(kp, w)  # (B, Lk)
        G = int(chunk.max()) + 1
        scale = D**-0.5
        out = self._local_attention(ql, kl, v, k_pos, chunk, scale)  # (B, H, Lk, D)
        index = chunk[:, None, :, None].expand(B, H, Lk, D)
        count = torch.zeros(B, G, dtype=q.dtype, device=q.device)
        count.scatter_add_(1, chunk, torch.ones_like(chunk, dtype=q.dtype))
        present = count > 0
        vbar = q.new_zeros(B, H, G, D).scatter_add_(2, index, out)
        vbar = vbar / count.clamp(min=1)[:, None, :, None]
        # kappa_g = sum_t softmax_t(vbar_g . ~k_t * scale) ~k_t over the chunk's keys
        logit = (vbar.gather(2, index) * kl).sum(-1) * scale  # (B, H, Lk)
        top = logit.new_full((B, H, G), float("-inf"))
        top = top.scatter_reduce(2, chunk[:, None].expand(B, H, Lk), logit, "amax")
        weight = (logit - top.gather(2, chunk[:, None].expand(B, H, Lk))).exp()
        total = logit.new_zeros(B, H, G).scatter_add_(2, chunk[:, None].expand(B, H, Lk), weight)
        kappa = q.new_zeros(B, H, G, D).scatter_add_(2, index, weight[..., None] * kl)
        kappa = kappa / total.clamp(min=torch.finfo(total.dtype).tiny)[..., None]
        return kappa, present

    def _local_attention(
        self, q: Tensor, k: Tensor, v: Tensor, k_pos: Tensor, chunk: Tensor, scale: float
    ) -> Tensor:
        """Bidirectional attention of every key's token inside its chunk: ``(B, H, Lk, D)``.
        One batch-shared consecutive range: chunks as a reshape (O(Lk w)); else a same-chunk
        mask (O(Lk^2))."""
        B, H, Lk, D = q.shape
        w = self.window_size
        consecutive = k_pos.shape[0] == 1 and (
            Lk == 1 or bool((k_pos[0, 1:] - k_pos[0, :-1] == 1).all())
        )
        if not consecutive:
            same = chunk[:, None, :, None] == chunk[:, None, None, :]
            return _softmax_attention(q, k, v, same, scale)
        front = int(k_pos[0, 0]) % w
        back = (-(front + Lk)) % w
        pad = (0, 0, front, back)
        n = (front + Lk + back) // w
        qc, kc, vc = (F.pad(x, pad).view(B, H, n, w, D) for x in (q, k, v))
        member = torch.zeros(front + Lk + back, dtype=torch.bool, device=q.device)
        member[front : front + Lk] = True
        mask = member.view(n, 1, w).expand(n, w, w)
        out = _softmax_attention(qc, kc, vc, mask, scale)
        return out.reshape(B, H, n * w, D)[:, :, front : front + Lk]

    def chunk_ranks(self, q: Tensor, q_pos: Tensor, kappa: Tensor, present: Tensor) -> Tensor:
        """``rank (B, H, Lq, G)`` int32 of the selected chunks of every query (-1 elsewhere,
        and everywhere for queries below ``begin_selective_length``): chunks ``0``, ``c - 1``,
        ``c`` forced, the best ``k - 3`` of ``1 .. c - 2`` by ``q_i . kappa_g`` (ties and
        empty chunks in index order), sorted ascending."""
        B, H, Lq, _ = q.shape
        G, k = kappa.shape[2], self.chunks
        qp = q_pos.expand(B, Lq)
        c = _floor_div(qp, self.window_size)[:, None, :, None]  # (B, 1, Lq, 1)
        g = torch.arange(G, device=q.device)
        score = torch.matmul(q, kappa.transpose(-1, -2))  # (B, H, Lq, G), unscaled
        candidate = (g >= 1) & (g <= c - 2) & present[:, None, None, :]
        forced = (g == 0) | (g == c - 1) | (g == c)
        key = torch.where(candidate, score, float("-inf"))
        key = torch.where(forced, float("inf"), key)
        # later chunks (g > c) are -inf too and come after every chunk <= c (c >= k)
        order = torch.sort(key, dim=-1, descending=True, stable=True)
        chosen = order.indices[..., : min(k, G)]
        chosen = torch.sort(chosen, dim=-1).values  # ascending chunk ids: rank = slot
        rank = torch.full((B, H, Lq, G), -1, dtype=torch.int32, device=q.device)
        slots = torch.arange(chosen.shape[-1], dtype=torch.int32, device=q.device)
        rank.scatter_(-1, chosen, slots.expand_as(chosen).contiguous())
        selecting = (qp >= self.begin_selective_length)[:, None, :, None]
        return torch.where(selecting, rank, -1)

    def piece_index(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """Piece ``k - 1 - rank`` for a key in a chunk of rank ``rank`` of a selecting query,
        piece ``k`` (plain RoPE) for the others; -1 for later keys and unselected chunks."""
        data: LongHeadsSelection = ctx.data
        qp, kp = ctx.q_pos[b, i], ctx.k_pos[b, j]
        visible = kp <= qp
        if data.rank is None:
            return torch.where(visible, 0, -1)
        G = data.rank.shape[-1]
        chunk = _floor_div(kp, self.window_size).clamp(max=G - 1)
        rank = data.rank[b, h, i, chunk].long()
        selecting = qp >= self.begin_selective_length
        if data.exclude_diagonal:
            visible = visible & ~(selecting & (kp == qp))
        piece = torch.where(
            selecting, torch.where(rank >= 0, self.chunks - 1 - rank, -1), self.chunks
        )
        return torch.where(visible, piece, -1)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, window_size={self.window_size}, "
            f"atten_length={self.atten_length}, "
            f"begin_selective_length={self.begin_selective_length}"
            + (", official_prefill=True" if self.official_prefill else "")
        )
